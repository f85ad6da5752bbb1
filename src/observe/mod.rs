//! Observe: what /proc says (procs), whether it can be believed (proctrust), a consistent table
//! (consistency), waiting for signalled processes to act (settle), the container's identity
//! (container), the TCP sockets that listen (sockets), what the walk's evidence reads of one
//! process (evidence). May use: kernel, record (the container's and a socket's records). Never
//! decides who is a sandbox process, and never signals.

pub mod consistency;
pub mod container;
pub mod evidence;
pub mod procs;
pub mod proctrust;
pub mod settle;
pub mod sockets;

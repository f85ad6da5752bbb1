//! The kernel: the one place that talks to it directly. Everything above reads like the contract;
//! everything here checks the return value of the call it makes. One module per kind of call:
//! - `errno`: a call's negative return as the io::Error of the errno it left.
//! - `process`: this process's ids, fork and spawn_shared, setsid, exit, its prctl flags, CPUs, boot clock.
//! - `reap`: waitpid, for any child or one.
//! - `signal`: names and numbers, masks and dispositions, pending signals, the signalfd, kill(2).
//! - `pidfd`: process descriptors: open, signal, still attached, pidfs identity.
//! - `creds`: effective ids and groups, the thread's own uid and filesystem-id switches.
//! - `ipc`: the seqpacket socket pair between the init and its helpers.
//! - `fdio`: one open descriptor: read, write, poll, non-blocking, terminal.
//! - `stat`: what a file is (fstat, statx), procfs, a namespace's inode.
//! - `dirfd`: opening and reading through a directory descriptor, following no link.
//! - `dirwrite`: changing a directory's entries (create, rename, unlink, mkdir, rmdir, sync).
//! - `flock`: the whole-file lock a running sidecar holds.
//! - `detach`: starting a process that outlives its starter (fork, setsid, fork, exec).
//! - `random`: random bytes.
//! - `sockdiag`: the listening TCP sockets, from the kernel's socket-diagnostics netlink.
//! - `landlock`: a ruleset made, its ports and paths allowed, enforced on a child before its exec.
//! - `seccomp`: the services' filter for what Landlock leaves open, an allow-list (an inet socket
//!   only as plain TCP or UDP; no io_uring).
//! - `users`: the container's passwd and group; `capcheck`: the capabilities a freeze needs.
//!
//! May use: libc, nix, caps, getrandom and std only. Never imports another folder of the crate;
//! a module here names another of this folder by its path (`crate::kernel::errno::check`).
//! Every other folder reaches the kernel through here; the one exception is spawn/plan between
//! fork and exec, where only async-signal-safe libc calls may run.

pub mod capcheck;
pub mod creds;
pub mod detach;
pub mod dirfd;
pub mod dirwrite;
pub mod errno;
pub mod fdio;
pub mod flock;
pub mod ipc;
pub mod landlock;
pub mod pidfd;
pub mod process;
pub mod random;
pub mod reap;
pub mod seccomp;
pub mod signal;
pub mod sockdiag;
pub mod stat;
pub mod users;

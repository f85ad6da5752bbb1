//! The kernel: system calls (dirfd, while it is split by kind of call), the user database (users)
//! and the capability check (capcheck).
//! May use: libc, nix, caps, getrandom and std only. Never imports another folder of the crate.
//! Every other folder reaches the kernel through here; the one exception is init/spawn between
//! fork and exec, where only async-signal-safe libc calls may run.

pub mod capcheck;
pub mod creds;
pub mod dirfd;
pub mod dirwrite;
pub mod errno;
pub mod fdio;
pub mod ipc;
pub mod pidfd;
pub mod process;
pub mod random;
pub mod reap;
pub mod signal;
pub mod stat;
pub mod users;

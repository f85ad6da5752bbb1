//! flock(2): the whole-file lock a running sidecar holds on its state dir's lock file, so that a
//! second start finds it held and never makes a second init.
//! May use: libc, std and kernel::errno.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use crate::kernel::errno::check;

/// Take an exclusive lock on `fd` without waiting: false when another open file description
/// holds it. The lock lives as long as the open file description (every copy of `fd` made by
/// fork or dup), and ends with the last of them.
pub fn try_lock_exclusive(fd: &OwnedFd) -> io::Result<bool> {
    // SAFETY: a valid descriptor; flock takes no pointer.
    match check(unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } as _) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Ok(false),
        Err(e) => Err(e),
    }
}

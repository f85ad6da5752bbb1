//! One open descriptor: read from it (retried on EINTR), write to it, wait until it is readable,
//! make it non-blocking, ask whether it is a terminal; a pipe; a descriptor inherited by number.
//! May use: libc, std and kernel::errno.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::kernel::errno::check;

pub(super) fn poll_in(fd: RawFd, timeout: Option<Duration>) -> io::Result<bool> {
    let ms = match timeout {
        None => -1,
        Some(d) => d.as_millis().min(i32::MAX as u128) as i32,
    };
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINTR) {
            return Ok(false);
        }
        return Err(e);
    }
    Ok(r > 0)
}

/// Wait until `fd` is readable or `timeout` passes; Ok(false) on timeout.
pub fn wait_readable(fd: RawFd, timeout: Duration) -> io::Result<bool> {
    poll_in(fd, Some(timeout))
}

pub fn isatty(fd: RawFd) -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(fd) == 1 }
}

/// One write(2); a non-blocking descriptor that cannot take anything gives EAGAIN.
pub fn write(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: a write from a valid buffer of the given length.
    check(unsafe { libc::write(fd, buf.as_ptr() as *const libc::c_void, buf.len()) } as _).map(|n| n as usize)
}

/// One read(2) into `buf`, retried on EINTR; 0 at the end of the file.
pub fn read_some(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: the kernel writes at most buf.len() bytes into buf.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// Make a descriptor non-blocking (a pipe the init reads from must never hold it).
pub fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor the caller holds, with integer arguments.
    let flags = check(unsafe { libc::fcntl(fd, libc::F_GETFL) } as _)?;
    check(unsafe { libc::fcntl(fd, libc::F_SETFL, flags as i32 | libc::O_NONBLOCK) } as _).map(drop)
}

/// A pipe, both ends close-on-exec: (read end, write end).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: the kernel writes two descriptors into the local array.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } as _)?;
    // SAFETY: the kernel just gave us these descriptors.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Take the descriptor `fd` handed over at exec (its number agreed beforehand): refused unless it
/// is open; made close-on-exec, so that nothing this process starts inherits it.
pub fn take_inherited(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: fcntl with integer arguments on a number that may not be open (EBADF then).
    check(unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } as _)?;
    // SAFETY: open (checked just now), and by the agreement at exec no one else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

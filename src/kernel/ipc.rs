//! Sockets between the init and its helpers: a SOCK_SEQPACKET pair, and sends and receives that
//! never block the sender and never raise SIGPIPE.
//! May use: libc, std and kernel::errno.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use crate::kernel::errno::check;

/// A connected pair of SOCK_SEQPACKET sockets: message boundaries kept, close-on-exec.
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: socketpair fills two descriptors that we then own.
    check(unsafe {
        libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr())
    } as _)?;
    // SAFETY: the kernel just gave us these descriptors.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Send one message; never blocks (the peer reads before the next one is sent).
pub fn send_msg(fd: RawFd, buf: &[u8]) -> io::Result<()> {
    // SAFETY: a valid buffer for the call.
    let n = unsafe {
        libc::send(
            fd,
            buf.as_ptr() as *const libc::c_void,
            buf.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != buf.len() {
        return Err(io::Error::other("short send"));
    }
    Ok(())
}

/// Receive one message into `buf`; Ok(0) means the peer is gone.
pub fn recv_msg(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: a valid buffer for the call.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// One send(2) that never blocks and never raises SIGPIPE.
pub fn send_nowait(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: a send from a valid buffer of the given length.
    check(unsafe {
        libc::send(
            fd,
            buf.as_ptr() as *const libc::c_void,
            buf.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    } as _)
    .map(|n| n as usize)
}

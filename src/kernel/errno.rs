//! A kernel call's answer as a Result: a negative return becomes the errno it left, as an
//! io::Error, so that every call in this folder checks the value it gets back.
//! May use: libc and std only.

use std::io;

/// The return value, or the errno the call left when it is negative.
pub(super) fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// The errno the last call left, as a number (EIO when it left none).
pub(super) fn errno_now() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

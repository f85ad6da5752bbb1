//! A read of one /proc file: what it holds, or that its process is gone (it exited). Any other
//! failure is unknown, never "no such process". May use: std, libc.

use std::fs;
use std::io;
use std::path::Path;

pub(super) enum Read<T> {
    Ok(T),
    Gone,
}

/// The error for anything that is not "this process exited".
pub(super) fn unknown(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("cannot read {}: {e} (the process table is unknown)", path.display()))
}

pub(super) fn is_gone(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ESRCH))
}

pub(super) fn read_prefix(path: &Path, max: usize) -> io::Result<Read<Vec<u8>>> {
    use std::io::Read as _;
    let mut b = Vec::new();
    let r = fs::File::open(path).and_then(|f| f.take(max as u64).read_to_end(&mut b));
    match r {
        Ok(_) => Ok(Read::Ok(b)),
        Err(e) if is_gone(&e) => Ok(Read::Gone),
        Err(e) => Err(unknown(path, e)),
    }
}

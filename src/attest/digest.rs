//! SHA-256 of one regular file, with proof that it did not change while it was read: what the
//! walk saw, what the open descriptor says before the first read and after the last (type,
//! device, inode, size, mtime, ctime) must all agree, and exactly `size` bytes must be read.

use super::walk::{changed, File};
use crate::kernel::{
    dirfd, fdio,
    stat::{self, Meta},
};
use sha2::{Digest, Sha256};
use std::time::Instant;

/// The facts a change to a file's content moves.
fn differs(a: &Meta, b: &Meta) -> Option<&'static str> {
    if a.kind() != b.kind() || a.dev != b.dev || a.ino != b.ino {
        Some("another file under its name")
    } else if a.size != b.size {
        Some("size")
    } else if a.mtime != b.mtime {
        Some("mtime")
    } else if a.ctime != b.ctime {
        Some("ctime")
    } else {
        None
    }
}

pub fn sha256(f: &File, buf: &mut [u8], deadline: Instant) -> Result<[u8; 32], String> {
    let fd = dirfd::open_file_at(&f.dir, &f.leaf).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT | libc::ELOOP | libc::ENXIO) => changed(&f.name, "removed or replaced"),
        _ => format!("cannot read {}: {e}", super::name::shown(&f.name)),
    })?;
    let look =
        |fd| stat::statx_fd(fd).map_err(|e| format!("cannot look at {}: {e}", super::name::shown(&f.name)));
    let before = look(&fd)?;
    if let Some(what) = differs(&f.meta, &before) {
        return Err(changed(&f.name, what));
    }
    let mut h = Sha256::new();
    let mut total: u64 = 0;
    let mut reads: u32 = 0;
    loop {
        let n = fdio::read_some(&fd, buf)
            .map_err(|e| format!("cannot read {}: {e}", super::name::shown(&f.name)))?;
        if n == 0 {
            break;
        }
        total += n as u64;
        if total > before.size {
            return Err(changed(&f.name, "grew"));
        }
        h.update(&buf[..n]);
        if total == before.size {
            // All of it: a write since shows in the stat after (size, mtime, ctime), so the read
            // that would say end-of-file is saved (one system call of a small file's six).
            break;
        }
        reads = reads.wrapping_add(1);
        if reads.is_multiple_of(64) && Instant::now() >= deadline {
            return Err(format!(
                "the time bound ran out while {} was hashed: raise --attest-timeout",
                super::name::shown(&f.name)
            ));
        }
    }
    if total != before.size {
        return Err(changed(&f.name, "shrank"));
    }
    let after = look(&fd)?;
    if let Some(what) = differs(&before, &after) {
        return Err(changed(&f.name, what));
    }
    Ok(h.finalize().into())
}

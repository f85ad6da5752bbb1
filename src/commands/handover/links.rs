//! The writable places hold no second name of a file the services could write: Landlock
//! allows writes by path, so a hard link beneath /tmp (made by the agent before the freeze, as
//! fs.protected_hardlinks lets the owner of a file, or anyone of a file they may write) to a
//! world-writable file elsewhere on the same filesystem (a reward the harness left writable)
//! would let a service write that file through the /tmp name. The services cannot make such a
//! link themselves (Landlock's REFER right keeps a file from gaining rights by a new name), so
//! one walk before they start finds every one there will be: on a thread that became the service
//! user (keeping only the right to list), any file but a directory or a symbolic link (whose
//! target Landlock judges by its own path) with more than one name that the user may write, or
//! owns, refuses the hand-over, named. A file it cannot write is harmless by any name.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Entries looked at beneath the writable places, and how long that may take: beyond either
/// the hand-over is refused (what is not looked at is not known to be safe).
const ENTRIES: usize = 200_000;
const TIME: Duration = Duration::from_secs(20);

/// Refuse when a file beneath `dirs` (not following symbolic links) that `uid` may write, or
/// owns, has a second name; checked as that user on a thread of its own.
pub fn single_names(uid: u32, gid: u32, dirs: &'static [&'static str]) -> Result<(), String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("quiesce-links".into())
        .spawn(move || {
            let keep = [caps::Capability::CAP_DAC_READ_SEARCH];
            let out = match crate::kernel::creds::thread_become(uid, gid, &keep) {
                Ok(()) => walk(uid, dirs),
                Err(e) => Err(format!("cannot look for hard links as user {uid}: {e}")),
            };
            let _ = tx.send(out);
        })
        .map_err(|e| format!("cannot start the hard-link check: {e}"))?;
    match rx.recv_timeout(TIME + Duration::from_secs(1)) {
        Ok(r) => r,
        Err(_) => Err(bound(&format!("{TIME:?}"))),
    }
}

fn walk(uid: u32, dirs: &[&str]) -> Result<(), String> {
    let until = Instant::now() + TIME;
    let mut left = ENTRIES;
    let mut todo: Vec<PathBuf> = Vec::new();
    for d in dirs {
        match std::fs::symlink_metadata(d) {
            Ok(m) if m.is_dir() => todo.push(PathBuf::from(d)),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(unreadable(Path::new(d), &e)),
        }
    }
    while let Some(dir) = todo.pop() {
        // Removed since it was listed (by the verifier's own: the agent is dead, and no service
        // runs yet): no name is left beneath it.
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(unreadable(&dir, &e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| unreadable(&dir, &e))?;
            let p = entry.path();
            let m = match std::fs::symlink_metadata(&p) {
                Ok(m) => m,
                // Removed since the listing: no name, so no second one.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(unreadable(&p, &e)),
            };
            left = left.checked_sub(1).ok_or_else(|| bound(&format!("{ENTRIES} entries")))?;
            if Instant::now() >= until {
                return Err(bound(&format!("{TIME:?}")));
            }
            use std::os::unix::fs::MetadataExt;
            if m.is_dir() {
                todo.push(p);
            } else if m.nlink() > 1 && !m.file_type().is_symlink() && (m.uid() == uid || writable(&p)?) {
                return Err(format!(
                    "{} has {} names (hard links), the service user may write it, and the services may \
                     write beneath {}: a second name can be a file outside the places they may write; \
                     remove the link before the hand-over",
                    p.display(),
                    m.nlink(),
                    dirs.join(", ")
                ));
            }
        }
    }
    Ok(())
}

/// Whether the thread's user may write the inode at `p` by its own permissions.
fn writable(p: &Path) -> Result<bool, String> {
    let fd = crate::kernel::dirfd::openat(None, p, libc::O_PATH | libc::O_NOFOLLOW)
        .map_err(|e| unreadable(p, &e))?;
    crate::kernel::creds::may_access_fd(&fd, libc::W_OK).map_err(|e| unreadable(p, &e))
}

fn unreadable(p: &Path, e: &std::io::Error) -> String {
    format!("cannot read {} while looking for hard links where the services may write: {e}", p.display())
}

fn bound(what: &str) -> String {
    format!(
        "the places the services may write hold more than the hard-link check looks at ({what}): \
         empty /tmp, /var/tmp and /dev/shm of what the tests do not need before the hand-over"
    )
}

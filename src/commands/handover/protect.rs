//! The protected-path check: before any service starts, a thread that has become the service
//! user walks `--protect` (nothing it may write or owns, no parent it may write that is not
//! sticky) and `--hide` (nothing it may read), links followed one step at a time.

use crate::kernel::creds;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Entries looked at under the protected paths, and how long that may take.
const PROTECT_ENTRIES: usize = 200_000;
const PROTECT_TIME: std::time::Duration = std::time::Duration::from_secs(20);

/// Refuse when the service user could write or owns anything under a protected path, or could
/// move one through a parent it may write that is not sticky. Checked on a thread that has
/// become that user (so access(2) answers for it, groups included), keeping only the right to
/// list what it could not.
pub fn protected_safe(uid: u32, gid: u32, paths: &[PathBuf], hidden: &[PathBuf]) -> Result<(), String> {
    let (paths, hidden) = (paths.to_vec(), hidden.to_vec());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("quiesce-protect".into())
        .spawn(move || {
            let keep = [caps::Capability::CAP_DAC_READ_SEARCH, caps::Capability::CAP_DAC_OVERRIDE];
            let out = match creds::thread_become(uid, gid, &keep) {
                Ok(()) => check_paths(uid, gid, &paths, libc::W_OK)
                    .and_then(|()| check_paths(uid, gid, &hidden, libc::R_OK)),
                Err(e) => Err(format!("cannot check the protected paths as user {uid}: {e}")),
            };
            let _ = tx.send(out);
        })
        .map_err(|e| format!("cannot start the protected-path check: {e}"))?;
    match rx.recv_timeout(PROTECT_TIME) {
        Ok(r) => r,
        Err(_) => Err(format!(
            "the protected-path check did not finish within {PROTECT_TIME:?} (at most {PROTECT_ENTRIES} entries)"
        )),
    }
}

/// Walk `paths` for an inode the user may access as `access` asks (W_OK: --protect, R_OK: --hide).
fn check_paths(uid: u32, gid: u32, paths: &[PathBuf], access: i32) -> Result<(), String> {
    let mut walk = Walk {
        uid,
        gid,
        access,
        until: Instant::now() + PROTECT_TIME,
        seen: std::collections::HashSet::new(),
        todo: Vec::new(),
    };
    for root in paths {
        walk.tree(root)?;
    }
    Ok(())
}

/// The protected walk: every inode under the paths (a link's target too, with its parents), each
/// judged by its own owner, mode and ACL, so that neither a path the user cannot reach nor a
/// second name of the file hides a writable one.
struct Walk {
    uid: u32,
    gid: u32,
    /// W_OK or R_OK: what the user may not do to any inode of the tree.
    access: i32,
    until: Instant,
    /// (device, inode) already judged: a loop of links, or a second name, is walked once.
    seen: std::collections::HashSet<(u64, u64)>,
    todo: Vec<PathBuf>,
}

impl Walk {
    fn tree(&mut self, root: &Path) -> Result<(), String> {
        use std::os::unix::fs::MetadataExt;
        let abs = std::path::absolute(root).map_err(|e| format!("protected path {}: {e}", root.display()))?;
        let mut hops = 0;
        let top = self.resolve(&abs, root, &mut hops)?;
        self.todo.push(top);
        while let Some(p) = self.todo.pop() {
            if self.seen.len() + self.todo.len() > PROTECT_ENTRIES || Instant::now() >= self.until {
                return Err(format!(
                    "more under the protected paths than the check looks at ({PROTECT_ENTRIES} entries or \
                     {PROTECT_TIME:?}): protect less"
                ));
            }
            let m =
                std::fs::symlink_metadata(&p).map_err(|e| format!("protected path {}: {e}", p.display()))?;
            if m.file_type().is_symlink() {
                // What it leads to is what a reader gets: every step of the way judged, then the
                // target walked as if protected itself.
                let mut hops = 0;
                let target = self.resolve(&p, root, &mut hops)?;
                let t = std::fs::metadata(&target).map_err(|e| format!("{}: {e}", target.display()))?;
                if !self.seen.contains(&(t.dev(), t.ino())) {
                    self.todo.push(target);
                }
                continue;
            }
            if !self.seen.insert((m.dev(), m.ino())) {
                continue;
            }
            if self.owned(&m) || self.may(&p, self.access)? {
                let (verb, not, flag) = if self.access == libc::R_OK {
                    ("read", "readable", "hide")
                } else {
                    ("write", "writable", "protect")
                };
                return Err(format!(
                    "the service user {} may {verb} {} (--{flag} {}): make it not {not} by that user, or \
                     {flag} less",
                    self.uid,
                    p.display(),
                    root.display()
                ));
            }
            if m.is_dir() {
                for entry in std::fs::read_dir(&p).map_err(|e| format!("{}: {e}", p.display()))? {
                    if self.todo.len() + self.seen.len() > PROTECT_ENTRIES {
                        break;
                    }
                    self.todo.push(entry.map_err(|e| format!("{}: {e}", p.display()))?.path());
                }
            }
        }
        Ok(())
    }

    /// Where the absolute path `p` leads, following its links one step at a time, and judging
    /// each directory passed through (one the user owns, or may write without the sticky bit,
    /// lets it replace what follows) and each entry on the way (one it owns it may change). A
    /// link into a directory the user may write, anywhere on the way, is refused as surely as
    /// one in the protected tree.
    fn resolve(&mut self, p: &Path, root: &Path, hops: &mut u32) -> Result<PathBuf, String> {
        use std::path::Component;
        let mut cur = PathBuf::from("/");
        for c in p.components() {
            match c {
                Component::Normal(name) => {
                    self.passable(&cur, p, root)?;
                    let next = cur.join(name);
                    let m = std::fs::symlink_metadata(&next).map_err(|e| {
                        format!(
                            "{} (on the way to {}, protected: {}): {e}; a path to nothing could be made \
                             by the service: remove the link",
                            next.display(),
                            p.display(),
                            root.display()
                        )
                    })?;
                    if self.owned(&m) {
                        return Err(format!(
                            "the service user {} owns {} (on the way to {}, protected: {})",
                            self.uid,
                            next.display(),
                            p.display(),
                            root.display()
                        ));
                    }
                    if m.file_type().is_symlink() {
                        *hops += 1;
                        if *hops > 40 {
                            return Err(format!(
                                "{}: too many links (protected: {})",
                                p.display(),
                                root.display()
                            ));
                        }
                        let t = std::fs::read_link(&next).map_err(|e| format!("{}: {e}", next.display()))?;
                        cur = self.resolve(&cur.join(t), root, hops)?;
                    } else {
                        cur = next;
                    }
                }
                Component::ParentDir => {
                    cur.pop();
                }
                Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            }
        }
        Ok(cur)
    }

    /// A directory on the way: not the user's, and not writable by it unless sticky.
    fn passable(&self, dir: &Path, p: &Path, root: &Path) -> Result<(), String> {
        let m = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let sticky = m.permissions().mode() & 0o1000 != 0;
        if self.owned(&m) || (!sticky && self.may(dir, libc::W_OK)?) {
            return Err(format!(
                "the service user {} may write {}, on the way to {} (protected: {}): it could replace \
                 what follows; make it not writable by that user",
                self.uid,
                dir.display(),
                p.display(),
                root.display()
            ));
        }
        Ok(())
    }

    fn owned(&self, m: &std::fs::Metadata) -> bool {
        use std::os::unix::fs::MetadataExt;
        m.uid() == self.uid || (m.gid() == self.gid && m.mode() & 0o020 != 0)
    }

    /// The inode at `p` (a last link not followed) by its own permissions.
    fn may(&self, p: &Path, access: i32) -> Result<bool, String> {
        let fd = crate::kernel::dirfd::openat(None, p, libc::O_PATH | libc::O_NOFOLLOW)
            .map_err(|e| format!("{}: {e}", p.display()))?;
        creds::may_access_fd(&fd, access)
            .map_err(|e| format!("cannot judge {} as the service user: {e}", p.display()))
    }
}

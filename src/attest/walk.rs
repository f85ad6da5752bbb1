//! The bounded walk of one named tree: every entry listed through the descriptor of its
//! directory, looked at with statx and never followed; regular files handed on to be hashed,
//! everything else recorded as it is. It never follows a symlink, never opens a FIFO, socket or
//! device, and never enters another mount: those are recorded (skipped, and why).

use super::name;
use crate::kernel::{
    dirfd,
    stat::{self, Meta},
};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::Instant;

/// What one attestation may take; any bound exceeded fails it (nothing partial is signed).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Bounds {
    /// Entries of every kind met by the walk, over all named paths.
    pub files: u64,
    /// Bytes of regular files (their sizes, sparse or not), over all named paths.
    pub bytes: u64,
    /// Directories below a named path, at most this deep (its entries are at depth 1).
    pub depth: u32,
    /// Seconds for the whole attestation.
    pub seconds: u64,
}

impl Default for Bounds {
    fn default() -> Bounds {
        Bounds { files: 1_000_000, bytes: 16 << 30, depth: 256, seconds: 300 }
    }
}

/// A regular file to hash: its directory (held open), its name there, and what the walk saw.
pub struct File {
    pub dir: Arc<OwnedFd>,
    pub leaf: CString,
    /// The absolute path's bytes.
    pub name: Vec<u8>,
    pub meta: Meta,
}

/// What a named path holds besides the regular files' contents.
#[derive(Debug, Default)]
pub struct Entries {
    /// The directories' names (the named path's own not among them); their count is its length.
    pub dirs: Vec<Vec<u8>>,
    pub files: u64,
    pub bytes: u64,
    /// (name, target text)
    pub symlinks: Vec<(Vec<u8>, Vec<u8>)>,
    /// (name, kind, rdev)
    pub special: Vec<(Vec<u8>, &'static str, u64)>,
    /// (name, why)
    pub skipped: Vec<(Vec<u8>, String)>,
    /// Regular files with more than one link: (dev, ino) -> (link count, names seen here).
    pub links: HashMap<(u64, u64), Links>,
}

/// A file's link count and the names it has in the walked tree.
pub type Links = (u32, Vec<Vec<u8>>);

/// Bytes of text the statement repeats from the tree, over all named paths: every entry's
/// absolute path, a hard-linked file's once more (its group), a symlink's target. Escaped, each
/// byte is at most three in the statement: with a million entries' fixed part, the envelope
/// stays below the 1 GiB verify reads. A million paths of 200 bytes fit.
pub const NAME_BYTES: u64 = 192 << 20;

/// What the walks of one attestation used so far, against its bounds.
pub struct Used {
    pub entries: u64,
    pub names: u64,
    pub bytes: u64,
    pub deadline: Instant,
}

impl Used {
    pub fn new(bounds: &Bounds, start: Instant) -> Used {
        Used {
            entries: 0,
            names: 0,
            bytes: 0,
            deadline: start + std::time::Duration::from_secs(bounds.seconds),
        }
    }
}

fn join(dir: &[u8], leaf: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(dir.len() + 1 + leaf.len());
    p.extend_from_slice(dir);
    if !dir.ends_with(b"/") {
        p.push(b'/');
    }
    p.extend_from_slice(leaf);
    p
}

pub fn changed(name: &[u8], what: &str) -> String {
    format!(
        "{} changed while it was attested ({what}): attest trees nothing writes to after the freeze",
        name::shown(name)
    )
}

fn special_kind(kind: u32) -> Option<&'static str> {
    Some(match kind {
        libc::S_IFIFO => "fifo",
        libc::S_IFSOCK => "socket",
        libc::S_IFCHR => "char-device",
        libc::S_IFBLK => "block-device",
        _ => return None,
    })
}

struct Frame {
    fd: Arc<OwnedFd>,
    path: Vec<u8>,
    depth: u32,
    subdirs: Vec<(CString, Meta)>,
}

struct Walk<'a> {
    bounds: &'a Bounds,
    used: &'a mut Used,
    root_dev: u64,
    root_mnt: Option<u64>,
    out: Entries,
    sink: &'a mut dyn FnMut(File) -> Result<(), String>,
}

impl Walk<'_> {
    fn tick(&mut self, at: &[u8]) -> Result<(), String> {
        self.used.entries += 1;
        self.text(at.len(), at)?;
        if self.used.entries > self.bounds.files {
            return Err(format!(
                "more than {} entries (at {}): raise --attest-max-files or attest a smaller tree",
                self.bounds.files,
                name::shown(at)
            ));
        }
        if Instant::now() >= self.used.deadline {
            return Err(format!(
                "the time bound of {} s ran out (at {}): raise --attest-timeout or attest a smaller tree",
                self.bounds.seconds,
                name::shown(at)
            ));
        }
        Ok(())
    }

    /// `n` more bytes of text from the tree in the statement, at `at`.
    fn text(&mut self, n: usize, at: &[u8]) -> Result<(), String> {
        self.used.names = self.used.names.saturating_add(n as u64);
        if self.used.names > NAME_BYTES {
            return Err(format!(
                "more than {NAME_BYTES} bytes of names and link targets (at {}): attest a tree with fewer or shorter names",
                name::shown(at)
            ));
        }
        Ok(())
    }

    /// Another mount below the path: a bind mount, a FUSE mount (dead or alive), a volume.
    fn elsewhere(&self, m: &Meta) -> bool {
        m.dev != self.root_dev || matches!((m.mnt_id, self.root_mnt), (Some(a), Some(b)) if a != b)
    }

    /// One regular file: counted, bounded, handed on.
    fn file(&mut self, dir: &Arc<OwnedFd>, leaf: CString, full: Vec<u8>, meta: Meta) -> Result<(), String> {
        self.used.bytes = self.used.bytes.saturating_add(meta.size);
        if self.used.bytes > self.bounds.bytes {
            return Err(format!(
                "more than {} bytes of files (at {}, {} bytes): raise --attest-max-bytes or attest a smaller tree",
                self.bounds.bytes,
                name::shown(&full),
                meta.size
            ));
        }
        self.out.files += 1;
        self.out.bytes += meta.size;
        if meta.nlink > 1 {
            self.text(full.len(), &full)?;
            self.out
                .links
                .entry((meta.dev, meta.ino))
                .or_insert((meta.nlink, Vec::new()))
                .1
                .push(full.clone());
        }
        (self.sink)(File { dir: dir.clone(), leaf, name: full, meta })
    }

    /// List a directory and take every entry but its subdirectories, which are returned.
    fn list(&mut self, fd: Arc<OwnedFd>, path: Vec<u8>, depth: u32) -> Result<Frame, String> {
        let mut names: Vec<Vec<u8>> = Vec::new();
        let room = self.bounds.files.saturating_sub(self.used.entries).min(usize::MAX as u64 - 1) as usize;
        let more = dirfd::each_entry(&fd, room + 1, |n| names.push(n.to_vec()))
            .map_err(|e| format!("cannot list {}: {e}", name::shown(&path)))?;
        if more {
            return Err(format!(
                "more than {} entries (in {}): raise --attest-max-files or attest a smaller tree",
                self.bounds.files,
                name::shown(&path)
            ));
        }
        let mut subdirs = Vec::new();
        for leaf in names {
            let full = join(&path, &leaf);
            self.tick(&full)?;
            // getdents never gives a name with a NUL in it.
            let Ok(c) = CString::new(leaf) else { continue };
            let meta = match stat::statx_at(&fd, &c) {
                Ok(m) => m,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Err(changed(&full, "removed")),
                Err(e) => {
                    self.out.skipped.push((full.clone(), unreadable(&full, e)?));
                    continue;
                }
            };
            if self.elsewhere(&meta) {
                self.out.skipped.push((full, "another mount: not entered".into()));
                continue;
            }
            match meta.kind() {
                libc::S_IFDIR => {
                    if depth + 1 > self.bounds.depth {
                        return Err(format!(
                            "{} is deeper than {} levels: raise --attest-max-depth or attest a shallower tree",
                            name::shown(&full),
                            self.bounds.depth
                        ));
                    }
                    self.out.dirs.push(full);
                    subdirs.push((c, meta));
                }
                libc::S_IFREG => self.file(&fd, c, full, meta)?,
                libc::S_IFLNK => match dirfd::read_link_at(&fd, &c) {
                    Ok(t) => {
                        self.text(t.len(), &full)?;
                        self.out.symlinks.push((full, t))
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                        return Err(changed(&full, "removed"))
                    }
                    Err(e) => self.out.skipped.push((full.clone(), unreadable(&full, e)?)),
                },
                k => match special_kind(k) {
                    Some(kind) => self.out.special.push((full, kind, meta.rdev)),
                    None => self.out.skipped.push((full, format!("unknown file type {k:o}"))),
                },
            }
        }
        // Entered in name order from the end: the order does not matter, the statement sorts.
        Ok(Frame { fd, path, depth, subdirs })
    }
}

/// Walk the named path `root` (absolute), handing each regular file to `sink`.
pub fn walk(
    root: &[u8],
    bounds: &Bounds,
    used: &mut Used,
    sink: &mut dyn FnMut(File) -> Result<(), String>,
) -> Result<Entries, String> {
    let shown = name::shown(root);
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(root));
    no_link_above(path, &shown)?;
    let meta = stat::statx_path(path).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT) => {
            format!("{shown} does not exist: create it before the freeze or stop attesting it")
        }
        _ => format!("cannot look at {shown}: {e}"),
    })?;
    let mut w =
        Walk { bounds, used, root_dev: meta.dev, root_mnt: meta.mnt_id, out: Entries::default(), sink };
    match meta.kind() {
        libc::S_IFDIR => {}
        libc::S_IFLNK => return Err(format!("{shown} is a symlink: attest the path it leads to")),
        libc::S_IFREG => {
            w.tick(root)?;
            let parent = path.parent().unwrap_or(std::path::Path::new("/"));
            let leaf = path.file_name().map(|n| n.as_bytes().to_vec()).unwrap_or_default();
            let dir = dirfd::open_dir(parent)
                .map_err(|e| format!("cannot open {}: {e}", name::shown(parent.as_os_str().as_bytes())))?;
            let leaf = CString::new(leaf).map_err(|_| format!("{shown}: a name with NUL"))?;
            w.file(&Arc::new(dir), leaf, root.to_vec(), meta)?;
            return Ok(w.out);
        }
        k => {
            w.tick(root)?;
            match special_kind(k) {
                Some(kind) => w.out.special.push((root.to_vec(), kind, meta.rdev)),
                None => w.out.skipped.push((root.to_vec(), format!("unknown file type {k:o}"))),
            }
            return Ok(w.out);
        }
    }
    let fd = dirfd::open_dir(path).map_err(|e| format!("cannot open {shown}: {e}"))?;
    let opened = stat::statx_fd(&fd).map_err(|e| format!("cannot look at {shown}: {e}"))?;
    if (opened.dev, opened.ino) != (meta.dev, meta.ino) {
        return Err(changed(root, "replaced"));
    }
    let first = w.list(Arc::new(fd), root.to_vec(), 0)?;
    let mut stack = vec![first];
    while let Some(top) = stack.last_mut() {
        let Some((leaf, seen)) = top.subdirs.pop() else {
            stack.pop();
            continue;
        };
        let full = join(&top.path, leaf.as_bytes());
        let depth = top.depth + 1;
        let fd = match dirfd::open_subdir_at(&top.fd, &leaf) {
            Ok(fd) => fd,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ELOOP | libc::ENOTDIR)) => {
                return Err(changed(&full, "removed or replaced"))
            }
            Err(e) => {
                w.out.skipped.push((full.clone(), unreadable(&full, e)?));
                continue;
            }
        };
        let now = stat::statx_fd(&fd).map_err(|e| format!("cannot look at {}: {e}", name::shown(&full)))?;
        if (now.dev, now.ino) != (seen.dev, seen.ino) {
            return Err(changed(&full, "replaced"));
        }
        let frame = w.list(Arc::new(fd), full, depth)?;
        stack.push(frame);
    }
    Ok(w.out)
}

/// Only a denial is an entry to skip as unreadable: any other error (no descriptor, no memory, an
/// I/O error) says nothing about the entry, and a statement without it would be partial.
fn unreadable(full: &[u8], e: std::io::Error) -> Result<String, String> {
    match e.raw_os_error() {
        Some(libc::EACCES | libc::EPERM) => Ok(format!("unreadable: {e}")),
        _ => Err(format!("cannot read {}: {e}: nothing is attested on a partial walk", name::shown(full))),
    }
}

/// A named path is attested where it is, not where a link in it leads: a directory above it that
/// the sandbox owned may hold a link to anywhere (`/etc`). Every component above the last is
/// looked at without following it. (The last one is refused as a link by the walk itself.)
fn no_link_above(path: &std::path::Path, shown: &str) -> Result<(), String> {
    let mut above = path.parent();
    while let Some(dir) = above {
        match std::fs::symlink_metadata(dir) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(format!(
                    "{shown}: {} is a symlink: name the path without links in it",
                    name::shown(dir.as_os_str().as_bytes())
                ))
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot look at {}: {e}", name::shown(dir.as_os_str().as_bytes()))),
        }
        above = dir.parent();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_denial_is_skipped_any_other_error_fails_the_walk() {
        let e = |n| std::io::Error::from_raw_os_error(n);
        assert!(unreadable(b"/w/a", e(libc::EACCES)).is_ok());
        assert!(unreadable(b"/w/a", e(libc::EPERM)).is_ok());
        for n in [libc::EMFILE, libc::ENFILE, libc::ENOMEM, libc::EIO, libc::EINTR] {
            let r = unreadable(b"/w/a", e(n));
            assert!(r.as_ref().is_err_and(|m| m.contains("partial walk")), "{n}: {r:?}");
        }
    }

    #[test]
    fn a_link_above_the_named_path_is_refused() {
        let d = std::env::temp_dir().join(format!("quiesce-linkabove-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("real/sub")).unwrap();
        std::os::unix::fs::symlink(d.join("real"), d.join("link")).unwrap();
        assert!(no_link_above(&d.join("real/sub"), "x").is_ok());
        let r = no_link_above(&d.join("link/sub"), "x");
        assert!(r.as_ref().is_err_and(|m| m.contains("is a symlink")), "{r:?}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}

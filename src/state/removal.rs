//! Removing a directory tree root finds in its state dir, through descriptors only: each
//! directory is opened relative to its parent without following a link, and each entry is
//! removed relative to the directory that holds it. No path is resolved again, so a rename or a
//! link put in place meanwhile cannot lead the removal into another directory. Bounded in
//! entries and depth: a larger tree is refused, not walked.

use crate::kernel::{dirfd, dirwrite};
use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::path::Path;

/// Entries removed at most, over the whole tree.
pub const MAX_ENTRIES: usize = 65_536;
/// Directories nested at most below the one removed.
pub const MAX_DEPTH: usize = 16;

/// Remove `name` in `dir`: a file, a link (never followed) or a directory with all it holds.
/// Missing is fine. `shown` names it in errors.
pub fn remove_at(dir: &OwnedFd, name: &OsStr, shown: &Path) -> Result<(), String> {
    remove_within(dir, name, shown, MAX_ENTRIES)
}

fn remove_within(dir: &OwnedFd, name: &OsStr, shown: &Path, entries: usize) -> Result<(), String> {
    let mut left = entries;
    remove(dir, name, shown, 0, &mut left)
}

fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

fn remove(dir: &OwnedFd, name: &OsStr, shown: &Path, depth: usize, left: &mut usize) -> Result<(), String> {
    let cannot = |e: std::io::Error| format!("cannot remove {}: {e}", shown.display());
    match dirwrite::unlink_os_at(dir, name) {
        Ok(()) => return Ok(()),
        Err(e) if errno(&e) == libc::ENOENT => return Ok(()),
        Err(e) if errno(&e) == libc::EISDIR => {}
        Err(e) => return Err(cannot(e)),
    }
    if depth >= MAX_DEPTH {
        return Err(format!(
            "{} is nested deeper than {MAX_DEPTH} directories, which quiesce never writes: remove it by hand",
            shown.display()
        ));
    }
    let sub = match dirfd::open_dir_at(dir, name) {
        Ok(fd) => fd,
        Err(e) if errno(&e) == libc::ENOENT => return Ok(()),
        // No longer a directory: removed as what it is now, once.
        Err(e) if matches!(errno(&e), libc::ENOTDIR | libc::ELOOP) => {
            return dirwrite::unlink_os_at(dir, name).map_err(cannot)
        }
        Err(e) => return Err(cannot(e)),
    };
    let (names, more) = dirfd::list_dir(&sub, *left).map_err(cannot)?;
    if more {
        return Err(format!(
            "{} is part of a tree of more entries than the {} quiesce removes: it never writes so \
             many; remove it by hand",
            shown.display(),
            MAX_ENTRIES
        ));
    }
    *left -= names.len();
    for n in &names {
        remove(&sub, n, &shown.join(n), depth + 1, left)?;
    }
    dirwrite::rmdir_at(dir, name).map_err(cannot)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn tmpdir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("quiesce-removal-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn open(d: &Path) -> OwnedFd {
        dirfd::open_dir(d).unwrap()
    }

    #[test]
    fn a_tree_goes_and_links_in_it_are_not_followed() {
        let d = tmpdir("tree");
        let outside = tmpdir("outside");
        fs::write(outside.join("keep"), "x").unwrap();
        fs::create_dir_all(d.join("t/a/b")).unwrap();
        fs::write(d.join("t/a/b/f"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, d.join("t/link")).unwrap();
        std::os::unix::fs::symlink(&outside, d.join("top-link")).unwrap();
        let fd = open(&d);
        remove_at(&fd, OsStr::new("t"), &d.join("t")).unwrap();
        remove_at(&fd, OsStr::new("top-link"), &d.join("top-link")).unwrap();
        remove_at(&fd, OsStr::new("missing"), &d.join("missing")).unwrap();
        assert_eq!(fs::read_dir(&d).unwrap().count(), 0);
        assert!(outside.join("keep").exists(), "a link was followed");
        fs::remove_dir_all(d).unwrap();
        fs::remove_dir_all(outside).unwrap();
    }

    #[test]
    fn too_deep_a_tree_is_refused() {
        let d = tmpdir("deep");
        let deep: std::path::PathBuf = (0..=MAX_DEPTH).map(|i| i.to_string()).collect();
        fs::create_dir_all(d.join("t").join(&deep)).unwrap();
        let e = remove_at(&open(&d), OsStr::new("t"), &d.join("t")).unwrap_err();
        assert!(e.contains("nested deeper") && e.contains("by hand"), "{e}");
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn too_large_a_tree_is_refused_and_listing_stops_at_its_limit() {
        let d = tmpdir("wide");
        fs::create_dir_all(d.join("t/a")).unwrap();
        for i in 0..5 {
            fs::write(d.join(format!("t/a/{i}")), "x").unwrap();
        }
        let sub = dirfd::open_dir_at(&open(&d.join("t")), OsStr::new("a")).unwrap();
        assert_eq!(dirfd::list_dir(&sub, 3).map(|(n, more)| (n.len(), more)).unwrap(), (3, true));
        let sub = dirfd::open_dir_at(&open(&d.join("t")), OsStr::new("a")).unwrap();
        assert_eq!(dirfd::list_dir(&sub, 5).map(|(n, more)| (n.len(), more)).unwrap(), (5, false));
        let e = remove_within(&open(&d), OsStr::new("t"), &d.join("t"), 4).unwrap_err();
        assert!(e.contains("more entries") && e.contains("by hand"), "{e}");
        remove_within(&open(&d), OsStr::new("t"), &d.join("t"), 6).unwrap();
        assert!(!d.join("t").exists());
        fs::remove_dir_all(d).unwrap();
    }
}

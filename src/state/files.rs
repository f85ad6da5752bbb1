//! Reading the files quiesce trusts (state-dir files, keys, markers). Each is opened once, never
//! through a link at its last component, and every check of type, owner and mode is made with
//! fstat on the descriptor that is then read: nothing can be swapped between check and read.
//!
//! Keys are the exception for links: a Kubernetes Secret volume reaches every key through two
//! (`key -> ..data/key`, `..data -> ..2026_11_30_x`). There the path is resolved, every directory
//! on the resolved path is checked to be replaceable by root only, and the last component is
//! opened relative to its checked parent without following a link.

use crate::kernel::{dirfd, stat};
use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

/// What a file must satisfy besides being a regular file.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    pub root_owned: bool,
    /// Mode bits that must be clear.
    pub deny: u32,
    /// A larger file is refused (and never read whole).
    pub max: u64,
}

/// State-dir files: written by the init (root) alone.
pub const STATE: Rule = Rule { root_owned: true, deny: 0o022, max: 16 << 20 };
/// A file named on the command line whose content is checked otherwise (a signed marker).
pub const ANY: Rule = Rule { root_owned: false, deny: 0, max: 16 << 20 };
pub const PRIVATE_KEY: Rule = Rule { root_owned: true, deny: 0o077, max: 64 << 10 };
/// The attestation's envelope: written by the init's worker, as large as a million names make it.
pub const ATTESTATION: Rule = Rule { root_owned: true, deny: 0o022, max: 1 << 30 };
pub const PUBLIC_KEY: Rule = Rule { root_owned: true, deny: 0o022, max: 64 << 10 };

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileError {
    /// Not there.
    Missing(String),
    /// There, but refused: a link, not a regular file, the wrong owner or mode, too large.
    Unsafe(String),
    /// There, but reading failed.
    Unreadable(String),
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            FileError::Missing(m) | FileError::Unsafe(m) | FileError::Unreadable(m) => f.write_str(m),
        }
    }
}

impl From<FileError> for String {
    fn from(e: FileError) -> String {
        e.to_string()
    }
}

const READ_FLAGS: i32 = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;

/// Open `name` relative to `dir` (None: as a path) for reading, without following a link at its
/// last component; `shown` names it in errors.
fn open_file(dir: Option<&OwnedFd>, name: &Path, shown: &Path) -> Result<OwnedFd, FileError> {
    dirfd::openat(dir.map(|d| d.as_raw_fd()), name, READ_FLAGS).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT) => FileError::Missing(format!("{}: {e}", shown.display())),
        Some(libc::ELOOP) => FileError::Unsafe(format!(
            "{} is a symlink: links are refused here; replace it with the file itself",
            shown.display()
        )),
        _ => FileError::Unreadable(format!("{}: {e}", shown.display())),
    })
}

/// Check the open descriptor against `rule`, then read at most `rule.max` bytes from it.
fn check_and_read(fd: OwnedFd, rule: Rule, shown: &Path) -> Result<Vec<u8>, FileError> {
    let st = stat::fstat(&fd).map_err(|e| FileError::Unreadable(format!("{}: {e}", shown.display())))?;
    check_stat(&st, rule, shown)?;
    let mut buf = Vec::with_capacity((st.st_size.max(0) as u64).min(rule.max) as usize);
    File::from(fd)
        .take(rule.max + 1)
        .read_to_end(&mut buf)
        .map_err(|e| FileError::Unreadable(format!("{}: {e}", shown.display())))?;
    if buf.len() as u64 > rule.max {
        return Err(FileError::Unsafe(format!(
            "{} is larger than {} bytes: it is not a file quiesce wrote; remove it",
            shown.display(),
            rule.max
        )));
    }
    Ok(buf)
}

fn check_stat(st: &libc::stat, rule: Rule, shown: &Path) -> Result<(), FileError> {
    let mode = st.st_mode & 0o7777;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(FileError::Unsafe(format!(
            "{} is not a regular file: replace it with the file itself",
            shown.display()
        )));
    }
    if rule.root_owned && st.st_uid != 0 {
        return Err(FileError::Unsafe(format!(
            "{} is owned by uid {}, not root: chown root it",
            shown.display(),
            st.st_uid
        )));
    }
    if mode & rule.deny != 0 {
        let (who, fix) = if rule.deny & 0o044 != 0 {
            ("accessible by group or others", "chmod 600 it".to_string())
        } else {
            ("writable by group or others", "chmod go-w it".to_string())
        };
        return Err(FileError::Unsafe(format!("{} is {who} (mode {mode:o}): {fix}", shown.display())));
    }
    Ok(())
}

/// Read `name` in the directory `dir` (whose path is `dir_path`, for messages).
pub fn read_in(dir: &OwnedFd, dir_path: &Path, name: &str, rule: Rule) -> Result<Vec<u8>, FileError> {
    let shown = dir_path.join(name);
    let fd = open_file(Some(dir), Path::new(name), &shown)?;
    check_and_read(fd, rule, &shown)
}

/// Read a file by path, refusing a link at its last component.
pub fn read_path(path: &Path, rule: Rule) -> Result<Vec<u8>, FileError> {
    let fd = open_file(None, path, path)?;
    check_and_read(fd, rule, path)
}

/// Open a directory by path without following a link at its last component, for checks by
/// fstat and for reads relative to it. The descriptor is O_PATH: opening has no side effect.
pub fn open_dir(path: &Path) -> io::Result<(OwnedFd, libc::stat)> {
    let fd = dirfd::openat(None, path, libc::O_PATH | libc::O_NOFOLLOW)?;
    let st = stat::fstat(&fd)?;
    Ok((fd, st))
}

/// Open a subdirectory of an open directory, the same way.
pub fn open_subdir(dir: &OwnedFd, name: &Path) -> io::Result<(OwnedFd, libc::stat)> {
    let fd = dirfd::openat(Some(dir.as_raw_fd()), name, libc::O_PATH | libc::O_NOFOLLOW)?;
    let st = stat::fstat(&fd)?;
    Ok((fd, st))
}

/// Read a key file (`what`: "signing key", "public key"), which may be reached through links.
pub fn read_key(path: &Path, what: &str, rule: Rule) -> Result<Vec<u8>, String> {
    let resolved = std::fs::canonicalize(path).map_err(|e| format!("{what} {}: {e}", path.display()))?;
    read_resolved(&resolved, path, what, rule)
}

/// Walk `resolved` (absolute, without links) from `/`, each directory opened relative to its
/// checked parent without following links, and read its last component. A directory passes
/// when it is owned by root and no one else can write in it; a root-owned sticky directory
/// (`/tmp`, a Kubernetes Secret volume's root) passes when the entry taken through it is owned
/// by root, since only root can then rename or remove that entry.
fn read_resolved(resolved: &Path, given: &Path, what: &str, rule: Rule) -> Result<Vec<u8>, String> {
    let unsafe_key = |m: String| format!("{what} {}: {m}", given.display());
    let (mut dir, mut st) = open_dir(Path::new("/")).map_err(|e| unsafe_key(format!("/: {e}")))?;
    let mut dir_path = PathBuf::from("/");
    let names: Vec<&std::ffi::OsStr> = resolved
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    let Some((last, parents)) = names.split_last() else {
        return Err(unsafe_key("names a directory, not a key file".into()));
    };
    for name in parents {
        let (next, next_st) = open_subdir(&dir, Path::new(name))
            .map_err(|e| unsafe_key(format!("{}: {e}", dir_path.join(name).display())))?;
        check_dir_on_path(&st, &dir_path, &next_st, &dir_path.join(name)).map_err(unsafe_key)?;
        if next_st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            let shown = dir_path.join(name);
            return Err(unsafe_key(format!(
                "{} changed into a non-directory while it was opened: retry",
                shown.display()
            )));
        }
        dir = next;
        st = next_st;
        dir_path.push(name);
    }
    let shown = dir_path.join(last);
    let fd = open_file(Some(&dir), Path::new(last), &shown).map_err(|e| unsafe_key(e.to_string()))?;
    let file_st = stat::fstat(&fd).map_err(|e| unsafe_key(format!("{}: {e}", shown.display())))?;
    check_dir_on_path(&st, &dir_path, &file_st, &shown).map_err(unsafe_key)?;
    check_and_read(fd, rule, &shown).map_err(|e| unsafe_key(e.to_string()))
}

/// May anyone but root replace `child` (at `child_path`), an entry of the directory `dir` (at
/// `dir_path`)?
fn check_dir_on_path(
    dir: &libc::stat,
    dir_path: &Path,
    child: &libc::stat,
    child_path: &Path,
) -> Result<(), String> {
    let mode = dir.st_mode & 0o7777;
    if dir.st_uid != 0 {
        return Err(format!(
            "directory {} on its path is owned by uid {}: chown root it, or keep the key in a \
             directory only root can write",
            dir_path.display(),
            dir.st_uid
        ));
    }
    if mode & 0o022 == 0 {
        return Ok(());
    }
    if mode & libc::S_ISVTX == 0 {
        return Err(format!(
            "directory {} on its path is writable by group or others (mode {mode:o}): chmod go-w it, \
             or keep the key in a directory only root can write",
            dir_path.display()
        ));
    }
    if child.st_uid != 0 {
        return Err(format!(
            "{} on its path is owned by uid {} in the sticky, world-writable directory {}: chown root it",
            child_path.display(),
            child.st_uid,
            dir_path.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{symlink, PermissionsExt};

    /// A root-owned 0755 scratch tree under the crate's target dir, outside /tmp's sticky rules.
    fn tree(tag: &str) -> PathBuf {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("target")
            .join(format!("files-test-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    fn mode(p: &Path, m: u32) {
        fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
    }

    /// The layout a Kubernetes Secret volume has: key -> ..data/key, ..data -> ..2026_11_30_x.
    fn secret_volume(root: &Path) -> PathBuf {
        let vol = root.join("secret");
        let real = vol.join("..2026_11_30_x");
        fs::create_dir_all(&real).unwrap();
        mode(&vol, 0o1777);
        mode(&real, 0o755);
        fs::write(real.join("key"), b"KEY").unwrap();
        mode(&real.join("key"), 0o600);
        symlink("..2026_11_30_x", vol.join("..data")).unwrap();
        symlink("..data/key", vol.join("key")).unwrap();
        vol.join("key")
    }

    #[test]
    fn a_key_through_secret_volume_links_loads() {
        let root = tree("secret");
        let key = secret_volume(&root);
        assert_eq!(read_key(&key, "signing key", PRIVATE_KEY).unwrap(), b"KEY");
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn a_key_behind_a_directory_others_can_write_is_refused() {
        let root = tree("weakdir");
        let key = secret_volume(&root);
        let real = root.join("secret/..2026_11_30_x");
        for (m, want) in [(0o775, "writable by group or others"), (0o757, "writable by group or others")] {
            mode(&real, m);
            let e = read_key(&key, "signing key", PRIVATE_KEY).unwrap_err();
            assert!(e.contains(&real.display().to_string()) && e.contains(want), "{e}");
            assert!(e.contains("chmod go-w"), "{e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
        mode(&real, 0o755);
        // Owned by another uid: that uid could replace the key.
        fs::create_dir(real.join("sub")).unwrap();
        fs::rename(real.join("key"), real.join("sub/key")).unwrap();
        fs::remove_file(root.join("secret/key")).unwrap();
        symlink("..data/sub/key", root.join("secret/key")).unwrap();
        assert!(read_key(&key, "signing key", PRIVATE_KEY).is_ok());
        std::os::unix::fs::chown(real.join("sub"), Some(4242), None).unwrap();
        let e = read_key(&key, "signing key", PRIVATE_KEY).unwrap_err();
        assert!(e.contains("sub on its path is owned by uid 4242") && e.contains("chown root"), "{e}");
        std::os::unix::fs::chown(real.join("sub"), Some(0), None).unwrap();
        // The volume's root is sticky and world-writable, as Kubernetes makes it: it guards
        // root's entries only, and without the sticky bit it guards nothing.
        let vol = root.join("secret");
        mode(&vol, 0o777);
        let e = read_key(&key, "signing key", PRIVATE_KEY).unwrap_err();
        assert!(e.contains(&format!("directory {} on its path", vol.display())), "{e}");
        mode(&vol, 0o1777);
        std::os::unix::fs::chown(&real, Some(4242), None).unwrap();
        let e = read_key(&key, "signing key", PRIVATE_KEY).unwrap_err();
        assert!(e.contains(&format!("{} on its path is owned by uid 4242", real.display())), "{e}");
        std::os::unix::fs::chown(&real, Some(0), None).unwrap();
        assert!(read_key(&key, "signing key", PRIVATE_KEY).is_ok());
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn a_key_swapped_for_a_link_after_resolution_is_refused() {
        let root = tree("swap");
        let key = secret_volume(&root);
        let resolved = fs::canonicalize(&key).unwrap();
        // The swap: the resolved last component becomes a link to a file the attacker chose.
        fs::write(root.join("other"), b"OTHER").unwrap();
        mode(&root.join("other"), 0o600);
        fs::remove_file(&resolved).unwrap();
        symlink(root.join("other"), &resolved).unwrap();
        let e = read_resolved(&resolved, &key, "signing key", PRIVATE_KEY).unwrap_err();
        assert!(e.contains("is a symlink"), "{e}");
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn key_modes_and_owner_are_checked_on_the_descriptor() {
        let root = tree("keymode");
        let key = root.join("k");
        fs::write(&key, b"K").unwrap();
        mode(&key, 0o640);
        let e = read_key(&key, "signing key", PRIVATE_KEY).unwrap_err();
        assert!(e.contains("chmod 600"), "{e}");
        mode(&key, 0o644);
        assert!(read_key(&key, "public key", PUBLIC_KEY).is_ok());
        mode(&key, 0o666);
        assert!(read_key(&key, "public key", PUBLIC_KEY).unwrap_err().contains("chmod go-w"));
        mode(&key, 0o600);
        std::os::unix::fs::chown(&key, Some(4242), None).unwrap();
        assert!(read_key(&key, "signing key", PRIVATE_KEY).unwrap_err().contains("owned by uid 4242"));
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn state_files_links_fifos_and_oversize_are_refused() {
        let root = tree("state");
        let (dir, _) = open_dir(&root).unwrap();
        fs::write(root.join("ok"), b"x").unwrap();
        assert_eq!(read_in(&dir, &root, "ok", STATE).unwrap(), b"x");
        symlink(root.join("ok"), root.join("link")).unwrap();
        assert!(
            matches!(read_in(&dir, &root, "link", STATE), Err(FileError::Unsafe(m)) if m.contains("symlink"))
        );
        assert!(matches!(read_in(&dir, &root, "none", STATE), Err(FileError::Missing(_))));
        // A FIFO would block a reader forever; it is opened non-blocking and refused by type.
        let fifo = std::ffi::CString::new(root.join("fifo").to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        assert!(
            matches!(read_in(&dir, &root, "fifo", STATE), Err(FileError::Unsafe(m)) if m.contains("regular"))
        );
        std::os::unix::fs::chown(root.join("ok"), Some(4242), None).unwrap();
        assert!(
            matches!(read_in(&dir, &root, "ok", STATE), Err(FileError::Unsafe(m)) if m.contains("uid 4242"))
        );
        let small = Rule { max: 4, ..ANY };
        fs::write(root.join("big"), b"12345").unwrap();
        assert!(
            matches!(read_path(&root.join("big"), small), Err(FileError::Unsafe(m)) if m.contains("larger"))
        );
        fs::remove_dir_all(root).unwrap();
    }
}

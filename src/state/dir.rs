//! The state directory: status, marker, public key, freeze requests and their results.
//! Every write is atomic and cannot follow a planted link; every read is checked on its descriptor.

use crate::record::freeze::{Phases, Survivor};
use crate::state::files::{self, FileError};
use serde::{Deserialize, Serialize};
use std::fs;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub const DEFAULT_DIR: &str = "/run/quiesce";
pub const MARKER: &str = "quiescence.jws";
pub const STATUS: &str = "status.json";
pub const PUBKEY: &str = "signing.pub";
/// The DSSE envelope of the attestation (one JSON line), next to the marker.
pub const ATTESTATION: &str = "quiescence.intoto.jsonl";

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Status {
    pub id: String,
    /// The `quiesce freeze` request this freeze answers, if any.
    pub request_id: Option<String>,
    pub nonce: Option<String>,
    pub state: FreezeState,
    pub reason: Option<String>,
    pub survivors: Vec<Survivor>,
    pub killed: usize,
    /// Sandbox processes the stop could not bring to a stop before the kill (e.g. in D state).
    #[serde(default)]
    pub unstopped: usize,
    pub phases_ms: Phases,
    /// Identities in the init's history table after the freeze (it should stay as small as the
    /// namespace; the soak watches it).
    #[serde(default)]
    pub history: usize,
    /// Dead sandbox processes (zombies) whose parent is not the init, after the freeze: a PID 1
    /// that never reaps holds their pids for good. They run nothing and pass the proof.
    #[serde(default)]
    pub unreaped_zombies: usize,
    /// When the freeze's stop began, in milliseconds of the wall clock since the epoch (0: not
    /// begun): how long after its request a freeze started is read from outside against it.
    #[serde(default)]
    pub started_unix_ms: u64,
    /// The attestation of the frozen trees, when paths are named: it never changes `state`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attestation: Option<Attestation>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Attestation {
    pub state: AttestationState,
    pub reason: Option<String>,
}

/// What a status says of its freeze, spelt in status.json and the results as the variant's name
/// in kebab case ("freezing", "quiescent", "failed", "launch-recorded"): clients and harnesses
/// match those words.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum FreezeState {
    /// Begun: the old marker is gone and no new one is signed yet.
    #[default]
    Freezing,
    Quiescent,
    Failed,
    /// Not a freeze: the answer to a launch record of `quiesce exec`, once the init holds it.
    LaunchRecorded,
}

/// What a status says of its freeze's attestation: "running", "attested" or "failed".
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum AttestationState {
    #[default]
    Running,
    Attested,
    Failed,
}

impl FreezeState {
    /// The word status.json holds.
    pub fn as_str(self) -> &'static str {
        match self {
            FreezeState::Freezing => "freezing",
            FreezeState::Quiescent => "quiescent",
            FreezeState::Failed => "failed",
            FreezeState::LaunchRecorded => "launch-recorded",
        }
    }
}

impl AttestationState {
    /// The word status.json holds.
    pub fn as_str(self) -> &'static str {
        match self {
            AttestationState::Running => "running",
            AttestationState::Attested => "attested",
            AttestationState::Failed => "failed",
        }
    }
}

impl std::fmt::Display for FreezeState {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for AttestationState {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

pub struct StateDir {
    pub path: PathBuf,
    /// The directory as opened and checked: every read goes through it.
    fd: OwnedFd,
}

impl std::fmt::Debug for StateDir {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.debug_struct("StateDir").field("path", &self.path).finish()
    }
}

/// Refuse a directory that someone other than root could have planted or can write into.
/// `st` comes from fstat on the descriptor the caller keeps.
fn check_dir(st: &libc::stat, path: &Path) -> Result<(), String> {
    match st.st_mode & libc::S_IFMT {
        libc::S_IFDIR => {}
        libc::S_IFLNK => {
            return Err(format!(
                "state dir {} is a symlink: remove it or pick another --state-dir",
                path.display()
            ))
        }
        _ => {
            return Err(format!(
                "state dir {} is not a directory: remove it or pick another --state-dir",
                path.display()
            ))
        }
    }
    if st.st_uid != 0 {
        return Err(format!(
            "state dir {} is owned by uid {}, not root: chown root it",
            path.display(),
            st.st_uid
        ));
    }
    if st.st_mode & 0o022 != 0 {
        return Err(format!(
            "state dir {} is writable by group or others (mode {:o}): chmod 755 it",
            path.display(),
            st.st_mode & 0o7777
        ));
    }
    Ok(())
}

/// Why a state dir could not be made, and what to do about it.
fn create_error(path: &Path, e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EROFS) => format!(
            "cannot create state dir {}: read-only file system: mount a tmpfs there \
             (docker run --tmpfs {}) or pick a writable --state-dir",
            path.display(),
            path.parent().filter(|p| *p != Path::new("/")).unwrap_or(path).display()
        ),
        _ => format!("cannot create state dir {}: {e}: pick another --state-dir", path.display()),
    }
}

/// Can anyone but root rename the state dir away and put something else under its name? The
/// dir itself is checked strictly; its parent may legitimately be a 0777 volume (a Kubernetes
/// emptyDir), so that is said, not refused. None when the parent cannot be looked at.
pub fn parent_warning(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty())?;
    let md = fs::metadata(parent).ok()?;
    let mode = md.mode() & 0o7777;
    let open = md.uid() != 0 || (mode & 0o022 != 0 && mode & libc::S_ISVTX == 0);
    open.then(|| {
        format!(
            "{} (mode {mode:o}, owner uid {}) lets users other than root rename the state dir {} \
             away: make it root's and 0755 (Kubernetes: an initContainer, see \
             examples/kubernetes) or sticky",
            parent.display(),
            md.uid(),
            path.display()
        )
    })
}

impl StateDir {
    /// Open an existing, safe state directory (subcommands).
    pub fn open(path: &Path) -> Result<StateDir, String> {
        let (fd, st) = files::open_dir(path).map_err(|e| {
            format!("state dir {}: {e}: create it or pick another --state-dir", path.display())
        })?;
        check_dir(&st, path)?;
        Ok(StateDir { path: path.to_path_buf(), fd })
    }

    /// Create (mode 0755) if missing, then check (the init).
    pub fn create(path: &Path) -> Result<StateDir, String> {
        if fs::symlink_metadata(path).is_err() {
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent).map_err(|e| create_error(path, &e))?;
            }
            // Made with its mode, through the parent's descriptor, never chmodded by path: in a
            // parent anyone may write in, the new directory can be swapped for a link between a
            // mkdir and a chmod, which would follow it. What is at the path is checked at open.
            let (parent, name) = match (path.parent(), path.file_name()) {
                (Some(p), Some(n)) => (if p.as_os_str().is_empty() { Path::new(".") } else { p }, n),
                _ => return Err(format!("state dir {}: not a directory path", path.display())),
            };
            let dir = crate::kernel::dirfd::open_dir(parent).map_err(|e| create_error(path, &e))?;
            // The name made is the name opened next: one that is not UTF-8 is refused, not
            // made under a lossy spelling of itself.
            let utf8 = name
                .to_str()
                .ok_or_else(|| format!("state dir {}: not UTF-8: pick another", path.display()))?;
            match crate::kernel::dirwrite::mkdir_only_at(&dir, utf8, 0o755) {
                Ok(()) => return StateDir::made(&dir, name, path),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(create_error(path, &e)),
            }
        }
        StateDir::open(path)
    }

    /// The directory `name` just made in `parent`, given its mode 0755 (the umask may have taken
    /// bits away) and checked. It is opened through the parent without following a link, and for
    /// reading: `fchmod` on the O_PATH descriptor `open` takes is EBADF in the kernel, which one C
    /// library hides by going through /proc and another does not. The descriptor chmodded is the
    /// one checked and kept, so nothing put at the path meanwhile is taken for it.
    fn made(parent: &OwnedFd, name: &std::ffi::OsStr, path: &Path) -> Result<StateDir, String> {
        let chmod_error = |e: io::Error| format!("cannot chmod {}: {e}", path.display());
        let fd = crate::kernel::dirfd::open_dir_at(parent, name).map_err(chmod_error)?;
        // What was opened must be what mkdirat made as far as it shows: root's, no bits beyond
        // 0755. In a parent others may write in, the entry can be swapped for another directory
        // between the two; chmodding that one would open it to others or take its sticky bit.
        // Not "empty": a second start of the init's (a sidecar started twice at once) may
        // already be writing in the directory this one made.
        let st = crate::kernel::stat::fstat(&fd).map_err(|e| format!("state dir {}: {e}", path.display()))?;
        let fresh =
            st.st_mode & libc::S_IFMT == libc::S_IFDIR && st.st_uid == 0 && st.st_mode & 0o7777 & !0o755 == 0;
        if !fresh {
            return Err(format!(
                "state dir {} was replaced while it was made: make it beforehand, root's and 0755, \
                 in a directory only root may write in",
                path.display()
            ));
        }
        crate::kernel::dirwrite::fchmod(&fd, 0o755).map_err(chmod_error)?;
        let st = crate::kernel::stat::fstat(&fd).map_err(|e| format!("state dir {}: {e}", path.display()))?;
        check_dir(&st, path)?;
        Ok(StateDir { path: path.to_path_buf(), fd })
    }

    /// An existing subdirectory, opened through this one and checked like it.
    pub fn sub(&self, name: &str) -> Result<StateDir, String> {
        let path = self.path.join(name);
        let (fd, st) = files::open_subdir(&self.fd, Path::new(name))
            .map_err(|e| format!("{}: {e}: is the init running with this --state-dir?", path.display()))?;
        check_dir(&st, &path)?;
        Ok(StateDir { path, fd })
    }

    /// The subdirectory `name`, made root's alone (0700) when missing: what passes through it
    /// (freeze requests, launch records, their answers) is no sandbox process's to see.
    pub fn ensure_sub(&self, name: &str) -> Result<StateDir, String> {
        match crate::kernel::dirwrite::mkdir_at(&self.fd, name, 0o700) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot create {}: {e}", self.path.join(name).display())),
        }
        self.sub(name)
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Read a file of this directory: opened once, no link followed, owner and mode checked on
    /// the descriptor that is read.
    pub fn read(&self, name: &str) -> Result<Vec<u8>, FileError> {
        files::read_in(&self.fd, &self.path, name, files::STATE)
    }

    /// Read a file of this directory under another rule than the state files' (a larger bound).
    pub fn read_with(&self, name: &str, rule: files::Rule) -> Result<Vec<u8>, FileError> {
        files::read_in(&self.fd, &self.path, name, rule)
    }

    /// Like `write_atomic`, through the descriptor opened at start rather than the path: the
    /// directory above may be one the sandbox user can write in (a Kubernetes emptyDir is 0777),
    /// and a path can be made to lead elsewhere after the check; the descriptor cannot.
    pub fn write_atomic(&self, name: &str, data: &[u8], mode: u32) -> io::Result<()> {
        self.write_file(name, data, mode, true)?;
        crate::kernel::dirwrite::sync_dir(&self.fd)
    }

    /// Like `write_atomic`, but durable only once `make_durable` has synced the file returned:
    /// for the files the init writes at start, whose fsyncs (milliseconds on a disk) need not
    /// delay the command. Readers see the file whole either way (the rename is atomic); what
    /// waits is only its survival of a crash of the machine, which the init does not survive.
    pub fn write_atomic_deferred(&self, name: &str, data: &[u8], mode: u32) -> io::Result<fs::File> {
        self.write_file(name, data, mode, false)
    }

    /// Sync files written by `write_atomic_deferred`, then this directory's entries.
    pub fn make_durable(&self, files: Vec<fs::File>) -> io::Result<()> {
        for f in files {
            f.sync_all()?;
        }
        crate::kernel::dirwrite::sync_dir(&self.fd)
    }

    fn write_file(&self, name: &str, data: &[u8], mode: u32, sync: bool) -> io::Result<fs::File> {
        let mut rnd = [0u8; 8];
        crate::kernel::random::getrandom(&mut rnd)?;
        let tmp = format!(".{name}.{}", hex(&rnd));
        let mut f = crate::kernel::dirwrite::create_excl_at(&self.fd, &tmp, mode)?;
        let res = (|| {
            f.write_all(data)?;
            f.set_permissions(fs::Permissions::from_mode(mode))?;
            if sync {
                f.sync_all()?;
            }
            crate::kernel::dirwrite::rename_at(&self.fd, &tmp, name)
        })();
        if res.is_err() {
            let _ = crate::kernel::dirwrite::unlink_at(&self.fd, &tmp);
        }
        res.map(|()| f)
    }

    /// Take `from` away under the name `to` (both in this directory).
    pub fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        crate::kernel::dirwrite::rename_at(&self.fd, from, to)
    }

    /// Remove `name` here and all it holds, through descriptors (see `removal`).
    pub fn remove_tree(&self, name: &str) -> Result<(), String> {
        crate::state::removal::remove_at(&self.fd, std::ffi::OsStr::new(name), &self.file(name))
    }

    /// The names in this directory, listed through its descriptor, never its path: at most
    /// `limit`, and whether more were left.
    pub fn list(&self, limit: usize) -> io::Result<(Vec<std::ffi::OsString>, bool)> {
        let fd = crate::kernel::dirfd::open_dir_at(&self.fd, std::ffi::OsStr::new("."))?;
        crate::kernel::dirfd::list_dir(&fd, limit)
    }

    /// What `name` here is (type, mode, times), not following a link.
    pub fn stat(&self, name: &str) -> io::Result<libc::stat> {
        let c = std::ffi::CString::new(name).map_err(|_| io::Error::other("file name with NUL"))?;
        crate::kernel::stat::fstatat(&self.fd, &c)
    }

    pub fn remove(&self, name: &str) -> io::Result<()> {
        match crate::kernel::dirwrite::unlink_at(&self.fd, name) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// A root-only file of this directory (0600), opened for reading and writing, created when
    /// missing, emptied when `truncate`; no link followed, never passed to a command it execs.
    pub fn open_private(&self, name: &str, truncate: bool) -> io::Result<fs::File> {
        crate::kernel::dirwrite::open_private_at(&self.fd, name, 0o600, truncate)
    }

    /// Can the init write here? Refused: a read-only mount, or a directory where a file cannot be
    /// made and removed (a full or immutable one, a policy that denies it). Said with the fix.
    pub fn check_writable(&self) -> Result<(), String> {
        let shown = self.path.display();
        match crate::kernel::stat::read_only(&self.fd) {
            Ok(false) => {}
            Ok(true) => {
                return Err(format!(
                    "state dir {shown} is on a read-only mount: mount a tmpfs there or pick a writable --state-dir"
                ))
            }
            Err(e) => return Err(format!("cannot statvfs state dir {shown}: {e}: pick another --state-dir")),
        }
        let mut rnd = [0u8; 8];
        crate::kernel::random::getrandom(&mut rnd).map_err(|e| format!("cannot read random bytes: {e}"))?;
        let probe = format!(".probe.{}", hex(&rnd));
        crate::kernel::dirwrite::create_excl_at(&self.fd, &probe, 0o600)
            .and_then(|_| crate::kernel::dirwrite::unlink_at(&self.fd, &probe))
            .map_err(|e| {
                format!("state dir {shown} is not writable ({e}): make it root's and writable, or pick another --state-dir")
            })
    }

    pub fn write_status(&self, st: &Status) -> io::Result<()> {
        self.write_atomic(STATUS, &status_json(st)?, 0o644)
    }
}

pub fn status_json(st: &Status) -> io::Result<Vec<u8>> {
    let mut text = serde_json::to_vec_pretty(st).map_err(io::Error::other)?;
    text.push(b'\n');
    Ok(text)
}

/// A status as status.json and the results directory hold it.
pub fn parse_status(b: &[u8]) -> Result<Status, String> {
    serde_json::from_slice(b).map_err(|e| format!("not a quiesce status: {e}"))
}

/// Temp file in the same directory (O_EXCL|O_NOFOLLOW), fsync, rename over the target.
pub fn write_atomic(dir: &Path, name: &str, data: &[u8], mode: u32) -> io::Result<()> {
    let mut rnd = [0u8; 8];
    crate::kernel::random::getrandom(&mut rnd)?;
    let tmp = dir.join(format!(".{name}.{}", hex(&rnd)));
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    let res = (|| {
        f.write_all(data)?;
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        fs::rename(&tmp, dir.join(name))
    })();
    if res.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    res?;
    // The rename is durable only once the directory is synced.
    fs::File::open(dir)?.sync_all()
}

pub fn hex(b: &[u8]) -> String {
    // A table, not `format!` per byte: an attestation writes a digest per file, and a
    // formatted byte costs a hundred times the lookup.
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        s.push(char::from(DIGITS[usize::from(x >> 4)]));
        s.push(char::from(DIGITS[usize::from(x & 15)]));
    }
    s
}

pub fn new_id() -> io::Result<String> {
    let mut b = [0u8; 16];
    crate::kernel::random::getrandom(&mut b)?;
    Ok(hex(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("quiesce-state-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn atomic_write_and_refusals() {
        let d = tmpdir("a");
        let sd = StateDir::create(&d).unwrap();
        sd.write_atomic("x", b"hello", 0o600).unwrap();
        assert_eq!(fs::read(d.join("x")).unwrap(), b"hello");
        assert_eq!(fs::metadata(d.join("x")).unwrap().mode() & 0o777, 0o600);
        // Only the target remains: no temp files left behind.
        assert_eq!(fs::read_dir(&d).unwrap().count(), 1);

        fs::set_permissions(&d, fs::Permissions::from_mode(0o775)).unwrap();
        assert!(StateDir::open(&d).unwrap_err().contains("writable by group"));
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();

        let link = tmpdir("link");
        std::os::unix::fs::symlink(&d, &link).unwrap();
        assert!(StateDir::open(&link).unwrap_err().contains("symlink"));
        fs::remove_file(&link).unwrap();

        // A planted link at the read path is not followed.
        std::os::unix::fs::symlink("/etc/passwd", d.join(STATUS)).unwrap();
        assert!(sd.read(STATUS).is_err());
        fs::remove_dir_all(&d).unwrap();
    }
}

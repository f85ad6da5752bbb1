//! The state directory: status, marker, public key and freeze requests.
//! Every write is atomic and cannot follow a planted link.

use serde::{Deserialize, Serialize};
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub const DEFAULT_DIR: &str = "/run/quiesce";
pub const MARKER: &str = "quiescence.jws";
pub const STATUS: &str = "status.json";
pub const PUBKEY: &str = "signing.pub";
pub const REQUEST: &str = "request";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Survivor {
    pub pid: i32,
    pub uid: u32,
    pub state: char,
    pub comm: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Phases {
    pub stop: u64,
    pub walk: u64,
    pub kill: u64,
    pub probe: u64,
    pub total: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Status {
    pub id: String,
    /// The `quiesce freeze` request this freeze answers, if any.
    pub request_id: Option<String>,
    pub nonce: Option<String>,
    /// freezing, quiescent or failed
    pub state: String,
    pub reason: Option<String>,
    pub survivors: Vec<Survivor>,
    pub killed: usize,
    pub phases_ms: Phases,
    /// Identities in the init's history table after the freeze (it should stay as small as the
    /// namespace; the soak watches it).
    #[serde(default)]
    pub history: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Request {
    pub nonce: Option<String>,
    pub request_id: String,
}

#[derive(Debug)]
pub struct StateDir {
    pub path: PathBuf,
}

/// Refuse a directory that someone other than root could have planted or can write into.
pub fn check_dir(path: &Path) -> Result<(), String> {
    let md = fs::symlink_metadata(path)
        .map_err(|e| format!("state dir {}: {e}: create it or pick another --state-dir", path.display()))?;
    if md.file_type().is_symlink() {
        return Err(format!(
            "state dir {} is a symlink: remove it or pick another --state-dir",
            path.display()
        ));
    }
    if !md.is_dir() {
        return Err(format!(
            "state dir {} is not a directory: remove it or pick another --state-dir",
            path.display()
        ));
    }
    if md.uid() != 0 {
        return Err(format!(
            "state dir {} is owned by uid {}, not root: chown root it",
            path.display(),
            md.uid()
        ));
    }
    if md.mode() & 0o022 != 0 {
        return Err(format!(
            "state dir {} is writable by group or others (mode {:o}): chmod 755 it",
            path.display(),
            md.mode() & 0o7777
        ));
    }
    Ok(())
}

impl StateDir {
    /// Open an existing, safe state directory (subcommands).
    pub fn open(path: &Path) -> Result<StateDir, String> {
        check_dir(path)?;
        Ok(StateDir { path: path.to_path_buf() })
    }

    /// Create (mode 0755) if missing, then check (the init).
    pub fn create(path: &Path) -> Result<StateDir, String> {
        if fs::symlink_metadata(path).is_err() {
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent).map_err(|e| {
                    format!("cannot create {}: {e}: pick another --state-dir", parent.display())
                })?;
            }
            match fs::create_dir(path) {
                Ok(()) => {
                    fs::set_permissions(path, fs::Permissions::from_mode(0o755))
                        .map_err(|e| format!("cannot chmod {}: {e}", path.display()))?;
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(format!(
                        "cannot create state dir {}: {e}: pick another --state-dir",
                        path.display()
                    ))
                }
            }
        }
        StateDir::open(path)
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Temp file in the same directory (O_EXCL|O_NOFOLLOW), fsync, rename over the target.
    pub fn write_atomic(&self, name: &str, data: &[u8], mode: u32) -> io::Result<()> {
        let mut rnd = [0u8; 8];
        crate::sys::getrandom(&mut rnd)?;
        let tmp = self.path.join(format!(".{name}.{}", hex(&rnd)));
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
            fs::rename(&tmp, self.path.join(name))
        })();
        if res.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        res?;
        // The rename is durable only once the directory is synced.
        fs::File::open(&self.path)?.sync_all()
    }

    pub fn remove(&self, name: &str) -> io::Result<()> {
        match fs::remove_file(self.path.join(name)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    pub fn write_status(&self, st: &Status) -> io::Result<()> {
        let mut text = serde_json::to_vec_pretty(st).map_err(io::Error::other)?;
        text.push(b'\n');
        self.write_atomic(STATUS, &text, 0o644)
    }

    pub fn read_status(&self) -> io::Result<Option<Status>> {
        match read_nofollow(&self.file(STATUS)) {
            Ok(b) => serde_json::from_slice(&b).map(Some).map_err(io::Error::other),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn read_request(&self) -> io::Result<Option<Request>> {
        match read_nofollow(&self.file(REQUEST)) {
            Ok(b) => serde_json::from_slice(&b).map(Some).map_err(io::Error::other),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Read a file without following a link at its last component.
pub fn read_nofollow(path: &Path) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut f =
        fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(path)?;
    let mut b = Vec::new();
    f.read_to_end(&mut b)?;
    Ok(b)
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn new_id() -> io::Result<String> {
    let mut b = [0u8; 16];
    crate::sys::getrandom(&mut b)?;
    Ok(hex(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(sd.read_status().is_err());
        fs::remove_dir_all(&d).unwrap();
    }
}

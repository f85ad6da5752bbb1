//! What the running init publishes in its state dir (sandbox.json) for the subcommands beside it.

use crate::state::dir::StateDir;
use crate::state::files::FileError;
use serde::Serialize;
use std::path::Path;

pub const SANDBOX_FILE: &str = "sandbox.json";

/// What the running init tells the subcommands beside it about its sandbox.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Published {
    pub uids: Vec<u32>,
    /// Whether a loginuid marks a sandbox launch in this container (see taint::Policy).
    pub lineage: bool,
    /// Where the sandbox is defined by lineage alone (`--sandbox-lineage`): the loginuid every
    /// launch must write, whatever its user. Absent otherwise, and in files of earlier versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<u32>,
    /// The init's pid and start time in this PID namespace: where `freeze` sends its signal when
    /// the init is not PID 1, checked against the start time so a reused pid is never signalled.
    #[serde(default)]
    pub pid: i32,
    #[serde(default)]
    pub start_time: u64,
    /// The signal the init takes requests on (`--freeze-signal`); 0 in files of earlier versions,
    /// which took SIGUSR1.
    #[serde(default)]
    pub freeze_signal: i32,
}

/// A sandbox.json's bytes, read as the init writes them.
pub fn parse(b: &[u8]) -> serde_json::Result<Published> {
    serde_json::from_slice(b)
}

/// What the init using `dir` published. None: nothing (no init with a sandbox here, or one still
/// starting). An error: a sandbox.json is there but cannot be trusted (not root's, writable by
/// others, a link, not what an init writes), which is never the same as none.
pub fn published_in(dir: &StateDir) -> Result<Option<Published>, String> {
    match dir.read(SANDBOX_FILE) {
        Ok(b) => parse(&b).map(Some).map_err(|e| {
            format!(
                "{}: not what a quiesce init publishes ({e}): remove it",
                dir.file(SANDBOX_FILE).display()
            )
        }),
        Err(FileError::Missing(_)) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// The sandbox the running init published, for advice only (which UIDs `ps` marks, whether a
/// loginuid counts): None when there is no init here or what is there cannot be trusted.
pub fn published(state_dir: &Path) -> Option<Published> {
    StateDir::open(state_dir).ok().and_then(|d| published_in(&d).ok().flatten())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn only_a_missing_sandbox_file_means_nothing_was_published() {
        let d = std::env::temp_dir().join(format!("quiesce-published-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        let sd = StateDir::create(&d).unwrap();
        assert_eq!(published_in(&sd).map(|p| p.is_none()), Ok(true));
        let file = d.join(SANDBOX_FILE);
        fs::write(&file, r#"{"uids":[4242],"lineage":true,"pid":7,"start_time":9}"#).unwrap();
        fs::set_permissions(&file, fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(published_in(&sd).unwrap().map(|p| (p.pid, p.start_time)), Some((7, 9)));
        fs::set_permissions(&file, fs::Permissions::from_mode(0o666)).unwrap();
        let e = published_in(&sd).unwrap_err();
        assert!(e.contains(SANDBOX_FILE) && e.contains("writable by group or others"), "{e}");
        fs::write(&file, "{not json").unwrap();
        fs::set_permissions(&file, fs::Permissions::from_mode(0o644)).unwrap();
        let e = published_in(&sd).unwrap_err();
        assert!(e.contains(SANDBOX_FILE) && e.contains("remove it"), "{e}");
        fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", &file).unwrap();
        assert!(published_in(&sd).unwrap_err().contains("symlink"));
        fs::remove_dir_all(d).unwrap();
    }
}

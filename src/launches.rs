//! Launch records: what `quiesce exec` tells the init before the sandbox command runs. The
//! client writes one file per launch in `launches/` (only root can write there), naming itself
//! (the process that is about to become the sandbox command: the pid and start time survive the
//! exec) and its parent, the launcher. The file is there before the sandbox command's first
//! instruction, so the init knows the launch and its launcher without having to observe them:
//! an escape that completes between two observations cannot hide who started it.

use crate::files::FileError;
use crate::state::StateDir;
use crate::sys::Pid;
use serde::{Deserialize, Serialize};

pub const LAUNCHES: &str = "launches";
/// Records read per call at most; the init reads them at every refresh and removes what it read,
/// so more than this means something writes faster than any launcher does.
pub const MAX_READ: usize = 4096;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Launch {
    pub pid: Pid,
    pub start_time: u64,
    /// The launcher; 0 when it is outside the PID namespace (`docker exec`).
    pub ppid: Pid,
    /// The launcher's start time (0 when outside).
    pub parent_start_time: u64,
    /// The launch carries the sandbox loginuid and the init follows it.
    pub lineage: bool,
    /// A setuid binary can raise the launch's privilege (no no_new_privs).
    pub setuid: bool,
}

impl Launch {
    /// A launch that can become root without lineage following it: only observation and these
    /// records tell its processes apart from the launcher's own.
    pub fn unfollowed(&self) -> bool {
        self.setuid && !self.lineage
    }

    fn file_name(&self) -> String {
        format!("{}-{}.json", self.pid, self.start_time)
    }
}

/// Parse the record in file `name`: JSON whose pid and start time are its name.
pub fn parse(bytes: &[u8], name: &str) -> Result<Launch, String> {
    let l: Launch = serde_json::from_slice(bytes).map_err(|e| format!("not a launch record: {e}"))?;
    if l.file_name() != name || l.pid <= 0 || l.ppid < 0 {
        return Err("its pid and start time are not its file name".into());
    }
    Ok(l)
}

/// The client side: record this launch; an error names the directory and the fix.
pub fn record(state: &StateDir, l: &Launch) -> Result<(), String> {
    let dir = state.sub(LAUNCHES)?;
    let body = serde_json::to_vec(l).map_err(|e| e.to_string())?;
    // Readers need the rename only: the init does not outlive a crash of the machine.
    dir.write_atomic_deferred(&l.file_name(), &body, 0o644)
        .map(drop)
        .map_err(|e| format!("cannot record the launch in {}: {e} (run this as root)", dir.path.display()))
}

/// The init side: the directory, emptied at start (a previous init's records name other processes).
pub struct Registry {
    dir: StateDir,
}

impl Registry {
    pub fn new(state: &StateDir) -> Result<Registry, String> {
        state.remove_tree(LAUNCHES).map_err(|e| format!("stale {LAUNCHES}/: {e}"))?;
        Ok(Registry { dir: state.ensure_sub(LAUNCHES)? })
    }

    /// Take every record written since the last call. An error means some record may be unread:
    /// the caller must not certify on what it did read.
    pub fn take(&self) -> Result<Vec<Launch>, String> {
        let what = || self.dir.path.display().to_string();
        let (names, left) = self.dir.list(MAX_READ).map_err(|e| format!("cannot list {}: {e}", what()))?;
        let mut out = Vec::new();
        for name in names {
            // A dot file is a record still being written; a name that is not UTF-8 is no record.
            let Some(name) = name.to_str().filter(|n| !n.starts_with('.')).map(str::to_string) else {
                continue;
            };
            let launch = match self.dir.read(&name) {
                Ok(b) => parse(&b, &name).map_err(|e| format!("{}/{name}: {e}", what()))?,
                Err(FileError::Missing(_)) => continue,
                Err(e) => return Err(format!("{}/{name}: {e}", what())),
            };
            self.dir.remove(&name).map_err(|e| format!("cannot remove {}/{name}: {e}", what()))?;
            out.push(launch);
        }
        if left {
            return Err(format!("more than {MAX_READ} launch records in {} at once", what()));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_named_by_its_pid_and_start_time() {
        let l =
            Launch { pid: 7, start_time: 99, ppid: 0, parent_start_time: 0, lineage: false, setuid: true };
        let body = serde_json::to_vec(&l).unwrap();
        assert_eq!(parse(&body, "7-99.json"), Ok(l.clone()));
        assert!(parse(&body, "7-98.json").is_err());
        assert!(parse(b"{}", "7-99.json").is_err());
        assert!(l.unfollowed());
        assert!(!Launch { lineage: true, ..l.clone() }.unfollowed());
        assert!(!Launch { setuid: false, ..l }.unfollowed());
    }
}

//! What a sidecar keeps in its state dir: the lock it holds for its whole life, its log, and the
//! line it said once ready (sidecar.json), which answers a start that finds it running.

use crate::state::dir::StateDir;
use crate::state::files::FileError;
use serde::{Deserialize, Serialize};

/// Held (flock, exclusive) by the running sidecar from before its start until it ends.
pub const LOCK: &str = "sidecar.lock";
/// The sidecar's standard output and error, emptied at each start.
pub const LOG: &str = "sidecar.log";
/// The ready line, as the start printed it.
pub const READY_FILE: &str = "sidecar.json";

/// The one line of JSON a start prints: what the harness keeps of the sidecar.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ready {
    /// Always "quiesce": what the line is.
    pub sidecar: String,
    pub version: String,
    /// The sidecar's pid and start time (clock ticks since boot) in its PID namespace.
    pub pid: i32,
    pub start_time: u64,
    /// Absolute.
    pub state_dir: String,
    /// The signing public key (SPKI PEM), as signing.pub holds it.
    pub public_key: String,
    pub sandbox_uids: Vec<u32>,
    pub lineage: bool,
    /// True from the start that made this sidecar; false from one that found it running.
    pub started: bool,
    /// Written into sidecar.json when the sidecar ended on SIGTERM or SIGINT; never in a ready line.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopped: bool,
}

impl Ready {
    /// The line, without its newline.
    pub fn line(&self) -> String {
        // A struct of strings, numbers and booleans always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// What sidecar.json says. None: nothing there. An error: a file that cannot be trusted (not
/// root's, a link) or is not what a sidecar writes.
pub fn read(dir: &StateDir) -> Result<Option<Ready>, String> {
    match dir.read(READY_FILE) {
        Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| {
            format!("{}: not what a quiesce sidecar writes ({e}): remove it", dir.file(READY_FILE).display())
        }),
        Err(FileError::Missing(_)) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ready_line_reads_back_and_says_stopped_only_when_stopped() {
        let mut r = Ready {
            sidecar: "quiesce".into(),
            version: "1".into(),
            pid: 7,
            start_time: 9,
            state_dir: "/run/quiesce".into(),
            public_key: "-----BEGIN PUBLIC KEY-----\n".into(),
            sandbox_uids: vec![4242],
            lineage: true,
            started: true,
            stopped: false,
        };
        let line = r.line();
        assert!(!line.contains('\n') && !line.contains("stopped"), "{line}");
        assert!(line.starts_with(r#"{"sidecar":"quiesce","version":"1","pid":7,"start_time":9,"#), "{line}");
        assert_eq!(serde_json::from_str::<Ready>(&line).unwrap(), r);
        r.stopped = true;
        assert!(r.line().ends_with(r#""started":true,"stopped":true}"#));
    }
}

//! Launch records: what `quiesce exec` tells the init before the sandbox command runs. The
//! client sends the record as a request (`requests`), waits until the init has taken it, and only
//! then drops privilege and execs: the init knows the launch and its launcher before the sandbox
//! command's first instruction, whatever any observation saw, and nothing the command does later
//! (root included) can take the record back. The record names the process that becomes the
//! sandbox command (pid and start time survive the exec) and its parent, the launcher.

use crate::kernel::process::Pid;
use serde::{Deserialize, Serialize};

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

    /// What a record must be to be taken at all.
    pub fn check(&self) -> Result<(), String> {
        if self.pid <= 1 || self.ppid < 0 || (self.ppid == 0) != (self.parent_start_time == 0) {
            return Err(format!("launch record for pid {} names no process a launch can be", self.pid));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_launch_without_lineage_that_setuid_can_raise_is_unfollowed() {
        let l =
            Launch { pid: 7, start_time: 99, ppid: 0, parent_start_time: 0, lineage: false, setuid: true };
        assert!(l.unfollowed());
        assert!(l.check().is_ok());
        assert!(!Launch { lineage: true, ..l.clone() }.unfollowed());
        assert!(!Launch { setuid: false, ..l.clone() }.unfollowed());
        assert!(Launch { pid: 1, ..l.clone() }.check().is_err());
        assert!(Launch { ppid: 5, ..l.clone() }.check().is_err(), "a launcher with no start time");
        assert!(Launch { ppid: 5, parent_start_time: 3, ..l }.check().is_ok());
    }
}

//! The reaper: collects PID 1's exited children in bounded batches, and tells the command's end
//! and the attestation worker's apart from every other child's. May use: kernel.

use crate::kernel::{
    process::Pid,
    reap::{self, Reaped},
    signal,
};

pub(super) struct Reaper {
    /// The command's pid; None in a sidecar, which has no command.
    pub(super) main: Option<Pid>,
    /// The command's start time, read once it ran (None: unreadable).
    pub(super) main_start: Option<u64>,
    pub(super) status: Option<i32>,
    /// waitpid said ECHILD: the init has no child at all.
    pub(super) childless: bool,
    /// The attestation worker's pid, and its exit code once reaped: never the command's.
    pub(super) watch: Option<Pid>,
    pub(super) watched: Option<i32>,
}

/// Children reaped per call at most: a sandbox process that hands the init zombies as fast as
/// a pids limit lets it (clone(CLONE_PARENT) from a process reparented to PID 1) would otherwise
/// keep it in this loop for as long as it likes, away from a pending freeze or SIGTERM.
const REAP_BATCH: usize = 256;

impl Reaper {
    /// Reap a batch of exited children; true when more may be waiting. The batch ends early
    /// when a signal other than SIGCHLD is pending: the main loop handles that first, then
    /// comes back for the rest without sleeping.
    pub(super) fn reap(&mut self) -> bool {
        for i in 0..REAP_BATCH {
            if i % 4 == 3 && signal::other_signal_pending(libc::SIGCHLD) {
                return true;
            }
            match reap::reap_one() {
                Ok(Some(r)) => {
                    self.childless = false;
                    let (pid, code) = match r {
                        Reaped::Exited(p, c) => (p, c),
                        Reaped::Signaled(p, s) => (p, 128 + s),
                    };
                    if Some(pid) == self.watch {
                        self.watch = None;
                        self.watched = Some(code);
                    } else if Some(pid) == self.main && self.status.is_none() {
                        log::debug!("command (pid {pid}) ended with status {code}");
                        self.status = Some(code);
                    }
                }
                Ok(None) => {
                    self.childless = false;
                    return false;
                }
                Err(e) if e.raw_os_error() == Some(libc::ECHILD) => {
                    self.childless = true;
                    return false;
                }
                Err(e) => {
                    log::error!("waitpid failed: {e}; retrying on the next signal");
                    return false;
                }
            }
        }
        true
    }
}

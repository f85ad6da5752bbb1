//! The client that asked for a freeze is the init's own while the freeze lasts: a root process
//! entered from outside the PID namespace, which the proof must not take for an escapee's.
//! Which process that is, the kernel says, not the request: where a sandbox process can become
//! root (setuid binaries work), it can rewrite a request in `requests/` to name a child of its
//! own, or kill the client and put a child on its pid within the client's start tick.
//!
//! Where it decides: only for a client born in its freeze's starting tick where nothing orders
//! that tick's processes (`tests/freeze.rs` t27, t28), and only against a request a root process
//! wrote. Where a launch can become root unseen the init takes no client at all
//! (`init/freezing.rs`); what is left is a root agent (`--sandbox-lineage`) that makes an
//! untagged root process of the orchestrator's write a request naming a child of its own, which
//! the checks below refuse unless that child is this binary, started as `freeze`, from outside,
//! untraced. `tests/request_forgery.rs` forges one (y05: a request naming a `quiesce exec`
//! entered from outside, which claims it with its launch's signal) and runs a real client under
//! a shell inside (y06: a parent in this namespace); each refusal is read in the init's log.
//!
//! What it vouches for: nothing. A client starts no process, so one with a live child is not a
//! client (a root process that exec'd this binary after starting a helper), and is judged like
//! any other process. Nor does it run anything but its own code: it is this binary started as
//! `freeze`, whose code never execs (`quiesce exec` is the same binary, and runs what it is
//! given once its launch is recorded). Where the init may not read the client's executable (no CAP_SYS_PTRACE,
//! the client undumpable), nothing tells the client from an undumpable root process that runs
//! anything: it is not taken for the init's own then.

use crate::decide::newcomers::Own;
use crate::kernel::{pidfd, process::Pid};
use crate::observe::procs::reader::Reader;
use crate::observe::procs::table::Table;
use std::os::fd::OwnedFd;

/// The subcommand a client runs as.
const SUBCOMMAND: &[u8] = b"freeze";

/// A client shown to be one: its pidfd is held, so its pid names it and nothing else for as long
/// as the pidfd says it is attached.
pub struct Client {
    pid: Pid,
    start_time: u64,
    fd: OwnedFd,
}

impl Client {
    /// The process the request names, if it is a client: the start time the request says,
    /// entered from outside (no parent in this namespace), running this binary as the kernel
    /// shows it, not traced. Why not, otherwise.
    pub fn check(reader: &Reader, pid: Pid, start_time: u64) -> Result<Client, String> {
        let fd = pidfd::pidfd_open(pid).map_err(|e| format!("pidfd_open({pid}): {e}"))?;
        let c = Client { pid, start_time, fd };
        c.genuine(reader)?;
        c.runs_freeze(reader)?;
        c.genuine(reader)?;
        Ok(c)
    }

    /// This binary, started as `freeze`: what the kernel shows, not what the request says.
    fn runs_freeze(&self, reader: &Reader) -> Result<(), String> {
        let pid = self.pid;
        match reader.runs_own_binary(pid) {
            Ok(Some(true)) => {}
            Ok(Some(false)) => return Err(format!("process {pid} does not run this binary")),
            Ok(None) => return Err(format!("process {pid} exited")),
            // A client makes itself undumpable, and root without CAP_SYS_PTRACE may not read an
            // undumpable process's executable: so may any root process make itself, whatever it
            // runs. Unknown is not "this binary". (This arm only words the refusal the next one
            // makes too: cargo mutants' changes to its guard are equivalent.)
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(format!(
                    "the executable of process {pid} is unreadable without CAP_SYS_PTRACE, so it cannot \
                     be told from a root process that runs anything"
                ))
            }
            Err(e) => return Err(e.to_string()),
        }
        match reader.second_arg(pid).map_err(|e| e.to_string())? {
            Some(a) if a == SUBCOMMAND => Ok(()),
            Some(a) => Err(format!(
                "process {pid} runs this binary as '{}', not as '{}'",
                String::from_utf8_lossy(&a),
                String::from_utf8_lossy(SUBCOMMAND)
            )),
            None => Err(format!("process {pid} exited")),
        }
    }

    /// Its identity for the proof, while it is still that process, from outside and untraced,
    /// and started nothing that `snap` shows alive.
    pub fn own(&self, reader: &Reader, snap: &Table) -> Option<Own> {
        if let Some(child) = snap.values().find(|p| p.ppid == self.pid && p.alive()) {
            log::info!(
                "freeze client {}: not the init's own: a client starts no process, and {} ({}) is its child",
                self.pid,
                child.pid,
                child.comm
            );
            return None;
        }
        match self.genuine(reader).and_then(|()| self.runs_freeze(reader)).and_then(|()| self.genuine(reader))
        {
            Ok(()) => Some((self.pid, self.start_time)),
            Err(e) => {
                log::debug!("freeze client {}: not the init's own now: {e}", self.pid);
                None
            }
        }
    }

    fn genuine(&self, reader: &Reader) -> Result<(), String> {
        let pid = self.pid;
        let mut pass = reader.pass().map_err(|e| e.to_string())?;
        let st = pass.stat(pid).map_err(|e| e.to_string())?.ok_or(format!("process {pid} exited"))?;
        if st.start_time != self.start_time {
            return Err(format!("process {pid} started at tick {}, not {}", st.start_time, self.start_time));
        }
        if st.ppid != 0 {
            return Err(format!("process {pid} has a parent in this namespace ({})", st.ppid));
        }
        match pass.tracer(pid).map_err(|e| e.to_string())? {
            Some(0) => {}
            Some(t) => return Err(format!("process {pid} is traced by {t}")),
            None => return Err(format!("process {pid} exited")),
        }
        // What was read is the pidfd's process only if it still holds the pid after the reads.
        if !pidfd::pidfd_attached(&self.fd) {
            return Err(format!("process {pid} exited"));
        }
        Ok(())
    }
}

//! The stop: SIGSTOP every sandbox process (kill(-1) as each sandbox UID, swept again while any
//! still runs, and a pidfd for what it may miss) and observe until every one shows stopped or the
//! stop's wait runs out.

use crate::decide::taint::{Policy, Tainted};
use crate::freeze::kill::missable;
use crate::freeze::progress::{live, ms, Run};
use crate::freeze::target;
use crate::kernel::process;
use crate::observe::consistency;
use crate::observe::procs::model::Proc;
use crate::observe::procs::reader::Reader;
use crate::observe::procs::table::Table;
use crate::observe::settle;
use std::io;
use std::time::{Duration, Instant};

/// kill(-1, SIGSTOP) sweeps per stop pass that follows one still seeing running processes.
const STOP_SWEEPS: u32 = 8;

/// Observe into `table` (the observation before, read again in its own room: its loginuids that
/// were set are reused) and classify; the policy remembers what it saw, so an escape later does
/// not help.
fn observe(reader: &Reader, policy: &mut Policy, table: &mut Table) -> io::Result<Tainted> {
    reader.refresh(table, &policy.uids, None)?;
    let tainted = policy.classify(table);
    policy.remember(table, &tainted);
    Ok(tainted)
}

impl Run<'_> {
    /// Stop everything; returns the last observation, in which every sandbox process is
    /// stopped (or the wait ran out). Every pass that still sees a running sandbox process sends
    /// the kernel-side kill(-1, SIGSTOP) again: processes that SIGCONT each other undo any
    /// one-by-one stop, but not a stop that reaches all of them at once.
    /// The stop starts from `table`, the freeze's copy of the init's last tracking observation,
    /// and reads each of its own observations into it.
    pub fn stop(&mut self, stop_wait: Duration, table: &mut Table) -> Result<Tainted, String> {
        let t = Instant::now();
        let until = (t + stop_wait).min(self.deadline);
        let mut first = true;
        let mut waiting: Vec<settle::Target> = Vec::new();
        let last = loop {
            // After the first pass, sweep several times back to back within one switch: a process
            // caught in the middle of its own SIGCONT sweep undoes the part of ours that came
            // before it, while one woken with a stop of ours pending stops again before it runs
            // any code; the next sweep re-stops what the last SIGCONT undid.
            let sweeps = if first { 1 } else { STOP_SWEEPS };
            let swept = Instant::now();
            self.cred
                .kill_all_as_repeated(&self.policy.uids, libc::SIGSTOP, sweeps)
                .map_err(|e| format!("credential switch failed: {e}"))?;
            let settle = Instant::now();
            if first {
                waiting = self.first_waiting(table);
                log::debug!(
                    "stop: {} processes to wait for, listed in {:?}",
                    waiting.len(),
                    settle.elapsed()
                );
            }
            let left = settle::wait(self.reader, &waiting, settle::Goal::Stopped, until);
            let pass = Instant::now();
            self.since = consistency::last_pid(self.reader.root()).ok();
            let tainted =
                observe(self.reader, self.policy, table).map_err(|e| format!("/proc unreadable: {e}"))?;
            let snap = &*table;
            self.ancestry.note(snap, &tainted, process::getpid());
            let running: Vec<&Proc> = live(snap, &tainted).filter(|p| !p.stopped()).collect();
            log::debug!(
                "stop: {sweeps} sweep(s) in {:?}, waited {:?} for a sample of {} ({left} not stopped), observed {} processes \
                 in {:?}, {} sandbox, {} not yet stopped",
                settle - swept,
                pass - settle,
                waiting.len(),
                snap.len(),
                pass.elapsed(),
                tainted.len(),
                running.len()
            );
            if self.stopped_or_out(&running, until, stop_wait) {
                break tainted;
            }
            self.stop_running(&running, first)?;
            waiting = running.iter().map(|p| (p.pid, Some(p.start_time))).collect();
            first = false;
        };
        // From the first stop the init sent, before this function (`run::Context::began`).
        self.phases.stop = ms(self.start.elapsed());
        Ok(last)
    }

    /// What to wait for before the first full observation, listed while the first sweep takes
    /// effect: what runs as a sandbox UID now, and the sandbox processes of the init's last
    /// tracking observation (`seen`). Anything else is found by the observation.
    fn first_waiting(&mut self, seen: &Table) -> Vec<settle::Target> {
        let tainted = self.policy.classify(seen);
        self.ancestry.note(seen, &tainted, process::getpid());
        // In pid order; a pid both lists name keeps the observation's start time.
        let mut w: Vec<settle::Target> = live(seen, &tainted).map(|p| (p.pid, Some(p.start_time))).collect();
        let from_seen = w.len();
        for (pid, start) in settle::owned_by(self.reader, &self.policy.uids) {
            if w[..from_seen].binary_search_by_key(&pid, |t| t.0).is_err() {
                w.push((pid, start));
            }
        }
        w.sort_by_key(|t| t.0);
        w.dedup_by_key(|t| t.0);
        w
    }

    /// Is the stop over: no sandbox process `running`, or the wait run out (what still runs is
    /// noted as unstopped, and killed anyway)?
    fn stopped_or_out(&mut self, running: &[&Proc], until: Instant, stop_wait: Duration) -> bool {
        if running.is_empty() {
            self.unstopped.clear();
            return true;
        }
        if Instant::now() >= until {
            self.unstopped = running.iter().map(|p| p.pid).collect();
            log::warn!(
                "freeze: {} sandbox process(es) not stopped after {:?}; killing anyway",
                running.len(),
                stop_wait
            );
            return true;
        }
        false
    }

    /// SIGSTOP through a pidfd what still runs. kill(-1) reached the rest already and they are
    /// on their way to stopping; on the `first` pass only what it may have missed needs one.
    fn stop_running(&self, running: &[&Proc], first: bool) -> Result<(), String> {
        for p in running {
            if !first || missable(p, &self.policy.uids) {
                target::signal(self.reader, p, libc::SIGSTOP).map_err(|e| format!("signal failed: {e}"))?;
            }
        }
        Ok(())
    }
}

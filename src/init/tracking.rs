//! Tracking: the periodic refresh of the sandbox's history table, and the launch records of
//! `quiesce exec` held before their commands run. May use: kernel, state, observe, decide.

use crate::decide::newcomers;
use crate::decide::taint::Policy;
use crate::kernel::process::{self, Pid};
use crate::observe::procs::reader::Reader;
use crate::state::launches::Launch;
use std::time::{Duration, Instant};

/// What the init has learnt of the sandbox so far: it changes with every refresh and launch
/// record, and a freeze starts from it.
pub struct Tracking {
    pub policy: Policy,
    /// The last tracking observation.
    pub seen: crate::observe::procs::table::Table,
    /// What the launch records of `quiesce exec` said so far.
    pub launchers: newcomers::Launchers,
    /// When the last tracking refresh completed; None: the last one was cut off.
    pub tracked_at: Option<Instant>,
    /// The sandbox processes made the OOM killer's first choice so far.
    pub oom: crate::init::oom::OomFirst,
}

/// When the next refresh is due: every interval, and on SIGCHLD at most every 100 ms.
pub(super) struct Schedule {
    /// The next periodic refresh; None: no interval.
    pub(super) next: Option<Instant>,
    last: Instant,
}

impl Schedule {
    pub(super) fn new() -> Schedule {
        Schedule { next: None, last: Instant::now() }
    }

    /// A refresh is due at `now`; `child`: SIGCHLD came this turn.
    pub(super) fn due(&self, now: Instant, child: bool) -> bool {
        let periodic = self.next.is_some_and(|t| now >= t);
        // Under a fork storm SIGCHLD comes constantly: refresh at most every 100 ms for it.
        let on_child = child && now.duration_since(self.last) >= RETRY;
        periodic || on_child
    }

    /// A refresh began at `now` and ended as `how`. One cut off (by a signal: a launch
    /// record's, a freeze request's) is tried again `RETRY` later, not an interval later: a
    /// freeze within that interval would otherwise find no fresh refresh and make its own
    /// before its stop (`look_again`). One that failed waits the interval, as before.
    pub(super) fn done(&mut self, now: Instant, interval: Option<Duration>, how: Refresh) {
        self.last = now;
        self.next = interval.map(|i| now + if how == Refresh::Cut { i.min(RETRY) } else { i });
    }
}

/// How soon a cut-off refresh is tried again; SIGCHLD brings one no sooner either.
const RETRY: Duration = Duration::from_millis(100);

/// Refresh the history table: remember every sandbox process seen now. Processes already seen
/// are re-read from their stat line only, which keeps the periodic cost small.
///
/// Under a fork storm the init gets a tiny share of the CPU and a refresh can take seconds, so a
/// pending signal other than SIGCHLD interrupts it: a freeze request or SIGTERM comes first.
/// (Only root may signal the init, so the sandbox cannot use this to starve the refresh.)
/// `oom`: raise the newcomers' OOM scores after it (`Oom::Raise`); a freeze's own look leaves
/// that to the next refresh (`Oom::Later`): it kills them anyway, and a pass over a thousand
/// newcomers cost the freeze tens of milliseconds before its stop.
/// Returns how the refresh ended.
pub(super) fn track(t: &mut Tracking, abort: &dyn Fn() -> bool, oom: Oom) -> Refresh {
    let reader = Reader::default();
    let began = Instant::now();
    // Read into the last table's room, which stays the last complete observation until this one
    // completes: the freeze starts from it, and decides from it who may vouch.
    match reader.refresh(&mut t.seen, &[], Some(abort)) {
        Ok(true) => {
            let read = began.elapsed();
            let tainted = t.policy.classify(&t.seen);
            t.policy.remember(&t.seen, &tainted);
            let raised = Instant::now();
            if oom == Oom::Raise && !t.oom.raise(reader.root(), &t.seen, &tainted, abort) {
                log::debug!("raising the sandbox's oom_score_adj interrupted: the rest at the next refresh");
            }
            t.launchers.prune(&t.seen);
            t.tracked_at = Some(Instant::now());
            log::debug!(
                "tracking: {} processes read in {read:?}, {} sandbox, oom pass {:?}",
                t.seen.len(),
                tainted.len(),
                raised.elapsed()
            );
            Refresh::Done
        }
        Ok(false) => {
            log::debug!("tracking interrupted after {:?}", began.elapsed());
            t.tracked_at = None;
            Refresh::Cut
        }
        Err(e) => {
            log::warn!("tracking: {e}");
            t.tracked_at = None;
            Refresh::Failed
        }
    }
}

/// How a tracking refresh ended: went through, cut off by `abort`, or failed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Refresh {
    Done,
    Cut,
    Failed,
}

/// Whether a tracking refresh raises the OOM scores of the sandbox processes it finds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Oom {
    Raise,
    Later,
}

/// Hold a launch record: its process is the sandbox's from its first instruction (history), and
/// its launcher is noted. For an unfollowed launch every process above it now is noted too: a
/// child the launch leaves behind goes to the nearest subreaper above it when its parent exits,
/// and any of them may be one. The chain above a live process only shrinks later (its members
/// exit; orphans go further up, to what is noted already), so one walk now covers it.
pub(super) fn take_launch(t: &mut Tracking, l: &Launch) {
    log::debug!("launch recorded: pid {} by {}", l.pid, l.ppid);
    t.policy.history.insert((l.pid, l.start_time));
    t.launchers.add(l);
    if !l.unfollowed() || l.ppid == 0 {
        return;
    }
    let reader = Reader::default();
    let mut pass = match reader.pass() {
        Ok(p) => p,
        Err(e) => {
            // Only the launcher is known then; what is above it is the init's own note.
            log::warn!("cannot read the processes above launcher {}: {e}", l.ppid);
            return;
        }
    };
    let me = process::getpid();
    // From the launch itself, alive and waiting for this answer: a launcher that exited since it
    // wrote the record has handed it to a process above, which is noted through the live chain.
    let first = match pass.stat(l.pid) {
        Ok(Some(p)) if p.start_time == l.start_time => l.pid,
        _ => l.ppid,
    };
    let unknown = |pid: Pid, e: std::io::Error| {
        // Not "gone": what is above it stays unnoted, and the init's own note is all there is.
        log::warn!("cannot read process {pid} above launch {}: {e}", l.pid);
    };
    // A process of the chain that is gone by the time it is read (a launcher that exits while
    // this walks) has handed its children up already, maybe to a subreaper between it and the
    // init: the walk starts again from the launch, whose parent link says where they went.
    // Bounded: no chain of live processes is longer than a pids limit lets anyone build, and a
    // chain that keeps changing is walked again a few times only.
    let (mut cur, mut restarts) = (first, 0);
    for _ in 0..4096 {
        let p = match pass.stat(cur) {
            Ok(Some(p)) => p,
            Ok(None) if cur != first && restarts < 64 => {
                (cur, restarts) = (first, restarts + 1);
                continue;
            }
            Ok(None) => return,
            Err(e) => return unknown(cur, e),
        };
        if p.ppid <= 1 || p.ppid == me {
            return;
        }
        let parent = match pass.stat(p.ppid) {
            Ok(Some(p)) => p,
            Ok(None) if restarts < 64 => {
                (cur, restarts) = (first, restarts + 1);
                continue;
            }
            Ok(None) => return,
            Err(e) => return unknown(p.ppid, e),
        };
        t.launchers.add_above(parent.pid, parent.start_time, l.start_time);
        cur = parent.pid;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refresh cut off by a signal is due again soon; one that went through or failed waits
    /// the interval; with no interval none is scheduled.
    #[test]
    fn a_cut_refresh_is_due_again_soon() {
        let (now, every) = (Instant::now(), Some(Duration::from_secs(1)));
        let next = |how| {
            let mut s = Schedule::new();
            s.done(now, every, how);
            s.next
        };
        assert_eq!(next(Refresh::Cut), Some(now + RETRY));
        assert_eq!(next(Refresh::Done), Some(now + Duration::from_secs(1)));
        assert_eq!(next(Refresh::Failed), Some(now + Duration::from_secs(1)));
        let mut s = Schedule::new();
        s.done(now, None, Refresh::Cut);
        assert_eq!(s.next, None);
        assert!(!s.due(now + RETRY, false) && s.due(now + RETRY, true));
    }
}

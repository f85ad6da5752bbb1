//! Processes that appeared during a freeze with no parent left to vouch for them.
//!
//! A freeze stops the sandbox, but a process can restart itself (a SIGCONT timer) between the
//! stop and the kill. If it holds root through a setuid helper, it can become root for good, fork
//! a child into a session of its own and exit: `kill(-1)` as the sandbox UID no longer reaches
//! the child, no observation saw it, its parent is gone and, without lineage, nothing marks it.
//! Such a child cannot be told from a root daemon that double-forked at the same moment, so the
//! proof refuses to certify while one lives: a failed freeze, never a marker with a survivor.
//!
//! Only orphans count: a newcomer whose parent predates the freeze and lives is that parent's
//! (if the parent were the sandbox's, ancestry would mark the child). Processes entered from
//! outside the PID namespace (ppid 0, e.g. `docker exec` of the orchestrator, the freeze client
//! itself) are not orphans here; `docs/threat-model.md` names what that leaves.

use crate::procs::{Proc, Snapshot};
use crate::sys::Pid;
use crate::taint::Tainted;

/// When the freeze began: the boot clock in ticks (stat's start-time unit) and the pid counter.
pub struct Since {
    pub ticks: u64,
    /// None: unreadable, and every process of the starting tick counts as new.
    pub last_pid: Option<Pid>,
}

impl Since {
    /// Born during the freeze: in a later tick, or in the same tick (ticks are 10 ms, a freeze
    /// can be shorter) with a pid handed out since (`now`: the pid counter now).
    fn born(&self, p: &Proc, now: Option<Pid>) -> bool {
        p.start_time > self.ticks
            || (p.start_time == self.ticks
                && match (self.last_pid, now) {
                    (Some(a), Some(b)) => crate::consistency::allocated_between(a, b, p.pid),
                    _ => true,
                })
    }
}

/// Live, untainted processes born during the freeze whose chain of such newcomers ends at the
/// init (`init`, or 1) or at a parent no longer there. `now`: the pid counter at the observation.
/// `own`: the init's own helper processes.
pub fn orphaned<'a>(
    snap: &'a Snapshot,
    tainted: &Tainted,
    since: &Since,
    now: Option<Pid>,
    init: Pid,
    own: &[Pid],
) -> Vec<&'a Proc> {
    let new =
        |p: &Proc| p.alive() && since.born(p, now) && !tainted.contains_key(&p.pid) && !own.contains(&p.pid);
    snap.procs
        .values()
        .filter(|p| new(p))
        .filter(|p| {
            let mut cur = *p;
            // Bounded by the snapshot: each hop moves to another process of it.
            for _ in 0..snap.procs.len() {
                match snap.procs.get(&cur.ppid) {
                    Some(parent) if new(parent) => cur = parent,
                    Some(parent) => return parent.pid == init || parent.pid == 1 || !parent.alive(),
                    None => return cur.ppid != 0,
                }
            }
            true
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::taint::Reason;

    fn proc(pid: Pid, ppid: Pid, start_time: u64) -> Proc {
        Proc {
            pid,
            ppid,
            pgid: pid,
            sid: pid,
            state: 'S',
            start_time,
            comm: String::new(),
            cmdline: Vec::new(),
            exe: None,
            loginuid: None,
            threads: Vec::new(),
        }
    }

    fn snap(ps: &[Proc]) -> Snapshot {
        Snapshot { procs: ps.iter().map(|p| (p.pid, p.clone())).collect() }
    }

    #[test]
    fn orphans_born_during_the_freeze_are_named_and_nothing_else() {
        let s = snap(&[
            proc(1, 0, 1),
            proc(10, 1, 5),    // a root service from before the freeze
            proc(11, 10, 120), // its child, born during the freeze: the service vouches for it
            proc(20, 1, 130),  // born during the freeze, reparented to the init: an orphan
            proc(21, 20, 131), // its child: named through it
            proc(30, 0, 140),  // entered from outside the namespace
            proc(40, 77, 150), // its parent is gone from the snapshot
            proc(50, 1, 99),   // born before the freeze
            proc(60, 1, 160),  // the init's own helper
            proc(70, 1, 170),  // the sandbox's: marked, killed by the freeze
        ]);
        let tainted: Tainted = [(70, vec![Reason::Uid])].into_iter().collect();
        let since = Since { ticks: 100, last_pid: Some(5) };
        let got: Vec<Pid> =
            orphaned(&s, &tainted, &since, Some(99), 1, &[60]).iter().map(|p| p.pid).collect();
        assert_eq!(got, vec![20, 21, 40]);
    }

    #[test]
    fn in_the_freezes_first_tick_the_pid_counter_decides() {
        let s = snap(&[proc(1, 0, 1), proc(8, 1, 100), proc(9, 1, 100)]);
        let since = Since { ticks: 100, last_pid: Some(8) };
        let got: Vec<Pid> =
            orphaned(&s, &Tainted::new(), &since, Some(9), 1, &[]).iter().map(|p| p.pid).collect();
        assert_eq!(got, vec![9], "8 was handed out before the freeze began");
        let unknown = Since { ticks: 100, last_pid: None };
        assert_eq!(orphaned(&s, &Tainted::new(), &unknown, Some(9), 1, &[]).len(), 2);
    }

    #[test]
    fn a_zombie_is_no_newcomer() {
        let mut z = proc(20, 1, 130);
        z.state = 'Z';
        let since = Since { ticks: 100, last_pid: None };
        assert!(orphaned(&snap(&[proc(1, 0, 1), z]), &Tainted::new(), &since, None, 1, &[]).is_empty());
    }
}

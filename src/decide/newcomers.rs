//! Processes that appeared during a freeze with no parent left to vouch for them.
//!
//! A freeze stops the sandbox, but a process can restart itself (a SIGCONT timer) between the
//! stop and the kill. If it holds root through a setuid helper, it can become root for good, fork
//! a child into a session of its own and exit: `kill(-1)` as the sandbox UID no longer reaches
//! the child, no observation saw it, its parent is gone and, without lineage, nothing marks it.
//! Such a child cannot be told from a root daemon that double-forked at the same moment, so the
//! proof refuses to certify while one lives: a failed freeze, never a marker with a survivor.
//!
//! A newcomer whose parent predates the freeze and lives is that parent's (if the parent were
//! the sandbox's, ancestry would mark the child), with one exception: `clone(CLONE_PARENT)` makes
//! the child a child of its creator's parent, and the child of an escapee that exits goes to the
//! nearest subreaper above it: both parents live and predate the freeze. So a parent seen above a sandbox process that lineage
//! does not follow vouches for nothing ([`Ancestry`]), and where such a process came in from
//! outside the PID namespace (ppid 0, `docker exec -u`), neither does the outside: a newcomer with
//! ppid 0 is refused too. Processes entered from outside otherwise (the orchestrator's own
//! `docker exec`, the freeze client) are not orphans.

use crate::decide::taint::{Reason, Tainted};
use crate::kernel::process::Pid;
use crate::observe::procs::model::Proc;
use crate::observe::procs::table::Table;
use crate::state::launches::Launch;
use std::collections::{HashMap, HashSet};

/// When the freeze began: the boot clock in ticks (stat's start-time unit), and what tells the
/// processes of that tick apart.
pub struct Since {
    pub ticks: u64,
    /// The pidfs identity of a kernel pid object made at the start (`consistency::start_identity`):
    /// a process of the starting tick is new if its own is greater. None where the kernel gives no
    /// such order; then the pid counter decides.
    pub order: Option<u64>,
    /// The pid counter at the start. None: unreadable, and every process of the starting tick
    /// counts as new.
    pub last_pid: Option<Pid>,
}

impl Since {
    /// The start, now: the clock first, then the identity and the counter. A process made after
    /// them started in the clock's tick or later, so it is new by its tick or, in that same tick,
    /// by its order; one made between the clock and them may count as old, and was made before
    /// the start. (The other way round, a process made after the identity but stamped in the tick
    /// before the clock's would count as old.) An unreadable clock makes every process count as
    /// born during the freeze (more refusals, never fewer).
    pub fn take(reader: &crate::observe::procs::reader::Reader) -> Since {
        let ticks = crate::kernel::process::boot_ticks().unwrap_or(0);
        // Where identities exist but none could be had now (no pid free for a thread), every
        // process of the starting tick counts as new. On a 64-bit build on Linux 6.9 or later both
        // sides are true, so `||` for `&&` differs only without pidfs identities or on 32 bits
        // (docs/testing.md, mutation testing).
        let order = crate::observe::consistency::start_identity(reader).or_else(|| {
            (cfg!(target_pointer_width = "64") && crate::observe::consistency::identities()).then_some(0)
        });
        let last_pid = crate::observe::consistency::last_pid(reader.root()).ok();
        Since { ticks, order, last_pid }
    }

    /// Born during the freeze: in a later tick, or in the same tick (ticks are 10 ms, a freeze
    /// can be shorter) and made after the start. The identity orders processes exactly. The
    /// counter (`now`: the counter at the observation) only says the pid was not handed out in
    /// between if it went less than once round, which a nearly full pid space does not promise
    /// (see consistency): kernels without pidfs rely on that.
    pub fn born(&self, p: &Proc, now: Option<Pid>) -> bool {
        p.start_time > self.ticks
            || (p.start_time == self.ticks
                && match (self.order, self.last_pid, now) {
                    (Some(o), _, _) => crate::observe::consistency::made_after(p.pid, p.start_time, o),
                    (None, Some(a), Some(b)) => crate::observe::consistency::allocated_between(a, b, p.pid),
                    _ => true,
                })
    }
}

/// What the launch records (and the init's own start of the command) say, kept for as long as
/// each launcher lives: who started sandbox processes, and since when a launch that lineage
/// does not follow and that a setuid binary can make root ("unfollowed") may have handed a
/// child to it. Such a child may be born long before a freeze and never be observed as the
/// sandbox's: the proof refuses every untainted child of such a parent born since, whatever its
/// age ([`unfollowed_children`]).
#[derive(Debug, Default, Clone)]
pub struct Launchers {
    /// (pid, start time) of each launcher → the start tick of its first unfollowed launch.
    by_launcher: HashMap<(Pid, u64), Option<u64>>,
    /// A launch came from outside the PID namespace; Some: an unfollowed one, since that tick.
    outside: Option<Option<u64>>,
    /// An unfollowed launch anywhere, since that tick: its children that it leaves behind go to
    /// the init (or the nearest subreaper above it) when it exits.
    init_since: Option<u64>,
    /// Launches lineage follows: the process carries the sandbox loginuid from before its record
    /// was sent, even where an observation read it before it set it.
    followed: HashSet<(Pid, u64)>,
}

fn earliest(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, y) => x.or(y),
    }
}

impl Launchers {
    /// Take in one launch; its process itself is the policy's to remember (history).
    pub fn add(&mut self, l: &Launch) {
        if l.lineage {
            self.followed.insert((l.pid, l.start_time));
        }
        let since = l.unfollowed().then_some(l.start_time);
        if l.ppid == 0 {
            self.outside = Some(earliest(self.outside.flatten(), since));
        } else {
            let e = self.by_launcher.entry((l.ppid, l.parent_start_time)).or_insert(None);
            *e = earliest(*e, since);
        }
        self.init_since = earliest(self.init_since, since);
    }

    /// A process above the launcher of an unfollowed launch (a subreaper may be among them).
    pub fn add_above(&mut self, pid: Pid, start_time: u64, since: u64) {
        let e = self.by_launcher.entry((pid, start_time)).or_insert(None);
        *e = earliest(*e, Some(since));
    }

    /// The command the init starts itself, as a launch by the init.
    pub fn add_command(&mut self, start_time: u64, unfollowed: bool) {
        if unfollowed {
            self.init_since = earliest(self.init_since, Some(start_time));
        }
    }

    /// Forget launchers that are gone: a later process with the same pid is another process.
    pub fn prune(&mut self, snap: &Table) {
        let live = |(pid, st): &(Pid, u64)| snap.get(pid).is_some_and(|p| p.start_time == *st);
        self.by_launcher.retain(|k, _| live(k));
        self.followed.retain(live);
    }

    /// Whether any launch so far may become root unseen.
    pub fn any_unfollowed(&self) -> bool {
        self.init_since.is_some()
    }

    /// Since when `parent` (None: the outside, ppid 0) may hold a child of an unfollowed launch;
    /// `init`: the init's pid.
    fn unfollowed_since(&self, parent: Option<&Proc>, init: Pid) -> Option<u64> {
        match parent {
            None => self.outside.flatten(),
            Some(p) if p.pid == init || p.pid == 1 => self.init_since,
            Some(p) => self.by_launcher.get(&(p.pid, p.start_time)).copied().flatten(),
        }
    }
}

/// A process of the init's own, by pid and start time: a later process with its pid is another
/// one, whatever its parent made it do.
pub type Own = (Pid, u64);

fn is_own(own: &[Own], p: &Proc) -> bool {
    own.contains(&(p.pid, p.start_time))
}

/// Live, untainted processes (not the init's own) whose parent may hold what an unfollowed launch
/// left behind and that were born since that launch: a launcher of one, the init, the outside.
/// Unlike [`orphaned`] this looks at processes of any age: an escape before the freeze leaves the
/// same child as one during it. A launcher's other children, a root daemon that daemonized since,
/// an orchestrator's `docker exec` are named too: they cannot be told apart from an escapee's.
pub fn unfollowed_children<'a>(
    snap: &'a Table,
    tainted: &Tainted,
    launchers: &Launchers,
    init: Pid,
    own: &[Own],
) -> Vec<&'a Proc> {
    if !launchers.any_unfollowed() {
        return Vec::new();
    }
    snap.values()
        .filter(|p| p.alive() && p.pid != init && !tainted.contains_key(&p.pid) && !is_own(own, p))
        .filter(|p| {
            let parent = if p.ppid == 0 { None } else { snap.get(&p.ppid) };
            // A parent gone from the table, or read dead (the table reads each process at its own
            // moment: a child read before its parent exited still names it): nothing vouches,
            // and an escapee that exited is one. Its children belong to the init or a subreaper
            // by now, whatever the entry says.
            if p.ppid != 0 && !parent.is_some_and(|q| q.alive()) {
                return launchers.init_since.is_some_and(|t| p.start_time >= t);
            }
            // The init's own processes (the command, a worker, the freeze client) vouch for no
            // child born since an unfollowed launch: a root escapee's CLONE_PARENT child of one
            // of them has it as its parent.
            if parent.is_some_and(|q| is_own(own, q)) {
                return launchers.init_since.is_some_and(|t| p.start_time >= t);
            }
            launchers.unfollowed_since(parent, init).is_some_and(|t| p.start_time >= t)
        })
        .collect()
}

/// The processes seen, during one freeze, above a sandbox process whose descendants lineage does
/// not mark (its loginuid is not the sandbox's: lineage off, or entered with `docker exec -u`).
/// A child such a process makes with CLONE_PARENT, or leaves to a subreaper above it, has one of
/// these as its parent, and nothing else marks it.
#[derive(Default)]
pub struct Ancestry {
    /// (pid, start time): a later process with the same pid is another process.
    above: HashSet<(Pid, u64)>,
    /// Such a process's chain ended at a process entered from outside (ppid 0, not the init).
    outside: bool,
    /// Launches lineage follows (see [`Launchers`]).
    followed: HashSet<(Pid, u64)>,
}

impl Ancestry {
    /// What the launch records say: the launcher of an unfollowed launch is above it whether or
    /// not an observation saw the launch under it, and so is the outside. (A followed launch's
    /// children carry its loginuid: its launcher's new children are the launcher's own.)
    pub fn from_launchers(l: &Launchers) -> Ancestry {
        Ancestry {
            above: l.by_launcher.iter().filter(|(_, since)| since.is_some()).map(|(k, _)| *k).collect(),
            outside: l.outside.flatten().is_some(),
            followed: l.followed.clone(),
        }
    }

    /// Count the outside as above a sandbox process: lineage off while a setuid binary can make a
    /// process entered with `docker exec -u` root, so one may have come from there unseen.
    pub fn suspect_outside(&mut self) {
        self.outside = true;
    }

    /// Add what one observation shows. Every observation of the freeze is noted: a chain can
    /// change between them (a parent exits, its children move to a subreaper).
    pub fn note(&mut self, snap: &Table, tainted: &Tainted, init: Pid) {
        let mut walked: HashSet<Pid> = HashSet::new();
        for (pid, why) in tainted {
            if why.contains(&Reason::Lineage) {
                continue;
            }
            let Some(mut cur) = snap.get(pid) else { continue };
            // A followed launch read before it tagged itself (as root, in transit) is lineage's.
            if self.followed.contains(&(cur.pid, cur.start_time)) {
                continue;
            }
            // Bounded by the table: each hop moves to another process of it, once per call.
            for _ in 0..=snap.len() {
                if cur.ppid == 0 {
                    self.outside |= cur.pid != init && cur.pid != 1;
                    break;
                }
                let Some(parent) = snap.get(&cur.ppid) else { break };
                self.above.insert((parent.pid, parent.start_time));
                if !walked.insert(parent.pid) {
                    break;
                }
                cur = parent;
            }
        }
    }

    fn vouches(&self, parent: &Proc) -> bool {
        !self.above.contains(&(parent.pid, parent.start_time))
    }
}

/// Live, untainted processes born during the freeze whose chain of such newcomers ends at the
/// init (`init`, or 1), at a parent no longer there, at a parent that [`Ancestry`] says cannot
/// vouch, or outside when a sandbox process came from there. `now`: the pid counter at the
/// observation. `own`: the init's own helper processes.
pub fn orphaned<'a>(
    snap: &'a Table,
    tainted: &Tainted,
    ancestry: &Ancestry,
    since: &Since,
    now: Option<Pid>,
    init: Pid,
    own: &[Own],
) -> Vec<&'a Proc> {
    let new = |p: &Proc| p.alive() && since.born(p, now) && !tainted.contains_key(&p.pid) && !is_own(own, p);
    snap.values()
        .filter(|p| new(p))
        .filter(|p| {
            let mut cur = *p;
            // Bounded by the table: each hop moves to another process of it.
            for _ in 0..snap.len() {
                match snap.get(&cur.ppid) {
                    Some(parent) if new(parent) => cur = parent,
                    Some(parent) => {
                        return parent.pid == init
                            || parent.pid == 1
                            || !parent.alive()
                            || !ancestry.vouches(parent)
                    }
                    None => return cur.ppid != 0 || ancestry.outside,
                }
            }
            true
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::taint::Reasons;

    fn proc(pid: Pid, ppid: Pid, start_time: u64) -> Proc {
        Proc::fixture(pid, ppid, start_time, 0)
    }

    fn snap(ps: &[Proc]) -> Table {
        Table::of(ps)
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
            proc(40, 77, 150), // its parent is gone from the table
            proc(50, 1, 99),   // born before the freeze
            proc(60, 1, 160),  // the init's own helper
            proc(70, 1, 170),  // the sandbox's: marked, killed by the freeze
        ]);
        let tainted: Tainted = [(70, Reasons::of(&[Reason::Uid]))].into_iter().collect();
        let since = Since { ticks: 100, order: None, last_pid: Some(5) };
        let got: Vec<Pid> = orphaned(&s, &tainted, &Ancestry::default(), &since, Some(99), 1, &[(60, 160)])
            .iter()
            .map(|p| p.pid)
            .collect();
        assert_eq!(got, vec![20, 21, 40]);
        // Another process with the helper's pid is not the helper.
        let got: Vec<Pid> = orphaned(&s, &tainted, &Ancestry::default(), &since, Some(99), 1, &[(60, 159)])
            .iter()
            .map(|p| p.pid)
            .collect();
        assert_eq!(got, vec![20, 21, 40, 60]);
    }

    #[test]
    fn in_the_freezes_first_tick_the_pid_counter_decides() {
        let s = snap(&[proc(1, 0, 1), proc(8, 1, 100), proc(9, 1, 100)]);
        let since = Since { ticks: 100, order: None, last_pid: Some(8) };
        let got: Vec<Pid> = orphaned(&s, &Tainted::new(), &Ancestry::default(), &since, Some(9), 1, &[])
            .iter()
            .map(|p| p.pid)
            .collect();
        assert_eq!(got, vec![9], "8 was handed out before the freeze began");
        let unknown = Since { ticks: 100, order: None, last_pid: None };
        assert_eq!(orphaned(&s, &Tainted::new(), &Ancestry::default(), &unknown, Some(9), 1, &[]).len(), 2);
    }

    #[test]
    fn in_the_freezes_first_tick_a_processs_identity_decides_where_the_kernel_gives_one() {
        let Some(order) =
            Since::take(&crate::observe::procs::reader::Reader::default()).order.filter(|&o| o > 0)
        else {
            crate::observe::consistency::skip_test(
                "in_the_freezes_first_tick_a_processs_identity_decides_where_the_kernel_gives_one",
                "no ordered pidfs identities on this kernel: the counter decides",
            );
            return;
        };
        let reader = crate::observe::procs::reader::Reader::default();
        let me = crate::kernel::process::getpid();
        let mine = reader.start_time(me).unwrap().unwrap();
        let mut child = std::process::Command::new("sleep").arg("10").spawn().unwrap();
        let kid = child.id() as Pid;
        let theirs = reader.start_time(kid).unwrap().unwrap();
        let at = |ticks| Since { ticks, order: Some(order), last_pid: None };
        assert!(!at(mine).born(&proc(me, 1, mine), None), "made before the start");
        assert!(at(theirs).born(&proc(kid, me, theirs), None), "made after the start");
        // The counter alone: back at the child's pid, as in a pid space full but one, it says
        // the child's pid was not handed out since.
        let counter = Since { ticks: theirs, order: None, last_pid: Some(kid) };
        assert!(!counter.born(&proc(kid, me, theirs), Some(kid)));
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn a_zombie_is_no_newcomer() {
        let mut z = proc(20, 1, 130);
        z.state = 'Z';
        z.threads.clear();
        let since = Since { ticks: 100, order: None, last_pid: None };
        assert!(orphaned(
            &snap(&[proc(1, 0, 1), z]),
            &Tainted::new(),
            &Ancestry::default(),
            &since,
            None,
            1,
            &[]
        )
        .is_empty());
    }

    #[test]
    fn a_parent_above_a_sandbox_process_vouches_for_nothing() {
        // 10: a root launcher of 20 (the sandbox's, lineage off); 30: a root service beside it.
        let s = snap(&[
            proc(1, 0, 1),
            proc(10, 1, 5),
            proc(20, 10, 6),
            proc(30, 1, 7),
            proc(40, 10, 120), // born during the freeze under the launcher (CLONE_PARENT)
            proc(50, 30, 130), // born during the freeze under the service
        ]);
        let tainted: Tainted = [(20, Reasons::of(&[Reason::Uid]))].into_iter().collect();
        let mut a = Ancestry::default();
        a.note(&s, &tainted, 1);
        let since = Since { ticks: 100, order: None, last_pid: Some(5) };
        let got: Vec<Pid> =
            orphaned(&s, &tainted, &a, &since, Some(99), 1, &[]).iter().map(|p| p.pid).collect();
        assert_eq!(got, vec![40]);
        // The same chain followed by lineage: every child of 20 carries its loginuid.
        let lineage: Tainted = [(20, Reasons::of(&[Reason::Uid, Reason::Lineage]))].into_iter().collect();
        let mut a = Ancestry::default();
        a.note(&s, &lineage, 1);
        assert!(orphaned(&s, &lineage, &a, &since, Some(99), 1, &[]).is_empty());
        // Another process with the launcher's pid is another process.
        let mut later = s.clone();
        later.insert(10, proc(10, 1, 50));
        assert!(orphaned(&later, &tainted, &a, &since, Some(99), 1, &[]).iter().all(|p| p.pid != 40));
    }

    #[test]
    fn a_newcomer_from_outside_counts_once_a_sandbox_process_came_from_there() {
        let s = snap(&[
            proc(1, 0, 1),
            proc(20, 1, 6),   // started by the init
            proc(30, 0, 140), // entered from outside during the freeze
        ]);
        let since = Since { ticks: 100, order: None, last_pid: Some(5) };
        let by_init: Tainted = [(20, Reasons::of(&[Reason::Uid]))].into_iter().collect();
        let mut a = Ancestry::default();
        a.note(&s, &by_init, 1);
        assert!(orphaned(&s, &by_init, &a, &since, Some(99), 1, &[]).is_empty());
        let mut entered = s.clone();
        entered.insert(21, proc(21, 0, 8)); // `docker exec -u`: a sandbox process from outside
        let from_outside: Tainted = [(21, Reasons::of(&[Reason::Uid]))].into_iter().collect();
        a.note(&entered, &from_outside, 1);
        let got: Vec<Pid> =
            orphaned(&entered, &from_outside, &a, &since, Some(99), 1, &[]).iter().map(|p| p.pid).collect();
        assert_eq!(got, vec![30]);
    }

    #[test]
    fn a_parent_read_dead_vouches_for_nothing_since_an_unfollowed_launch() {
        use crate::state::launches::Launch;
        // 20: an unfollowed launch at tick 50 under the init; 60: a root process it left (born
        // since), which the table read alive with parent 70; 70 read afterwards, dead. 70 is no
        // launcher, so alive it would vouch (it is refused itself); dead, its child is the init's.
        let mut dead = proc(70, 1, 55);
        dead.state = 'Z';
        dead.threads[0].state = 'Z';
        let s = snap(&[proc(1, 0, 1), proc(20, 1, 50), dead, proc(60, 70, 56), proc(61, 70, 40)]);
        let tainted: Tainted = [(20, Reasons::of(&[Reason::History]))].into_iter().collect();
        let mut l = Launchers::default();
        l.add(&Launch {
            pid: 20,
            start_time: 50,
            ppid: 1,
            parent_start_time: 1,
            lineage: false,
            setuid: true,
        });
        let got: Vec<Pid> = unfollowed_children(&s, &tainted, &l, 1, &[]).iter().map(|p| p.pid).collect();
        assert_eq!(got, vec![60], "born since the launch under a dead parent; 61 is from before it");
        let mut alive = s.clone();
        alive.insert(70, proc(70, 1, 55));
        let got: Vec<Pid> = unfollowed_children(&alive, &tainted, &l, 1, &[]).iter().map(|p| p.pid).collect();
        assert_eq!(got, vec![70], "alive, the parent is refused itself and vouches for its child");
    }

    #[test]
    fn an_unfollowed_launch_leaves_its_launcher_the_init_and_the_outside_unable_to_vouch_since_it() {
        use crate::state::launches::Launch;
        // 10: a root launcher; 20: its unfollowed launch at tick 50; 30: a root service beside it.
        let s = snap(&[
            proc(1, 0, 1),
            proc(10, 1, 5),
            proc(20, 10, 50),
            proc(30, 1, 7),
            proc(11, 10, 40), // the launcher's child from before the launch
            proc(12, 10, 60), // born under the launcher since: an escape's child, or its own
            proc(31, 30, 70), // the service's child: the service vouches
            proc(40, 1, 80),  // handed to the init since
            proc(41, 1, 45),  // a daemon from before the launch
            proc(50, 0, 90),  // entered from outside since; no launch came from there
        ]);
        let tainted: Tainted = [(20, Reasons::of(&[Reason::History]))].into_iter().collect();
        let launch =
            Launch { pid: 20, start_time: 50, ppid: 10, parent_start_time: 5, lineage: false, setuid: true };
        let mut l = Launchers::default();
        let got = |l: &Launchers, own: &[Own]| -> Vec<Pid> {
            unfollowed_children(&s, &tainted, l, 1, own).iter().map(|p| p.pid).collect()
        };
        l.add(&Launch { setuid: false, ..launch.clone() });
        l.add(&Launch { lineage: true, ..launch.clone() });
        assert!(got(&l, &[]).is_empty(), "followed or setuid-less launches leave nothing unseen");
        l.add(&launch);
        assert_eq!(got(&l, &[]), vec![12, 40]);
        assert_eq!(got(&l, &[(40, 80)]), vec![12], "the init's own helpers and the freeze client");
        assert_eq!(
            got(&l, &[(40, 79)]),
            vec![12, 40],
            "a later process with the client's pid is another one"
        );
        l.add(&Launch { pid: 21, start_time: 85, ppid: 0, parent_start_time: 0, ..launch.clone() });
        assert_eq!(got(&l, &[]), vec![12, 40, 50]);
        // The launcher gone, a later process with its pid is another process.
        let mut later = s.clone();
        later.insert(10, proc(10, 1, 95));
        l.prune(&later);
        assert!(!unfollowed_children(&later, &tainted, &l, 1, &[]).iter().any(|p| p.pid == 12));
        // The launch's launcher is above it for newcomers during the freeze, unobserved.
        let a = Ancestry::from_launchers(&Launchers {
            by_launcher: [((10, 5), Some(50))].into(),
            ..Default::default()
        });
        assert!(!a.vouches(&proc(10, 1, 5)));
        assert!(a.vouches(&proc(30, 1, 7)));
    }

    #[test]
    fn a_followed_launch_read_before_it_tagged_itself_leaves_the_outside_vouching() {
        use crate::state::launches::Launch;
        // 20: `quiesce exec` entered from outside, read while still root and untagged, held as
        // the sandbox's by its record (history); 30: another client entered during the freeze.
        let s = snap(&[proc(1, 0, 1), proc(20, 0, 50), proc(30, 0, 140)]);
        let tainted: Tainted = [(20, Reasons::of(&[Reason::History]))].into_iter().collect();
        let mut l = Launchers::default();
        l.add(&Launch {
            pid: 20,
            start_time: 50,
            ppid: 0,
            parent_start_time: 0,
            lineage: true,
            setuid: true,
        });
        let mut a = Ancestry::from_launchers(&l);
        a.note(&s, &tainted, 1);
        let since = Since { ticks: 100, order: None, last_pid: Some(5) };
        assert!(orphaned(&s, &tainted, &a, &since, Some(99), 1, &[]).is_empty());
        // Without the record's word, the same read counts the outside as a sandbox process's.
        let mut b = Ancestry::default();
        b.note(&s, &tainted, 1);
        assert_eq!(orphaned(&s, &tainted, &b, &since, Some(99), 1, &[]).len(), 1);
        // The record counts while its process lives, and is forgotten once another has its pid.
        let orphans = |l: &Launchers| {
            let mut a = Ancestry::from_launchers(l);
            a.note(&s, &tainted, 1);
            orphaned(&s, &tainted, &a, &since, Some(99), 1, &[]).len()
        };
        l.prune(&s);
        assert_eq!(orphans(&l), 0, "alive, its record still says lineage follows it");
        let mut gone = s.clone();
        gone.insert(20, proc(20, 0, 60));
        l.prune(&gone);
        assert_eq!(orphans(&l), 1, "another process with its pid is not followed");
    }

    #[test]
    fn a_launch_is_unfollowed_only_with_setuid_and_without_lineage() {
        use crate::state::launches::Launch;
        let launch =
            Launch { pid: 20, start_time: 50, ppid: 10, parent_start_time: 5, lineage: true, setuid: true };
        let mut l = Launchers::default();
        assert!(!l.any_unfollowed());
        l.add(&launch);
        l.add(&Launch { lineage: false, setuid: false, ..launch.clone() });
        l.add_command(40, false);
        assert!(!l.any_unfollowed(), "followed, or no setuid: nothing becomes root unseen");
        l.add_command(40, true);
        assert!(l.any_unfollowed(), "the init's own command, unfollowed");
    }

    #[test]
    fn the_init_s_command_unfollowed_leaves_the_init_unable_to_vouch_since_it_started() {
        // In a sidecar the init is not PID 1: both it (7) and PID 1 hold what an escape leaves.
        let s = snap(&[proc(1, 0, 1), proc(7, 1, 2), proc(20, 7, 40), proc(30, 7, 30), proc(31, 1, 45)]);
        let tainted: Tainted = [(20, Reasons::of(&[Reason::History]))].into_iter().collect();
        let mut l = Launchers::default();
        l.add_command(40, true);
        let got: Vec<Pid> = unfollowed_children(&s, &tainted, &l, 7, &[]).iter().map(|p| p.pid).collect();
        assert_eq!(got, vec![31], "born since the command under PID 1; 30 is from before it");
        let mut under_init = s.clone();
        under_init.insert(32, proc(32, 7, 41));
        let got: Vec<Pid> =
            unfollowed_children(&under_init, &tainted, &l, 7, &[]).iter().map(|p| p.pid).collect();
        assert_eq!(got, vec![31, 32], "and under the init itself");
    }

    #[test]
    fn a_process_above_an_unfollowed_launch_vouches_for_nothing_born_since_while_it_lives() {
        // 10: a subreaper above the launcher of an unfollowed launch at tick 50.
        let s = snap(&[proc(1, 0, 1), proc(10, 1, 5), proc(11, 10, 40), proc(12, 10, 60)]);
        let mut l = Launchers::default();
        l.add_above(10, 5, 50);
        l.add_command(50, true);
        let got: Vec<Pid> =
            unfollowed_children(&s, &Tainted::new(), &l, 1, &[]).iter().map(|p| p.pid).collect();
        assert_eq!(got, vec![12]);
        // Alive, it stays above; gone, a later process with its pid is another one.
        l.prune(&s);
        assert!(!Ancestry::from_launchers(&l).vouches(&proc(10, 1, 5)));
        let mut later = s.clone();
        later.insert(10, proc(10, 1, 95));
        l.prune(&later);
        assert!(Ancestry::from_launchers(&l).vouches(&proc(10, 1, 5)));
        assert!(unfollowed_children(&later, &Tainted::new(), &l, 1, &[]).iter().all(|p| p.pid != 12));
    }

    #[test]
    fn the_outside_suspected_vouches_for_no_newcomer_from_there() {
        let s = snap(&[proc(1, 0, 1), proc(30, 0, 140)]);
        let since = Since { ticks: 100, order: None, last_pid: Some(5) };
        let mut a = Ancestry::default();
        assert!(orphaned(&s, &Tainted::new(), &a, &since, Some(99), 1, &[]).is_empty());
        a.suspect_outside();
        let got: Vec<Pid> =
            orphaned(&s, &Tainted::new(), &a, &since, Some(99), 1, &[]).iter().map(|p| p.pid).collect();
        assert_eq!(got, vec![30]);
    }

    #[test]
    fn every_process_above_a_sandbox_process_is_noted_and_pid_1_is_no_outside() {
        // A sidecar (init 7): PID 1 -> 10 -> 15 -> 20, the sandbox's, lineage off.
        let s = snap(&[
            proc(1, 0, 1),
            proc(7, 1, 2),
            proc(10, 1, 5),
            proc(15, 10, 6),
            proc(20, 15, 7),
            proc(40, 10, 120), // born during the freeze under the grandparent
            proc(50, 0, 130),  // entered from outside during the freeze
        ]);
        let tainted: Tainted = [(20, Reasons::of(&[Reason::Uid]))].into_iter().collect();
        let mut a = Ancestry::default();
        a.note(&s, &tainted, 7);
        assert!(!a.vouches(&proc(15, 10, 6)) && !a.vouches(&proc(10, 1, 5)) && !a.vouches(&proc(1, 0, 1)));
        let since = Since { ticks: 100, order: None, last_pid: Some(5) };
        let got: Vec<Pid> =
            orphaned(&s, &tainted, &a, &since, Some(99), 7, &[]).iter().map(|p| p.pid).collect();
        assert_eq!(got, vec![40], "PID 1 ends the chain: the outside is not above it");
    }

    #[test]
    fn a_child_of_the_init_s_own_vouched_for_only_before_an_unfollowed_launch() {
        // 40: the freeze client (the init's own); 41 born under it before the launch, 42 since.
        let s = snap(&[proc(1, 0, 1), proc(40, 0, 30), proc(41, 40, 45), proc(42, 40, 55)]);
        let mut l = Launchers::default();
        l.add_command(50, true);
        let got: Vec<Pid> =
            unfollowed_children(&s, &Tainted::new(), &l, 1, &[(40, 30)]).iter().map(|p| p.pid).collect();
        assert_eq!(got, vec![42]);
    }

    #[test]
    fn a_newcomer_under_pid_1_the_init_or_a_dead_parent_is_an_orphan() {
        // A sidecar (init 7). 60: under PID 1; 61: under the init; 71: under 70, read dead.
        let mut dead = proc(70, 1, 8);
        dead.state = 'Z';
        dead.threads[0].state = 'Z';
        let s = snap(&[
            proc(1, 0, 1),
            proc(7, 1, 2),
            proc(10, 1, 5),
            proc(11, 10, 120), // under a root service from before the freeze: vouched for
            proc(60, 1, 140),
            proc(61, 7, 141),
            dead,
            proc(71, 70, 150),
        ]);
        let since = Since { ticks: 100, order: None, last_pid: Some(5) };
        let got: Vec<Pid> = orphaned(&s, &Tainted::new(), &Ancestry::default(), &since, Some(99), 7, &[])
            .iter()
            .map(|p| p.pid)
            .collect();
        assert_eq!(got, vec![60, 61, 71]);
    }
}

//! Who counts as a sandbox process. Any one reason is enough; names are never looked at.

use crate::kernel::process::Pid;
use crate::observe::procs::model::Proc;
use crate::observe::procs::table::Table;
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Reason {
    /// Some UID (real, effective, saved, fs) of some thread is a sandbox UID.
    Uid,
    /// Its parent chain reaches a sandbox process.
    Ancestry,
    /// Its audit login UID, set once at a sandbox launch and inherited, is a sandbox UID.
    Lineage,
    /// The init once saw it as a sandbox process.
    History,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Uid => "uid",
            Reason::Ancestry => "ancestry",
            Reason::Lineage => "lineage",
            Reason::History => "history",
        }
    }
}

/// The reasons that make one process a sandbox process: a set of `Reason`s in one byte, listed
/// in `Reason`'s order.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Reasons(u8);

const ALL: [Reason; 4] = [Reason::Uid, Reason::Ancestry, Reason::Lineage, Reason::History];

impl Reasons {
    #[cfg(test)]
    pub fn of(rs: &[Reason]) -> Reasons {
        let mut out = Reasons::default();
        rs.iter().for_each(|&r| out.push(r));
        out
    }

    pub fn push(&mut self, r: Reason) {
        self.0 |= 1 << r as u8;
    }

    pub fn contains(&self, r: &Reason) -> bool {
        self.0 & (1 << *r as u8) != 0
    }

    pub fn is_empty(&self) -> bool {
        self.0 == 0
    }

    /// The reasons in `Reason`'s order.
    pub fn iter(self) -> impl Iterator<Item = Reason> {
        ALL.into_iter().filter(move |r| self.contains(r))
    }
}

impl std::fmt::Debug for Reasons {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl PartialEq<Vec<Reason>> for Reasons {
    fn eq(&self, other: &Vec<Reason>) -> bool {
        self.iter().eq(other.iter().copied())
    }
}

/// The identities (pid, start time) the init once saw as sandbox processes, sorted: 16 bytes
/// each (a hash set's table cost more than twice that).
#[derive(Debug, Default, Clone)]
pub struct History(Vec<(Pid, u64)>);

impl History {
    pub fn contains(&self, id: &(Pid, u64)) -> bool {
        self.0.binary_search(id).is_ok()
    }

    /// Add one identity (a launch record: one at a time).
    pub fn insert(&mut self, id: (Pid, u64)) {
        if let Err(i) = self.0.binary_search(&id) {
            self.0.insert(i, id);
        }
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    #[allow(dead_code)] // the pair clippy asks of a public `len`
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn retain(&mut self, keep: impl FnMut(&(Pid, u64)) -> bool) {
        self.0.retain(keep);
    }

    /// Add many identities in one sort.
    fn extend(&mut self, ids: Vec<(Pid, u64)>) {
        if ids.is_empty() {
            return;
        }
        self.0.reserve_exact(ids.len());
        self.0.extend(ids);
        self.0.sort_unstable();
        self.0.dedup();
    }
}

/// The loginuid a launch writes where the sandbox is defined by lineage alone: no process here
/// has one unless quiesce wrote it (the init refuses to start where it inherited one), so the
/// value only has to be a UID the container's user namespace maps (Docker's and rootless
/// engines' maps of 65,536 UIDs both hold it); the process's own UIDs play no part.
pub const LINEAGE_TAG: u32 = 65533;

/// The policy: sandbox UIDs, whether a loginuid means a sandbox launch, and the identities
/// (pid, start time) remembered as tainted.
#[derive(Debug, Default, Clone)]
pub struct Policy {
    /// A process holding one of these UIDs is a sandbox process (and kill(-1) is sent as each).
    /// Empty where the sandbox is defined by lineage alone (`--sandbox-lineage`).
    pub uids: Vec<u32>,
    /// The loginuids a sandbox launch writes: the sandbox UIDs, or the lineage tag alone.
    pub tags: Vec<u32>,
    /// A loginuid counts only where quiesce is the one that wrote it: off when the init itself
    /// inherited a loginuid (every process of the container then carries it) or --no-lineage.
    pub lineage: bool,
    pub history: History,
}

/// The sandbox processes of an observation, by pid, with their reasons.
pub type Tainted = BTreeMap<Pid, Reasons>;

impl Policy {
    /// Sandbox users: a process is the sandbox's by its UIDs, or by the loginuid a launch as
    /// one of them wrote.
    pub fn new(uids: Vec<u32>, lineage: bool) -> Policy {
        Policy { tags: uids.clone(), uids, lineage, history: History::default() }
    }

    /// A sandbox of lineage alone: a process is the sandbox's by the loginuid `tag` its launch
    /// wrote (or its ancestry, or history), whatever its UIDs, root included.
    pub fn lineage_only(tag: u32) -> Policy {
        Policy { uids: Vec::new(), tags: vec![tag], lineage: true, history: History::default() }
    }

    /// The sandbox is defined by lineage alone.
    pub fn by_lineage(&self) -> bool {
        self.uids.is_empty() && self.lineage
    }

    fn direct(&self, p: &Proc) -> Reasons {
        let mut r = Reasons::default();
        if p.all_uids().any(|u| self.uids.contains(&u)) {
            r.push(Reason::Uid);
        }
        if self.lineage && p.loginuid.is_some_and(|u| self.tags.contains(&u)) {
            r.push(Reason::Lineage);
        }
        if self.history.contains(&(p.pid, p.start_time)) {
            r.push(Reason::History);
        }
        r
    }

    /// Classify every process of the table. The init (pid 1 / ourselves) is never tainted.
    /// The work lists run beside the table, one byte per process, in its order.
    pub fn classify(&self, snap: &Table) -> Tainted {
        let me = crate::kernel::process::getpid();
        let direct: Vec<Reasons> =
            snap.values().map(|p| if p.pid == me { Reasons::default() } else { self.direct(p) }).collect();
        let ancestry = tainted_ancestors(snap, &direct, me);
        // In pid order: the map is built in one go, its nodes full.
        snap.values()
            .zip(direct)
            .zip(ancestry)
            .filter(|((p, _), _)| p.pid != me)
            .filter_map(|((p, mut reasons), above)| {
                if above {
                    reasons.push(Reason::Ancestry);
                }
                (!reasons.is_empty()).then_some((p.pid, reasons))
            })
            .collect()
    }

    /// Remember every tainted process so that it stays tainted after it escapes its lineage.
    pub fn remember(&mut self, snap: &Table, tainted: &Tainted) {
        // Forget identities that no longer exist, so the table stays as small as the namespace.
        self.history.retain(|(pid, st)| snap.get(pid).is_some_and(|p| p.start_time == *st));
        let new: Vec<(Pid, u64)> = tainted
            .keys()
            .filter_map(|pid| snap.get(pid))
            .map(|p| (p.pid, p.start_time))
            .filter(|id| !self.history.contains(id))
            .collect();
        self.history.extend(new);
    }
}

/// For every process of the table, in its order: does its parent chain reach a process with a
/// direct reason? Each process is settled once (a 4,096-deep chain must not cost a walk up the
/// chain per process). The chain stops at the init, at a parent outside the table, and after as
/// many steps as the table has (a cycle, from pid reuse between reads).
fn tainted_ancestors(t: &Table, direct: &[Reasons], me: Pid) -> Vec<bool> {
    let mut memo: Vec<Option<bool>> = vec![None; t.len()];
    let tainted = |i: usize| !direct[i].is_empty();
    let mut chain: Vec<usize> = Vec::new();
    for start in 0..t.len() {
        chain.clear();
        let mut cur = start;
        let mut top = false;
        while chain.len() <= t.len() {
            if let Some(known) = memo[cur] {
                top = known || tainted(cur);
                break;
            }
            let parent = t.at(cur).ppid;
            chain.push(cur);
            if parent <= 0 || parent == me {
                break;
            }
            let Some(up) = t.position(parent) else { break };
            if tainted(up) {
                top = true;
                break;
            }
            cur = up;
        }
        // `top` answers for every process of the chain: only its first may have a direct
        // reason (a parent with one ends the walk before it is pushed), so what lies above each
        // is what lies above the last.
        for &idx in &chain {
            memo[idx].get_or_insert(top);
        }
    }
    memo.into_iter().map(|m| m.unwrap_or(false)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::procs::model::Thread;

    fn p(pid: Pid, ppid: Pid, uid: u32) -> Proc {
        Proc::fixture(pid, ppid, pid as u64 * 10, uid)
    }

    fn snap(ps: Vec<Proc>) -> Table {
        Table::of(&ps)
    }

    #[test]
    fn a_sandbox_of_lineage_alone_is_its_tagged_processes_and_what_they_start_whatever_the_uid() {
        let tagged = |pid, ppid, uid| {
            let mut q = p(pid, ppid, uid);
            q.loginuid = Some(65533);
            q
        };
        // 10: a root launch; 11, its child that became 4242; 12: a child of an untagged root
        // process under it (ancestry). 20: root, untagged; 21: 4242 untagged; 22: another tag.
        let mut other = p(22, 0, 0);
        other.loginuid = Some(4242);
        let s = snap(vec![
            tagged(10, 0, 0),
            tagged(11, 10, 4242),
            p(12, 11, 0),
            p(20, 0, 0),
            p(21, 0, 4242),
            other,
        ]);
        let pol = Policy::lineage_only(65533);
        assert!(pol.by_lineage() && !Policy::new(vec![4242], true).by_lineage());
        let t = pol.classify(&s);
        assert_eq!(t.keys().copied().collect::<Vec<_>>(), vec![10, 11, 12]);
        assert_eq!(t[&10], vec![Reason::Lineage]);
        assert_eq!(t[&12], vec![Reason::Ancestry]);
        // The tag counts only where lineage is followed.
        let off = Policy { lineage: false, ..Policy::lineage_only(65533) };
        assert!(off.classify(&s).is_empty());
    }

    #[test]
    fn reasons() {
        let mut thread_uid = p(20, 0, 0);
        thread_uid.threads.push(Thread {
            tid: 21,
            state: 'S',
            uids: [0, 4242, 0, 0],
            gids: [0; 4],
            creds: true,
        });
        let mut escapee = p(30, 1, 0);
        escapee.loginuid = Some(4242);
        let s = snap(vec![p(10, 0, 4242), p(11, 10, 0), p(12, 11, 0), p(13, 0, 0), thread_uid, escapee]);
        let mut pol = Policy::new(vec![4242], true);
        let t = pol.classify(&s);
        // Without lineage the loginuid means nothing.
        assert!(!Policy::new(vec![4242], false).classify(&s).contains_key(&30));
        assert_eq!(t[&10], vec![Reason::Uid]);
        assert_eq!(t[&11], vec![Reason::Ancestry]);
        assert_eq!(t[&12], vec![Reason::Ancestry]);
        assert!(!t.contains_key(&13));
        assert_eq!(t[&20], vec![Reason::Uid]);
        assert_eq!(t[&30], vec![Reason::Lineage]);

        // History: 11 escaped (its parent is gone, it is root); remembered, it stays tainted.
        pol.remember(&s, &t);
        let later = snap(vec![p(11, 1, 0), p(13, 0, 0)]);
        assert_eq!(pol.classify(&later)[&11], vec![Reason::History]);
        // Same pid, other start time: a different process, not tainted.
        let mut reused = p(11, 1, 0);
        reused.start_time += 1;
        assert!(pol.classify(&snap(vec![reused])).is_empty());
    }

    #[test]
    fn a_deep_chain_is_classified_once_per_process() {
        // 4,096 root processes, each the child of the one before, under one sandbox process.
        // Pids above any pid_max: the test's own pid (never classified) is not among them.
        const B: Pid = 5_000_000;
        let mut ps = vec![p(B, 0, 4242)];
        ps.extend((B + 1..B + 4097).map(|pid| p(pid, pid - 1, 0)));
        let t = Policy::new(vec![4242], true).classify(&snap(ps));
        assert_eq!(t.len(), 4097);
        assert_eq!(t[&B], vec![Reason::Uid]);
        assert!((B + 1..B + 4097).all(|pid| t[&pid] == vec![Reason::Ancestry]));
        // Below a root process that is not a sandbox process, nothing is tainted.
        let mut ps = vec![p(B, 0, 0)];
        ps.extend((B + 1..B + 4097).map(|pid| p(pid, pid - 1, 0)));
        assert!(Policy::new(vec![4242], true).classify(&snap(ps)).is_empty());
    }

    #[test]
    fn cycles_terminate() {
        let s = snap(vec![p(5, 6, 0), p(6, 5, 0)]);
        assert!(Policy::new(vec![4242], true).classify(&s).is_empty());
    }

    #[test]
    fn a_sandbox_process_under_a_clean_parent_has_its_own_reason_only() {
        // Pids that fall down the chain, so the walk from the lowest goes up through the others.
        let s = snap(vec![p(40, 13, 4242), p(13, 0, 0), p(5, 6, 0), p(6, 7, 0), p(7, 0, 4242)]);
        let t = Policy::new(vec![4242], true).classify(&s);
        assert_eq!(t[&40], vec![Reason::Uid]);
        assert_ne!(t[&40], vec![Reason::Uid, Reason::Ancestry]);
        assert_ne!(t[&40], vec![]);
        assert!(!t.contains_key(&13));
        assert_eq!(t[&5], vec![Reason::Ancestry]);
        assert_eq!(t[&6], vec![Reason::Ancestry]);
        assert_eq!(format!("{:?}", t[&7]), "[Uid]");
    }

    #[test]
    fn the_chain_stops_at_the_init() {
        let me = crate::kernel::process::getpid();
        let s = snap(vec![p(3, 0, 4242), p(me, 3, 0), p(me + 1, me, 0)]);
        let t = Policy::new(vec![4242], true).classify(&s);
        assert!(!t.contains_key(&me), "the init is never the sandbox's");
        assert!(!t.contains_key(&(me + 1)), "nor its children through it");
    }

    #[test]
    fn reasons_are_named_as_the_evidence_and_the_status_name_them() {
        for r in ALL {
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str(), "{r:?}");
        }
        assert_eq!(ALL.map(Reason::as_str), ["uid", "ancestry", "lineage", "history"]);
    }

    #[test]
    fn history_keeps_each_identity_once_and_forgets_those_gone() {
        let mut h = History::default();
        assert!(h.is_empty());
        assert_eq!(h.len(), 0);
        h.insert((20, 5));
        h.insert((10, 7));
        h.insert((20, 5));
        assert_eq!((h.len(), h.is_empty()), (2, false));
        assert!(h.contains(&(10, 7)) && h.contains(&(20, 5)) && !h.contains(&(20, 6)));
        // Remembered while alive with the same start time; forgotten once gone or reused.
        let mut pol = Policy::new(vec![4242], true);
        let s = snap(vec![p(10, 0, 4242), p(11, 10, 0)]);
        let t = pol.classify(&s);
        pol.remember(&s, &t);
        assert_eq!(pol.history.len(), 2);
        pol.remember(&s, &Tainted::new());
        assert_eq!(pol.history.len(), 2, "alive, with the start times remembered");
        let mut reused = p(11, 1, 0);
        reused.start_time += 1;
        pol.remember(&snap(vec![p(10, 0, 4242), reused]), &Tainted::new());
        assert_eq!(pol.history.len(), 1);
        assert!(pol.history.contains(&(10, 100)));
    }
}

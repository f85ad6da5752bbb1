//! Who counts as a sandbox process. Any one reason is enough; names are never looked at.

use crate::procs::{Proc, Snapshot};
use crate::sys::Pid;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};

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

/// The policy: sandbox UIDs, whether a loginuid means a sandbox launch, and the identities
/// (pid, start time) remembered as tainted.
#[derive(Debug, Default, Clone)]
pub struct Policy {
    pub uids: Vec<u32>,
    /// A loginuid counts only where quiesce is the one that wrote it: off when the init itself
    /// inherited a loginuid (every process of the container then carries it) or --no-lineage.
    pub lineage: bool,
    pub history: HashSet<(Pid, u64)>,
}

pub type Tainted = BTreeMap<Pid, Vec<Reason>>;

impl Policy {
    pub fn new(uids: Vec<u32>, lineage: bool) -> Policy {
        Policy { uids, lineage, history: HashSet::new() }
    }

    fn direct(&self, p: &Proc) -> Vec<Reason> {
        let mut r = Vec::new();
        if p.all_uids().any(|u| self.uids.contains(&u)) {
            r.push(Reason::Uid);
        }
        if self.lineage && p.loginuid.is_some_and(|u| self.uids.contains(&u)) {
            r.push(Reason::Lineage);
        }
        if self.history.contains(&(p.pid, p.start_time)) {
            r.push(Reason::History);
        }
        r
    }

    /// Classify every process of the snapshot. The init (pid 1 / ourselves) is never tainted.
    pub fn classify(&self, snap: &Snapshot) -> Tainted {
        let me = crate::sys::getpid();
        let direct: BTreeMap<Pid, Vec<Reason>> =
            snap.procs.values().filter(|p| p.pid != me).map(|p| (p.pid, self.direct(p))).collect();
        let ancestry = tainted_ancestors(snap, &direct, me);
        let mut out: Tainted = BTreeMap::new();
        for (pid, mut reasons) in direct {
            if ancestry.get(&pid).copied().unwrap_or(false) {
                reasons.push(Reason::Ancestry);
            }
            if !reasons.is_empty() {
                reasons.sort();
                out.insert(pid, reasons);
            }
        }
        out
    }

    /// Remember every tainted process so that it stays tainted after it escapes its lineage.
    pub fn remember(&mut self, snap: &Snapshot, tainted: &Tainted) {
        for pid in tainted.keys() {
            if let Some(p) = snap.procs.get(pid) {
                self.history.insert((p.pid, p.start_time));
            }
        }
        // Forget identities that no longer exist, so the table stays as small as the namespace.
        self.history.retain(|(pid, st)| snap.procs.get(pid).is_some_and(|p| p.start_time == *st));
    }
}

/// For every process: does its parent chain reach a process with a direct reason? Each process
/// is settled once (a 4,096-deep chain must not cost a walk up the chain per process). The chain
/// stops at the init, at a parent outside the table, and after as many steps as the table has
/// (a cycle, from pid reuse between reads).
fn tainted_ancestors(snap: &Snapshot, direct: &BTreeMap<Pid, Vec<Reason>>, me: Pid) -> HashMap<Pid, bool> {
    let mut memo: HashMap<Pid, bool> = HashMap::new();
    let tainted = |pid: &Pid| direct.get(pid).is_some_and(|r| !r.is_empty());
    for &start in snap.procs.keys() {
        let mut chain = Vec::new();
        let mut cur = start;
        let mut top = false;
        while chain.len() <= snap.procs.len() {
            if let Some(&known) = memo.get(&cur) {
                top = known || tainted(&cur);
                break;
            }
            let Some(parent) = snap.procs.get(&cur).map(|p| p.ppid) else { break };
            chain.push(cur);
            if parent <= 0 || parent == me || !snap.procs.contains_key(&parent) {
                break;
            }
            if tainted(&parent) {
                top = true;
                break;
            }
            cur = parent;
        }
        // `top` answers for the last of the chain; each one below gets its parent's answer or,
        // when the parent itself has a direct reason, true.
        let mut answer = top;
        for (i, pid) in chain.iter().enumerate().rev() {
            if i + 1 < chain.len() {
                let parent = chain[i + 1];
                answer = answer || tainted(&parent);
            }
            memo.entry(*pid).or_insert(answer);
        }
    }
    memo
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procs::Thread;

    fn p(pid: Pid, ppid: Pid, uid: u32) -> Proc {
        Proc::fixture(pid, ppid, pid as u64 * 10, uid)
    }

    fn snap(ps: Vec<Proc>) -> Snapshot {
        Snapshot::of(&ps)
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
}

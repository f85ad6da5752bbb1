//! The table of an observation: its processes by pid in one sorted vector, changed in one pass
//! (`apply`, `settle`). May use: kernel, observe.

use crate::kernel::process::Pid;
use crate::observe::procs::model::Proc;

/// The processes of an observation by pid: a vector sorted by pid, so that an entry costs the
/// process's own bytes and nothing more (a map's nodes cost about as much again, and building
/// one from a list holds the list, a sort buffer and the map at once). The sandbox chooses how
/// many processes there are; PID 1 holds one of these tables while it tracks, read again in place
/// (`Reader::refresh`), and a second, the freeze's own, while a freeze runs.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Table {
    pub(super) v: Vec<Proc>,
}

impl Table {
    /// From processes in any order; a pid listed twice keeps its last entry.
    pub fn from_procs(mut v: Vec<Proc>) -> Table {
        if !v.windows(2).all(|w| w[0].pid < w[1].pid) {
            // Stable, so that of equal pids the last one stays last; dedup then keeps it.
            v.sort_by_key(|p| p.pid);
            v.reverse();
            v.dedup_by_key(|p| p.pid);
            v.reverse();
        }
        v.shrink_to_fit();
        Table { v }
    }

    /// From processes given in a test, in any order.
    #[cfg(test)]
    pub fn of(ps: &[Proc]) -> Table {
        Table::from_procs(ps.to_vec())
    }

    #[cfg(test)]
    pub(super) fn keys_sorted(&self) -> bool {
        self.v.windows(2).all(|w| w[0].pid < w[1].pid)
    }

    fn find(&self, pid: Pid) -> Result<usize, usize> {
        self.v.binary_search_by_key(&pid, |p| p.pid)
    }

    /// Where `pid` is in the table's order (that of `values`).
    pub fn position(&self, pid: Pid) -> Option<usize> {
        self.find(pid).ok()
    }

    /// The process at a position of the table's order.
    pub fn at(&self, i: usize) -> &Proc {
        &self.v[i]
    }

    pub fn get(&self, pid: &Pid) -> Option<&Proc> {
        self.find(*pid).ok().map(|i| &self.v[i])
    }

    pub fn contains_key(&self, pid: &Pid) -> bool {
        self.find(*pid).is_ok()
    }

    pub fn len(&self) -> usize {
        self.v.len()
    }

    #[allow(dead_code)] // the pair clippy asks of a public `len`
    pub fn is_empty(&self) -> bool {
        self.v.is_empty()
    }

    /// Processes in ascending pid order.
    pub fn values(&self) -> std::slice::Iter<'_, Proc> {
        self.v.iter()
    }

    /// Insert or replace one process (tests build tables so). Costs a shift of the entries above it: many changes at once
    /// go through `apply`.
    #[cfg(test)]
    pub fn insert(&mut self, pid: Pid, p: Proc) -> Option<Proc> {
        debug_assert_eq!(pid, p.pid);
        match self.find(pid) {
            Ok(i) => Some(std::mem::replace(&mut self.v[i], p)),
            Err(i) => {
                self.v.insert(i, p);
                None
            }
        }
    }

    #[cfg(test)]
    pub fn remove(&mut self, pid: &Pid) -> Option<Proc> {
        self.find(*pid).ok().map(|i| self.v.remove(i))
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&Pid, &Proc) -> bool) {
        self.v.retain(|p| keep(&p.pid, p));
    }

    /// Put the table back in order after a refresh: entries marked GONE out, `added` in. The
    /// smaller list goes into the larger (a namespace filled since the last refresh has most of
    /// its entries among the new ones), whose room grows in place.
    pub(super) fn settle(&mut self, mut added: Vec<Proc>) {
        let v = &mut self.v;
        v.retain(|p| p.pid != GONE);
        if !added.is_empty() {
            if added.len() > v.len() {
                std::mem::swap(v, &mut added);
            }
            v.reserve_exact(added.len());
            v.append(&mut added);
            drop(added);
            v.sort_unstable_by_key(|p| p.pid);
        }
        if v.capacity() > v.len() + v.len() / 8 + 16 {
            v.shrink_to_fit();
        }
    }

    /// Apply a batch of reads: Some replaces or adds the process, None removes the pid; of two
    /// entries for one pid the later one counts. One pass over the table whatever the batch's
    /// size (a pass of the proof may read thousands), and no second table.
    pub fn apply(&mut self, mut batch: Vec<(Pid, Option<Proc>)>) {
        // Stable: of equal pids the later entry stays after the earlier.
        batch.sort_by_key(|e| e.0);
        let mut removed: Vec<usize> = Vec::new();
        let mut added: Vec<Proc> = Vec::new();
        let mut it = batch.into_iter().peekable();
        while let Some((pid, p)) = it.next() {
            if it.peek().is_some_and(|n| n.0 == pid) {
                continue;
            }
            match (self.find(pid), p) {
                (Ok(i), Some(p)) => self.v[i] = p,
                (Ok(i), None) => removed.push(i),
                (Err(_), Some(p)) => added.push(p),
                (Err(_), None) => {}
            }
        }
        if !removed.is_empty() {
            // `removed` is ascending: the batch was sorted by pid, and so is the table.
            let mut k = 0;
            let mut idx = 0;
            self.v.retain(|_| {
                let drop = removed.get(k) == Some(&idx);
                k += drop as usize;
                idx += 1;
                !drop
            });
        }
        if !added.is_empty() {
            self.v.extend(added);
            self.v.sort_unstable_by_key(|p| p.pid);
        }
    }
}

impl std::ops::Index<&Pid> for Table {
    type Output = Proc;
    fn index(&self, pid: &Pid) -> &Proc {
        self.get(pid).expect("no process with this pid in the table")
    }
}

/// The pid of an entry a refresh found gone, until the table is put back in order (/proc never
/// lists pid 0).
pub(super) const GONE: Pid = 0;

//! The walk: the evidence of every sandbox process the stop left stopped, and of each one that
//! shows up later (created after the walk) before it is killed. The evidence never decides.

use crate::decide::taint::Tainted;
use crate::freeze::evidence;
use crate::freeze::progress::{live, ms, Run};
use crate::kernel::process::Pid;
use crate::observe::procs::model::Proc;
use crate::observe::procs::table::Table;
use std::time::Instant;

impl Run<'_> {
    /// Record the evidence of every sandbox process after the stop. The reads that can wait on
    /// the target run on a reader thread with a deadline, within a share of the budget.
    pub fn walk(&mut self, snap: &Table, tainted: &Tainted) {
        let t = Instant::now();
        let n = live(snap, tainted).count();
        let targets = live(snap, tainted).map(|p| evidence::Target::of(p, tainted[&p.pid]));
        self.evidence = evidence::gather(targets, n, evidence::walk_deadline(t, self.deadline), self.since);
        self.phases.walk = ms(t.elapsed());
    }

    /// Add to the evidence every live sandbox process not in it yet: those created after the
    /// walk (injected, or hopping) are killed too, and the marker lists what the freeze killed.
    /// They are recorded from the observation alone (no command line: they are running).
    /// `walked`: the identities the walk recorded, sorted.
    pub fn late_evidence(&mut self, snap: &Table, tainted: &Tainted, walked: &[(Pid, u64)]) {
        let in_walk = |p: &Proc| walked.binary_search(&(p.pid, p.start_time)).is_ok();
        for p in live(snap, tainted) {
            if !in_walk(p) && self.late.insert((p.pid, p.start_time)) {
                evidence::add_late(&mut self.evidence, evidence::Target::of(p, tainted[&p.pid]));
            }
        }
    }
}

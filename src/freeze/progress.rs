//! One freeze in progress: what it carries from step to step (its budget, its phases, the
//! evidence so far, who may vouch for a newcomer) and how it ends when a step fails.

use crate::decide::newcomers;
use crate::decide::taint::{Policy, Tainted};
use crate::freeze::evidence::Gathered;
use crate::freeze::run::{Outcome, Reap};
use crate::kernel::process::Pid;
use crate::observe::procs::model::Proc;
use crate::observe::procs::reader::Reader;
use crate::observe::procs::table::Table;
use crate::record::freeze::{Phases, Survivor};
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// Milliseconds, as the phases count them.
pub fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// The live sandbox processes of a table.
pub fn live<'a>(snap: &'a Table, tainted: &'a Tainted) -> impl Iterator<Item = &'a Proc> + 'a {
    tainted.keys().filter_map(|pid| snap.get(pid)).filter(|p| p.alive())
}

/// The live sandbox processes of a table, as the status names them.
pub fn survivors(snap: &Table, tainted: &Tainted) -> Vec<Survivor> {
    live(snap, tainted)
        .map(|p| Survivor { pid: p.pid, uid: p.uid(), state: p.state, comm: p.comm.to_string() })
        .collect()
}

/// One freeze as it goes from step to step.
pub struct Run<'a> {
    pub cred: &'a mut crate::freeze::cred::Switcher,
    pub reader: &'a Reader,
    pub policy: &'a mut Policy,
    pub reap: &'a mut dyn Reap,
    pub start: Instant,
    pub deadline: Instant,
    pub phases: Phases,
    pub evidence: Gathered,
    /// Every (pid, start time) the evidence recorded after the walk, kept or only counted (the
    /// walk's own are the live sandbox processes of the stop's observation).
    pub late: HashSet<(Pid, u64)>,
    pub unstopped: Vec<Pid>,
    /// The pid counter before the last stop observation (None: unreadable).
    pub since: Option<Pid>,
    /// Who may vouch for a process born during the freeze, from every observation of it.
    pub ancestry: newcomers::Ancestry,
}

impl Run<'_> {
    /// The freeze failed: why, and what it names as alive.
    pub fn fail(self, reason: String, survivors: Vec<Survivor>) -> Outcome {
        let mut phases = self.phases;
        phases.total = ms(self.start.elapsed());
        Outcome {
            ok: false,
            reason: Some(reason),
            survivors,
            evidence: self.evidence,
            phases,
            unstopped: self.unstopped,
        }
    }

    /// The freeze proved: no sandbox process is alive and a parent vouches for every newcomer.
    pub fn succeed(self, survivors: Vec<Survivor>) -> Outcome {
        let mut phases = self.phases;
        phases.total = ms(self.start.elapsed());
        Outcome {
            ok: true,
            reason: None,
            survivors,
            evidence: self.evidence,
            phases,
            unstopped: self.unstopped,
        }
    }
}

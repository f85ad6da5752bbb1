//! The proof's last question, asked once no sandbox process is alive: does a parent vouch for
//! every process born during the freeze (and for every child born since a launch that lineage
//! does not follow)? One that none vouches for is looked at again for a short while; if it is
//! still there the freeze fails naming it. The failure texts are status reasons: word for word.

use crate::decide::newcomers;
use crate::decide::taint::Tainted;
use crate::freeze::progress::Run;
use crate::freeze::run::Context;
use crate::kernel::process::{self, Pid};
use crate::observe::consistency;
use crate::observe::procs::model::Proc;
use crate::observe::procs::table::Table;
use crate::record::freeze::Survivor;
use std::time::{Duration, Instant};

/// How long the proof keeps looking while newcomers no parent vouches for are alive.
const ORPHAN_GRACE: Duration = Duration::from_secs(1);

/// What the look at the processes born during the freeze came to.
pub enum Vouched {
    /// A parent vouches for every one.
    All,
    /// Some have none, and the grace is not over: look again.
    Again,
    /// Some still have none: the freeze fails, saying why and naming them.
    Refused(String, Vec<Survivor>),
}

impl Run<'_> {
    /// Does a parent vouch for every process of `snap` born during the freeze? `first`: when
    /// the proof first found one that none vouches for, the start of the grace.
    pub fn vouched(
        &mut self,
        snap: &Table,
        tainted: &Tainted,
        ctx: &Context,
        first: &mut Option<Instant>,
    ) -> Vouched {
        let client = ctx.client.as_ref().and_then(|c| c.own(self.reader, snap));
        let own: Vec<newcomers::Own> =
            self.cred.helper(self.reader).into_iter().chain(ctx.own.iter().copied()).chain(client).collect();
        let now = consistency::last_pid(self.reader.root()).ok();
        // The one case where the client's identity decides (tests/freeze.rs t27, t28): said
        // once per look, so a run shows it was reached.
        if let Some(p) = client.and_then(|(pid, _)| snap.get(&pid)).filter(|p| ctx.since.born(p, now)) {
            log::info!(
                "proof: freeze client {} was born during the freeze; the init's own as the kernel shows it",
                p.pid
            );
        }
        let mut orphans =
            newcomers::orphaned(snap, tainted, &self.ancestry, &ctx.since, now, process::getpid(), &own);
        let newcomers_found = !orphans.is_empty();
        for p in newcomers::unfollowed_children(snap, tainted, ctx.launchers, process::getpid(), &own) {
            if !orphans.iter().any(|o| o.pid == p.pid) {
                orphans.push(p);
            }
        }
        if orphans.is_empty() {
            return Vouched::All;
        }
        // A root process entered from outside in the middle of switching to a sandbox UID
        // (`docker exec -u` during the freeze) or a short-lived child of a launcher reads the
        // same: look again for a short while, failing only if one is still there. What such a
        // newcomer leaves behind is again a newcomer under a parent that cannot vouch.
        let until = *first.get_or_insert_with(Instant::now) + ORPHAN_GRACE;
        if Instant::now() < until.min(self.deadline) {
            log::debug!("proof: {} newcomer(s) no parent vouches for; looking again", orphans.len());
            return Vouched::Again;
        }
        let found = orphans
            .iter()
            .map(|p| Survivor { pid: p.pid, uid: p.uid(), state: p.state, comm: p.comm.to_string() })
            .collect();
        Vouched::Refused(refusal(&orphans, newcomers_found, ctx.client_refused.as_ref()), found)
    }
}

/// Why the freeze fails with `orphans` alive, naming up to eight of them. `newcomers_found`:
/// some were born with no parent that can vouch (else all are children of an unfollowed launch).
/// `client_refused`: the process a request named as its client, and why it is not taken for one.
fn refusal(orphans: &[&Proc], newcomers_found: bool, client_refused: Option<&(Pid, String)>) -> String {
    let named: Vec<String> =
        orphans.iter().take(8).map(|p| format!("{} uid {} {}", p.pid, p.uid(), p.comm)).collect();
    // The client named among them: say why it is not the init's own, and the way round.
    let client_note = client_refused
        .filter(|(pid, _)| orphans.iter().any(|p| p.pid == *pid))
        .map(|(pid, why)| {
            format!(
                "; process {pid} asked for this freeze and is not taken for the init's own ({why}): \
                 freeze with a bare signal (docker kill -s USR1) and read status.json"
            )
        })
        .unwrap_or_default();
    let reason = if newcomers_found {
        format!(
            "{} process(es) appeared during the freeze with no parent that can vouch for them ({}): they cannot \
             be told from the sandbox's; retry once no root daemon forks during a freeze",
            orphans.len(),
            named.join(", ")
        )
    } else {
        format!(
            "{} process(es) born since a launch that lineage does not follow and a setuid binary can make \
             root, under its launcher, the init or the outside ({}): they cannot be told from what such \
             a launch leaves behind; launch with lineage, or without setuid (no-new-privileges)",
            orphans.len(),
            named.join(", ")
        )
    };
    format!("{reason}{client_note}")
}

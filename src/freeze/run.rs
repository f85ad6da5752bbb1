//! The freeze: stop every sandbox process, walk them, kill them, then prove with an
//! observation taken after the last kill that none is alive. Bounded by one budget.
//!
//! `run` conducts one freeze; each step is a module of its own: `stop` (observe, decide who is a
//! sandbox process, stop them), `walk` (their evidence), `kill`, `proof` (observe again until
//! none is alive) and `orphans` (who vouches for the processes born meanwhile). `progress` is the
//! freeze as it goes from step to step.

use crate::decide::newcomers;
use crate::decide::taint::Policy;
use crate::freeze::client;
use crate::freeze::evidence::Gathered;
use crate::freeze::progress::{live, survivors, Run};
use crate::kernel::process::Pid;
use crate::observe::procs;
use crate::observe::procs::reader::Reader;
use crate::observe::procs::table::Table;
use crate::record::freeze::{Phases, Survivor};
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// Where the freeze starts from, besides the init's last observation.
pub struct Context<'a> {
    /// Taken when the request was taken, before anything announced the freeze.
    pub since: newcomers::Since,
    pub launchers: &'a newcomers::Launchers,
    /// Processes that are the init's own whenever they were born: the client that asked for this
    /// freeze (root, entered from outside, alive throughout), the init's command, an attestation
    /// worker not yet reaped. By pid and start time: any of them may end during the freeze (a
    /// root escapee can kill the client; the init reaps its command), and a later process with
    /// its pid is not the init's.
    pub own: Vec<newcomers::Own>,
    /// The client that asked for this freeze, shown to be one by the kernel (see `client`).
    pub client: Option<client::Client>,
    /// The process a request named as its client, and why it is not taken for one.
    pub client_refused: Option<(Pid, String)>,
    /// Lineage is off and setuid binaries work: a process entered with `docker exec -u` may have
    /// become root before any observation saw it, so the outside vouches for no newcomer.
    pub outside_unseen: bool,
    /// When the init took the freeze (the old marker's unlink, then its first stop of the sandbox
    /// UIDs, before the status write and the fresh look): the freeze's clock and its stop phase
    /// start there.
    pub began: Instant,
}

/// The freeze's start point (`newcomers::Since::take`: what orders the starting tick's processes,
/// then the clock); a process of the starting tick made after it is new. Unreadable clock: every
/// process counts as born during the freeze (more refusals, never fewer).
pub fn start_point(reader: &procs::reader::Reader) -> newcomers::Since {
    newcomers::Since::take(reader)
}

pub struct Config {
    pub cred: crate::freeze::cred::Switcher,
    pub timeout: Duration,
    /// How long to wait for every sandbox thread to show stopped before walking anyway.
    pub stop_wait: Duration,
}

#[derive(Debug)]
pub struct Outcome {
    pub ok: bool,
    pub reason: Option<String>,
    pub survivors: Vec<Survivor>,
    pub evidence: Gathered,
    pub phases: Phases,
    /// Processes that never showed stopped (e.g. uninterruptible sleep).
    pub unstopped: Vec<Pid>,
}

/// What the freeze asks of the init that runs it: reap the init's exited children, a batch at a
/// time, as the init always does (it alone knows which child is its command and records its
/// status). The proof asks between its looks: what the kill left holds its pids as zombies until
/// reaped, and where a pids limit was reached the proof needs those pids free again.
pub trait Reap {
    /// Reap one batch without waiting; true when more may be waiting.
    fn reap_batch(&mut self) -> bool;
}

/// Run one freeze. `seen`: the init's last tracking observation, left as it is (the next freeze
/// within the interval starts from it again, as from any tracking refresh). `reap`: the init,
/// which reaps for it (see `Reap`).
pub fn run(
    cfg: &mut Config,
    policy: &mut Policy,
    reader: &Reader,
    seen: &Table,
    ctx: Context,
    reap: &mut dyn Reap,
) -> Outcome {
    let start = ctx.began;
    let mut ancestry = newcomers::Ancestry::from_launchers(ctx.launchers);
    if ctx.outside_unseen {
        ancestry.suspect_outside();
    }
    let mut run = Run {
        cred: &mut cfg.cred,
        reader,
        policy,
        reap,
        start,
        deadline: start + cfg.timeout,
        phases: Phases::default(),
        evidence: Gathered::default(),
        late: HashSet::new(),
        unstopped: Vec::new(),
        since: None,
        ancestry,
    };
    // One table of the freeze's own from here on, starting as the tracking view: every observation
    // of the freeze is read into it, and it goes when the freeze ends.
    let mut table = seen.clone();
    // Observe and decide: the stop's last observation names the sandbox processes, all stopped.
    let tainted = match run.stop(cfg.stop_wait, &mut table) {
        Ok(x) => x,
        Err(e) => return run.fail(e, Vec::new()),
    };
    // Act: record them, then kill them.
    run.walk(&table, &tainted);
    if let Err(e) = run.kill(&table, &tainted) {
        return run.fail(e, survivors(&table, &tainted));
    }
    // What the walk recorded (sorted: `live` goes in pid order), for the evidence of latecomers.
    let walked: Vec<(Pid, u64)> = live(&table, &tainted).map(|p| (p.pid, p.start_time)).collect();
    // Prove: observe until no sandbox process is alive and a parent vouches for every newcomer.
    run.prove(&mut table, &walked, &ctx, cfg.timeout)
}

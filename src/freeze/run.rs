//! The freeze: stop every sandbox process, walk them, kill them, then prove with an
//! observation taken after the last kill that none is alive. Bounded by one budget.

use crate::decide::newcomers;
use crate::decide::taint::Policy;
use crate::freeze::client;
use crate::freeze::evidence::Gathered;
use crate::freeze::kill::Reach;
use crate::freeze::progress::{live, ms, survivors, Run};
use crate::kernel::sys::{self, Pid};
use crate::observe::consistency;
use crate::observe::procs::{self, Reader, Snapshot};
use crate::observe::settle;
use crate::state::{dir::Phases, dir::Survivor};
use std::collections::HashSet;
use std::io;
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

/// How long the kill waits, at most, for the processes it killed to exit before the proof's
/// observation (which then finds what is left, kills it again and looks again).
const EXIT_WAIT: Duration = Duration::from_secs(1);

/// How long the proof keeps looking while newcomers no parent vouches for are alive.
const ORPHAN_GRACE: Duration = Duration::from_secs(1);

/// Run one freeze. `seen`: the init's last tracking observation, left as it is (the next freeze
/// within the interval starts from it again, as from any tracking refresh). `reap` reaps a batch
/// of zombie children of the init (and records the command's status); true when more may be
/// waiting.
pub fn run(
    cfg: &mut Config,
    policy: &mut Policy,
    reader: &Reader,
    seen: &Snapshot,
    ctx: Context,
    reap: &mut dyn FnMut() -> bool,
) -> Outcome {
    let start = Instant::now();
    let Context { since: born_since, launchers, own: also_own, client, client_refused, outside_unseen } = ctx;
    let mut ancestry = newcomers::Ancestry::from_launchers(launchers);
    if outside_unseen {
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
    let mut own = seen.clone();
    let table = &mut own;
    let tainted = match run.stop(cfg.stop_wait, table) {
        Ok(x) => x,
        Err(e) => return run.fail(e, Vec::new()),
    };
    let snap = &*table;
    run.walk(snap, &tainted);

    let t = Instant::now();
    // kill(-1) reaches every stopped process it can reach, and anything one of them forks
    // before dying; the other channels go to the rest. A process some SIGCONT restarted after
    // the stop observation and that left kill(-1)'s reach meanwhile is the proof's to find.
    let uids = run.policy.uids.clone();
    let reach = if run.unstopped.is_empty() { Reach::Unsettled(&uids) } else { Reach::All };
    if let Err(e) = run.kill_channels(snap, &tainted, reach) {
        return run.fail(e, survivors(snap, &tainted));
    }
    let sent = Instant::now();
    let killed: Vec<settle::Target> = live(snap, &tainted).map(|p| (p.pid, Some(p.start_time))).collect();
    let left = settle::wait(run.reader, &killed, settle::Goal::Dead, (sent + EXIT_WAIT).min(run.deadline));
    let exited = Instant::now();
    // The zombies are left for after the proof: each costs it one stat read (a dead process's
    // line says all there is), no more than reaping it costs here, and the kill is over sooner.
    log::debug!(
        "kill: signals sent in {:?}, waited {:?} for exits ({left} of a sample left)",
        sent - t,
        exited - sent,
    );
    run.phases.kill = ms(t.elapsed());

    let t = Instant::now();
    let mut pause = Duration::from_millis(1);
    let mut rounds = 0u32;
    let mut first_orphans: Option<Instant> = None;
    // The survivors of the last complete observation, for a pass the budget cuts off.
    let mut last_left: Vec<Survivor> = Vec::new();
    // What the walk recorded (sorted: `live` goes in pid order), for the evidence of latecomers.
    let walked: Vec<(Pid, u64)> = live(snap, &tainted).map(|p| (p.pid, p.start_time)).collect();
    drop(killed);
    loop {
        // The proof: a consistent observation taken after the last kill, read into the table.
        let observed = consistency::observe(run.reader, table, run.deadline);
        let passes = match observed {
            Ok(Ok(x)) => x,
            Ok(Err(churn)) if churn.unheld && Instant::now() < run.deadline => {
                // No pid free for a thread to hold the counter with: the sandbox held a pids
                // limit, and what the kill left holds those pids as zombies until the init reaps
                // them. Reaping frees them; the next observation starts over from a full listing.
                let mut more = true;
                for _ in 0..64 {
                    if !more || Instant::now() >= run.deadline {
                        break;
                    }
                    more = (run.reap)();
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(20));
                continue;
            }
            Ok(Err(churn)) if churn.unheld => {
                run.phases.probe = ms(t.elapsed());
                return run.fail(
                    format!(
                        "no pid was free to hold the pid counter with (a pids limit reached; the init \
                         reaped its exited children meanwhile) within the {:?} budget: the final \
                         observation cannot be shown consistent, and what is alive is unknown",
                        cfg.timeout
                    ),
                    Vec::new(),
                );
            }
            Ok(Err(churn)) => {
                run.phases.probe = ms(t.elapsed());
                let n =
                    if churn.created == u64::MAX { "many".to_string() } else { churn.created.to_string() };
                return run.fail(
                    format!(
                        "processes kept appearing: {n} pid(s) created during the last of {} passes \
                             of the final observation, within the {:?} budget",
                        churn.passes, cfg.timeout
                    ),
                    Vec::new(),
                );
            }
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                run.phases.probe = ms(t.elapsed());
                // What the last complete observation found alive is what is known of now.
                if !last_left.is_empty() {
                    let n = last_left.len();
                    let why = format!(
                        "{n} sandbox process(es) still alive after the {:?} budget ({rounds} kill rounds)",
                        cfg.timeout
                    );
                    return run.fail(why, last_left);
                }
                return run.fail(
                    format!(
                        "the final observation did not end within the {:?} budget ({e}): what is alive is \
                         unknown; freeze again once the machine is less loaded, or raise --freeze-timeout",
                        cfg.timeout
                    ),
                    Vec::new(),
                );
            }
            Err(e) => {
                run.phases.probe = ms(t.elapsed());
                return run.fail(format!("/proc unreadable: {e}"), Vec::new());
            }
        };
        let snap = &*table;
        let tainted = run.policy.classify(snap);
        run.policy.remember(snap, &tainted);
        run.ancestry.note(snap, &tainted, sys::getpid());
        if passes > 1 {
            log::debug!("proof: consistent after {passes} passes");
        }
        let left = survivors(snap, &tainted);
        if left.is_empty() {
            run.phases.probe = ms(t.elapsed());
            let own: Vec<newcomers::Own> = run
                .cred
                .helper(run.reader)
                .into_iter()
                .chain(also_own.iter().copied())
                .chain(client.as_ref().and_then(|c| c.own(run.reader, snap)))
                .collect();
            let now = consistency::last_pid(run.reader.root()).ok();
            let mut orphans =
                newcomers::orphaned(snap, &tainted, &run.ancestry, &born_since, now, sys::getpid(), &own);
            let newcomers_found = !orphans.is_empty();
            for p in newcomers::unfollowed_children(snap, &tainted, launchers, sys::getpid(), &own) {
                if !orphans.iter().any(|o| o.pid == p.pid) {
                    orphans.push(p);
                }
            }
            // A root process entered from outside in the middle of switching to a sandbox UID
            // (`docker exec -u` during the freeze) or a short-lived child of a launcher reads the
            // same: look again for a short while, failing only if one is still there. What such a
            // newcomer leaves behind is again a newcomer under a parent that cannot vouch.
            if !orphans.is_empty() {
                let until = *first_orphans.get_or_insert_with(Instant::now) + ORPHAN_GRACE;
                if Instant::now() < until.min(run.deadline) {
                    log::debug!("proof: {} newcomer(s) no parent vouches for; looking again", orphans.len());
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(20));
                    continue;
                }
                let named: Vec<String> =
                    orphans.iter().take(8).map(|p| format!("{} uid {} {}", p.pid, p.uid(), p.comm)).collect();
                let found = orphans
                    .iter()
                    .map(|p| Survivor { pid: p.pid, uid: p.uid(), state: p.state, comm: p.comm.to_string() })
                    .collect();
                // The client named among them: say why it is not the init's own, and the way round.
                let client_note = client_refused
                    .as_ref()
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
                return run.fail(format!("{reason}{client_note}"), found);
            }
            run.phases.total = ms(start.elapsed());
            return Outcome {
                ok: true,
                reason: None,
                survivors: left,
                evidence: run.evidence,
                phases: run.phases,
                unstopped: run.unstopped,
            };
        }
        run.late_evidence(snap, &tainted, &walked);
        last_left = left.clone();
        rounds += 1;
        if Instant::now() >= run.deadline {
            run.phases.probe = ms(t.elapsed());
            let n = left.len();
            return run.fail(
                format!(
                    "{n} sandbox process(es) still alive after the {:?} budget ({rounds} kill rounds)",
                    cfg.timeout
                ),
                left,
            );
        }
        if let Err(e) = run.kill_channels(snap, &tainted, Reach::All) {
            return run.fail(e, left);
        }
        (run.reap)();
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

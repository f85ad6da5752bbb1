//! The init: start the command, reap everything, forward signals, freeze on request,
//! shut down cleanly. Once the command runs, nothing here may end the init by error.

use crate::attest::{job::Job, statement::Freeze};
use crate::decide::newcomers::{self, Since};
use crate::decide::taint::Policy;
use crate::freeze;
use crate::init::attesting::{self, Worker};
use crate::init::reaper::Reaper;
use crate::init::shutdown::{remap, signal_rest, Shutdown};
use crate::init::spawn::Plan;
use crate::init::tracking::{take_launch, track};
use crate::kernel::sys::{self, Pid, SignalFd};
use crate::marker::{self, jws::Claims};
use crate::observe::procs::reader::Reader;
use crate::state::requests::{self, Request};
use crate::state::{self, dir::StateDir, dir::Status};
use ed25519_dalek::SigningKey;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub struct Sandbox {
    pub policy: Policy,
    /// The last tracking observation.
    pub seen: crate::observe::procs::table::Snapshot,
    pub state: StateDir,
    /// Start-time files not yet synced (see `StateDir::write_atomic_deferred`).
    pub unsynced: Vec<std::fs::File>,
    pub intake: requests::Intake,
    pub key: SigningKey,
    pub freeze_signal: i32,
    pub freeze: freeze::run::Config,
    pub after_freeze_exit: bool,
    pub track_interval: Option<Duration>,
    /// The command is a sandbox launch (--run-as).
    pub command_is_sandbox: bool,
    /// What the launch records of `quiesce exec` said so far.
    pub launchers: newcomers::Launchers,
    /// The init runs with no_new_privs (so does everything entered into the container): no
    /// setuid binary makes any process root.
    pub no_new_privs: bool,
    /// When the last tracking refresh completed; None: the last one was cut off.
    pub tracked_at: Option<Instant>,
    /// What to attest after a quiescent freeze.
    pub attest: attesting::Setup,
    /// The attestation worker of the last freeze, while it runs.
    pub worker: Option<Worker>,
    /// The last freeze's final status, rewritten when its attestation ends.
    pub last: Option<Status>,
}

pub struct Config {
    pub plan: Plan,
    pub pgroup: bool,
    pub remap_exit: Vec<u8>,
    pub grace: Duration,
    pub sandbox: Option<Sandbox>,
}

fn now_unix() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The freeze reaps through the init's own reaper: a reaped command's status is recorded as always.
impl freeze::run::Reap for Reaper {
    fn reap_batch(&mut self) -> bool {
        self.reap()
    }
}

/// One freeze. `born_since`: its start point, taken before its request was taken (see `run`).
fn do_freeze(sb: &mut Sandbox, reaper: &mut Reaper, pending_request: Option<Request>, born_since: Since) {
    let id = state::dir::new_id().unwrap_or_else(|_| format!("{}", now_unix()));
    // The last freeze's attestation ends here: what it would sign is no longer the tree's state.
    reaper.watch = None;
    reaper.watched = None;
    let lingering = sb.worker.take().and_then(Worker::end_for_freeze);
    let nonce = pending_request.as_ref().and_then(|r| r.nonce.clone());
    let asked: Vec<String> = pending_request.as_ref().map(|r| r.attest.clone()).unwrap_or_default();
    // The init's own command is the init's, whenever it was born (the same pid with the same
    // start time: a later process with its pid is another one), unless it is the sandbox's own
    // launch (--run-as), which history holds from its start.
    let command = reaper
        .main_start
        .filter(|_| !sb.command_is_sandbox)
        .filter(|&t| Reader::default().start_time(reaper.main).ok().flatten() == Some(t));
    // The client only as the kernel shows it: the request is a file any root process of the
    // namespace may have rewritten. The worker is an unreaped child: its pid is its own until
    // the init reaps it.
    let mut client_refused = None;
    // Where a launch can become root unseen, no client is the init's own: a root process of the
    // container that may read a client's executable may also write its memory (/proc/PID/mem,
    // no tracer to see), and one that may not leaves nothing to tell the client by. The client
    // matters only there (it is no newcomer otherwise).
    let unseen_root = sb.launchers.any_unfollowed() || (!sb.policy.lineage && !sb.no_new_privs);
    let client = pending_request.as_ref().and_then(|r| r.pid.zip(r.start_time)).and_then(|(pid, t)| {
        if unseen_root {
            client_refused = Some((
                pid,
                "where a launch can become root unseen, a root process of the container can take over any \
                 client (its memory is writable through /proc/PID/mem without a tracer)"
                    .to_string(),
            ));
            return None;
        }
        freeze::client::Client::check(&Reader::default(), pid, t)
            .map_err(|e| {
                log::info!("freeze client {pid} is not taken for the init's own: {e}");
                client_refused = Some((pid, e));
            })
            .ok()
    });
    let lingering = lingering.and_then(|pid| Some((pid, Reader::default().start_time(pid).ok().flatten()?)));
    let own: Vec<(Pid, u64)> = command.map(|t| (reaper.main, t)).into_iter().chain(lingering).collect();
    let request_id = pending_request.map(|r| r.request_id);
    let mut status = Status {
        id: id.clone(),
        request_id,
        nonce: nonce.clone(),
        state: "freezing".into(),
        reason: None,
        survivors: vec![],
        killed: 0,
        unstopped: 0,
        phases_ms: Default::default(),
        history: sb.policy.history.len(),
        attestation: None,
    };
    // The old marker and attestation go before any signal is sent: a failed freeze must not
    // leave one behind.
    for (file, what) in [(state::dir::MARKER, "marker"), (state::dir::ATTESTATION, "attestation")] {
        if let Err(e) = sb.state.remove(file) {
            log::error!("freeze {id} failed: cannot remove the old {what}: {e}");
            status.state = "failed".into();
            status.reason = Some(format!("cannot remove the old {what}: {e}"));
            publish(sb, &status);
            return;
        }
    }
    if let Err(e) = sb.state.write_status(&status) {
        log::error!("cannot write status: {e}");
    }
    log::info!("freeze {id}: starting");
    // The stop starts from the last refresh: one that is older than the interval, or was cut off
    // (a fork storm, a signal), may not have seen a sandbox process that lives now, nor where it
    // came from. Look again first, within a bound: a storm must not hold the freeze back.
    let stale = match (sb.tracked_at, sb.track_interval) {
        (Some(at), Some(every)) => at.elapsed() > every,
        _ => true,
    };
    if stale {
        let until = Instant::now() + FRESH_LOOK;
        if !track(sb, &|| Instant::now() >= until) {
            log::warn!("freeze {id}: no fresh observation within {FRESH_LOOK:?}; starting from the last one");
        }
    }
    let reader = Reader::default();
    let ctx = freeze::run::Context {
        since: born_since,
        launchers: &sb.launchers,
        own,
        client,
        client_refused,
        outside_unseen: !sb.policy.lineage && !sb.no_new_privs,
    };
    // The freeze reads its observations into a table of its own: `sb.seen` stays the last tracking
    // refresh, which the next freeze within the interval starts from.
    let mut out = freeze::run::run(&mut sb.freeze, &mut sb.policy, &reader, &sb.seen, ctx, reaper);
    status.phases_ms = out.phases.clone();
    status.killed = out.evidence.count();
    status.unstopped = out.unstopped.len();
    status.history = sb.policy.history.len();
    if !out.unstopped.is_empty() {
        log::warn!("freeze {id}: never stopped: {:?}", out.unstopped);
    }
    let mut facts = None;
    if out.ok {
        // Known before the marker is signed: the marker names what this freeze attests.
        let (attest_claim, refused) = attesting::paths_for(&sb.attest, &asked);
        let attest_paths = match refused {
            None => Ok(attest_claim.clone()),
            Some(e) => Err(e),
        };
        let signed = crate::observe::container::this_container().and_then(|container| {
            facts = Some(Freeze {
                id: id.clone(),
                jti: id.clone(),
                nonce: nonce.clone(),
                container: container.clone(),
                sandbox_uids: sb.policy.uids.clone(),
                killed: status.killed as u64,
                phases_ms: out.phases.clone(),
            });
            let claims = Claims {
                iss: "quiesce".into(),
                iat: now_unix(),
                jti: id.clone(),
                nonce,
                sandbox_uids: sb.policy.uids.clone(),
                result: "quiescent".into(),
                survivors: 0,
                container,
                // Moved, not copied: it may be a megabyte.
                processes: std::mem::take(&mut out.evidence.processes),
                processes_omitted: out.evidence.omitted,
                phases_ms: out.phases.clone(),
                version: env!("QUIESCE_VERSION").into(),
                lineage: Some(sb.policy.lineage),
                setuid: Some(!sb.no_new_privs),
                attest: attest_claim,
            };
            marker::jws::sign(&sb.key, &claims)
        });
        match signed.and_then(|jws| sb.state.write_atomic(state::dir::MARKER, jws.as_bytes(), 0o644)) {
            Ok(()) => {
                status.state = "quiescent".into();
                log::info!(
                    "freeze {id}: quiescent, {} process(es) killed in {} ms",
                    status.killed,
                    out.phases.total
                );
            }
            Err(e) => {
                status.state = "failed".into();
                status.reason = Some(format!("cannot write the marker: {e}"));
                log::error!("freeze {id} failed: cannot write the marker: {e}");
            }
        }
        if status.state == "quiescent" {
            status.attestation = facts.and_then(|f| start_attestation(sb, reaper, f, attest_paths));
        }
    } else {
        status.state = "failed".into();
        status.reason = out.reason.clone();
        status.survivors = out.survivors.clone();
        let names: Vec<String> =
            out.survivors.iter().map(|s| format!("{} uid {} {} {}", s.pid, s.uid, s.state, s.comm)).collect();
        log::error!(
            "freeze {id} failed: {}; survivors: [{}]",
            out.reason.as_deref().unwrap_or("unknown"),
            names.join(", ")
        );
    }
    publish(sb, &status);
}

/// The final status: in status.json, and where the client that asked for this freeze looks.
fn publish(sb: &mut Sandbox, status: &Status) {
    if let Err(e) = sb.state.write_status(status) {
        log::error!("cannot write status: {e}");
    }
    sb.intake.answer(status);
    sb.last = Some(status.clone());
}

/// Start the attestation of a quiescent freeze, when paths are named: its state to publish.
fn start_attestation(
    sb: &mut Sandbox,
    reaper: &mut Reaper,
    freeze: Freeze,
    paths: Result<Vec<String>, String>,
) -> Option<state::dir::Attestation> {
    let id = freeze.id.clone();
    let failed = |why: String| {
        log::error!("freeze {id}: attestation failed: {why}");
        Some(state::dir::Attestation { state: "failed".into(), reason: Some(why) })
    };
    let paths = match paths {
        Ok(p) if p.is_empty() => return None,
        Ok(p) => p,
        Err(e) => return failed(e),
    };
    let job = Job {
        state_dir: sb.state.path.clone(),
        paths,
        bounds: sb.attest.bounds,
        threads: sys::cpus().clamp(1, 2),
        freeze,
        seed: state::dir::hex(sb.key.as_bytes()),
    };
    let started = attesting::start(&job);
    let mut seed = job.seed;
    zeroize::Zeroize::zeroize(&mut seed);
    match started {
        Ok(w) => {
            log::info!("freeze {id}: attestation started (worker pid {})", w.pid);
            reaper.watch = Some(w.pid);
            sb.worker = Some(w);
            Some(state::dir::Attestation { state: "running".into(), reason: None })
        }
        Err(e) => failed(e),
    }
}

/// The worker was reaped with `code`: the last freeze's status gets its attestation's end.
fn attestation_ended(sb: &mut Sandbox, code: i32) {
    let Some(w) = sb.worker.take() else { return };
    let pid = w.pid;
    let (st, reason) = w.finish(code);
    match &reason {
        Some(r) if st == "failed" => log::error!("attestation failed (worker pid {pid}): {r}"),
        r => log::info!("attestation {st}: {}", r.as_deref().unwrap_or("")),
    }
    if let Some(mut last) = sb.last.take() {
        last.attestation = Some(state::dir::Attestation { state: st, reason });
        publish(sb, &last);
    }
}

/// How long a freeze waits, at most, for a fresh observation when the last refresh is stale.
const FRESH_LOOK: Duration = Duration::from_secs(1);

/// Run the init; returns the exit code.
pub fn run(mut cfg: Config) -> i32 {
    let sfd = match sys::block_all_signals().and_then(|_| SignalFd::new()) {
        Ok(s) => s,
        Err(e) => {
            crate::init::logging::line(format_args!("quiesce: cannot set up signal handling: {e}"));
            return 2;
        }
    };
    let main = match cfg.plan.spawn() {
        Ok(pid) => pid,
        Err(e) => {
            crate::init::logging::line(format_args!("quiesce: cannot start the command: {e}"));
            return 2;
        }
    };
    log::debug!("command started as pid {main}");
    let main_start = Reader::default().start_time(main).ok().flatten();
    let mut reaper = Reaper { main, main_start, status: None, childless: false, watch: None, watched: None };
    if let (Some(sb), Some(t)) = (cfg.sandbox.as_mut(), main_start) {
        if sb.command_is_sandbox {
            // The init's own launch: the sandbox's from its first instruction, seen or not.
            sb.policy.history.insert((main, t));
        }
    }
    let mut shutdown = Shutdown::None;
    let mut frozen = false;
    let mut term_after_freeze = false;
    let mut next_track: Option<Instant> = None;
    let mut last_track = Instant::now();
    // Children left to reap after a full batch: the next turn does not wait.
    let mut backlog = false;
    if let Some(sb) = cfg.sandbox.as_mut() {
        if let Err(e) = sb.state.make_durable(std::mem::take(&mut sb.unsynced)) {
            log::error!("cannot sync the start-time files in {}: {e}", sb.state.path.display());
        }
        track(sb, &|| sys::other_signal_pending(libc::SIGCHLD));
        next_track = sb.track_interval.map(|i| Instant::now() + i);
    }

    loop {
        let now = Instant::now();
        let deadline = match shutdown {
            Shutdown::Terminating { kill_at } => Some(kill_at),
            Shutdown::Killing { give_up_at } => Some(give_up_at.min(now + Duration::from_millis(50))),
            Shutdown::None => next_track,
        };
        let worker_due = cfg.sandbox.as_ref().and_then(|sb| sb.worker.as_ref()).map(|w| w.deadline);
        let deadline = match (deadline, worker_due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut timeout = deadline.map(|d| d.saturating_duration_since(now));
        // Children left to reap, or freeze requests waiting (one freeze per pass): come back at
        // once, with signals read in between.
        if backlog || cfg.sandbox.as_ref().is_some_and(|sb| sb.intake.busy()) {
            timeout = Some(Duration::ZERO);
        }
        if let Err(e) = sfd.wait(timeout) {
            log::error!("waiting for signals failed: {e}");
            std::thread::sleep(Duration::from_millis(100));
        }

        let mut got_chld = false;
        let mut freeze_senders: Vec<Pid> = Vec::new();
        // Bounded: standard signals coalesce, so at most one of each plus queued RT signals.
        for _ in 0..4096 {
            let (sig, sender) = match sfd.read() {
                Ok(Some(x)) => x,
                Ok(None) => break,
                Err(e) => {
                    log::error!("reading signals failed: {e}");
                    break;
                }
            };
            if sig == libc::SIGCHLD {
                got_chld = true;
                continue;
            }
            if let Some(sb) = cfg.sandbox.as_ref() {
                if sig == sb.freeze_signal {
                    log::info!("freeze requested by pid {sender}");
                    if freeze_senders.len() < 64 {
                        freeze_senders.push(sender);
                    }
                    continue;
                }
            }
            if frozen && (sig == libc::SIGTERM || sig == libc::SIGINT) {
                // After a freeze the init waits for this to end the container.
                term_after_freeze = true;
            }
            if reaper.status.is_none() {
                let target = if cfg.pgroup { -main } else { main };
                log::debug!("forwarding {} to {target}", sys::signal_name(sig));
                if let Err(e) = sys::kill(target, sig) {
                    log::debug!("forwarding {} failed: {e}", sys::signal_name(sig));
                }
            }
        }

        // A freeze request goes first: one batch of reaping costs milliseconds when the init has
        // thousands of children (each waitpid walks them all). The freeze reaps as it kills.
        let freeze_waiting =
            !freeze_senders.is_empty() || cfg.sandbox.as_ref().is_some_and(|sb| sb.intake.busy());
        backlog = freeze_waiting || reaper.reap();

        if let Some(sb) = cfg.sandbox.as_mut() {
            if let Some(code) = reaper.watched.take() {
                attestation_ended(sb, code);
            }
            if let Some(w) = sb.worker.as_mut().filter(|w| Instant::now() >= w.deadline) {
                let why = format!(
                    "the time bound of {} s ran out: raise --attest-timeout or attest a smaller tree",
                    sb.attest.bounds.seconds
                );
                w.kill(why.clone());
                // Said now: a worker stuck in the kernel (a FUSE mount that never answers) may
                // not die of SIGKILL, and its reaping may never come.
                log::error!("attestation failed (worker pid {}): {why}", w.pid);
                if let Some(mut last) = sb.last.take() {
                    last.attestation =
                        Some(state::dir::Attestation { state: "failed".into(), reason: Some(why) });
                    publish(sb, &last);
                }
            }
            // The start point comes before anything a sandbox process can tell a freeze by: the
            // request's rename in `requests/` (root's alone, 0700, so only a root process could),
            // the launch chains walked, the old marker's removal, "freezing" in status.json. A
            // process that waits for those makes what it makes after this point, where the proof
            // looks for newcomers. A request queued by an earlier take gets the point of the pass
            // that runs it: its rename was in that root-only directory, and nothing since told.
            let since = (!freeze_senders.is_empty() || sb.intake.busy())
                .then(|| freeze::run::start_point(&Reader::default()));
            let job = sb.intake.next(&freeze_senders);
            // Launch records taken with it are held before any freeze runs, and only then answered.
            for (id, launch) in sb.intake.take_launches() {
                take_launch(sb, &launch);
                sb.intake.answer_launch(&id);
            }
            if let Some(job) = job {
                let since = since.unwrap_or_else(|| freeze::run::start_point(&Reader::default()));
                do_freeze(sb, &mut reaper, job, since);
                frozen = true;
                backlog = reaper.reap();
            }
            let now = Instant::now();
            let periodic = next_track.is_some_and(|t| now >= t);
            // Under a fork storm SIGCHLD comes constantly: refresh at most every 100 ms for it.
            let on_child = got_chld && now.duration_since(last_track) >= Duration::from_millis(100);
            // Queued freeze requests come first (each freeze makes its own observation), and so
            // does a signal that came in meanwhile: a refresh lists all of /proc before it can
            // notice one.
            if matches!(shutdown, Shutdown::None)
                && !sb.intake.busy()
                && (periodic || on_child)
                && !sys::other_signal_pending(libc::SIGCHLD)
            {
                track(sb, &|| sys::other_signal_pending(libc::SIGCHLD));
                last_track = now;
                next_track = sb.track_interval.map(|i| now + i);
            }
        }

        let Some(code) = reaper.status else { continue };
        let stay = frozen && cfg.sandbox.as_ref().is_some_and(|sb| !sb.after_freeze_exit);
        if stay && !term_after_freeze {
            continue;
        }
        let now = Instant::now();
        match shutdown {
            Shutdown::None => {
                if reaper.childless && sys::getpid() != 1 {
                    return remap(code, &cfg.remap_exit);
                }
                if signal_rest(libc::SIGTERM) == 0 && reaper.childless {
                    return remap(code, &cfg.remap_exit);
                }
                log::debug!("command ended; terminating the rest with a {:?} grace", cfg.grace);
                shutdown = Shutdown::Terminating { kill_at: now + cfg.grace };
            }
            Shutdown::Terminating { kill_at } if now >= kill_at => {
                log::info!("grace over; killing what is left");
                signal_rest(libc::SIGKILL);
                shutdown = Shutdown::Killing { give_up_at: now + Duration::from_secs(5) };
            }
            Shutdown::Killing { give_up_at } if now >= give_up_at => {
                log::error!("processes survived SIGKILL for 5 s (uninterruptible?); exiting anyway");
                return remap(code, &cfg.remap_exit);
            }
            Shutdown::Killing { .. } => {
                signal_rest(libc::SIGKILL);
            }
            _ => {}
        }
        if reaper.childless {
            return remap(code, &cfg.remap_exit);
        }
    }
}

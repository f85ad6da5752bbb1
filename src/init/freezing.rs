//! Freezing: one freeze conducted from its request to its published status. The freeze itself
//! (stop, kill, proof) is `freeze::run`'s; here the init names its own processes, signs the
//! marker, starts the attestation and answers the client. May use every folder below the init.

use crate::attest::{job::Job, statement::Freeze};
use crate::decide::newcomers::Since;
use crate::freeze;
use crate::init::attesting::{self, Worker};
use crate::init::reaper::Reaper;
use crate::init::run::Sandbox;
use crate::init::tracking::{track, Oom, Refresh};
use crate::kernel::process::{self, Pid};
use crate::marker::{self, jws::Claims};
use crate::observe::procs::reader::Reader;
use crate::state;
use crate::state::dir::{AttestationState, FreezeState, Status};
use crate::state::requests::Request;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn now_unix() -> u64 {
    unix_ms() / 1000
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// kill(-1, SIGSTOP) as each sandbox UID, right after the old marker's unlink: until it, every
/// step of the init waits for a CPU behind whatever the sandbox runs (under a fork bomb of 2,000
/// the marker's removal and the status write took seconds, nearly all of it waiting on the run
/// queue); after it, what those UIDs run is only what a process of theirs that was woken (a
/// timer's SIGCONT) runs until the stop's sweeps stop it again. It decides nothing: the freeze's
/// stop sweeps again, finds what this missed (other UIDs by ancestry, a lineage sandbox by
/// pidfd) and waits for every one. A freeze that then fails before its kill leaves them stopped,
/// as a failed stop does. A switch that fails here fails the freeze, as it would in the stop: a
/// credential helper that does not answer may have been stopped by a sandbox process in its
/// switched instant, and the freeze ends there rather than go on with a new one.
fn stop_first(sb: &mut Sandbox) -> Result<(), String> {
    let uids = sb.tracking.policy.uids.clone();
    if uids.is_empty() {
        return Ok(());
    }
    sb.settings
        .freeze
        .cred
        .kill_all_as(&uids, libc::SIGSTOP)
        .map_err(|e| format!("credential switch failed: {e}"))
}

/// The freeze reaps through the init's own reaper: a reaped command's status is recorded as always.
impl freeze::run::Reap for Reaper {
    fn reap_batch(&mut self) -> bool {
        self.reap()
    }
}

/// One freeze. `born_since`: its start point, taken before its request was taken (see `run`).
pub(super) fn do_freeze(
    sb: &mut Sandbox,
    reaper: &mut Reaper,
    pending_request: Option<Request>,
    born_since: Since,
) {
    let taken = Instant::now();
    let started_unix_ms = unix_ms();
    // The old marker goes before any signal, by a bare unlink (a sync would be one more sleep
    // before the stop): a sandbox that holds the stop back (a credential helper it stopped waits
    // out its bound) must not hold a readable marker with it. The attestation goes in
    // `announce`, once its worker is gone; without the marker it answers for nothing.
    let before = sb
        .state
        .remove(state::dir::MARKER)
        .map_err(|e| format!("cannot remove the old marker: {e}"))
        .and_then(|()| stop_first(sb));
    let stopped = taken.elapsed();
    let id = state::dir::new_id().unwrap_or_else(|_| format!("{}", now_unix()));
    let reader = Reader::default();
    // The last freeze's attestation ends here: what it would sign is no longer the tree's state.
    reaper.watch = None;
    reaper.watched = None;
    let lingering = sb.worker.take().and_then(Worker::end_for_freeze);
    let nonce = pending_request.as_ref().and_then(|r| r.nonce.clone());
    let asked: Vec<String> = pending_request.as_ref().map(|r| r.attest.clone()).unwrap_or_default();
    let command = own_command(sb, reaper, &reader);
    let (client, client_refused) = own_client(sb, &reader, pending_request.as_ref());
    let lingering = lingering.and_then(|pid| Some((pid, reader.start_time(pid).ok().flatten()?)));
    let own: Vec<(Pid, u64)> = command.into_iter().chain(lingering).collect();
    let request_id = pending_request.map(|r| r.request_id);
    let mut status = Status {
        id: id.clone(),
        request_id,
        nonce: nonce.clone(),
        state: FreezeState::Freezing,
        reason: None,
        survivors: vec![],
        killed: 0,
        unstopped: 0,
        phases_ms: Default::default(),
        history: sb.tracking.policy.history.len(),
        unreaped_zombies: 0,
        started_unix_ms,
        attestation: None,
    };
    if !announce(sb, &mut status, before) {
        return;
    }
    let announced = taken.elapsed();
    log::info!("freeze {id}: starting");
    look_again(sb, &id);
    log::debug!(
        "freeze {id}: sandbox UIDs stopped {stopped:?} after the request was taken, the old attestation gone \
         and the status written by {announced:?}, the fresh look done by {:?}",
        taken.elapsed()
    );
    let ctx = freeze::run::Context {
        since: born_since,
        launchers: &sb.tracking.launchers,
        own,
        client,
        client_refused,
        outside_unseen: !sb.tracking.policy.lineage && !sb.settings.no_new_privs,
        began: taken,
    };
    // The freeze reads its observations into a table of its own: `sb.tracking.seen` stays the
    // last tracking refresh, which the next freeze within the interval starts from.
    let mut out = freeze::run::run(
        &mut sb.settings.freeze,
        &mut sb.tracking.policy,
        &reader,
        &sb.tracking.seen,
        ctx,
        reaper,
    );
    status.phases_ms = out.phases.clone();
    status.killed = out.evidence.count();
    status.unstopped = out.unstopped.len();
    status.history = sb.tracking.policy.history.len();
    if !out.unstopped.is_empty() {
        log::warn!("freeze {id}: never stopped: {:?}", out.unstopped);
    }
    status.unreaped_zombies = unreaped_zombies(sb, &reader, &id);
    if out.ok {
        sign(sb, reaper, &mut status, &mut out, nonce, &asked);
    } else {
        failed(&mut status, &out);
    }
    publish(sb, &status);
}

/// Zombies of the sandbox UIDs whose parent is not this init, counted (and logged by UID) after
/// the freeze: beside a PID 1 that never reaps (a sidecar's), each one holds a pid until the
/// container ends, and a pids limit counts it. The proof is not concerned: a zombie runs nothing.
fn unreaped_zombies(sb: &Sandbox, reader: &Reader, id: &str) -> usize {
    let snap = match reader.snapshot(crate::observe::procs::model::Detail::Light) {
        Ok(s) => s,
        Err(e) => {
            log::warn!("freeze {id}: cannot count the zombies left: {e}");
            return 0;
        }
    };
    let Ok(pass) = reader.pass() else { return 0 };
    let me = process::getpid();
    let mut by_uid = std::collections::BTreeMap::<u32, usize>::new();
    // A dead process's credentials are not read (its stat line says all a freeze needs): its
    // /proc directory's owner, its effective UID, says whose it was.
    let dead = snap.values().filter(|p| !p.alive() && p.ppid != me);
    for uid in dead.filter_map(|p| pass.owner(p.pid)).filter(|u| sb.tracking.policy.uids.contains(u)) {
        *by_uid.entry(uid).or_default() += 1;
    }
    let n = by_uid.values().sum();
    if n > 0 {
        log::info!("freeze {id}: {n} sandbox zombie(s) whose parent does not reap them hold their pids: {by_uid:?} (by UID)");
    }
    n
}

/// The command's pid and start time when it is the init's own: the same pid with the same start
/// time (a later process with its pid is another one), whenever it was born, unless it is the
/// sandbox's own launch (--run-as), which history holds from its start. None too for a sidecar.
fn own_command(sb: &Sandbox, reaper: &Reaper, reader: &Reader) -> Option<(Pid, u64)> {
    let (main, t) = reaper.main.zip(reaper.main_start)?;
    (!sb.settings.command_is_sandbox && reader.start_time(main).ok().flatten() == Some(t))
        .then_some((main, t))
}

/// The client that asked for this freeze, when it is the init's own; else the process the
/// request named, and why it is not.
fn own_client(
    sb: &Sandbox,
    reader: &Reader,
    request: Option<&Request>,
) -> (Option<freeze::client::Client>, Option<(Pid, String)>) {
    // The client only as the kernel shows it: the request is a file any root process of the
    // namespace may have rewritten. The worker is an unreaped child: its pid is its own until
    // the init reaps it.
    let mut client_refused = None;
    // Where a launch can become root unseen, no client is the init's own: a root process of the
    // container that may read a client's executable may also write its memory (/proc/PID/mem,
    // no tracer to see), and one that may not leaves nothing to tell the client by. The client
    // matters only there (it is no newcomer otherwise).
    let unseen_root =
        sb.tracking.launchers.any_unfollowed() || (!sb.tracking.policy.lineage && !sb.settings.no_new_privs);
    let client = request.and_then(|r| r.pid.zip(r.start_time)).and_then(|(pid, t)| {
        if unseen_root {
            client_refused = Some((
                pid,
                "where a launch can become root unseen, a root process of the container can take over any \
                 client (its memory is writable through /proc/PID/mem without a tracer)"
                    .to_string(),
            ));
            return None;
        }
        freeze::client::Client::check(reader, pid, t)
            .map_err(|e| {
                log::info!("freeze client {pid} is not taken for the init's own: {e}");
                client_refused = Some((pid, e));
            })
            .ok()
    });
    (client, client_refused)
}

/// What came `before` (the old marker's removal, the first stop) failed, or the old attestation
/// cannot go: the freeze fails, its status published (false). A failed freeze must leave neither
/// behind. Else "freezing" in status.json.
fn announce(sb: &mut Sandbox, status: &mut Status, before: Result<(), String>) -> bool {
    let id = status.id.clone();
    let gone = before.and_then(|()| {
        sb.state
            .remove(state::dir::ATTESTATION)
            .map_err(|e| format!("cannot remove the old attestation: {e}"))
    });
    if let Err(why) = gone {
        log::error!("freeze {id} failed: {why}");
        status.state = FreezeState::Failed;
        status.reason = Some(why);
        publish(sb, status);
        return false;
    }
    write_status(sb, status);
    true
}

/// The stop starts from the last refresh: one that is older than the interval, or was cut off
/// (a fork storm, a signal), may not have seen a sandbox process that lives now, nor where it
/// came from. Look again first, within a bound: a storm must not hold the freeze back. The look
/// raises no OOM score: the freeze kills what it would raise, and the pass cost a thousand
/// newcomers' freeze 60 ms before its stop here (the next refresh raises what survives).
fn look_again(sb: &mut Sandbox, id: &str) {
    let stale = match (sb.tracking.tracked_at, sb.settings.track_interval) {
        (Some(at), Some(every)) => at.elapsed() > every,
        _ => true,
    };
    if stale {
        let until = Instant::now() + FRESH_LOOK;
        if track(&mut sb.tracking, &|| Instant::now() >= until, Oom::Later) != Refresh::Done {
            log::warn!("freeze {id}: no fresh observation within {FRESH_LOOK:?}; starting from the last one");
        }
    }
}

/// A quiescent freeze: sign its marker, then start its attestation.
fn sign(
    sb: &mut Sandbox,
    reaper: &mut Reaper,
    status: &mut Status,
    out: &mut freeze::run::Outcome,
    nonce: Option<String>,
    asked: &[String],
) {
    let id = status.id.clone();
    let mut facts = None;
    // Known before the marker is signed: the marker names what this freeze attests.
    let (attest_claim, refused) = attesting::paths_for(&sb.settings.attest, asked);
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
            sandbox_uids: sb.tracking.policy.uids.clone(),
            killed: status.killed as u64,
            phases_ms: out.phases.clone(),
        });
        let claims = Claims {
            iss: "quiesce".into(),
            iat: now_unix(),
            jti: id.clone(),
            nonce,
            sandbox_uids: sb.tracking.policy.uids.clone(),
            result: "quiescent".into(),
            survivors: 0,
            container,
            // Moved, not copied: it may be a megabyte.
            processes: std::mem::take(&mut out.evidence.processes),
            processes_omitted: out.evidence.omitted,
            services: std::mem::take(&mut out.evidence.services),
            phases_ms: out.phases.clone(),
            version: env!("QUIESCE_VERSION").into(),
            lineage: Some(sb.tracking.policy.lineage),
            setuid: Some(!sb.settings.no_new_privs),
            sandbox: Some(if sb.tracking.policy.by_lineage() { "lineage" } else { "uid" }.into()),
            agent_root: Some(sb.tracking.policy.by_lineage() || !sb.settings.no_new_privs),
            attest: attest_claim,
        };
        marker::jws::sign(&sb.settings.key, &claims)
    });
    match signed.and_then(|jws| sb.state.write_atomic(state::dir::MARKER, jws.as_bytes(), 0o644)) {
        Ok(()) => {
            status.state = FreezeState::Quiescent;
            log::info!(
                "freeze {id}: quiescent, {} process(es) killed in {} ms",
                status.killed,
                out.phases.total
            );
        }
        Err(e) => {
            status.state = FreezeState::Failed;
            status.reason = Some(format!("cannot write the marker: {e}"));
            log::error!("freeze {id} failed: cannot write the marker: {e}");
        }
    }
    if status.state == FreezeState::Quiescent {
        status.attestation = facts.and_then(|f| start_attestation(sb, reaper, f, attest_paths));
    }
}

/// A failed freeze: its reason and survivors, said.
fn failed(status: &mut Status, out: &freeze::run::Outcome) {
    let id = status.id.clone();
    status.state = FreezeState::Failed;
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

/// status.json says this freeze's state, or is not there: one that cannot be written (a full
/// or read-only file system) must not leave the last freeze's "quiescent" readable as if it
/// were this one's. Removing needs no room; a read-only file system keeps it, and says so.
fn write_status(sb: &Sandbox, status: &Status) {
    if let Err(e) = sb.state.write_status(status) {
        log::error!("cannot write status: {e}");
        if let Err(e) = sb.state.remove(state::dir::STATUS) {
            log::error!("cannot remove the last status either: {e}");
        }
    }
}

/// The final status: in status.json, and where the client that asked for this freeze looks.
fn publish(sb: &mut Sandbox, status: &Status) {
    write_status(sb, status);
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
        Some(state::dir::Attestation { state: AttestationState::Failed, reason: Some(why) })
    };
    let paths = match paths {
        Ok(p) if p.is_empty() => return None,
        Ok(p) => p,
        Err(e) => return failed(e),
    };
    let job = Job {
        state_dir: sb.state.path.clone(),
        paths,
        bounds: sb.settings.attest.bounds,
        threads: process::cpus().clamp(1, 2),
        freeze,
        seed: state::dir::hex(sb.settings.key.as_bytes()),
    };
    let started = attesting::start(&job);
    let mut seed = job.seed;
    zeroize::Zeroize::zeroize(&mut seed);
    match started {
        Ok(w) => {
            log::info!("freeze {id}: attestation started (worker pid {})", w.pid);
            reaper.watch = Some(w.pid);
            sb.worker = Some(w);
            Some(state::dir::Attestation { state: AttestationState::Running, reason: None })
        }
        Err(e) => failed(e),
    }
}

/// The worker was reaped with `code`: the last freeze's status gets its attestation's end.
pub(super) fn attestation_ended(sb: &mut Sandbox, code: i32) {
    let Some(w) = sb.worker.take() else { return };
    let pid = w.pid;
    let (st, reason) = w.finish(code);
    match &reason {
        Some(r) if st == AttestationState::Failed => {
            log::error!("attestation failed (worker pid {pid}): {r}")
        }
        r => log::info!("attestation {st}: {}", r.as_deref().unwrap_or("")),
    }
    if let Some(mut last) = sb.last.take() {
        last.attestation = Some(state::dir::Attestation { state: st, reason });
        publish(sb, &last);
    }
}

/// The attestation worker outlived its time bound: killed, and the last freeze's status says so.
pub(super) fn attestation_overdue(sb: &mut Sandbox) {
    if let Some(w) = sb.worker.as_mut().filter(|w| Instant::now() >= w.deadline) {
        let why = format!(
            "the time bound of {} s ran out: raise --attest-timeout or attest a smaller tree",
            sb.settings.attest.bounds.seconds
        );
        w.kill(why.clone());
        // Said now: a worker stuck in the kernel (a FUSE mount that never answers) may
        // not die of SIGKILL, and its reaping may never come.
        log::error!("attestation failed (worker pid {}): {why}", w.pid);
        if let Some(mut last) = sb.last.take() {
            last.attestation =
                Some(state::dir::Attestation { state: AttestationState::Failed, reason: Some(why) });
            publish(sb, &last);
        }
    }
}

/// How long a freeze waits, at most, for a fresh observation when the last refresh is stale.
const FRESH_LOOK: Duration = Duration::from_secs(1);

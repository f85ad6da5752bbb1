//! PID 1's loop: one event at a time (a child exited, a freeze was asked for, a signal to forward,
//! a tick), in the manner of catatonit's `switch` on the signal; what each event asks for is done
//! by the module of that job (reaper, freezing, tracking, shutdown). May use every folder below
//! the init.
//!
//! Before the command runs, a failure to set up ends the init (exit code 2). Once it runs,
//! `run` returns only through the shutdown, with the command's exit code: every error after that
//! point is logged and the loop goes on. A sidecar runs the loop with no command: it ends on
//! SIGTERM or SIGINT, with 0.

use crate::freeze;
use crate::init::attesting::{self, Worker};
use crate::init::freezing::{attestation_ended, attestation_overdue, do_freeze};
use crate::init::reaper::Reaper;
use crate::init::shutdown::{remap, Shutdown};
use crate::init::tracking::{take_launch, track, Oom, Schedule, Tracking};
use crate::kernel::{
    process::Pid,
    signal::{self, Origin, SignalFd},
};
use crate::observe::procs::reader::Reader;
use crate::spawn::plan::Plan;
use crate::state::dir::{StateDir, Status};
use crate::state::requests::{self, Job};
use ed25519_dalek::SigningKey;
use std::time::{Duration, Instant};

/// The sandbox's side of the init: its fixed settings, what tracking has learnt, and the state
/// dir with what passes through it.
pub struct Sandbox {
    pub settings: Settings,
    pub tracking: Tracking,
    pub state: StateDir,
    /// Start-time files not yet synced (see `StateDir::write_atomic_deferred`).
    pub unsynced: Vec<std::fs::File>,
    pub intake: requests::Intake,
    /// The attestation worker of the last freeze, while it runs.
    pub worker: Option<Worker>,
    /// The last freeze's final status, rewritten when its attestation ends.
    pub last: Option<Status>,
}

/// What the command line and the start-up fixed: no freeze or refresh changes it.
pub struct Settings {
    pub key: SigningKey,
    pub freeze_signal: i32,
    pub freeze: freeze::run::Config,
    pub after_freeze_exit: bool,
    pub track_interval: Option<Duration>,
    /// The command is a sandbox launch (--run-as).
    pub command_is_sandbox: bool,
    /// The init runs with no_new_privs (so does everything entered into the container): no
    /// setuid binary makes any process root.
    pub no_new_privs: bool,
    /// What to attest after a quiescent freeze.
    pub attest: attesting::Setup,
}

pub struct Config {
    /// None: a sidecar's loop, with no command of its own.
    pub plan: Option<Plan>,
    pub pgroup: bool,
    pub remap_exit: Vec<u8>,
    pub grace: Duration,
    pub sandbox: Option<Sandbox>,
}

/// What wakes PID 1: each signal read from the signalfd, then one tick for the turn.
enum Event {
    /// SIGCHLD: children exited.
    Child,
    /// The freeze signal, and where it came from.
    Freeze(Origin),
    /// Any other signal, and where it came from: the command's, forwarded to it (with no command:
    /// SIGTERM and SIGINT end the loop, the rest are dropped).
    Forward(i32, Origin),
    /// The signals are read (or the wait timed out): reap, freeze, track, shut down.
    Tick,
}

/// Freeze signals kept per turn at most: their senders are looked for among the requests.
const SENDERS: usize = 64;

/// What one turn's signals asked for, done at its tick.
#[derive(Default)]
struct Turn {
    child: bool,
    freeze_senders: Vec<Pid>,
}

/// The loop's state from one turn to the next.
struct Pid1 {
    reaper: Reaper,
    shutdown: Shutdown,
    /// A freeze ran: the init stays once the command ended, unless told to exit after a freeze.
    frozen: bool,
    /// SIGTERM or SIGINT came after a freeze: the container may end.
    term_after_freeze: bool,
    schedule: Schedule,
    /// Children left to reap after a full batch: the next turn does not wait.
    backlog: bool,
    /// With no command: SIGTERM or SIGINT came, and the loop ends with 0.
    stopped: bool,
}

/// Run the init; returns the exit code.
pub fn run(mut cfg: Config) -> i32 {
    let sfd = match signal::block_all_signals().and_then(|_| SignalFd::new()) {
        Ok(s) => s,
        Err(e) => {
            crate::init::logging::line(format_args!("quiesce: cannot set up signal handling: {e}"));
            return 2;
        }
    };
    let main = match cfg.plan.as_ref().map(|p| p.spawn(crate::init::logging::line)).transpose() {
        Ok(pid) => pid,
        Err(e) => {
            crate::init::logging::line(format_args!("quiesce: cannot start the command: {e}"));
            return 2;
        }
    };
    // The command runs: from here on the init never dies of its own error.
    let mut pid1 = Pid1::start(&mut cfg, main);
    loop {
        pid1.wait(&sfd, &cfg);
        let mut turn = Turn::default();
        let freeze_signal = cfg.sandbox.as_ref().map(|sb| sb.settings.freeze_signal);
        let fsig = freeze_signal.unwrap_or(0);
        for event in events(&sfd, freeze_signal) {
            match event {
                Event::Child => turn.child = true,
                Event::Freeze(origin) if may_be_the_sandboxs(&cfg, fsig, origin) => {
                    dropped(fsig, origin, BY_UID)
                }
                Event::Freeze(origin) => {
                    // One whose sender the kernel does not name (a root agent's kind) is a bare
                    // one: it takes no request (a request is taken only on its own client's signal).
                    let pid = match origin {
                        Origin::Sent(s) => s.pid,
                        _ => 0,
                    };
                    log::info!("freeze requested by pid {pid}");
                    if turn.freeze_senders.len() < SENDERS {
                        turn.freeze_senders.push(pid);
                    }
                }
                Event::Forward(sig, origin) if may_be_the_sandboxs(&cfg, sig, origin) => {
                    dropped(sig, origin, BY_UID)
                }
                Event::Forward(sig, origin) if from_the_sandbox(&cfg, origin) => {
                    dropped(sig, origin, BY_LINEAGE)
                }
                Event::Forward(sig, _) => pid1.forward(&cfg, sig),
                Event::Tick => {
                    if let Some(code) = pid1.tick(&mut cfg, &turn) {
                        return code;
                    }
                }
            }
        }
    }
}

/// The signals pending now, then the tick.
fn events(sfd: &SignalFd, freeze_signal: Option<i32>) -> impl Iterator<Item = Event> + '_ {
    // Bounded: standard signals coalesce, so at most one of each plus queued RT signals.
    let signals = (0..4096).map_while(move |_| match sfd.read() {
        Ok(x) => x,
        Err(e) => {
            log::error!("reading signals failed: {e}");
            None
        }
    });
    signals
        .map(move |(sig, origin)| match sig {
            libc::SIGCHLD => Event::Child,
            s if Some(s) == freeze_signal => Event::Freeze(origin),
            s => Event::Forward(s, origin),
        })
        .chain(std::iter::once(Event::Tick))
}

const BY_UID: &str = "with a sandbox user, a signal that a sandbox process may have sent (its real UID a sandbox \
    UID, a sender the kernel does not name, a file owner's SIGIO or SIGURG) is not acted on: it can reach PID 1 \
    while a freeze's credential switch holds that UID";
const BY_LINEAGE: &str =
    "with a root agent, only a process that carries no lineage tag (the orchestrator's, or one from outside) \
     may signal the command";

fn dropped(sig: i32, origin: Origin, why: &str) {
    let from = match origin {
        Origin::Sent(s) => format!("pid {} (uid {})", s.pid, s.uid),
        Origin::Kernel => "the kernel".to_string(),
        Origin::Unnamed => "a sender the kernel does not name".to_string(),
    };
    log::warn!("{} from {from} dropped: {why}", signal::signal_name(sig));
}

/// With sandbox UIDs, a sandbox process can send PID 1 any signal while a freeze's credential
/// switch has the init's thread hold its UID (`freeze::cred`): SIGKILL and SIGSTOP the kernel
/// drops, every other signal is queued. So the init acts on no signal a sandbox process may have
/// sent: one whose sender's real UID (the kernel's) is a sandbox UID, unless it comes from outside
/// the namespace (pid 0, which no sandbox process is: an engine whose UID the user namespace does
/// not map is named 65534, which may be the sandbox user's); one whose sender the kernel does not
/// name (a queued signal writes any pid and UID; a poll signal chosen with F_SETSIG); and a file
/// owner's SIGIO or SIGURG, which the kernel sends only where that owner could signal PID 1. The
/// kernel's other signals (a terminal's hangup) pass no such check and stay the command's.
/// SIGCHLD is not asked: it only makes the init reap.
fn may_be_the_sandboxs(cfg: &Config, sig: i32, origin: Origin) -> bool {
    let Some(sb) = cfg.sandbox.as_ref() else { return false };
    let uids = &sb.tracking.policy.uids;
    !uids.is_empty()
        && match origin {
            Origin::Sent(s) => s.pid != 0 && uids.contains(&s.uid),
            Origin::Kernel => matches!(sig, libc::SIGIO | libc::SIGURG),
            Origin::Unnamed => true,
        }
}

/// In a sandbox of lineage alone the agent is root, and root may signal PID 1: a signal from a
/// process of the namespace is the agent's unless that process is shown to carry no loginuid
/// (the agent's all carry its tag; one that exited before it was read is not shown clean). A
/// signal whose sender the kernel does not name (queued with a pid of its sender's choosing,
/// SIGIO, a poll signal) is the agent's too. Signals from outside (sender 0, sent by kill or a
/// pidfd: the engine's `docker stop`) are the orchestrator's.
fn from_the_sandbox(cfg: &Config, origin: Origin) -> bool {
    let by_lineage = cfg.sandbox.as_ref().is_some_and(|sb| sb.tracking.policy.by_lineage());
    by_lineage
        && match origin {
            Origin::Sent(s) if s.pid == 0 => false,
            Origin::Sent(s) => !matches!(crate::observe::procs::reader::loginuid_of(s.pid), Ok(None)),
            Origin::Kernel | Origin::Unnamed => true,
        }
}

impl Pid1 {
    /// The command started as `main` (None: no command): hold it, make the start-time files
    /// durable, take the first tracking observation.
    fn start(cfg: &mut Config, main: Option<Pid>) -> Pid1 {
        match main {
            Some(pid) => log::debug!("command started as pid {pid}"),
            None => log::debug!("no command: waiting for freeze requests until SIGTERM or SIGINT"),
        }
        let main_start = main.and_then(|m| Reader::default().start_time(m).ok().flatten());
        let reaper = Reaper { main, main_start, status: None, childless: false, watch: None, watched: None };
        if let (Some(sb), Some(m), Some(t)) = (cfg.sandbox.as_mut(), main, main_start) {
            if sb.settings.command_is_sandbox {
                // The init's own launch: the sandbox's from its first instruction, seen or not.
                sb.tracking.policy.history.insert((m, t));
            }
        }
        let mut schedule = Schedule::new();
        if let Some(sb) = cfg.sandbox.as_mut() {
            if let Err(e) = sb.state.make_durable(std::mem::take(&mut sb.unsynced)) {
                log::error!("cannot sync the start-time files in {}: {e}", sb.state.path.display());
            }
            let began = Instant::now();
            let how = track(&mut sb.tracking, &|| signal::other_signal_pending(libc::SIGCHLD), Oom::Raise);
            schedule.done(began, sb.settings.track_interval, how);
        }
        Pid1 {
            reaper,
            shutdown: Shutdown::None,
            frozen: false,
            term_after_freeze: false,
            schedule,
            backlog: false,
            stopped: false,
        }
    }

    /// Wait for a signal, until the next thing due at most.
    fn wait(&self, sfd: &SignalFd, cfg: &Config) {
        let now = Instant::now();
        let deadline = self.shutdown.deadline(now).or(self.schedule.next);
        let worker_due = cfg.sandbox.as_ref().and_then(|sb| sb.worker.as_ref()).map(|w| w.deadline);
        let deadline = match (deadline, worker_due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut timeout = deadline.map(|d| d.saturating_duration_since(now));
        // Children left to reap, or freeze requests waiting (one freeze per pass): come back at
        // once, with signals read in between.
        if self.backlog || cfg.sandbox.as_ref().is_some_and(|sb| sb.intake.busy()) {
            timeout = Some(Duration::ZERO);
        }
        if let Err(e) = sfd.wait(timeout) {
            log::error!("waiting for signals failed: {e}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A signal for the command: sent on to it (or its process group) while it runs. With no
    /// command, SIGTERM and SIGINT stop the loop and any other is dropped.
    fn forward(&mut self, cfg: &Config, sig: i32) {
        if self.frozen && (sig == libc::SIGTERM || sig == libc::SIGINT) {
            // After a freeze the init waits for this to end the container.
            self.term_after_freeze = true;
        }
        let Some(main) = self.reaper.main else {
            if sig == libc::SIGTERM || sig == libc::SIGINT {
                log::info!("{}: stopping", signal::signal_name(sig));
                self.stopped = true;
            } else {
                log::debug!("{} dropped: there is no command to forward it to", signal::signal_name(sig));
            }
            return;
        };
        if self.reaper.status.is_none() {
            let target = if cfg.pgroup { -main } else { main };
            log::debug!("forwarding {} to {target}", signal::signal_name(sig));
            if let Err(e) = signal::kill(target, sig) {
                log::debug!("forwarding {} failed: {e}", signal::signal_name(sig));
            }
        }
    }

    /// The end of a turn: reap, then the sandbox's work, then the shutdown once the command
    /// ended. Some: the init's exit code.
    fn tick(&mut self, cfg: &mut Config, turn: &Turn) -> Option<i32> {
        // A freeze request goes first: one batch of reaping costs milliseconds when the init has
        // thousands of children (each waitpid walks them all). The freeze reaps as it kills.
        let freeze_waiting =
            !turn.freeze_senders.is_empty() || cfg.sandbox.as_ref().is_some_and(|sb| sb.intake.busy());
        self.backlog = freeze_waiting || self.reaper.reap();
        if let Some(sb) = cfg.sandbox.as_mut() {
            if let Some(code) = self.reaper.watched.take() {
                attestation_ended(sb, code);
            }
            attestation_overdue(sb);
            self.take_requests(sb, &turn.freeze_senders);
            self.track_if_due(sb, turn.child);
        }
        let code = if self.stopped { 0 } else { self.reaper.status? };
        let stay = !self.stopped
            && self.frozen
            && cfg.sandbox.as_ref().is_some_and(|sb| !sb.settings.after_freeze_exit);
        if stay && !self.term_after_freeze {
            return None;
        }
        self.shutdown.step(self.reaper.childless, cfg.grace).then(|| remap(code, &cfg.remap_exit))
    }

    /// Take the freeze requests and launch records waiting, and run one freeze.
    fn take_requests(&mut self, sb: &mut Sandbox, senders: &[Pid]) {
        // The start point comes before anything a sandbox process can tell a freeze by: the
        // request's rename in `requests/` (root's alone, 0700, so only a root process could),
        // the launch chains walked, the old marker's removal, "freezing" in status.json. A
        // process that waits for those makes what it makes after this point, where the proof
        // looks for newcomers. A request queued by an earlier take gets the point of the pass
        // that runs it: its rename was in that root-only directory, and nothing since told.
        let since =
            (!senders.is_empty() || sb.intake.busy()).then(|| freeze::run::start_point(&Reader::default()));
        let job = sb.intake.next(senders);
        // Launch records taken with it are held before any freeze runs, and only then answered.
        for (id, launch) in sb.intake.take_launches() {
            take_launch(&mut sb.tracking, &launch);
            sb.intake.answer_launch(&id);
        }
        let request = match job {
            Job::Idle => return,
            Job::Bare => None,
            Job::Request(r) => Some(r),
        };
        let since = since.unwrap_or_else(|| freeze::run::start_point(&Reader::default()));
        do_freeze(sb, &mut self.reaper, request, since);
        self.frozen = true;
        self.backlog = self.reaper.reap();
    }

    /// Refresh the tracking table when it is due and nothing comes first.
    fn track_if_due(&mut self, sb: &mut Sandbox, child: bool) {
        let now = Instant::now();
        // Queued freeze requests come first (each freeze makes its own observation), and so
        // does a signal that came in meanwhile: a refresh lists all of /proc before it can
        // notice one.
        if matches!(self.shutdown, Shutdown::None)
            && !sb.intake.busy()
            && self.schedule.due(now, child)
            && !signal::other_signal_pending(libc::SIGCHLD)
        {
            let how = track(&mut sb.tracking, &|| signal::other_signal_pending(libc::SIGCHLD), Oom::Raise);
            self.schedule.done(now, sb.settings.track_interval, how);
        }
    }
}

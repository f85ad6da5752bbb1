//! The init: start the command, reap everything, forward signals, freeze on request,
//! shut down cleanly. Once the command runs, nothing here may end the init by error.

use crate::decide::newcomers;
use crate::decide::taint::Policy;
use crate::freeze;
use crate::init::attesting::{self, Worker};
use crate::init::freezing::{attestation_ended, do_freeze, publish};
use crate::init::reaper::Reaper;
use crate::init::shutdown::{remap, signal_rest, Shutdown};
use crate::init::spawn::Plan;
use crate::init::tracking::{take_launch, track};
use crate::kernel::sys::{self, Pid, SignalFd};
use crate::observe::procs::reader::Reader;
use crate::state::requests;
use crate::state::{self, dir::StateDir, dir::Status};
use ed25519_dalek::SigningKey;
use std::time::{Duration, Instant};

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

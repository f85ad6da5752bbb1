//! The freeze: stop every sandbox process, walk them, kill them, then prove with an
//! observation taken after the last kill that none is alive. Bounded by one budget.

use crate::evidence::{self, Gathered};
use crate::procs::{self, Detail, Proc, Reader, Snapshot};
use crate::state::{Phases, Survivor};
use crate::sys::{self, Pid};
use crate::taint::{Policy, Tainted};
use std::io;
use std::time::{Duration, Instant};

pub struct Config {
    pub cred: sys::CredThread,
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

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// The live sandbox processes of a snapshot.
fn live<'a>(snap: &'a Snapshot, tainted: &'a Tainted) -> impl Iterator<Item = &'a Proc> + 'a {
    tainted.keys().filter_map(|pid| snap.procs.get(pid)).filter(|p| p.alive())
}

/// Observe and classify; the policy remembers what it saw, so an escape later does not help.
fn observe(reader: &Reader, policy: &mut Policy, detail: Detail) -> io::Result<(Snapshot, Tainted)> {
    let snap = reader.snapshot(detail)?;
    let tainted = policy.classify(&snap);
    policy.remember(&snap, &tainted);
    Ok((snap, tainted))
}

fn depth(snap: &Snapshot, p: &Proc) -> usize {
    let mut d = 0;
    let mut cur = p.ppid;
    while let Some(parent) = snap.procs.get(&cur) {
        d += 1;
        if d > snap.procs.len() {
            break;
        }
        cur = parent.ppid;
    }
    d
}

/// Could kill(-1) from a thread switched to a sandbox UID miss this process? Its permission
/// check looks at the leader's real and saved UIDs only, and a leader that exited while other
/// threads run is not a reliable target.
fn missable(p: &Proc, uids: &[u32]) -> bool {
    match p.threads.iter().find(|t| t.tid == p.pid) {
        None => true,
        Some(l) => matches!(l.state, 'Z' | 'X') || !(uids.contains(&l.uids[0]) || uids.contains(&l.uids[2])),
    }
}

/// Signal live sandbox processes through pidfds, children before parents: all of them, or only
/// those the kernel-side channel may have missed.
fn signal_each(
    reader: &Reader,
    snap: &Snapshot,
    tainted: &Tainted,
    sig: i32,
    only_missable: Option<&[u32]>,
) -> io::Result<usize> {
    let mut targets: Vec<&Proc> =
        live(snap, tainted).filter(|p| only_missable.is_none_or(|u| missable(p, u))).collect();
    targets.sort_by_key(|p| std::cmp::Reverse(depth(snap, p)));
    let mut n = 0;
    for p in targets {
        if procs::signal(reader, p, sig)? {
            n += 1;
        }
    }
    Ok(n)
}

fn survivors(snap: &Snapshot, tainted: &Tainted) -> Vec<Survivor> {
    live(snap, tainted)
        .map(|p| Survivor { pid: p.pid, uid: p.uid(), state: p.state, comm: p.comm.clone() })
        .collect()
}

struct Run<'a> {
    cred: &'a sys::CredThread,
    reader: &'a Reader,
    policy: &'a mut Policy,
    reap: &'a mut dyn FnMut(),
    start: Instant,
    deadline: Instant,
    phases: Phases,
    evidence: Gathered,
    unstopped: Vec<Pid>,
}

impl Run<'_> {
    fn fail(self, reason: String, survivors: Vec<Survivor>) -> Outcome {
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

    /// Both channels: the kernel-atomic kill(-1) as each sandbox UID, then pidfds for whatever
    /// its permission check may have missed (`all`: for every live sandbox process).
    fn both_channels(
        &mut self,
        sig: i32,
        snap: &Snapshot,
        tainted: &Tainted,
        all: bool,
    ) -> Result<(), String> {
        self.cred
            .kill_all_as(&self.policy.uids, sig)
            .map_err(|e| format!("credential switch failed: {e}"))?;
        let uids = self.policy.uids.clone();
        let only = if all { None } else { Some(uids.as_slice()) };
        signal_each(self.reader, snap, tainted, sig, only).map_err(|e| format!("signal failed: {e}"))?;
        Ok(())
    }

    /// Stop everything; returns the last observation, in which every sandbox process is
    /// stopped (or the wait ran out).
    fn stop(&mut self, stop_wait: Duration) -> Result<(Snapshot, Tainted), String> {
        let t = Instant::now();
        self.cred
            .kill_all_as(&self.policy.uids, libc::SIGSTOP)
            .map_err(|e| format!("credential switch failed: {e}"))?;
        let until = (t + stop_wait).min(self.deadline);
        let mut pause = Duration::from_millis(1);
        let mut first = true;
        let last = loop {
            let pass = Instant::now();
            let (snap, tainted) = observe(self.reader, self.policy, Detail::Light)
                .map_err(|e| format!("/proc unreadable: {e}"))?;
            let running: Vec<&Proc> = live(&snap, &tainted).filter(|p| !p.stopped()).collect();
            log::debug!(
                "stop: observed {} processes in {:?}, {} sandbox, {} not yet stopped",
                snap.procs.len(),
                pass.elapsed(),
                tainted.len(),
                running.len()
            );
            if running.is_empty() {
                self.unstopped.clear();
                break (snap, tainted);
            }
            if Instant::now() >= until {
                self.unstopped = running.iter().map(|p| p.pid).collect();
                log::warn!(
                    "freeze: {} sandbox process(es) not stopped after {:?}; killing anyway",
                    running.len(),
                    stop_wait
                );
                break (snap, tainted);
            }
            // kill(-1) reached the rest already and they are on their way to stopping; on the
            // first pass only what it may have missed needs a pidfd.
            for p in running {
                if !first || missable(p, &self.policy.uids) {
                    procs::signal(self.reader, p, libc::SIGSTOP)
                        .map_err(|e| format!("signal failed: {e}"))?;
                }
            }
            first = false;
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        };
        self.phases.stop = ms(t.elapsed());
        Ok(last)
    }

    /// Record the evidence of every sandbox process while it is stopped. The reads that can
    /// wait on the target run on a reader thread with a deadline, within a share of the budget.
    fn walk(&mut self, snap: Snapshot, tainted: &Tainted) -> Snapshot {
        let t = Instant::now();
        let targets = live(&snap, tainted).map(|p| evidence::Target::of(p, &tainted[&p.pid]));
        self.evidence = evidence::gather(targets, evidence::walk_deadline(t, self.deadline));
        self.phases.walk = ms(t.elapsed());
        snap
    }
}

/// Run one freeze. `reap` reaps every zombie child of the init (and records the command's status).
pub fn run(cfg: &Config, policy: &mut Policy, reader: &Reader, reap: &mut dyn FnMut()) -> Outcome {
    let start = Instant::now();
    let mut run = Run {
        cred: &cfg.cred,
        reader,
        policy,
        reap,
        start,
        deadline: start + cfg.timeout,
        phases: Phases::default(),
        evidence: Gathered::default(),
        unstopped: Vec::new(),
    };
    let (snap, tainted) = match run.stop(cfg.stop_wait) {
        Ok(x) => x,
        Err(e) => return run.fail(e, Vec::new()),
    };
    let snap = run.walk(snap, &tainted);

    let t = Instant::now();
    if let Err(e) = run.both_channels(libc::SIGKILL, &snap, &tainted, false) {
        return run.fail(e, survivors(&snap, &tainted));
    }
    (run.reap)();
    run.phases.kill = ms(t.elapsed());

    let t = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        // The proof: a complete observation taken after the last kill.
        let (snap, tainted) = match observe(run.reader, run.policy, Detail::Light) {
            Ok(x) => x,
            Err(e) => {
                run.phases.probe = ms(t.elapsed());
                return run.fail(format!("/proc unreadable: {e}"), Vec::new());
            }
        };
        let left = survivors(&snap, &tainted);
        if left.is_empty() {
            run.phases.probe = ms(t.elapsed());
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
        if Instant::now() >= run.deadline {
            run.phases.probe = ms(t.elapsed());
            let n = left.len();
            return run.fail(
                format!("{n} sandbox process(es) still alive after the {:?} budget", cfg.timeout),
                left,
            );
        }
        if let Err(e) = run.both_channels(libc::SIGKILL, &snap, &tainted, true) {
            return run.fail(e, left);
        }
        (run.reap)();
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

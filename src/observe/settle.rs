//! Waiting, cheaply, for signalled processes to act on the signal: stopped after SIGSTOP, dead
//! after SIGKILL. Each of them needs the CPU to get there, and a full observation taken before
//! they all did is wasted (it reads status and more of every process, and is taken again). So
//! the freeze first re-reads only the stat line of a sample of the processes it signalled (and
//! of each thread, for a process with several), sleeping in between and leaving the CPU to them,
//! until the sample is there or the bound passes.
//!
//! Nothing is decided here: the stop ends with a full observation and the proof is a consistent
//! observation taken after the last kill. A process this wait lets go of too early (continued
//! again, or a pid reused) is seen there, and a read that fails only ends the wait.

use crate::kernel::process::Pid;
use crate::observe::procs::pass::Pass;
use crate::observe::procs::reader::Reader;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Goal {
    /// Every thread stopped (T), traced-stopped (t), or dead.
    Stopped,
    /// The process exited: gone, or a zombie whose thread count is down to its leader.
    Dead,
}

/// First pause while one process is not there yet, and the longest.
const PAUSE_MIN: Duration = Duration::from_micros(100);
const PAUSE_MAX: Duration = Duration::from_millis(2);

/// A process to wait for: its pid and, when known, its start time.
pub type Target = (Pid, Option<u64>);

/// How long the wait for stopped stays on one process. Some never stop by this channel (a
/// process the UID check of kill(-1) misses, one in uninterruptible sleep): after the first that
/// does not arrive in time, the rest are each read once, without waiting.
const STOP_PATIENCE: Duration = Duration::from_millis(20);

/// Processes the wait reads: the last one signalled and others spread evenly over the rest.
const SAMPLE: usize = 32;

/// Wait until a sample of the targets reached `goal`, or `bound` passed; returns how many of
/// the sample had not.
///
/// The targets were signalled at once, in the order the kernel signalled them (the task list,
/// which lists them here too), and act on it about in that order; reading every one of them would
/// cost about as much as the full observation that follows. So the wait reads the last one first,
/// then a sample spread over the rest: once those are there, the others most likely are too, and
/// the full observation finds any that are not.
pub fn wait(reader: &Reader, targets: &[Target], goal: Goal, bound: Instant) -> usize {
    let Ok(mut pass) = reader.pass() else { return targets.len().min(SAMPLE) };
    let step = targets.len().div_ceil(SAMPLE).max(1);
    let sample: Vec<Target> =
        targets.last().into_iter().chain(targets.iter().step_by(step)).copied().collect();
    let mut left = 0;
    let mut patient = true;
    for (i, &(pid, start)) in sample.iter().enumerate() {
        let mut pause = PAUSE_MIN;
        let give_up = match goal {
            Goal::Stopped if patient => bound.min(Instant::now() + STOP_PATIENCE),
            Goal::Stopped => Instant::now(),
            Goal::Dead => bound,
        };
        loop {
            match there(&mut pass, pid, start, goal) {
                Some(true) => break,
                Some(false) if Instant::now() < give_up => {}
                Some(false) if Instant::now() < bound => {
                    left += 1;
                    patient = false;
                    break;
                }
                // Past the bound, or unreadable: this one and the rest are left to the observation.
                _ => return left + (sample.len() - i),
            }
            std::thread::sleep(pause.min(give_up.saturating_duration_since(Instant::now())));
            pause = (pause * 2).min(PAUSE_MAX);
        }
    }
    left
}

/// Pids whose /proc directory belongs to one of `uids`, enough of them for a sample: the kernel
/// gives a process's directory its effective UID (root when it is not dumpable). One fstatat per
/// pid looked at, without reading anything the process can make slow. The listing is visited in
/// strides, so that the first found are spread over it, the highest pid first, and the visit ends
/// once `SAMPLE` more than a sample's worth are found: the rest would cost an fstatat each and
/// never be waited on (the observation after the wait finds everything).
pub fn owned_by(reader: &Reader, uids: &[u32]) -> Vec<Target> {
    let Ok(pass) = reader.pass() else { return Vec::new() };
    let Ok(mut pids) = reader.pids() else { return Vec::new() };
    pids.sort_unstable();
    let stride = pids.len().div_ceil(SAMPLE).max(1);
    let order = pids
        .len()
        .checked_sub(1)
        .into_iter()
        .chain((0..stride).flat_map(|o| (o..pids.len()).step_by(stride)));
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for i in order {
        if out.len() > 2 * SAMPLE {
            break;
        }
        let pid = pids[i];
        if seen.insert(pid) && pass.owner(pid).is_some_and(|u| uids.contains(&u)) {
            out.push((pid, None));
        }
    }
    out
}

/// Has this process reached `goal`? None: it could not be read (the wait ends).
fn there(pass: &mut Pass, pid: Pid, start: Option<u64>, goal: Goal) -> Option<bool> {
    let stat = match pass.stat(pid) {
        Ok(Some(s)) => s,
        // Exited (or the pid names another process now): the one signalled is gone.
        Ok(None) => return Some(true),
        Err(_) => return None,
    };
    if start.is_some_and(|s| s != stat.start_time) {
        return Some(true);
    }
    let dead = matches!(stat.state, 'Z' | 'X');
    match goal {
        Goal::Dead => Some(dead && stat.num_threads <= 1),
        Goal::Stopped if stat.num_threads <= 1 => Some(dead || matches!(stat.state, 'T' | 't')),
        // Every thread stopped includes the leader: while it runs, its threads need no read.
        Goal::Stopped if !dead && !matches!(stat.state, 'T' | 't') => Some(false),
        Goal::Stopped => match pass.task_states(pid) {
            Ok(Some(states)) => Some(states.iter().all(|c| matches!(c, 'T' | 't' | 'Z' | 'X' | 'x'))),
            Ok(None) => Some(true),
            Err(_) => None,
        },
    }
}

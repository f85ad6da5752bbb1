//! At a memory limit the sandbox's processes go before the init: each one a tracking refresh
//! finds is made the OOM killer's first choice (oom_score_adj 1000) unless it already is by
//! birth. `quiesce exec` and `--run-as` launches raise themselves before their command runs;
//! this reaches the rest, a process entered with `docker exec -u` above all, within a refresh
//! of its start. A child inherits its parent's score when it forks, so a process born after its
//! parent was raised needs no write of its own.
//!
//! Help for an honest agent, not a guarantee against a hostile one: without CAP_SYS_RESOURCE
//! (Docker's default) the kernel lets a process lower its score back to where it started, and a
//! hostile agent gains nothing by it but a dead init, which is no marker. Nothing the proof
//! rests on reads what is written here.
//!
//! May use: kernel, observe, decide (as the init does).

use crate::decide::taint::Tainted;
use crate::kernel::{dirfd, process, process::Pid};
use crate::observe::procs::parse::parse_stat;
use crate::observe::procs::table::Table;
use std::collections::HashMap;
use std::path::Path;

/// The sandbox processes known to hold the first choice, by identity (pid, start time), and the
/// clock tick since which they hold it: a child born in a later tick inherited it.
#[derive(Default)]
pub struct OomFirst {
    held: HashMap<(Pid, u64), u64>,
    /// The kernel refused a write once (an init without privilege): said once, not per process.
    refused_said: bool,
}

/// What one write ended in.
enum Raised {
    /// Written, at this clock tick.
    At(u64),
    /// The process is gone, or another one holds its pid: nothing to do.
    Gone,
    /// The kernel refused, or /proc could not be read: said, and not tried again for it.
    Failed(String),
}

impl OomFirst {
    /// Raise every live process of `tainted` in `seen` that does not hold the first choice yet,
    /// through `proc` (the /proc the observation was read from). Bounded by the table: each
    /// process is written at most once while it lives.
    pub fn raise(&mut self, proc: &Path, seen: &Table, tainted: &Tainted) {
        self.held.retain(|(pid, start), _| seen.get(pid).is_some_and(|p| p.start_time == *start));
        let mut todo: Vec<(u64, Pid, Pid)> = tainted
            .keys()
            .filter_map(|pid| seen.get(pid))
            .filter(|p| p.alive() && !self.held.contains_key(&(p.pid, p.start_time)))
            .map(|p| (p.start_time, p.pid, p.ppid))
            .collect();
        // Parents before their children, so that a child born after its parent's raise is seen
        // to have inherited it in the same pass.
        todo.sort_unstable();
        for (start, pid, ppid) in todo {
            let parent = seen.get(&ppid).and_then(|pp| self.held.get(&(ppid, pp.start_time)));
            if parent.is_some_and(|&since| start > since) {
                self.held.insert((pid, start), start);
                continue;
            }
            match raise_one(proc, pid, start) {
                Raised::At(tick) => {
                    self.held.insert((pid, start), tick);
                }
                Raised::Gone => {}
                Raised::Failed(e) => {
                    // Held as if raised: one try per process, so a refusal costs no write per refresh.
                    self.held.insert((pid, start), u64::MAX);
                    if !self.refused_said {
                        self.refused_said = true;
                        log::warn!(
                            "cannot raise sandbox process {pid}'s oom_score_adj to 1000 ({e}): at a memory \
                             limit the OOM killer may take the init; launch the agent with `quiesce exec`"
                        );
                    } else {
                        log::debug!("cannot raise process {pid}'s oom_score_adj: {e}");
                    }
                }
            }
        }
    }
}

/// Write 1000 to the oom_score_adj of the process `pid` that started at `start`, and no other:
/// its /proc directory, once open, names that process for as long as it lives (a later process
/// with its pid is not reached through it), and its start time is read through it first.
fn raise_one(proc: &Path, pid: Pid, start: u64) -> Raised {
    let dir = match dirfd::open_dir(&proc.join(pid.to_string())) {
        Ok(d) => d,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) || e.raw_os_error() == Some(libc::ESRCH) => {
            return Raised::Gone
        }
        Err(e) => return Raised::Failed(format!("{}/{pid}: {e}", proc.display())),
    };
    let mut buf = Vec::with_capacity(512);
    match dirfd::read_file_at(&dir, c"stat", &mut buf, 4096) {
        Ok(_) => {}
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) || e.raw_os_error() == Some(libc::ENOENT) => {
            return Raised::Gone
        }
        Err(e) => return Raised::Failed(format!("{}/{pid}/stat: {e}", proc.display())),
    }
    match parse_stat(&buf) {
        Ok(st) if st.start_time == start => {}
        Ok(_) => return Raised::Gone,
        Err(e) => return Raised::Failed(format!("{}/{pid}/stat: {e}", proc.display())),
    }
    match dirfd::write_file_at(&dir, c"oom_score_adj", b"1000") {
        Ok(()) => match process::boot_ticks() {
            Ok(t) => Raised::At(t),
            // Not known when: no child counts as born after it, each gets its own write.
            Err(_) => Raised::At(u64::MAX),
        },
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Raised::Gone,
        Err(e) => Raised::Failed(format!("{}/{pid}/oom_score_adj: {e}", proc.display())),
    }
}

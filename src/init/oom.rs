//! At a memory limit the sandbox's processes go before the init: each one a tracking refresh
//! finds is made the OOM killer's first choice (oom_score_adj 1000) unless it already is.
//! `quiesce exec` and `--run-as` launches raise themselves before their command runs (and their
//! children inherit it); this reaches the rest, a process entered with `docker exec -u` above
//! all, within a refresh of its start. Nothing is inferred from a parent: a process's parent
//! need not be the one that forked it (CLONE_PARENT, an orphan handed to a subreaper), and a
//! fork copies the score before it stamps the child's start time, so each process's own score
//! is read, and written when it is not 1000.
//!
//! Help for an honest agent, not a guarantee against a hostile one: without CAP_SYS_RESOURCE
//! (Docker's default) the kernel lets a process lower its score back to where it started, and a
//! hostile agent gains nothing by it but a dead init, which is no marker. Nothing the proof
//! rests on reads what is written here.
//!
//! May use: kernel, observe, decide (as the init does).

use crate::decide::taint::Tainted;
use crate::kernel::{dirfd, process::Pid};
use crate::observe::procs::parse::parse_stat;
use crate::observe::procs::table::Table;
use std::collections::HashSet;
use std::path::Path;

/// How many processes are raised between two looks at `abort`: a freeze request waiting behind
/// a pass over a fork storm's newcomers waits for at most this many.
const BETWEEN_LOOKS: usize = 64;

/// The sandbox processes seen to hold the first choice, by identity (pid, start time).
#[derive(Default)]
pub struct OomFirst {
    held: HashSet<(Pid, u64)>,
    /// The kernel refused a write once (an init without privilege): said once, not per process.
    refused_said: bool,
}

/// What one process's score ended as.
enum Raised {
    /// It holds 1000: it did already, or it was written.
    Held,
    /// The process is gone, or another one holds its pid: nothing to do.
    Gone,
    /// The kernel refused, or /proc could not be read: said, and not tried again for it.
    Failed(String),
}

impl OomFirst {
    /// Raise every live process of `tainted` in `seen` not yet seen to hold the first choice,
    /// through `proc` (the /proc the observation was read from). Each process is read once while
    /// it lives, and written at most once. Stops early when `abort` says something waits (the
    /// rest go at the next refresh); returns whether it went through.
    pub fn raise(&mut self, proc: &Path, seen: &Table, tainted: &Tainted, abort: &dyn Fn() -> bool) -> bool {
        self.held.retain(|(pid, start)| seen.get(pid).is_some_and(|p| p.start_time == *start));
        let todo: Vec<(Pid, u64)> = tainted
            .keys()
            .filter_map(|pid| seen.get(pid))
            .filter(|p| p.alive() && !self.held.contains(&(p.pid, p.start_time)))
            .map(|p| (p.pid, p.start_time))
            .collect();
        for (i, (pid, start)) in todo.into_iter().enumerate() {
            if i > 0 && i % BETWEEN_LOOKS == 0 && abort() {
                return false;
            }
            match raise_one(proc, pid, start) {
                Raised::Held => {
                    self.held.insert((pid, start));
                }
                Raised::Gone => {}
                Raised::Failed(e) => {
                    // Held as if raised: one try per process, so a refusal costs no write per refresh.
                    self.held.insert((pid, start));
                    if !self.refused_said {
                        self.refused_said = true;
                        log::warn!(
                            "cannot raise sandbox process {}'s oom_score_adj to 1000 ({e}): at a memory \
                             limit the OOM killer may take the init; launch the agent with `quiesce exec`",
                            pid
                        );
                    } else {
                        log::debug!("cannot raise process {pid}'s oom_score_adj: {e}");
                    }
                }
            }
        }
        true
    }
}

/// Make the process `pid` that started at `start`, and no other, hold oom_score_adj 1000: its
/// /proc directory, once open, names that process for as long as it lives (a later process with
/// its pid is not reached through it), and its start time is read through it first.
fn raise_one(proc: &Path, pid: Pid, start: u64) -> Raised {
    let dir = match dirfd::open_dir(&proc.join(pid.to_string())) {
        Ok(d) => d,
        Err(e) if is_gone(&e) => return Raised::Gone,
        Err(e) => return Raised::Failed(format!("{}/{pid}: {e}", proc.display())),
    };
    let mut buf = Vec::with_capacity(512);
    match dirfd::read_file_at(&dir, c"stat", &mut buf, 4096) {
        Ok(_) => {}
        Err(e) if is_gone(&e) => return Raised::Gone,
        Err(e) => return Raised::Failed(format!("{}/{pid}/stat: {e}", proc.display())),
    }
    match parse_stat(&buf) {
        Ok(st) if st.start_time == start => {}
        Ok(_) => return Raised::Gone,
        Err(e) => return Raised::Failed(format!("{}/{pid}/stat: {e}", proc.display())),
    }
    // A process that holds it already (a child of a raised one, mostly) is not written: a write
    // to a process sharing its memory with others walks every process of the machine.
    match dirfd::read_file_at(&dir, c"oom_score_adj", &mut buf, 16) {
        Ok(_) if buf.trim_ascii() == b"1000" => return Raised::Held,
        Ok(_) => {}
        Err(e) if is_gone(&e) => return Raised::Gone,
        Err(e) => return Raised::Failed(format!("{}/{pid}/oom_score_adj: {e}", proc.display())),
    }
    match dirfd::write_file_at(&dir, c"oom_score_adj", b"1000") {
        Ok(()) => Raised::Held,
        Err(e) if is_gone(&e) => Raised::Gone,
        Err(e) => Raised::Failed(format!("{}/{pid}/oom_score_adj: {e}", proc.display())),
    }
}

/// The process a /proc directory named has exited (or was never there).
fn is_gone(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ESRCH) | Some(libc::ENOENT))
}

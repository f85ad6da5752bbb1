//! A consistent observation: a process table in which every process alive at its final instant
//! was read while alive. A plain listing is not one: a process listed and then read as gone may
//! have forked a child after the listing passed, and that child is in no table. A sandbox process
//! that hops to a new pid faster than the init reads would never be seen.
//!
//! The PID namespace's pid counter (`/proc/sys/kernel/ns_last_pid`) is the pid the kernel handed
//! out last. It moves only when the kernel hands one out: it takes the first free pid after the
//! last one, going round to 300 at pid_max. So it comes back to the same value after as few new
//! processes as there are free pids (with one free pid every new process gets it, and the counter
//! never moves), not after pid_max of them. "It did not move" alone proves nothing.
//!
//! What does: a pid that stays taken cannot be handed out. The pass reads the counter (value L)
//! and makes sure something holds L from then on: the task that had L before the reading (a
//! pidfd of it, taken after the reading, and a start tick earlier than the clock read before the
//! reading), or else a thread the init starts for the window, which gets the next pid and so is
//! the one the counter names (when no thread can start, a pids limit reached, the observation
//! says so at once: the freeze reaps what it killed, which frees pids, and observes again). If
//! later the counter still reads L and the holder still holds L
//! (alive, or a zombie nobody reaped), no pid was handed out in between: the last one handed out
//! would have been L. So every process alive then existed when the window opened. The first
//! window opens before the first listing: if it ends quiet, every process alive at its end was
//! listed and read while alive.
//!
//! When a window ends with pids handed out, the pids between its two readings are read: they
//! are the ones handed out if the counter went less than once round, which a nearly full pid
//! space does not promise, so this only saves work. What makes the table right is the last
//! window: it ends quiet, its final listing finds any process the table lacks, and every entry
//! read before it whose pid may have been freed since is read again inside it. That is every
//! entry but the init's children: only a parent reaps a process and frees its pid (or the kernel,
//! at exit, when the parent ignores SIGCHLD), and the init does not reap while it observes; any
//! other process may be reaped meanwhile and its pid handed to a newcomer the old entry hides.
//!
//! One more turn: a pid is handed out a little before the new process shows in /proc (measured:
//! up to ~300 µs on a loaded machine). A fork whose pid was handed out before the window opened
//! can attach its child after the listing passed it; its parent is alive until the child is
//! attached, so either the table shows the parent alive or a final listing, taken after every
//! read, shows the child. A quiet window therefore ends with that listing, and any pid in it that
//! the table lacks is read and the window checked again. Processes reaped meanwhile need no care:
//! a hop that exits is a zombie child of the init, which does not reap while it observes, and one
//! reaped by another parent frees its pid only to the checks above.
//!
//! What this assumes: nobody rewrites ns_last_pid or picks a pid with clone3's set_tid (either
//! needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE over the namespace, which a container's processes
//! lack by default).

use crate::kernel::{
    pidfd,
    process::{self, Pid},
};
use crate::observe::procs::model::{Detail, Proc};
use crate::observe::procs::pass::Pass;
use crate::observe::procs::reader::Reader;
use crate::observe::procs::table::Table;
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Instant;

/// Pids handed out since the last check that are worth probing one by one; more means a fresh
/// listing is cheaper.
const PROBE_MAX: u64 = 256;

/// What one observation came to.
#[derive(Debug)]
pub enum Observed {
    /// A consistent table, read into the caller's, after this many passes.
    Consistent { passes: usize },
    /// Processes kept being created until the deadline: no consistent table in time.
    Churn {
        /// Pids handed out during the last pass; None: the counter went round, more than any
        /// count worth probing.
        created: Option<u64>,
        passes: usize,
    },
    /// Nothing could hold the counter's value: its pid was free and no thread could be started
    /// to take one (a pids limit reached). The caller may free pids (reap) and observe again.
    Unheld,
}

/// The last pid allocated in the reader's own PID namespace.
pub fn last_pid(root: &Path) -> io::Result<Pid> {
    let path = root.join("sys/kernel/ns_last_pid");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "cannot read {}: {e}: a consistent process table needs it (a kernel with \
                 CONFIG_CHECKPOINT_RESTORE, /proc without subset=pid)",
                path.display()
            ),
        )
    })?;
    text.trim().parse().map_err(|_| io::Error::other(format!("{} is not a pid", path.display())))
}

/// Pids handed out after `from` up to and including `to`, allowing for wrap-around.
pub fn allocated_between(from: Pid, to: Pid, pid: Pid) -> bool {
    if to >= from {
        pid > from && pid <= to
    } else {
        pid > from || pid <= to
    }
}

/// Pids handed out after `from` up to `to`; None when the counter wrapped: at least that many,
/// and more than any probe is worth.
fn distance(from: Pid, to: Pid) -> Option<u64> {
    (to >= from).then(|| (to - from) as u64)
}

/// What holds the counter's value while a window lasts: nothing can be handed that pid meanwhile.
enum Holder {
    /// The task that had the pid before the counter was read.
    Task(OwnedFd),
    /// A thread of the init started for the window; its id is the pid the counter names.
    Pin { _held: Pin },
}

/// A stretch of the pass from one reading of the counter.
struct Window {
    covered: Pid,
    holder: Option<Holder>,
}

impl Window {
    /// Read the counter and make sure something holds its value.
    fn open(root: &Path, pass: &mut Pass) -> io::Result<Window> {
        // The clock before the counter: a holder started in an earlier tick had the pid before.
        let tick = process::boot_ticks().ok();
        let covered = last_pid(root)?;
        if let Some(fd) = tick.and_then(|t| holder_since(pass, covered, t)) {
            return Ok(Window { covered, holder: Some(Holder::Task(fd)) });
        }
        match Pin::start() {
            Ok((pin, tid)) => Ok(Window { covered: tid, holder: Some(Holder::Pin { _held: pin }) }),
            Err(e) => {
                log::debug!(
                    "consistency: pid {covered} has no holder and no thread could take the next pid ({e})"
                );
                Ok(Window { covered, holder: None })
            }
        }
    }

    /// Still held? Asked after the last reading of the counter in the window.
    fn held(&self) -> bool {
        match &self.holder {
            Some(Holder::Task(fd)) => pidfd::pidfd_attached(fd),
            // The init's own thread, which ends only when the window is dropped.
            Some(Holder::Pin { .. }) => true,
            None => false,
        }
    }
}

/// A pidfd of the task that holds `pid` and started before `tick`: it took the pid before the
/// counter was read (the kernel hands out a pid before it stamps the start time).
fn holder_since(pass: &mut Pass, pid: Pid, tick: u64) -> Option<OwnedFd> {
    let fd = pidfd::pidfd_open_task(pid).ok()?;
    // /proc/PID/stat answers for a thread's id too.
    let start = pass.start_time(pid).ok()??;
    // The line read was the pidfd's task's only if it still holds the pid after the read.
    (start < tick && pidfd::pidfd_attached(&fd)).then_some(fd)
}

/// A thread of the init that holds the pid it got until dropped.
struct Pin {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Pin {
    /// Start one; its thread id.
    fn start() -> io::Result<(Pin, Pid)> {
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        // 64 KiB: the thread only sends its id and waits; a size below the minimum would be raised
        // to it (so cargo mutants' changes to this size are equivalent).
        let thread = std::thread::Builder::new().name("quiesce-pin".into()).stack_size(64 * 1024).spawn(
            move || {
                let _ = tid_tx.send(process::gettid());
                // Returns once the pin is dropped.
                let _ = stop_rx.recv();
            },
        )?;
        let pin = Pin { stop: Some(stop_tx), thread: Some(thread) };
        let tid = tid_rx
            .recv()
            .map_err(|_| io::Error::other("the pid-holding thread ended before it said its id"))?;
        Ok((pin, tid))
    }
}

// The join is for tidiness, not correctness: the sender goes with the pin either way, which ends
// the thread; a pin whose thread outlives it holds a pid no window counts on (docs/testing.md:
// cargo mutants' emptied `drop` is equivalent).
impl Drop for Pin {
    fn drop(&mut self) {
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The pidfs identity of the process `pid` names now (see `pidfd::pidfd_inode`).
fn identity(pid: Pid) -> Option<u64> {
    pidfd::pidfd_inode(&pidfd::pidfd_open(pid).ok()?).ok().flatten()
}

/// Does this kernel give pidfds an identity?
pub fn identities() -> bool {
    identity(process::getpid()).is_some()
}

/// A pidfs identity that every process of the namespace made from now on exceeds: that of the
/// task that has held the pid counter's value since before it was read (the namespace's last
/// process so far), or else of a thread made now. None where identities do not order processes
/// (before Linux 6.9, or a 32-bit kernel, which wraps them).
pub fn start_identity(reader: &Reader) -> Option<u64> {
    if !cfg!(target_pointer_width = "64") {
        return None;
    }
    let tick = process::boot_ticks().ok();
    let last = last_pid(reader.root()).ok();
    if let (Some(tick), Some(last), Ok(mut pass)) = (tick, last, reader.pass()) {
        // Made before the reading, and nothing made since returned to its pid while it held it:
        // whatever the namespace makes after the reading has a greater identity.
        if let Some(fd) = holder_since(&mut pass, last, tick) {
            if let Ok(Some(id)) = pidfd::pidfd_inode(&fd) {
                return Some(id);
            }
        }
    }
    std::thread::Builder::new()
        .name("quiesce-order".into())
        .stack_size(64 * 1024)
        .spawn(|| pidfd::pidfd_inode(&pidfd::pidfd_open_task(process::gettid()).ok()?).ok().flatten())
        .ok()?
        .join()
        .ok()
        .flatten()
}

/// Was the process `pid` with `start_time` made after the object of identity `order`? Yes
/// unless shown otherwise: the identity is the process's only if the pid still names a process
/// of that start time once it was taken.
pub fn made_after(pid: Pid, start_time: u64, order: u64) -> bool {
    let Ok(fd) = pidfd::pidfd_open(pid) else { return true };
    let Some(id) = pidfd::pidfd_inode(&fd).ok().flatten() else { return true };
    match Reader::default().start_time(pid) {
        Ok(Some(t)) if t == start_time && pidfd::pidfd_attached(&fd) => id > order,
        _ => true,
    }
}

/// The table being taken: its reads, put in by the batch, and whether a window of it saw pids
/// handed out.
struct Reads<'a> {
    /// The earlier observation, read again in its own room: its entries' loginuids that were
    /// set are reused.
    table: &'a mut Table,
    /// A window ended with pids handed out: entries read before the last window may name other
    /// processes by now, unless the init is their parent (see `volatile`).
    moved: bool,
    init: Pid,
    /// Reads not yet in the table: a run of reads goes in at once (`Table::apply`: one pass over
    /// the table, where one at a time would shift its entries for each).
    batch: Vec<(Pid, Option<Proc>)>,
}

impl Reads<'_> {
    fn read(&mut self, pass: &mut Pass, pid: Pid) -> io::Result<()> {
        let p = pass.read(pid, Detail::Light, self.table.get(&pid))?;
        self.batch.push((pid, p));
        Ok(())
    }

    /// Put the reads so far into the table: before anything looks at it.
    fn flush(&mut self) {
        if !self.batch.is_empty() {
            self.table.apply(std::mem::take(&mut self.batch));
        }
    }

    /// Entries whose pid may have been freed and handed to another process since they were
    /// read: all but the init's children, which only the init reaps, and it does not while it
    /// observes. (Nothing before a window that saw pids handed out.)
    fn volatile(&self) -> Vec<Pid> {
        if !self.moved {
            return Vec::new();
        }
        self.table.values().filter(|p| p.ppid != self.init).map(|p| p.pid).collect()
    }
    /// End a window the counter has not left: read again whatever may name another process by
    /// now, then list once more. Consistent if that listing found nothing new and the counter
    /// still reads the window's value, held; Missing if it found processes (read now).
    fn end_window(&mut self, reader: &Reader, pass: &mut Pass, window: &Window) -> io::Result<Ending> {
        for pid in self.volatile() {
            self.read(pass, pid)?;
        }
        self.flush();
        // The counter moves when a pid is handed out, a little before the new process shows
        // in /proc: a fork whose pid was handed out before the window opened may attach its
        // child after the listing passed it. Its parent is alive until then, so either the
        // table shows that parent alive, or the child is attached by now: a last listing,
        // after every read, finds any such child.
        let missing: Vec<Pid> =
            reader.pids()?.into_iter().filter(|pid| !self.table.contains_key(pid)).collect();
        if missing.is_empty() {
            let quiet = last_pid(reader.root())? == window.covered && window.held();
            return Ok(if quiet { Ending::Consistent } else { Ending::Moved });
        }
        for pid in missing {
            self.read(pass, pid)?;
        }
        self.flush();
        Ok(Ending::Missing)
    }

    /// Read the pids handed out in (from, to], between two windows' readings of the counter: one
    /// by one when the counter went less than once round and few enough, else from a fresh
    /// listing. That is only quicker: anything new that this misses is in the final listing,
    /// anything reused is read again at the end.
    fn read_between(&mut self, reader: &Reader, pass: &mut Pass, from: Pid, to: Pid) -> io::Result<()> {
        if distance(from, to).is_some_and(|d| d <= PROBE_MAX) {
            let mut pid = from;
            while pid != to {
                pid += 1;
                self.read(pass, pid)?;
            }
        } else {
            let mut listed = reader.pids()?;
            listed.sort_unstable();
            // Not listed now: exited (anything created since is in the next window).
            self.table.retain(|pid, _| listed.binary_search(pid).is_ok());
            for pid in listed {
                if self.table.contains_key(&pid) && !allocated_between(from, to, pid) {
                    continue;
                }
                self.read(pass, pid)?;
            }
        }
        self.flush();
        Ok(())
    }
}

/// How a window the counter had not left ended (`Reads::end_window`).
enum Ending {
    /// Nothing new listed, and the counter still held at the window's value.
    Consistent,
    /// The last listing found processes the table lacked: read now, the window is checked again.
    Missing,
    /// The counter moved just now, or its holder let the pid go: it may have been handed out
    /// again.
    Moved,
}

/// A consistent table of the whole PID namespace, read into `snap` (an earlier observation, whose
/// loginuids that were set are reused: its room is the new table's), with the number of passes it
/// took; or Churn when processes kept being created until `deadline`; or Unheld.
pub fn observe(reader: &Reader, snap: &mut Table, deadline: Instant) -> io::Result<Observed> {
    // No pass outlives the budget: under load one listing of a large namespace took twice it.
    let bounded = reader.bounded(deadline);
    let reader = &bounded;
    let root = reader.root().to_path_buf();
    let mut pass = reader.pass()?;
    let mut window = Window::open(&root, &mut pass)?;
    if window.holder.is_none() {
        return Ok(Observed::Unheld);
    }
    reader.refresh(snap, &[], None)?;
    let mut reads = Reads { table: snap, moved: false, init: process::getpid(), batch: Vec::new() };
    let mut passes = 1;
    loop {
        let now = last_pid(&root)?;
        if now == window.covered {
            match reads.end_window(reader, &mut pass, &window)? {
                Ending::Consistent => return Ok(Observed::Consistent { passes }),
                Ending::Missing => {
                    passes += 1;
                    if Instant::now() >= deadline {
                        return Ok(Observed::Churn { created: Some(0), passes });
                    }
                    continue;
                }
                Ending::Moved => {}
            }
        }
        if Instant::now() >= deadline {
            return Ok(Observed::Churn { created: distance(window.covered, now), passes });
        }
        passes += 1;
        let next = Window::open(&root, &mut pass)?;
        if next.holder.is_none() {
            // Nothing can hold the counter's value (no free pid for a thread): the caller may
            // free some and start over.
            return Ok(Observed::Unheld);
        }
        reads.moved = true;
        // Every pid in (covered, next.covered] was handed out before `next` opened, if the
        // counter went less than once round: read those now.
        reads.read_between(reader, &mut pass, window.covered, next.covered)?;
        window = next;
    }
}

/// A unit test that cannot run on this kernel says so, loudly, where the suite collects skips.
#[cfg(test)]
pub(crate) fn skip_test(name: &str, reason: &str) {
    eprintln!("{name}: skipped: {reason}");
    if let Ok(log) = std::env::var("QUIESCE_SKIP_LOG") {
        use std::io::Write as _;
        if let Ok(mut f) = std::fs::OpenOptions::new().append(true).create(true).open(log) {
            let _ = writeln!(f, "{name}: {reason}");
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_observation_past_its_budget_fails_rather_than_goes_on() {
        let reader = crate::observe::procs::reader::Reader::default();
        let mut snap = reader.snapshot(crate::observe::procs::model::Detail::Light).unwrap();
        let past = std::time::Instant::now();
        match super::observe(&reader, &mut snap, past) {
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}"),
            Ok(Observed::Unheld) => {}
            Ok(churn @ Observed::Churn { .. }) => panic!("no pid free for the holder thread here: {churn:?}"),
            Ok(Observed::Consistent { passes }) => {
                panic!("a whole observation of {passes} pass(es) ran past its budget")
            }
        }
        // With time left it completes.
        let later = std::time::Instant::now() + std::time::Duration::from_secs(30);
        assert!(matches!(super::observe(&reader, &mut snap, later), Ok(super::Observed::Consistent { .. })));
    }

    use super::*;

    #[test]
    fn ranges_wrap() {
        assert!(allocated_between(10, 20, 11));
        assert!(allocated_between(10, 20, 20));
        assert!(!allocated_between(10, 20, 10));
        assert!(!allocated_between(10, 20, 21));
        assert!(allocated_between(32000, 305, 32001));
        assert!(allocated_between(32000, 305, 300));
        assert!(!allocated_between(32000, 305, 306));
        assert!(!allocated_between(32000, 305, 32000));
        assert_eq!(distance(10, 20), Some(10));
        assert_eq!(distance(20, 10), None);
    }

    /// A child that sleeps, its pid, and its start time once it is readable.
    fn sleeper() -> (std::process::Child, Pid, u64) {
        let child = std::process::Command::new("sleep").arg("10").spawn().unwrap();
        let pid = child.id() as Pid;
        let start = Reader::default().start_time(pid).unwrap().unwrap();
        (child, pid, start)
    }

    #[test]
    fn a_holder_holds_its_pid_until_it_is_reaped_and_only_one_older_than_the_reading_counts() {
        let (mut child, pid, start) = sleeper();
        let r = Reader::default();
        let mut pass = r.pass().unwrap();
        // Read in the tick it started: it may have taken its pid after the counter was read.
        assert!(holder_since(&mut pass, pid, start).is_none());
        let fd = holder_since(&mut pass, pid, start + 1).expect("a holder from before the tick");
        assert!(pidfd::pidfd_attached(&fd));
        child.kill().unwrap();
        // A zombie still holds its pid: nothing can be handed it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let waited =
            unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOWAIT) };
        assert_eq!(waited, 0);
        assert!(pidfd::pidfd_attached(&fd), "a zombie holds its pid");
        child.wait().unwrap();
        assert!(!pidfd::pidfd_attached(&fd), "reaped: its pid may be handed out again");
    }

    #[test]
    fn a_window_always_has_a_holder_here() {
        let r = Reader::default();
        let mut pass = r.pass().unwrap();
        for _ in 0..20 {
            let w = Window::open(r.root(), &mut pass).unwrap();
            // (A task holder of this busy namespace may be gone by now: only the pin is sure.)
            assert!(w.holder.is_some(), "window at {} has no holder", w.covered);
            if let Some(Holder::Pin { .. }) = w.holder {
                assert!(w.held());
                // The pin's thread id is a task of this process until the window is dropped.
                let task = format!("/proc/self/task/{}", w.covered);
                assert!(std::path::Path::new(&task).exists(), "{task}");
                drop(w);
                // The join returns when the thread has cleared its tid; the kernel removes its
                // task entry a moment later (under load, a visible one).
                let gone = (0..200).any(|_| {
                    let here = std::path::Path::new(&task).exists();
                    if here {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                    !here
                });
                assert!(gone, "{task} outlived its window by a second");
            }
        }
    }

    #[test]
    fn identities_name_one_process_and_order_them_by_creation() {
        // pidfs gives pidfds an identity since Linux 6.9: there, none is a fault of ours.
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut v = release.trim().split(['.', '-']).map(|n| n.parse::<u32>().unwrap_or(0));
        let (major, minor) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
        assert!(identities() || (major, minor) < (6, 9), "Linux {release} gives no pidfs identity");
        if !identities() {
            skip_test(
                "identities_name_one_process_and_order_them_by_creation",
                "no pidfs identities on this kernel (before Linux 6.9): nothing to check",
            );
            return;
        }
        let me = process::getpid();
        assert_eq!(identity(me), identity(me));
        let order = start_identity(&Reader::default()).expect("a 64-bit kernel with pidfs orders identities");
        let mine = Reader::default().start_time(me).unwrap().unwrap();
        assert!(!made_after(me, mine, order), "this process was made before");
        assert!(!made_after(me, mine, identity(me).unwrap()), "nor after itself");
        assert!(made_after(me, mine + 1, order), "another start time: not shown to be this process");
        let (mut child, pid, start) = sleeper();
        assert!(identity(pid).unwrap() > order);
        assert!(made_after(pid, start, order));
        // Another start time at that pid: not shown to be the one that was read, so new.
        assert!(made_after(pid, start + 1, order));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(identity(pid), None);
        assert!(made_after(pid, start, order), "gone: nothing shows it old");
    }

    #[test]
    fn a_quiet_table_is_consistent_at_once_and_a_new_child_is_found() {
        let r = Reader::default();
        // This namespace is the host's, shared with whatever else runs here: a burst of forks
        // elsewhere can keep one pass from ending quiet, so it gets three chances.
        let snap = (0..3)
            .find_map(|_| {
                let deadline = Instant::now() + std::time::Duration::from_secs(5);
                let mut snap = Table::default();
                match observe(&r, &mut snap, deadline) {
                    Ok(Observed::Consistent { .. }) => Some(snap),
                    other => {
                        eprintln!("not quiet here: {other:?}");
                        None
                    }
                }
            })
            .expect("no quiet observation in three tries of 5 s");
        assert!(snap.contains_key(&crate::kernel::process::getpid()));
        assert!(last_pid(r.root()).unwrap() > 0);
    }
}

//! The reader: every process of the namespace read into a table, after proctrust says /proc
//! can be believed. May use: kernel, observe.

use crate::kernel::sys::{self, Pid};
use crate::observe::procs::model::{Detail, Named, Proc};
use crate::observe::procs::pass::Pass;
use crate::observe::procs::read::{is_gone, read_prefix, unknown, Read};
use crate::observe::procs::table::{Snapshot, Table, GONE};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Bytes of /proc/PID/cmdline read per process.
pub const CMDLINE_READ: usize = 4096;

/// Processes from which a light observation is split between two threads.
const SPLIT_MIN: usize = 64;

/// Entries a reading thread gathers before it puts them into the table.
const READ_BATCH: usize = 64;

/// Can a second thread run at the same time as this one?
pub fn several_cores() -> bool {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(sys::cpus) > 1
}

pub struct Reader {
    pub(super) root: PathBuf,
    /// Reads stop with a TimedOut error from this moment on: under load one pass over a large
    /// namespace can take longer than any budget a freeze has (see `bounded`).
    pub(super) until: Option<std::time::Instant>,
}

impl Default for Reader {
    fn default() -> Self {
        Reader { root: PathBuf::from("/proc"), until: None }
    }
}

impl Reader {
    /// The same reader, whose every pass fails (TimedOut) once `until` has come.
    pub fn bounded(&self, until: std::time::Instant) -> Reader {
        Reader { root: self.root.clone(), until: Some(until) }
    }

    #[cfg(test)]
    pub fn at(root: impl Into<PathBuf>) -> Reader {
        Reader { root: root.into(), until: None }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The pids /proc lists right now (thread-group leaders).
    pub fn pids(&self) -> io::Result<Vec<Pid>> {
        let dir = sys::open_dir(&self.root).map_err(|e| unknown(&self.root, e))?;
        let mut out = Vec::new();
        // No allocation per entry: the freeze lists the table several times.
        sys::each_entry(&dir, usize::MAX, |name| {
            if let Some(pid) = std::str::from_utf8(name).ok().and_then(|s| s.parse::<Pid>().ok()) {
                out.push(pid);
            }
        })
        .map_err(|e| unknown(&self.root, e))?;
        Ok(out)
    }

    /// Read one process. Ok(None): it exited (or `pid` is a thread's id, not a process's).
    #[cfg(test)]
    pub fn read(&self, pid: Pid, detail: Detail) -> io::Result<Option<Proc>> {
        self.pass()?.read(pid, detail, None)
    }

    /// Start a pass of reads.
    pub fn pass(&self) -> io::Result<Pass<'_>> {
        let dir = sys::open_dir(&self.root).map_err(|e| unknown(&self.root, e))?;
        Ok(Pass {
            reader: self,
            dir,
            buf: Vec::with_capacity(4096),
            name: Vec::with_capacity(64),
            deciding: &[],
            reads: 0,
        })
    }

    /// cmdline and exe of a process: what a person needs to recognise it.
    pub(super) fn evidence(&self, dir: &Path) -> io::Result<Named> {
        {
            // The process chooses its command line's size (even terabytes, through
            // PR_SET_MM): only the first bytes are read.
            let cmdline = match read_prefix(&dir.join("cmdline"), CMDLINE_READ)? {
                Read::Gone => Vec::new(),
                Read::Ok(b) => b
                    .split(|&c| c == 0)
                    .filter(|s| !s.is_empty())
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .collect(),
            };
            // A zombie or kernel thread has no exe: that is an answer, not an unknown.
            let exe = fs::read_link(dir.join("exe")).ok().map(|p| p.to_string_lossy().into_owned());
            Ok(Named { cmdline, exe })
        }
    }

    /// Every process of the PID namespace. Fails whole if any entry is unknown.
    pub fn snapshot(&self, detail: Detail) -> io::Result<Snapshot> {
        self.snapshot_after(detail, None)
    }

    /// Like `snapshot`, reusing what `prev` saw that cannot have changed (see `Pass::read`).
    pub fn snapshot_after(&self, detail: Detail, prev: Option<&Snapshot>) -> io::Result<Snapshot> {
        self.snapshot_deciding(detail, prev, &[])
    }

    /// Like `snapshot_after`, for a classification by `uids` (any UID of any thread): a process
    /// whose leader holds one of them is decided by its leader, so its other threads are read
    /// for their state only, from their stat line (cheaper than status: about two thirds, at
    /// 1,000 threads). Nothing else changes; a process whose leader holds none of them has
    /// every thread's credentials read.
    pub fn snapshot_deciding(
        &self,
        detail: Detail,
        prev: Option<&Snapshot>,
        uids: &[u32],
    ) -> io::Result<Snapshot> {
        crate::observe::proctrust::check(&self.root)?;
        let procs = self.read_all(&self.pids()?, detail, prev, uids)?;
        if !procs.contains_key(&sys::getpid()) {
            return Err(io::Error::other(format!(
                "{} does not list this process: the process table is unknown",
                self.root.display()
            )));
        }
        Ok(Snapshot { procs })
    }

    /// Read every pid of `pids`. A large light observation is read by two threads, half each:
    /// the reads are the kernel's CPU work, which a second core halves. The helper is started
    /// for this call and joined before it returns (reads of stat and status never wait on the
    /// target); when it cannot be started (a pids limit), this thread reads both halves. Both
    /// put what they read into one table, made once for as many entries as there are pids, a
    /// few at a time: PID 1 never holds a half beside the whole.
    fn read_all(
        &self,
        pids: &[Pid],
        detail: Detail,
        prev: Option<&Snapshot>,
        deciding: &[u32],
    ) -> io::Result<Table> {
        let all = std::sync::Mutex::new(Vec::with_capacity(pids.len()));
        let put = |batch: &mut Vec<Proc>| all.lock().unwrap_or_else(|e| e.into_inner()).append(batch);
        let part = |pids: &[Pid]| -> io::Result<()> {
            let mut pass = self.pass()?;
            pass.deciding = deciding;
            let mut batch = Vec::with_capacity(READ_BATCH);
            for &pid in pids {
                if let Some(p) = pass.read(pid, detail, prev.and_then(|s| s.procs.get(&pid)))? {
                    batch.push(p);
                    if batch.len() == READ_BATCH {
                        put(&mut batch);
                    }
                }
            }
            put(&mut batch);
            Ok(())
        };
        if detail != Detail::Light || pids.len() < SPLIT_MIN || !several_cores() {
            part(pids)?;
        } else {
            let (a, b) = pids.split_at(pids.len() / 2);
            let (mine, theirs) = std::thread::scope(|s| {
                let helper = std::thread::Builder::new()
                    .name("quiesce-observe".into())
                    .stack_size(256 * 1024)
                    .spawn_scoped(s, || part(b));
                let mine = part(a);
                let theirs = match helper {
                    Ok(h) => h.join().unwrap_or_else(|_| Err(io::Error::other("observation helper failed"))),
                    Err(_) => part(b),
                };
                (mine, theirs)
            });
            mine?;
            theirs?;
        }
        let mut all = all.into_inner().unwrap_or_else(|e| e.into_inner());
        // The halves' batches interleave; a sort in place puts them back in pid order.
        all.sort_unstable_by_key(|p| p.pid);
        Ok(Table::from_procs(all))
    }

    /// Like `snapshot_deciding(Light, Some(snap), uids)`, read into `snap`'s own room: every pid
    /// listed now is read again into its entry (its last entry is what a loginuid already set is
    /// reused from), a pid listed for the first time is added, and an entry whose pid is no
    /// longer listed goes. No second table is built beside it; once this returns Ok(true) the
    /// table is exactly what a fresh observation would have read.
    ///
    /// `abort` (the init's periodic refresh) is asked before every process (one syscall against
    /// the several a read costs: when a CPU storm leaves the init 1% of a core, 32 processes took
    /// a quarter of a second); when it says yes, Ok(false) comes back at once. With `abort`, the
    /// table is the last complete observation until this one completes: what the reading finds
    /// changed, gone or new is held aside (only the entries that differ, so a quiet namespace
    /// costs next to nothing) and applied at the end; an aborted or failed refresh leaves the
    /// table exactly as it was, since the freeze decides from it. Without `abort` (a table the
    /// caller throws away when a read fails: the freeze's own), entries are read into place and
    /// a large table is read by two threads, half of it each.
    pub fn refresh(
        &self,
        snap: &mut Snapshot,
        uids: &[u32],
        abort: Option<&dyn Fn() -> bool>,
    ) -> io::Result<bool> {
        crate::observe::proctrust::check(&self.root)?;
        let mut pids = self.pids()?;
        pids.sort_unstable();
        pids.dedup();
        let slots = &mut snap.procs.v[..];
        let part = |slots: &mut [Proc], pids: &[Pid], added: &mut Vec<Proc>| -> io::Result<()> {
            let mut pass = self.pass()?;
            pass.deciding = uids;
            merge(&mut pass, slots, pids, added)
        };
        if let Some(abort) = abort {
            let mut pass = self.pass()?;
            pass.deciding = uids;
            let Some(pending) = merge_pending(&mut pass, slots, &pids, abort)? else {
                return Ok(false);
            };
            pending.commit(&mut snap.procs);
            return Ok(true);
        }
        let mut added = Vec::new();
        let done = if slots.len() < SPLIT_MIN || !several_cores() {
            part(slots, &pids, &mut added)
        } else {
            // Each half of the table with the pids listed in its range; pids above the first
            // half's last entry are the second half's.
            let mid = slots.len() / 2;
            let (lo, hi) = slots.split_at_mut(mid);
            let cut = pids.partition_point(|&p| p < hi[0].pid);
            let (lo_pids, hi_pids) = pids.split_at(cut);
            let second = std::sync::Mutex::new(Some(hi));
            let run_second = || -> io::Result<Vec<Proc>> {
                let taken = second.lock().unwrap_or_else(|e| e.into_inner()).take();
                let mut more = Vec::new();
                match taken {
                    Some(hi) => part(hi, hi_pids, &mut more).map(|()| more),
                    None => Ok(more),
                }
            };
            let (mine, theirs) = std::thread::scope(|s| {
                let helper = std::thread::Builder::new()
                    .name("quiesce-observe".into())
                    .stack_size(256 * 1024)
                    .spawn_scoped(s, run_second);
                let mine = part(lo, lo_pids, &mut added);
                let theirs = match helper {
                    Ok(h) => h.join().unwrap_or_else(|_| Err(io::Error::other("observation helper failed"))),
                    // No thread (a pids limit): this one reads the second half too.
                    Err(_) => run_second(),
                };
                (mine, theirs)
            });
            match (mine, theirs) {
                (Ok(()), Ok(mut more)) => {
                    added.append(&mut more);
                    Ok(())
                }
                (Err(e), _) | (_, Err(e)) => Err(e),
            }
        };
        // Whatever happened, the table is put back in order: gone entries out, new ones in.
        snap.procs.settle(added);
        done?;
        if !snap.procs.contains_key(&sys::getpid()) {
            return Err(io::Error::other(format!(
                "{} does not list this process: the process table is unknown",
                self.root.display()
            )));
        }
        Ok(true)
    }

    /// Start time of `pid` now; Ok(None) if it exited.
    pub fn start_time(&self, pid: Pid) -> io::Result<Option<u64>> {
        self.pass()?.start_time(pid)
    }

    /// Does `pid` run the file this process runs (its exe, by device and inode)? Ok(None): it
    /// exited.
    /// The second word of `pid`'s command line (a subcommand of this binary's), at most
    /// CMDLINE_READ bytes read; None: gone.
    pub fn second_arg(&self, pid: Pid) -> io::Result<Option<Vec<u8>>> {
        let path = self.root.join(pid.to_string()).join("cmdline");
        match read_prefix(&path, CMDLINE_READ).map_err(|e| unknown(&path, e))? {
            Read::Gone => Ok(None),
            Read::Ok(b) => Ok(Some(b.split(|&c| c == 0).nth(1).unwrap_or_default().to_vec())),
        }
    }

    pub fn runs_own_binary(&self, pid: Pid) -> io::Result<Option<bool>> {
        use std::os::unix::fs::MetadataExt;
        let own = self.root.join("self/exe");
        let me = std::fs::metadata(&own).map_err(|e| unknown(&own, e))?;
        let exe = self.root.join(pid.to_string()).join("exe");
        match std::fs::metadata(&exe) {
            Ok(m) => Ok(Some(m.dev() == me.dev() && m.ino() == me.ino())),
            Err(e) if is_gone(&e) => Ok(None),
            Err(e) => Err(unknown(&exe, e)),
        }
    }
}

/// What a refresh with an abort found, held aside until it completes: the entries that read
/// differently (by position), those gone (by position, ascending) and the pids new to the table.
struct Pending {
    changed: Vec<(usize, Proc)>,
    gone: Vec<usize>,
    added: Vec<Proc>,
}

impl Pending {
    fn commit(self, table: &mut Table) {
        for (i, p) in self.changed {
            table.v[i] = p;
        }
        for i in self.gone {
            table.v[i].pid = GONE;
        }
        table.settle(self.added);
    }
}

/// Like `merge`, leaving `slots` as they are: Ok(None) when `abort` said stop.
fn merge_pending(
    pass: &mut Pass,
    slots: &[Proc],
    pids: &[Pid],
    abort: &dyn Fn() -> bool,
) -> io::Result<Option<Pending>> {
    let mut out = Pending { changed: Vec::new(), gone: Vec::new(), added: Vec::new() };
    let mut i = 0;
    for &pid in pids {
        if abort() {
            return Ok(None);
        }
        while i < slots.len() && slots[i].pid < pid {
            out.gone.push(i);
            i += 1;
        }
        if i < slots.len() && slots[i].pid == pid {
            match pass.read(pid, Detail::Light, Some(&slots[i]))? {
                Some(p) if p != slots[i] => out.changed.push((i, p)),
                Some(_) => {}
                None => out.gone.push(i),
            }
            i += 1;
        } else if let Some(p) = pass.read(pid, Detail::Light, None)? {
            out.added.push(p);
        }
    }
    out.gone.extend(i..slots.len());
    Ok(Some(out))
}

/// Read `pids` (sorted, each once) into `slots` (sorted by pid): a pid with an entry is read
/// into it, knowing the entry; one without goes to `added`; an entry whose pid is not listed, or
/// that reads as exited, is marked GONE.
fn merge(pass: &mut Pass, slots: &mut [Proc], pids: &[Pid], added: &mut Vec<Proc>) -> io::Result<()> {
    let mut i = 0;
    for &pid in pids {
        while i < slots.len() && slots[i].pid < pid {
            slots[i].pid = GONE;
            i += 1;
        }
        if i < slots.len() && slots[i].pid == pid {
            match pass.read(pid, Detail::Light, Some(&slots[i]))? {
                Some(p) => slots[i] = p,
                None => slots[i].pid = GONE,
            }
            i += 1;
        } else if let Some(p) = pass.read(pid, Detail::Light, None)? {
            added.push(p);
        }
    }
    for p in &mut slots[i..] {
        p.pid = GONE;
    }
    Ok(())
}

/// This process's audit loginuid, None when unset (or audit is absent).
pub fn own_loginuid() -> Option<u32> {
    fs::read_to_string("/proc/self/loginuid").ok()?.trim().parse::<u32>().ok().filter(|&u| u != u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refresh in the table's own room ends as a fresh observation would: a process listed now
    /// is in it with what it is now, one that is gone is not, and one it never saw is added.
    #[test]
    fn a_refresh_in_place_reads_what_a_fresh_observation_reads() {
        let r = Reader::default();
        let me = sys::getpid();
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let pid = child.id() as Pid;
        // A table with an entry whose pid no process holds, and a stale one of this process.
        let mut snap = Snapshot::of(&[Proc::fixture(i32::MAX - 7, 1, 5, 0), Proc::fixture(me, 1, 5, 0)]);
        assert!(r.refresh(&mut snap, &[], None).unwrap());
        assert!(!snap.procs.contains_key(&(i32::MAX - 7)), "a pid no process holds stays");
        assert!(snap.procs.contains_key(&pid), "a new process is not added");
        let fresh = r.snapshot(Detail::Light).unwrap();
        assert_eq!(snap.procs[&me].start_time, fresh.procs[&me].start_time);
        assert!(snap.procs.keys_sorted(), "the table is out of order");
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(r.refresh(&mut snap, &[], None).unwrap());
        assert!(!snap.procs.contains_key(&pid), "a reaped process stays");
        // Aborted at once: nothing read, nothing lost that was not known gone.
        let before = snap.procs.len();
        assert!(!r.refresh(&mut snap, &[], Some(&|| true)).unwrap());
        assert_eq!(snap.procs.len(), before);
    }

    /// A tracking refresh cut off near its end leaves the table the last complete observation:
    /// the freeze classifies it and notes whose parent can vouch, so an entry dropped, replaced or
    /// added by a reading that never finished would change what it decides.
    #[test]
    fn a_refresh_cut_off_leaves_the_last_complete_observation() {
        let r = Reader::default();
        let me = sys::getpid();
        let listed = r.pids().unwrap();
        // A pid no process holds, below this one, so that the reading passes it before the cut.
        let free = (2..me).rev().find(|p| !listed.contains(p)).expect("a free pid below this process");
        assert_ne!(me, 1, "run as PID 1: no pid below this one to leave out");
        // The last complete observation, but for pid 1 (new to the table when listed), this
        // process with another start time (read again), and an entry of the free pid.
        let mut table = r.snapshot(Detail::Light).unwrap().procs.v;
        let mut stale_me = table.iter().find(|p| p.pid == me).unwrap().clone();
        stale_me.start_time = 5;
        table.retain(|p| p.pid != me && p.pid != 1);
        table.push(stale_me);
        table.push(Proc::fixture(free, 1, 7, 4242));
        let mut snap = Snapshot { procs: Table::from_procs(table) };
        let before = snap.procs.clone();
        // Cut off before the last pid listed: every entry below it has been passed.
        let n = r.pids().unwrap().len();
        let calls = std::cell::Cell::new(0usize);
        let abort = || {
            calls.set(calls.get() + 1);
            calls.get() >= n
        };
        assert!(!r.refresh(&mut snap, &[], Some(&abort)).unwrap());
        assert!(calls.get() > 1, "the reading was cut off before it started");
        assert!(snap.procs.contains_key(&free), "an entry the cut-off reading found unlisted was dropped");
        assert_eq!(snap.procs[&me].start_time, 5, "an entry was replaced by a reading that never finished");
        assert!(!snap.procs.contains_key(&1), "a pid new to the table was added");
        assert_eq!(snap.procs, before, "a cut-off refresh changed the table");
        // Completed, it is what a fresh observation reads.
        assert!(r.refresh(&mut snap, &[], Some(&|| false)).unwrap());
        assert!(!snap.procs.contains_key(&free));
        assert_ne!(snap.procs[&me].start_time, 5);
    }

    #[test]
    fn unreadable_root_is_an_error() {
        let dir = std::env::temp_dir().join(format!("quiesce-notproc-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let err = Reader::at(&dir).snapshot(Detail::Light).unwrap_err();
        assert!(err.to_string().contains("not a procfs"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sees_itself_with_threads() {
        let s = Reader::default().snapshot(Detail::Full).unwrap();
        let me = &s.procs[&sys::getpid()];
        assert!(me.alive());
        assert!(!me.threads.is_empty());
        assert!(me.exe().is_some());
    }
}

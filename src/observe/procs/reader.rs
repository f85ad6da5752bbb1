//! The reader: every process of the namespace read into a table, after proctrust says /proc
//! can be believed. May use: kernel, observe.

use crate::kernel::{
    dirfd,
    process::{self, Pid},
};
use crate::observe::procs::model::{Detail, Named, Proc};
use crate::observe::procs::parse::{cmdline_words, listed_pid, second_word};
use crate::observe::procs::pass::Pass;
use crate::observe::procs::read::{is_gone, read_prefix, unknown, Read};
use crate::observe::procs::table::Table;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Bytes of /proc/PID/cmdline read per process.
pub const CMDLINE_READ: usize = 4096;

/// Processes from which a light observation is split between two threads.
pub(super) const SPLIT_MIN: usize = 64;

/// Entries a reading thread gathers before it puts them into the table.
const READ_BATCH: usize = 64;

/// Can a second thread run at the same time as this one?
pub fn several_cores() -> bool {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(process::cpus) > 1
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
        let dir = dirfd::open_dir(&self.root).map_err(|e| unknown(&self.root, e))?;
        let mut out = Vec::new();
        // No allocation per entry: the freeze lists the table several times.
        dirfd::each_entry(&dir, usize::MAX, |name| {
            if let Some(pid) = listed_pid(name) {
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
        let dir = dirfd::open_dir(&self.root).map_err(|e| unknown(&self.root, e))?;
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
                Read::Ok(b) => cmdline_words(&b),
            };
            // A zombie or kernel thread has no exe: that is an answer, not an unknown.
            let exe = fs::read_link(dir.join("exe")).ok().map(|p| p.to_string_lossy().into_owned());
            Ok(Named { cmdline, exe })
        }
    }

    /// Every process of the PID namespace. Fails whole if any entry is unknown.
    pub fn snapshot(&self, detail: Detail) -> io::Result<Table> {
        self.snapshot_after(detail, None)
    }

    /// Like `snapshot`, reusing what `prev` saw that cannot have changed (see `Pass::read`).
    pub fn snapshot_after(&self, detail: Detail, prev: Option<&Table>) -> io::Result<Table> {
        self.snapshot_deciding(detail, prev, &[])
    }

    /// Like `snapshot_after`, for a classification by `uids` (any UID of any thread): a process
    /// whose leader holds one of them is decided by its leader, so its other threads are read
    /// for their state only, from their stat line (cheaper than status: about two thirds, at
    /// 1,000 threads). Nothing else changes; a process whose leader holds none of them has
    /// every thread's credentials read.
    pub fn snapshot_deciding(&self, detail: Detail, prev: Option<&Table>, uids: &[u32]) -> io::Result<Table> {
        crate::observe::proctrust::check(&self.root)?;
        let procs = self.read_all(&self.pids()?, detail, prev, uids)?;
        if !procs.contains_key(&process::getpid()) {
            return Err(io::Error::other(format!(
                "{} does not list this process: the process table is unknown",
                self.root.display()
            )));
        }
        Ok(procs)
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
        prev: Option<&Table>,
        deciding: &[u32],
    ) -> io::Result<Table> {
        let all = std::sync::Mutex::new(Vec::with_capacity(pids.len()));
        let put = |batch: &mut Vec<Proc>| all.lock().unwrap_or_else(|e| e.into_inner()).append(batch);
        let part = |pids: &[Pid]| -> io::Result<()> {
            let mut pass = self.pass()?;
            pass.deciding = deciding;
            let mut batch = Vec::with_capacity(READ_BATCH);
            for &pid in pids {
                if let Some(p) = pass.read(pid, detail, prev.and_then(|s| s.get(&pid)))? {
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

    /// Start time of `pid` now; Ok(None) if it exited.
    pub fn start_time(&self, pid: Pid) -> io::Result<Option<u64>> {
        self.pass()?.start_time(pid)
    }

    /// Start time of `pid` while it can still act; Ok(None) if it exited, a dead process's
    /// zombie included (its stat line says Z and counts only itself): under a PID 1 that never
    /// reaps, an init that ended stays one, and answers nothing.
    pub fn live_start_time(&self, pid: Pid) -> io::Result<Option<u64>> {
        let stat = self.pass()?.stat(pid)?;
        Ok(stat
            .filter(|s| !(crate::observe::procs::model::exited(s.state) && s.num_threads == 1))
            .map(|s| s.start_time))
    }

    /// Does `pid` run the file this process runs (its exe, by device and inode)? Ok(None): it
    /// exited.
    /// The second word of `pid`'s command line (a subcommand of this binary's), at most
    /// CMDLINE_READ bytes read; None: gone.
    pub fn second_arg(&self, pid: Pid) -> io::Result<Option<Vec<u8>>> {
        let path = self.root.join(pid.to_string()).join("cmdline");
        match read_prefix(&path, CMDLINE_READ).map_err(|e| unknown(&path, e))? {
            Read::Gone => Ok(None),
            Read::Ok(b) => Ok(Some(second_word(&b).to_vec())),
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

/// The audit loginuid of process `pid`, None when unset (or audit is absent); an error when it
/// cannot be read (gone, or no /proc).
pub fn loginuid_of(pid: Pid) -> io::Result<Option<u32>> {
    let text = fs::read_to_string(format!("/proc/{pid}/loginuid"))?;
    Ok(text.trim().parse::<u32>().ok().filter(|&u| u != u32::MAX))
}

/// This process's audit loginuid, None when unset (or audit is absent).
pub fn own_loginuid() -> Option<u32> {
    fs::read_to_string("/proc/self/loginuid").ok()?.trim().parse::<u32>().ok().filter(|&u| u != u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let me = &s[&process::getpid()];
        assert!(me.alive());
        assert!(!me.threads.is_empty());
        assert!(me.exe().is_some());
    }
}

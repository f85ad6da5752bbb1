//! The process table as /proc shows it, and PID-reuse-safe handles for acting on a process.
//!
//! A process that vanished between listing and reading has exited. Any other failure is
//! *unknown* and is returned as an error: it is never read as "no such process".

use crate::sys::{self, Pid};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// Bytes of /proc/PID/cmdline read per process.
pub const CMDLINE_READ: usize = 4096;

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Thread {
    pub tid: Pid,
    pub state: char,
    /// real, effective, saved, filesystem (all u32::MAX when `creds` is false)
    pub uids: [u32; 4],
    pub gids: [u32; 4],
    /// Whether the UIDs and GIDs were read. A non-leader thread of a process whose leader
    /// already holds a sandbox UID is read for its state only (see `Reader::snapshot_deciding`).
    pub creds: bool,
}

impl Thread {
    /// A thread whose state alone was read.
    fn state_only(tid: Pid, state: char) -> Thread {
        Thread { tid, state, uids: [u32::MAX; 4], gids: [u32::MAX; 4], creds: false }
    }
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Proc {
    pub pid: Pid,
    pub ppid: Pid,
    pub pgid: Pid,
    pub sid: Pid,
    pub state: char,
    /// Field 22 of stat, in clock ticks since boot: with the pid, the process's identity.
    pub start_time: u64,
    pub comm: String,
    pub cmdline: Vec<String>,
    pub exe: Option<String>,
    pub loginuid: Option<u32>,
    pub threads: Vec<Thread>,
}

/// A state letter of a task that has exited: zombie or dead.
fn exited(state: char) -> bool {
    matches!(state, 'Z' | 'X' | 'x')
}

impl Proc {
    /// Dead means every thread is a zombie or gone; a zombie leader with a running thread is alive.
    pub fn alive(&self) -> bool {
        if self.threads.is_empty() {
            return !exited(self.state);
        }
        self.threads.iter().any(|t| !exited(t.state))
    }

    /// Every live thread is stopped (T) or traced-stopped (t).
    pub fn stopped(&self) -> bool {
        self.threads.iter().all(|t| matches!(t.state, 'T' | 't') || exited(t.state))
    }

    /// Every UID of every thread whose credentials were read.
    pub fn all_uids(&self) -> impl Iterator<Item = u32> + '_ {
        self.threads.iter().filter(|t| t.creds).flat_map(|t| t.uids.iter().copied())
    }

    /// The leader's real UID, as people expect to see it.
    pub fn uid(&self) -> u32 {
        let read = || self.threads.iter().filter(|t| t.creds);
        read().find(|t| t.tid == self.pid).or_else(|| read().next()).map(|t| t.uids[0]).unwrap_or(u32::MAX)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detail {
    /// stat, per-thread status, loginuid: enough to decide and act.
    Light,
    /// plus cmdline and exe: the evidence.
    Full,
}

#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    pub procs: BTreeMap<Pid, Proc>,
}

#[cfg(test)]
impl Proc {
    /// A process as unit tests build it: leads its own group and session, asleep, one thread
    /// with `uid` for all four UIDs.
    pub fn fixture(pid: Pid, ppid: Pid, start_time: u64, uid: u32) -> Proc {
        Proc {
            pid,
            ppid,
            pgid: pid,
            sid: pid,
            state: 'S',
            start_time,
            comm: "x".into(),
            cmdline: Vec::new(),
            exe: None,
            loginuid: None,
            threads: vec![Thread { tid: pid, state: 'S', uids: [uid; 4], gids: [0; 4], creds: true }],
        }
    }
}

#[cfg(test)]
impl Snapshot {
    pub fn of(ps: &[Proc]) -> Snapshot {
        Snapshot { procs: ps.iter().map(|p| (p.pid, p.clone())).collect() }
    }
}

/// Processes from which a light observation is split between two threads.
const SPLIT_MIN: usize = 64;

/// Can a second thread run at the same time as this one?
pub fn several_cores() -> bool {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(sys::cpus) > 1
}

/// Bytes of a stat, status or loginuid file read at most: far more than the kernel writes.
const FILE_MAX: usize = 64 * 1024;

enum Read<T> {
    Ok(T),
    Gone,
}

/// The error for anything that is not "this process exited".
fn unknown(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("cannot read {}: {e} (the process table is unknown)", path.display()))
}

fn is_gone(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ESRCH))
}

fn read_prefix(path: &Path, max: usize) -> io::Result<Read<Vec<u8>>> {
    use std::io::Read as _;
    let mut b = Vec::new();
    let r = fs::File::open(path).and_then(|f| f.take(max as u64).read_to_end(&mut b));
    match r {
        Ok(_) => Ok(Read::Ok(b)),
        Err(e) if is_gone(&e) => Ok(Read::Gone),
        Err(e) => Err(unknown(path, e)),
    }
}

pub struct Stat {
    pub pid: Pid,
    pub comm: String,
    pub state: char,
    pub ppid: Pid,
    pub pgid: Pid,
    pub sid: Pid,
    /// Field 20: threads not yet released (a dead process's zombie leader counts as one).
    pub num_threads: i64,
    pub start_time: u64,
}

impl Stat {
    /// The process this stat line describes, with what else was read of it.
    fn into_proc(
        self,
        threads: Vec<Thread>,
        loginuid: Option<u32>,
        evidence: (Vec<String>, Option<String>),
    ) -> Proc {
        Proc {
            pid: self.pid,
            ppid: self.ppid,
            pgid: self.pgid,
            sid: self.sid,
            state: self.state,
            start_time: self.start_time,
            comm: self.comm,
            cmdline: evidence.0,
            exe: evidence.1,
            loginuid,
            threads,
        }
    }
}

/// Parse /proc/PID/stat. comm may hold spaces, parentheses and newlines, so the fields after
/// it are found from the *last* ')'.
pub fn parse_stat(text: &[u8]) -> Result<Stat, String> {
    let open = text.iter().position(|&b| b == b'(').ok_or("stat has no '('")?;
    let close = text.iter().rposition(|&b| b == b')').ok_or("stat has no ')'")?;
    if close < open {
        return Err("stat has ')' before '('".into());
    }
    let pid = std::str::from_utf8(&text[..open])
        .map_err(|_| "stat pid is not text")?
        .trim()
        .parse()
        .map_err(|_| "stat pid is not a number")?;
    let comm = String::from_utf8_lossy(&text[open + 1..close]).into_owned();
    let rest = std::str::from_utf8(&text[close + 1..]).map_err(|_| "stat fields are not text")?;
    // f[0] is field 3 (state); field N is f[N-3]. Fields 3 to 22 are read; no list is built.
    let mut f = [""; 20];
    let mut n = 0;
    for (slot, field) in f.iter_mut().zip(rest.split_ascii_whitespace()) {
        *slot = field;
        n += 1;
    }
    if n < 20 {
        return Err(format!("stat has {n} fields after comm, expected at least 20"));
    }
    let num = |i: usize| -> Result<i64, String> {
        f[i].parse::<i64>().map_err(|_| format!("stat field {} is not a number", i + 3))
    };
    let state = f[0].chars().next().ok_or("stat state is empty")?;
    Ok(Stat {
        pid,
        comm,
        state,
        ppid: num(1)? as Pid,
        pgid: num(2)? as Pid,
        sid: num(3)? as Pid,
        num_threads: num(17)?,
        start_time: f[19].parse().map_err(|_| "stat field 22 is not a number")?,
    })
}

/// The state field of a stat line (the character after the last ')'), without the rest.
fn stat_state(text: &[u8]) -> Result<char, String> {
    let close = text.iter().rposition(|&b| b == b')').ok_or("stat has no ')'")?;
    match text.get(close + 1..close + 3) {
        Some([b' ', c]) if c.is_ascii_alphabetic() => Ok(*c as char),
        _ => Err("stat has no state after comm".into()),
    }
}

/// Parse the State, Uid, Gid (and Threads, where present) lines of a status file.
pub fn parse_status(text: &str) -> Result<(char, [u32; 4], [u32; 4]), String> {
    parse_status_threads(text).map(|s| (s.state, s.uids, s.gids))
}

struct Status {
    state: char,
    uids: [u32; 4],
    gids: [u32; 4],
    /// None in a status without the line (every kernel since 2.6 writes it).
    threads: Option<usize>,
    /// The thread group this task belongs to (None in a status without the line).
    tgid: Option<Pid>,
}

fn parse_status_threads(text: &str) -> Result<Status, String> {
    let mut tgid = None;
    let mut state = None;
    let mut uids = None;
    let mut gids = None;
    let mut threads = None;
    let four = |v: &str| -> Option<[u32; 4]> {
        let mut out = [0u32; 4];
        let mut n = 0;
        for x in v.split_ascii_whitespace() {
            let id = x.parse().ok()?;
            *out.get_mut(n)? = id;
            n += 1;
        }
        (n == 4).then_some(out)
    };
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("State:") {
            state = v.trim().chars().next();
        } else if let Some(v) = line.strip_prefix("Uid:") {
            uids = four(v);
        } else if let Some(v) = line.strip_prefix("Gid:") {
            gids = four(v);
        } else if let Some(v) = line.strip_prefix("Threads:") {
            threads = Some(v.trim().parse().map_err(|_| "status Threads is not a number")?);
        } else if let Some(v) = line.strip_prefix("Tgid:") {
            tgid = Some(v.trim().parse().map_err(|_| "status Tgid is not a number")?);
        }
    }
    Ok(Status {
        state: state.ok_or("status has no State line")?,
        uids: uids.ok_or("status has no valid Uid line")?,
        gids: gids.ok_or("status has no valid Gid line")?,
        threads,
        tgid,
    })
}

pub struct Reader {
    root: PathBuf,
}

impl Default for Reader {
    fn default() -> Self {
        Reader { root: PathBuf::from("/proc") }
    }
}

impl Reader {
    #[cfg(test)]
    pub fn at(root: impl Into<PathBuf>) -> Reader {
        Reader { root: root.into() }
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
        })
    }

    /// cmdline and exe of a process: what a person needs to recognise it.
    fn evidence(&self, dir: &Path) -> io::Result<(Vec<String>, Option<String>)> {
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
            Ok((cmdline, exe))
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
        crate::proctrust::check(&self.root)?;
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
    /// target); when it cannot be started (a pids limit), this thread reads both halves.
    fn read_all(
        &self,
        pids: &[Pid],
        detail: Detail,
        prev: Option<&Snapshot>,
        deciding: &[u32],
    ) -> io::Result<BTreeMap<Pid, Proc>> {
        let part = |pids: &[Pid]| -> io::Result<Vec<(Pid, Proc)>> {
            let mut pass = self.pass()?;
            pass.deciding = deciding;
            let mut out = Vec::with_capacity(pids.len());
            for &pid in pids {
                if let Some(p) = pass.read(pid, detail, prev.and_then(|s| s.procs.get(&pid)))? {
                    out.push((pid, p));
                }
            }
            Ok(out)
        };
        if detail != Detail::Light || pids.len() < SPLIT_MIN || !several_cores() {
            return Ok(part(pids)?.into_iter().collect());
        }
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
        Ok(mine?.into_iter().chain(theirs?).collect())
    }

    /// Like `snapshot(Light)`, for the init's periodic history refresh: credentials are read
    /// afresh, a loginuid already set is reused from `prev`.
    /// `abort` is asked before every process (one syscall against the several a read costs: when
    /// a CPU storm leaves the init 1% of a core, 32 processes took a quarter of a second); when it
    /// says yes, Ok(None) comes back at once.
    pub fn snapshot_since(&self, prev: &Snapshot, abort: &dyn Fn() -> bool) -> io::Result<Option<Snapshot>> {
        crate::proctrust::check(&self.root)?;
        let mut pass = self.pass()?;
        let mut procs = BTreeMap::new();
        for pid in self.pids()? {
            if abort() {
                return Ok(None);
            }
            if let Some(p) = pass.read(pid, Detail::Light, prev.procs.get(&pid))? {
                procs.insert(pid, p);
            }
        }
        Ok(Some(Snapshot { procs }))
    }

    /// Start time of `pid` now; Ok(None) if it exited.
    pub fn start_time(&self, pid: Pid) -> io::Result<Option<u64>> {
        self.pass()?.start_time(pid)
    }
}

/// One pass of reads over /proc: every file is opened relative to one descriptor of the /proc
/// directory (no path built or resolved from the root per file) and read into one buffer reused
/// for every file.
pub struct Pass<'a> {
    reader: &'a Reader,
    dir: OwnedFd,
    buf: Vec<u8>,
    /// "PID/FILE\0", rebuilt in place for every file.
    name: Vec<u8>,
    /// UIDs whose presence in a leader's credentials makes its other threads' moot.
    deciding: &'a [u32],
}

impl Pass<'_> {
    /// Read `pid`'s `file` into the buffer.
    fn file(&mut self, pid: Pid, file: &str) -> io::Result<Read<()>> {
        use std::io::Write as _;
        self.name.clear();
        let _ = write!(self.name, "{pid}/{file}\0");
        let name = std::ffi::CStr::from_bytes_with_nul(&self.name).map_err(io::Error::other)?;
        match sys::read_file_at(&self.dir, name, &mut self.buf, FILE_MAX) {
            Ok(false) => Ok(Read::Ok(())),
            Ok(true) => Err(self.unknown(pid, file, io::Error::other("larger than expected"))),
            Err(e) if is_gone(&e) => Ok(Read::Gone),
            Err(e) => Err(self.unknown(pid, file, e)),
        }
    }

    fn unknown(&self, pid: Pid, file: &str, e: io::Error) -> io::Error {
        unknown(&self.reader.root.join(pid.to_string()).join(file), e)
    }

    /// The owner of `pid`'s /proc directory; None if it cannot be told (exited, or unreadable).
    pub fn owner(&self, pid: Pid) -> Option<u32> {
        let name = std::ffi::CString::new(pid.to_string()).ok()?;
        sys::fstatat(&self.dir, &name).ok().map(|st| st.st_uid)
    }

    /// Start time of `pid` now; Ok(None) if it exited.
    pub fn start_time(&mut self, pid: Pid) -> io::Result<Option<u64>> {
        Ok(self.stat(pid)?.map(|s| s.start_time))
    }

    /// `pid`'s stat line; Ok(None) if it exited.
    pub fn stat(&mut self, pid: Pid) -> io::Result<Option<Stat>> {
        match self.file(pid, "stat")? {
            Read::Gone => Ok(None),
            Read::Ok(()) => {
                parse_stat(&self.buf).map(Some).map_err(|e| self.unknown(pid, "stat", io::Error::other(e)))
            }
        }
    }

    /// Read one process, knowing what an earlier observation saw of it. Credentials are always
    /// read afresh (a root process may become the sandbox user at any time); only a loginuid
    /// that was already set is reused, since it cannot change again without CAP_AUDIT_CONTROL.
    /// Ok(None): it exited (or `pid` is a thread's id, not a process's).
    pub fn read(&mut self, pid: Pid, detail: Detail, prev: Option<&Proc>) -> io::Result<Option<Proc>> {
        let Some(stat) = self.stat(pid)? else { return Ok(None) };
        let known = prev.filter(|p| p.start_time == stat.start_time).and_then(|p| p.loginuid);
        // A zombie whose thread count (read with its state) is exactly itself is a dead process
        // with nothing left that can act: its stat line says all there is. After a kill, every
        // process killed is one of these until it is reaped. Not a count of 0: that is how a task
        // the kernel already released reads, and a read that goes through a leader an exec from
        // another thread just swapped out (de_thread) reads so while the pid names the live
        // execer. (A thread's id never reads as 1: its group still counts leader and thread.)
        // `ps` (Full) reads on, to show whose zombie it is.
        if detail == Detail::Light && exited(stat.state) && stat.num_threads == 1 {
            let leader = Thread::state_only(pid, stat.state);
            return Ok(Some(stat.into_proc(vec![leader], known, (Vec::new(), None))));
        }
        // The leader's status says how many threads there are; only a multi-threaded process
        // (whose threads may hold other credentials) needs its task directory walked.
        let st = match self.file(pid, "status")? {
            Read::Gone => return Ok(None),
            Read::Ok(()) => parse_status_threads(&String::from_utf8_lossy(&self.buf))
                .map_err(|e| self.unknown(pid, "status", io::Error::other(e)))?,
        };
        // /proc/TID of a non-leader thread is reachable by number though never listed: it is
        // part of its thread group's process, not a process of its own.
        if st.tgid.is_some_and(|t| t != pid) {
            return Ok(None);
        }
        let (lstate, luids, lgids) = (st.state, st.uids, st.gids);
        // Without the count, a process with threads of other credentials could pass as one.
        let nthreads = st
            .threads
            .ok_or_else(|| self.unknown(pid, "status", io::Error::other("status has no Threads line")))?;
        // Only a process counting other threads than its leader has them read.
        let leader = Thread { tid: pid, state: lstate, uids: luids, gids: lgids, creds: true };
        let mut threads = if nthreads > 1 {
            let read = if luids.iter().any(|u| self.deciding.contains(u)) {
                self.thread_states(pid, leader)?
            } else {
                self.threads(pid)?
            };
            match read {
                Read::Gone => return Ok(None),
                Read::Ok(t) => t,
            }
        } else {
            vec![leader]
        };
        // Dead only when the leader reads dead with a count, read with its state, of exactly
        // itself. Any other way of reading no live thread may be a read that straddled an exec
        // from another thread, which swaps the execer into the leader's pid (de_thread): through
        // the old leader the status reads a count of 0 (released), or the threads it counted
        // are gone by the time the task directory is read while the execer lives under the pid.
        // Such a process counts as alive: the proof kills it through its pid and looks again,
        // and a process that really died meanwhile reads dead the next time.
        if threads.iter().all(|t| exited(t.state)) && !(nthreads == 1 && exited(lstate)) {
            threads.push(Thread::state_only(pid, '?'));
        }
        let loginuid = match known {
            Some(u) => Some(u),
            None => match self.file(pid, "loginuid")? {
                Read::Gone => None,
                Read::Ok(()) => {
                    String::from_utf8_lossy(&self.buf).trim().parse::<u32>().ok().filter(|&u| u != u32::MAX)
                }
            },
        };
        let (cmdline, exe) = if detail == Detail::Full {
            self.reader.evidence(&self.reader.root.join(pid.to_string()))?
        } else {
            (Vec::new(), None)
        };
        Ok(Some(stat.into_proc(threads, loginuid, (cmdline, exe))))
    }

    /// The state of every thread of `pid`, from each thread's stat line; Ok(None) if it exited.
    pub fn task_states(&mut self, pid: Pid) -> io::Result<Option<Vec<char>>> {
        let task = self.reader.root.join(pid.to_string()).join("task");
        let rd = match fs::read_dir(&task) {
            Ok(rd) => rd,
            Err(e) if is_gone(&e) => return Ok(None),
            Err(e) => return Err(unknown(&task, e)),
        };
        let mut out = Vec::new();
        for ent in rd {
            let ent = match ent {
                Ok(ent) => ent,
                Err(e) if is_gone(&e) => return Ok(None),
                Err(e) => return Err(unknown(&task, e)),
            };
            let Some(tid) = ent.file_name().to_str().and_then(|s| s.parse::<Pid>().ok()) else {
                continue;
            };
            let file = format!("task/{tid}/stat");
            if let Read::Ok(()) = self.file(pid, &file)? {
                let st = parse_stat(&self.buf).map_err(|e| self.unknown(pid, &file, io::Error::other(e)))?;
                out.push(st.state);
            }
        }
        Ok(Some(out))
    }

    /// Every thread of `pid` with the leader as its status was just read and the others read
    /// for their state alone, from their stat line: for a process whose leader decides.
    fn thread_states(&mut self, pid: Pid, leader: Thread) -> io::Result<Read<Vec<Thread>>> {
        let Read::Ok(tids) = self.task_ids(pid)? else { return Ok(Read::Gone) };
        let mut out = Vec::new();
        for tid in tids {
            if tid == pid {
                continue;
            }
            let file = format!("task/{tid}/stat");
            match self.file(pid, &file)? {
                Read::Gone => continue,
                Read::Ok(()) => {
                    let state =
                        stat_state(&self.buf).map_err(|e| self.unknown(pid, &file, io::Error::other(e)))?;
                    out.push(Thread::state_only(tid, state));
                }
            }
        }
        // The leader is listed while its process lives, even as a zombie with threads running.
        out.push(leader);
        out.sort_by_key(|t| t.tid);
        Ok(Read::Ok(out))
    }

    /// The thread ids listed under /proc/PID/task.
    fn task_ids(&self, pid: Pid) -> io::Result<Read<Vec<Pid>>> {
        let task = self.reader.root.join(pid.to_string()).join("task");
        let rd = match fs::read_dir(&task) {
            Ok(rd) => rd,
            Err(e) if is_gone(&e) => return Ok(Read::Gone),
            Err(e) => return Err(unknown(&task, e)),
        };
        let mut out = Vec::new();
        for ent in rd {
            // A process that exits while its task directory is listed ends the listing with
            // ENOENT: it exited, which is an answer.
            let ent = match ent {
                Ok(ent) => ent,
                Err(e) if is_gone(&e) => return Ok(Read::Gone),
                Err(e) => return Err(unknown(&task, e)),
            };
            if let Some(tid) = ent.file_name().to_str().and_then(|s| s.parse::<Pid>().ok()) {
                out.push(tid);
            }
        }
        Ok(Read::Ok(out))
    }

    fn threads(&mut self, pid: Pid) -> io::Result<Read<Vec<Thread>>> {
        let Read::Ok(tids) = self.task_ids(pid)? else { return Ok(Read::Gone) };
        let mut out = Vec::new();
        for tid in tids {
            let file = format!("task/{tid}/status");
            match self.file(pid, &file)? {
                // A thread that exited while we listed: the others still count.
                Read::Gone => continue,
                Read::Ok(()) => {
                    let (state, uids, gids) = parse_status(&String::from_utf8_lossy(&self.buf))
                        .map_err(|e| self.unknown(pid, &file, io::Error::other(e)))?;
                    out.push(Thread { tid, state, uids, gids, creds: true });
                }
            }
        }
        out.sort_by_key(|t| t.tid);
        Ok(Read::Ok(out))
    }
}

/// This process's audit loginuid, None when unset (or audit is absent).
pub fn own_loginuid() -> Option<u32> {
    fs::read_to_string("/proc/self/loginuid").ok()?.trim().parse::<u32>().ok().filter(|&u| u != u32::MAX)
}

/// Why a pid may never be signalled through a handle.
pub fn forbidden_target(pid: Pid) -> Option<&'static str> {
    if pid <= 0 {
        Some("pid 0 or negative pids address groups")
    } else if pid == 1 {
        Some("pid 1 is the init")
    } else if pid == sys::getpid() {
        Some("the init itself")
    } else {
        None
    }
}

/// A pidfd pinned to one process identity (pid + start time).
pub struct Handle {
    fd: OwnedFd,
    pub pid: Pid,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Opened {
    /// The process exited, or the pid now names another process.
    Exited,
    Refused(&'static str),
}

impl Handle {
    /// Open a pidfd, then re-check the start time: a pidfd opened after the pid was reused
    /// points at the newcomer, and the start time tells them apart.
    pub fn open(reader: &Reader, pid: Pid, start_time: u64) -> io::Result<Result<Handle, Opened>> {
        Handle::open_in(&mut reader.pass()?, pid, start_time)
    }

    /// Like `open`, reading the start time within a pass: many handles, one /proc descriptor.
    pub fn open_in(pass: &mut Pass, pid: Pid, start_time: u64) -> io::Result<Result<Handle, Opened>> {
        if let Some(why) = forbidden_target(pid) {
            return Ok(Err(Opened::Refused(why)));
        }
        let fd = match sys::pidfd_open(pid) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(Err(Opened::Exited)),
            // EINVAL (ENOENT on newer kernels): the pid now names a thread, not a leader; the
            // process we saw is gone.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOENT)) => {
                return Ok(Err(Opened::Exited))
            }
            Err(e) => return Err(io::Error::new(e.kind(), format!("pidfd_open({pid}): {e}"))),
        };
        match pass.start_time(pid)? {
            Some(t) if t == start_time => Ok(Ok(Handle { fd, pid })),
            _ => Ok(Err(Opened::Exited)),
        }
    }

    /// Signal the process group this process leads. Ok(false): the group has no member left.
    /// Err with EINVAL: the kernel cannot (before 6.9).
    pub fn signal_group(&self, sig: i32) -> io::Result<bool> {
        match sys::pidfd_send_signal_group(&self.fd, sig) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Ok(false): the process has already exited.
    pub fn signal(&self, sig: i32) -> io::Result<bool> {
        match sys::pidfd_send_signal(&self.fd, sig) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(false),
            Err(e) => Err(io::Error::new(e.kind(), format!("signal pid {}: {e}", self.pid))),
        }
    }
}

/// Signal one observed process through a handle. Ok(false): exited, reused or refused.
pub fn signal(reader: &Reader, p: &Proc, sig: i32) -> io::Result<bool> {
    match Handle::open(reader, p.pid, p.start_time)? {
        Ok(h) => h.signal(sig),
        Err(_) => Ok(false),
    }
}

/// Like `signal`, within a pass (see `Handle::open_in`).
pub fn signal_in(pass: &mut Pass, p: &Proc, sig: i32) -> io::Result<bool> {
    match Handle::open_in(pass, p.pid, p.start_time)? {
        Ok(h) => h.signal(sig),
        Err(_) => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_hostile_comm() {
        let line = b"42 (a) b (c\nd) ) S 1 42 42 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 98765 1000 10";
        let s = parse_stat(line).unwrap();
        assert_eq!(s.pid, 42);
        assert_eq!(s.comm, "a) b (c\nd) ");
        assert_eq!((s.state, s.ppid, s.pgid, s.sid), ('S', 1, 42, 42));
        assert_eq!(s.start_time, 98765);
    }

    #[test]
    fn stat_malformed_is_an_error() {
        assert!(parse_stat(b"42 (x S 1").is_err());
        assert!(parse_stat(b"42 (x) S 1 2").is_err());
        assert!(parse_stat(b"x (y) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0").is_err());
        assert!(parse_stat(b"42 )x( S").is_err());
    }

    #[test]
    fn status_lines() {
        let t = "Name:\tx\nState:\tT (stopped)\nUid:\t4242\t0\t0\t4242\nGid:\t1\t2\t3\t4\n";
        assert_eq!(parse_status(t).unwrap(), ('T', [4242, 0, 0, 4242], [1, 2, 3, 4]));
        assert!(parse_status("State:\tS\nUid:\t1 2 3\nGid:\t1 2 3 4\n").is_err());
        assert!(parse_status("Uid:\t1 2 3 4\nGid:\t1 2 3 4\n").is_err());
    }

    #[test]
    fn never_signal_special_pids() {
        let r = Reader::default();
        for pid in [0, -1, -42, 1, sys::getpid()] {
            assert!(matches!(Handle::open(&r, pid, 0).unwrap(), Err(Opened::Refused(_))), "pid {pid}");
        }
    }

    #[test]
    fn reused_pid_is_refused() {
        // Our own child, opened with a start time that is not its own, is treated as exited.
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let pid = child.id() as Pid;
        let r = Reader::default();
        let real = r.start_time(pid).unwrap().unwrap();
        assert!(matches!(Handle::open(&r, pid, real + 1).unwrap(), Err(Opened::Exited)));
        let h = Handle::open(&r, pid, real).unwrap().unwrap();
        assert!(h.signal(libc::SIGKILL).unwrap());
        child.wait().unwrap();
        assert!(!h.signal(libc::SIGKILL).unwrap());
        assert_eq!(r.read(pid, Detail::Light).unwrap(), None);
    }

    #[test]
    fn a_dead_process_is_read_from_its_stat_alone() {
        // A child that exited and is not reaped yet: dead, and nothing but stat was needed.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as Pid;
        let r = Reader::default();
        let mut seen = None;
        for _ in 0..500 {
            match r.read(pid, Detail::Light).unwrap() {
                Some(p) if p.state == 'Z' => {
                    seen = Some(p);
                    break;
                }
                _ => std::thread::sleep(std::time::Duration::from_millis(2)),
            }
        }
        let full = r.read(pid, Detail::Full).unwrap();
        child.wait().unwrap();
        let p = seen.expect("the child never showed as a zombie");
        assert!(!p.alive());
        assert_eq!(p.threads.len(), 1);
        assert!(!p.threads[0].creds, "credentials read from a dead process's status");
        // What `ps` shows of the same zombie: whose it is.
        let full = full.expect("the zombie was reaped before its second read");
        assert!(!full.alive());
        assert_eq!(full.uid(), unsafe { libc::getuid() }, "{full:?}");
    }

    #[test]
    fn a_thread_id_is_not_a_process() {
        // pidfd_open refuses a thread that is not a leader with EINVAL: the process the freeze
        // saw under that number is gone, which is an answer, not an error.
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(unsafe { libc::gettid() }).unwrap();
            let _ = done_rx.recv();
        });
        let tid = rx.recv().unwrap();
        let r = Reader::default();
        let st = r.start_time(tid).unwrap().unwrap();
        assert!(matches!(Handle::open(&r, tid, st).unwrap(), Err(Opened::Exited)));
        assert_eq!(r.read(tid, Detail::Light).unwrap(), None);
        drop(done_tx);
        t.join().unwrap();
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
    fn stat_state_after_a_hostile_comm() {
        assert_eq!(stat_state(b"42 (a) b (c\nd) ) T 1 42 42 0").unwrap(), 'T');
        assert_eq!(stat_state(b"42 (x) t 1").unwrap(), 't');
        assert!(stat_state(b"42 (x S 1").is_err());
        assert!(stat_state(b"42 (x)").is_err());
        assert!(stat_state(b"42 (x)  S").is_err());
    }

    /// The leader decides only where it holds one of the UIDs: then the other threads are read
    /// for their state alone, and all of them are there; otherwise every thread's credentials are
    /// read, as without the UIDs.
    #[test]
    fn only_a_leader_holding_the_uid_leaves_its_threads_to_their_state() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let parked = std::thread::spawn(move || {
            tid_tx.send(unsafe { libc::gettid() }).unwrap();
            let _ = rx.recv();
        });
        let tid = tid_rx.recv().unwrap();
        let me = sys::getpid();
        let euid = unsafe { libc::geteuid() };
        let r = Reader::default();
        let full = r.snapshot_after(Detail::Light, None).unwrap().procs.remove(&me).unwrap();
        let other = if euid == 4242 { 4243 } else { 4242 };
        let undecided =
            r.snapshot_deciding(Detail::Light, None, &[other]).unwrap().procs.remove(&me).unwrap();
        let decided = r.snapshot_deciding(Detail::Light, None, &[euid]).unwrap().procs.remove(&me).unwrap();
        drop(tx);
        parked.join().unwrap();
        // Other tests' threads come and go meanwhile: only the leader and the parked thread are
        // looked at by id.
        assert!(full.threads.iter().any(|t| t.tid == tid), "{full:?}");
        assert!(undecided.threads.iter().all(|t| t.creds), "{undecided:?}");
        assert!(decided.threads.iter().all(|t| t.creds == (t.tid == me)), "{decided:?}");
        let p = decided.threads.iter().find(|t| t.tid == tid).expect("the parked thread is listed");
        assert!(matches!(p.state, 'S' | 'R'), "{p:?}");
        assert!(decided.threads.iter().any(|t| t.tid == me));
        let leader = full.threads.iter().find(|t| t.tid == me).unwrap();
        assert_eq!(decided.all_uids().collect::<Vec<_>>(), leader.uids.to_vec());
        assert_eq!(decided.uid(), full.uid());
        assert!(decided.alive());
    }

    #[test]
    fn sees_itself_with_threads() {
        let s = Reader::default().snapshot(Detail::Full).unwrap();
        let me = &s.procs[&sys::getpid()];
        assert!(me.alive());
        assert!(!me.threads.is_empty());
        assert!(me.exe.is_some());
    }
}

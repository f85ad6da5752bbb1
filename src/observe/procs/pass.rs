//! One pass of reads over /proc: one process, its threads, its start time or tracer, each read
//! relative to one descriptor of /proc. May use: kernel, observe.

use crate::kernel::{dirfd, process::Pid, stat};
use crate::observe::procs::model::{exited, Detail, Proc, Thread, Threads};
use crate::observe::procs::parse::{
    listed_pid, parse_stat, parse_status, parse_status_threads, stat_state, tracer_pid, Stat,
};
use crate::observe::procs::read::{is_gone, unknown, Read};
use crate::observe::procs::reader::Reader;
use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;

/// Bytes of a stat, status or loginuid file read at most: far more than the kernel writes.
const FILE_MAX: usize = 64 * 1024;

/// Reads between two looks at the clock in a bounded pass.
const CLOCK_EVERY: u32 = 32;

/// One pass of reads over /proc: every file is opened relative to one descriptor of the /proc
/// directory (no path built or resolved from the root per file) and read into one buffer reused
/// for every file.
pub struct Pass<'a> {
    pub(super) reader: &'a Reader,
    pub(super) dir: OwnedFd,
    pub(super) buf: Vec<u8>,
    /// "PID/FILE\0", rebuilt in place for every file.
    pub(super) name: Vec<u8>,
    /// UIDs whose presence in a leader's credentials makes its other threads' moot.
    pub(super) deciding: &'a [u32],
    /// Processes read so far, for the bounded reader's look at the clock.
    pub(super) reads: u32,
}

impl Pass<'_> {
    /// Read `pid`'s `file` into the buffer.
    fn file(&mut self, pid: Pid, file: &str) -> io::Result<Read<()>> {
        use std::io::Write as _;
        self.name.clear();
        let _ = write!(self.name, "{pid}/{file}\0");
        let name = std::ffi::CStr::from_bytes_with_nul(&self.name).map_err(io::Error::other)?;
        match dirfd::read_file_at(&self.dir, name, &mut self.buf, FILE_MAX) {
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
        stat::fstatat(&self.dir, &name).ok().map(|st| st.st_uid)
    }

    /// Start time of `pid` now; Ok(None) if it exited.
    pub fn start_time(&mut self, pid: Pid) -> io::Result<Option<u64>> {
        Ok(self.stat(pid)?.map(|s| s.start_time))
    }

    /// `pid`'s tracer (its status's TracerPid, 0 for none); Ok(None) if it exited.
    pub fn tracer(&mut self, pid: Pid) -> io::Result<Option<Pid>> {
        match self.file(pid, "status")? {
            Read::Gone => Ok(None),
            Read::Ok(()) => match tracer_pid(&self.buf) {
                Some(t) => Ok(Some(t)),
                None => Err(self.unknown(pid, "status", io::Error::other("no TracerPid line"))),
            },
        }
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
        self.count_read()?;
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
            return Ok(Some(stat.into_proc(Threads::One([leader]), known, None)));
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
        let leader = Thread { tid: pid, state: lstate, uids: luids, gids: lgids, creds: true };
        let Read::Ok(mut threads) = self.all_threads(pid, leader, nthreads)? else { return Ok(None) };
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
            None => self.loginuid(pid)?,
        };
        let named = if detail == Detail::Full {
            Some(Box::new(self.reader.evidence(&self.reader.root.join(pid.to_string()))?))
        } else {
            None
        };
        Ok(Some(stat.into_proc(threads, loginuid, named)))
    }

    /// One more process read; in a bounded pass, every CLOCK_EVERY reads, a TimedOut error once
    /// the pass's time is up.
    fn count_read(&mut self) -> io::Result<()> {
        self.reads = self.reads.wrapping_add(1);
        if let Some(until) = self.reader.until.filter(|_| self.reads % CLOCK_EVERY == 1) {
            if std::time::Instant::now() >= until {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "one pass over /proc did not end within the freeze's budget",
                ));
            }
        }
        Ok(())
    }

    /// The threads of a process whose leader's status was just read (`leader`, counting
    /// `nthreads`). Only a process counting other threads than its leader has them read: each
    /// one's credentials, or only its state where the leader holds a deciding UID.
    fn all_threads(&mut self, pid: Pid, leader: Thread, nthreads: usize) -> io::Result<Read<Threads>> {
        if nthreads <= 1 {
            return Ok(Read::Ok(Threads::One([leader])));
        }
        let read = if leader.uids.iter().any(|u| self.deciding.contains(u)) {
            self.thread_states(pid, leader)?
        } else {
            self.threads(pid)?
        };
        Ok(match read {
            Read::Gone => Read::Gone,
            Read::Ok(t) => Read::Ok(Threads::from(t)),
        })
    }

    /// `pid`'s loginuid; None when it is unset or the process exited.
    fn loginuid(&mut self, pid: Pid) -> io::Result<Option<u32>> {
        Ok(match self.file(pid, "loginuid")? {
            Read::Gone => None,
            Read::Ok(()) => {
                String::from_utf8_lossy(&self.buf).trim().parse::<u32>().ok().filter(|&u| u != u32::MAX)
            }
        })
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
            let Some(tid) = listed_pid(ent.file_name().as_bytes()) else {
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
            if let Some(tid) = listed_pid(ent.file_name().as_bytes()) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let me = crate::kernel::process::getpid();
        let euid = unsafe { libc::geteuid() };
        let r = Reader::default();
        let full = r.snapshot_after(Detail::Light, None).unwrap().remove(&me).unwrap();
        let other = if euid == 4242 { 4243 } else { 4242 };
        let undecided = r.snapshot_deciding(Detail::Light, None, &[other]).unwrap().remove(&me).unwrap();
        let decided = r.snapshot_deciding(Detail::Light, None, &[euid]).unwrap().remove(&me).unwrap();
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
}

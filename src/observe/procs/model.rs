//! The model of an observation: a process (Proc) with its threads, its name and what a person
//! needs to recognise it, and how much of it an observation reads (Detail). May use: kernel.

use crate::kernel::process::Pid;

#[derive(Debug, Clone, PartialEq, Eq)]
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
    pub(super) fn state_only(tid: Pid, state: char) -> Thread {
        Thread { tid, state, uids: [u32::MAX; 4], gids: [u32::MAX; 4], creds: false }
    }
}

/// A process's threads. Nearly every process has one: it is kept inside the entry, and only a
/// process with more has them on the heap (an allocation per entry cost as much as the entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Threads {
    One([Thread; 1]),
    Many(Vec<Thread>),
}

impl Threads {
    pub fn push(&mut self, t: Thread) {
        match self {
            Threads::One([first]) => {
                let first = first.clone();
                *self = Threads::Many(vec![first, t]);
            }
            Threads::Many(v) => v.push(t),
        }
    }

    #[cfg(test)]
    pub fn clear(&mut self) {
        *self = Threads::Many(Vec::new());
    }
}

impl From<Vec<Thread>> for Threads {
    fn from(mut v: Vec<Thread>) -> Threads {
        if v.len() == 1 {
            if let Some(t) = v.pop() {
                return Threads::One([t]);
            }
        }
        v.shrink_to_fit();
        Threads::Many(v)
    }
}

impl std::ops::Deref for Threads {
    type Target = [Thread];
    fn deref(&self) -> &[Thread] {
        match self {
            Threads::One(t) => t,
            Threads::Many(v) => v,
        }
    }
}

impl std::ops::DerefMut for Threads {
    fn deref_mut(&mut self) -> &mut [Thread] {
        match self {
            Threads::One(t) => t,
            Threads::Many(v) => v,
        }
    }
}

/// A process's name as stat shows it, kept in the entry: the kernel's comm is at most 15 bytes
/// (TASK_COMM_LEN); a longer one (a kernel thread's full name) is cut there. Only shown, never
/// decides anything.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Comm {
    len: u8,
    bytes: [u8; COMM_KEEP],
}

/// Bytes of a name kept.
const COMM_KEEP: usize = 15;

impl Comm {
    pub fn new(raw: &[u8]) -> Comm {
        let n = raw.len().min(COMM_KEEP);
        let mut bytes = [0u8; COMM_KEEP];
        bytes[..n].copy_from_slice(&raw[..n]);
        Comm { len: n as u8, bytes }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

impl From<&str> for Comm {
    fn from(s: &str) -> Comm {
        Comm::new(s.as_bytes())
    }
}

impl std::fmt::Display for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&String::from_utf8_lossy(self.as_bytes()))
    }
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(self.as_bytes()))
    }
}

/// One process of an observation. Fixed size, nothing on the heap for a process with one thread
/// (the sandbox chooses how many entries PID 1 holds): 104 bytes (`entry_size` below).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proc {
    pub pid: Pid,
    pub ppid: Pid,
    pub pgid: Pid,
    pub state: char,
    /// Field 22 of stat, in clock ticks since boot: with the pid, the process's identity.
    pub start_time: u64,
    pub comm: Comm,
    /// cmdline and exe, read by a full observation only (`ps`). Boxed: a light entry, of which
    /// PID 1 holds one per process of the namespace, does not carry their room.
    pub named: Option<Box<Named>>,
    pub loginuid: Option<u32>,
    pub threads: Threads,
}

/// What a person needs to recognise a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    pub cmdline: Vec<String>,
    pub exe: Option<String>,
}

/// A state letter of a task that has exited: zombie or dead.
pub(super) fn exited(state: char) -> bool {
    matches!(state, 'Z' | 'X' | 'x')
}

impl Proc {
    /// The command line a full observation read (empty otherwise).
    pub fn cmdline(&self) -> &[String] {
        self.named.as_ref().map_or(&[], |n| &n.cmdline)
    }

    /// The executable a full observation read.
    #[cfg(test)]
    pub fn exe(&self) -> Option<&str> {
        self.named.as_ref().and_then(|n| n.exe.as_deref())
    }

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

#[cfg(test)]
impl Proc {
    /// A process as unit tests build it: leads its own group and session, asleep, one thread
    /// with `uid` for all four UIDs.
    pub fn fixture(pid: Pid, ppid: Pid, start_time: u64, uid: u32) -> Proc {
        Proc {
            pid,
            ppid,
            pgid: pid,
            state: 'S',
            start_time,
            comm: "x".into(),
            named: None,
            loginuid: None,
            threads: vec![Thread { tid: pid, state: 'S', uids: [uid; 4], gids: [0; 4], creds: true }].into(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detail {
    /// stat, per-thread status, loginuid: enough to decide and act.
    Light,
    /// plus cmdline and exe: the evidence.
    Full,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What PID 1 holds per process of the namespace, per table (`docs/benchmarks.md`).
    #[test]
    fn entry_size() {
        assert_eq!(std::mem::size_of::<Thread>(), 44);
        assert_eq!(std::mem::size_of::<Threads>(), 48);
        assert_eq!(std::mem::size_of::<Comm>(), 16);
        assert_eq!(std::mem::size_of::<Proc>(), 104);
        let one = Proc::fixture(7, 1, 5, 4242);
        assert!(matches!(one.threads, Threads::One(_)), "one thread is kept in the entry");
        assert_eq!(Comm::from("a very long kernel thread name").to_string(), "a very long ker");
    }
}

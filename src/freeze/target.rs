//! The signalling target: a pidfd pinned to one observed process (pid and start time), so that
//! a reused pid is never signalled, and pid 0, negatives, PID 1 and the init never are. Whom to
//! signal is decided by the caller. May use: kernel, observe.

use crate::kernel::{
    pidfd,
    process::{self, Pid},
};
use crate::observe::procs::model::Proc;
use crate::observe::procs::pass::Pass;
use crate::observe::procs::reader::Reader;
use std::io;
use std::os::fd::OwnedFd;

/// Why a pid may never be signalled through a handle.
pub fn forbidden_target(pid: Pid) -> Option<&'static str> {
    if pid <= 0 {
        Some("pid 0 or negative pids address groups")
    } else if pid == 1 {
        Some("pid 1 is the init")
    } else if pid == process::getpid() {
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
        let fd = match pidfd::pidfd_open(pid) {
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
        match pidfd::pidfd_send_signal_group(&self.fd, sig) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Ok(false): the process has already exited.
    pub fn signal(&self, sig: i32) -> io::Result<bool> {
        match pidfd::pidfd_send_signal(&self.fd, sig) {
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
    use crate::observe::procs::model::Detail;

    #[test]
    fn never_signal_special_pids() {
        let r = Reader::default();
        for pid in [0, -1, -42, 1, process::getpid()] {
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
}

//! The services' killer, and who of the service user is alive: the killer is forked before any
//! service starts and kills them all after the command, or when verify dies.

use crate::kernel::{creds, process::Pid, reap};
use crate::observe::procs::{model::Detail, reader::Reader};
use std::time::{Duration, Instant};

/// The services' killer: a child forked before any service starts (so a pids limit they fill
/// cannot keep it from existing), root and waiting until asked. Each byte verify writes asks
/// for a burst of kill(-1) as the service user (`creds::kill_sweeps_from`: the services cannot
/// stop it), answered by a byte back; when verify's end of the pipe closes (verify ended, even
/// by SIGKILL) it sweeps once more and exits. No service can outlive its verify.
pub struct Killer {
    pub pid: Pid,
    ask: std::os::fd::OwnedFd,
    done: std::os::fd::OwnedFd,
}

/// A UID with no process, for the killer's real and saved IDs: far from any a system assigns.
fn outsider(uid: u32) -> u32 {
    uid ^ 0x4000_0000
}

impl Killer {
    pub fn start(uid: u32) -> Result<Killer, String> {
        use crate::kernel::fdio;
        use std::os::fd::AsRawFd;
        if alive_of(outsider(uid))? != 0 {
            return Err(format!("processes of UID {} are alive: name another --service-user", outsider(uid)));
        }
        let (ask_r, ask) = fdio::pipe().map_err(|e| format!("pipe: {e}"))?;
        let (done, done_w) = fdio::pipe().map_err(|e| format!("pipe: {e}"))?;
        let pid =
            crate::kernel::process::fork().map_err(|e| format!("cannot start the services' killer: {e}"))?;
        if pid == 0 {
            drop(ask);
            drop(done);
            // A session of its own: a signal to verify's group (timeout(1) sends one) leaves it
            // to do its last sweep once verify is gone.
            if let Err(e) = crate::kernel::process::setsid() {
                crate::kernel::process::exit_now(e.raw_os_error().unwrap_or(libc::EIO));
            }
            let mut byte = [0u8; 1];
            loop {
                let last = !matches!(fdio::read_some(&ask_r, &mut byte), Ok(1));
                // The same IDs again on every burst: allowed, each being one it holds already.
                let e =
                    creds::kill_sweeps_from(outsider(uid), uid, libc::SIGKILL, 20, Duration::from_millis(5));
                if e != 0 || last {
                    crate::kernel::process::exit_now(e);
                }
                if fdio::write(done_w.as_raw_fd(), b"k").is_err() {
                    crate::kernel::process::exit_now(0);
                }
            }
        }
        drop(ask_r);
        drop(done_w);
        Ok(Killer { pid, ask, done })
    }

    /// One burst, waited for until `until`.
    pub fn sweep(&self, until: Instant) -> Result<(), String> {
        use crate::kernel::fdio;
        use std::os::fd::AsRawFd;
        fdio::write(self.ask.as_raw_fd(), b"k").map_err(|e| format!("the services' killer is gone: {e}"))?;
        let left = until.saturating_duration_since(Instant::now());
        match fdio::wait_readable(self.done.as_raw_fd(), left) {
            Ok(true) => match fdio::read_some(&self.done, &mut [0u8; 1]) {
                Ok(1) => Ok(()),
                _ => Err("the services' killer ended".into()),
            },
            _ => Err("the services' killer did not answer in time".into()),
        }
    }

    /// Close the pipe (a last burst) and reap it.
    pub fn finish(self, until: Instant) {
        let Killer { pid, ask, done } = self;
        drop(ask);
        drop(done);
        while Instant::now() < until {
            if !matches!(reap::try_reap(pid), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        crate::kernel::signal::kill(pid, libc::SIGKILL).ok();
        let _ = reap::wait_child(pid);
    }
}

/// Processes alive (not zombies) with `uid` among their UIDs; an unreadable /proc is an error.
pub fn alive_of(uid: u32) -> Result<usize, String> {
    alive_but(uid, 0)
}

/// The same, leaving out `but` (the killer, whose effective UID is the user's).
pub fn alive_but(uid: u32, but: Pid) -> Result<usize, String> {
    let snap = Reader::default().snapshot(Detail::Light).map_err(|e| format!("cannot read /proc: {e}"))?;
    Ok(snap.values().filter(|p| p.pid != but && p.alive() && p.all_uids().any(|u| u == uid)).count())
}

//! Sending a signal with a sandbox UID's permissions: kill(-1) from a context switched to that
//! UID reaches exactly the processes the UID may signal, atomically with respect to fork.
//!
//! While a context is switched, a process of that UID may signal it, so where it lives matters:
//! - As PID 1, the calling thread itself (the init's loop). The kernel drops SIGKILL and SIGSTOP
//!   sent to a namespace's init from inside the namespace; every other signal is blocked, and the
//!   loop drops any signal whose sender holds a sandbox UID or is not named by the kernel
//!   (`init::run`). Nothing else opens to the sandbox: the thread keeps its permitted
//!   capabilities (its saved UID stays 0), and the kernel lets no process without them change its
//!   scheduling, limits or memory, or trace it. A hand-off to a thread of its own cost a wake-up
//!   instead: under an idle fork bomb of 2,000, the first stop came 4–466 ms after the init took
//!   the request through such a thread (median 335 ms of 7 runs), and 2.4–2.6 ms in place.
//! - Otherwise (a subreaper, or beside another PID 1), a child process. A sandbox process can kill
//!   or stop it during the instant it is switched; then the reply does not come, the helper is
//!   killed, the freeze fails (never certifies), and the next freeze starts a new helper. The
//!   init's own thread there would give the sandbox the init's process to signal as it pleases.
//!
//! The helper is started before the command runs, so a fork bomb that exhausts a pids limit
//! cannot keep it from existing at freeze time.

use crate::kernel::{
    creds, fdio, ipc, pidfd,
    process::{self, Pid},
    signal,
};
use crate::observe::procs::reader::Reader;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

/// Most UIDs one request carries (the sandbox UIDs: a handful in practice).
const MAX_UIDS: usize = 64;
/// How long a helper may take to answer one request before it is presumed hit.
const HELPER_ANSWER: Duration = Duration::from_secs(2);

pub enum Switcher {
    InPlace,
    Helper(Option<Helper>),
}

pub struct Helper {
    pid: Pid,
    handle: OwnedFd,
    sock: OwnedFd,
}

fn result_of(errno: i32, uid: u32) -> io::Result<()> {
    if errno == 0 {
        Ok(())
    } else {
        let e = io::Error::from_raw_os_error(errno);
        Err(io::Error::new(e.kind(), format!("signal as uid {uid}: {e}")))
    }
}

impl Switcher {
    /// The helper process (pid, start time) while it runs. Checked through its pidfd after its
    /// start time is read: once it has exited its pid can be handed to another process, which
    /// must not pass for the init's own.
    pub fn helper(&self, reader: &Reader) -> Option<(Pid, u64)> {
        match self {
            Switcher::Helper(Some(h)) => {
                let start = reader.start_time(h.pid).ok().flatten()?;
                (!h.exited()).then_some((h.pid, start))
            }
            _ => None,
        }
    }

    /// The calling thread as PID 1, a helper process otherwise.
    pub fn start() -> io::Result<Switcher> {
        if process::getpid() == 1 {
            Ok(Switcher::InPlace)
        } else {
            Ok(Switcher::Helper(Some(Helper::spawn()?)))
        }
    }

    /// kill(-1, sig) as each of `uids`, in turn.
    pub fn kill_all_as(&mut self, uids: &[u32], sig: i32) -> io::Result<()> {
        self.kill_all_as_repeated(uids, sig, 1)
    }

    /// kill(-1, sig) `sweeps` times back to back as each of `uids`, within one switch: no gap in
    /// which the switching context sleeps and leaves its CPU to the processes it signals.
    pub fn kill_all_as_repeated(&mut self, uids: &[u32], sig: i32, sweeps: u32) -> io::Result<()> {
        match self {
            Switcher::InPlace => {
                let r = uids.iter().try_for_each(|&u| result_of(creds::kill_all_as_uid(u, sig, sweeps), u));
                if r.is_err() {
                    still_root();
                }
                r
            }
            Switcher::Helper(slot) => {
                // One that has exited since the last freeze (killed from outside, say) is
                // replaced before it is asked: that it is gone is known, not presumed.
                let helper = match slot.take() {
                    Some(h) if !h.exited() => h,
                    gone => {
                        if let Some(h) = gone {
                            log::warn!("credential helper (pid {}) has exited: starting another", h.pid);
                        }
                        Helper::spawn().map_err(|e| {
                            io::Error::new(e.kind(), format!("cannot start a credential helper: {e}"))
                        })?
                    }
                };
                match helper.request(uids, sig, sweeps) {
                    Ok(r) => {
                        *slot = Some(helper);
                        r
                    }
                    Err(e) => {
                        helper.kill();
                        // Start the next one now, while the freeze that failed is reported, so
                        // that the next freeze need not fork.
                        *slot = Helper::spawn().ok();
                        Err(e)
                    }
                }
            }
        }
    }
}

/// After a failed switch in place: is the init's thread root again? If not, one more try, and
/// an error that says so, every time: the freeze has failed, and every signal from the sandbox
/// UID is dropped anyway (`init::run`), but the init cannot freeze or write as root until it is.
fn still_root() {
    match creds::thread_getresuid() {
        Ok((0, 0, 0)) => {}
        held => {
            let back = creds::switch_back_to_root();
            log::error!(
                "the init's thread held {held:?} after a failed switch to a sandbox UID; switched back to root: {back} \
                 (if false, no freeze can succeed: restart the container)"
            );
        }
    }
}

impl Helper {
    fn spawn() -> io::Result<Helper> {
        let (ours, theirs) = ipc::seqpacket_pair()?;
        let pid = process::fork()?;
        if pid == 0 {
            drop(ours);
            serve(theirs.as_raw_fd());
        }
        drop(theirs);
        // Our own child cannot be reaped before we look, so its pid is still its own here.
        let handle = pidfd::pidfd_open(pid)?;
        log::debug!("credential helper started as pid {pid}");
        Ok(Helper { pid, handle, sock: ours })
    }

    /// Has it exited? Its pidfd says so once it has; an error reading that counts as exited.
    fn exited(&self) -> bool {
        fdio::wait_readable(self.handle.as_raw_fd(), Duration::ZERO).unwrap_or(true)
    }

    /// Ok(answer), or Err when the helper did not answer (killed, stopped, or gone).
    fn request(&self, uids: &[u32], sig: i32, sweeps: u32) -> io::Result<io::Result<()>> {
        if uids.len() > MAX_UIDS {
            return Ok(Err(io::Error::other(format!("more than {MAX_UIDS} sandbox UIDs"))));
        }
        let mut msg = Vec::with_capacity(8 + 4 * uids.len());
        msg.extend_from_slice(&sig.to_ne_bytes());
        msg.extend_from_slice(&sweeps.to_ne_bytes());
        for u in uids {
            msg.extend_from_slice(&u.to_ne_bytes());
        }
        let gone = |what: String| {
            io::Error::other(format!(
                "credential helper (pid {}) {what}: a sandbox process may have killed or stopped it \
                 while it held a sandbox UID; a new one is started for the next freeze",
                self.pid
            ))
        };
        ipc::send_msg(self.sock.as_raw_fd(), &msg).map_err(|e| gone(format!("cannot be reached: {e}")))?;
        if !fdio::wait_readable(self.sock.as_raw_fd(), HELPER_ANSWER)? {
            return Err(gone(format!("did not answer within {HELPER_ANSWER:?}")));
        }
        let mut reply = [0u8; 8];
        let n = ipc::recv_msg(self.sock.as_raw_fd(), &mut reply).map_err(|e| gone(format!("{e}")))?;
        if n != 8 {
            return Err(gone("died".into()));
        }
        let errno = i32::from_ne_bytes([reply[0], reply[1], reply[2], reply[3]]);
        let uid = u32::from_ne_bytes([reply[4], reply[5], reply[6], reply[7]]);
        Ok(result_of(errno, uid))
    }

    fn kill(self) {
        if let Err(e) = pidfd::pidfd_send_signal(&self.handle, libc::SIGKILL) {
            if e.raw_os_error() != Some(libc::ESRCH) {
                log::error!("cannot kill the credential helper (pid {}): {e}", self.pid);
            }
        }
        // The init's reaper collects it like any other child.
    }
}

/// The helper's loop, in the forked child: syscalls on stack buffers only.
fn serve(fd: i32) -> ! {
    // It dies with the init, and of SIGTERM at shutdown like any other child, which keeps a
    // subreaper's shutdown from waiting out its grace period for it.
    if process::set_parent_death_kill().is_err() || signal::unblock_all_signals().is_err() {
        process::exit_now(1);
    }
    let mut buf = [0u8; 8 + 4 * MAX_UIDS];
    loop {
        let n = match ipc::recv_msg(fd, &mut buf) {
            Ok(n) if n >= 8 && n % 4 == 0 => n,
            _ => process::exit_now(0),
        };
        let sig = i32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]);
        let sweeps = u32::from_ne_bytes([buf[4], buf[5], buf[6], buf[7]]);
        let mut reply = [0u8; 8];
        for chunk in buf[8..n].chunks_exact(4) {
            let uid = u32::from_ne_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            let errno = creds::kill_all_as_uid(uid, sig, sweeps);
            if errno != 0 {
                reply[..4].copy_from_slice(&errno.to_ne_bytes());
                reply[4..].copy_from_slice(&uid.to_ne_bytes());
                break;
            }
        }
        if ipc::send_msg(fd, &reply).is_err() {
            process::exit_now(0);
        }
    }
}

//! Signals: their names and numbers, the calling thread's mask and dispositions, what is pending,
//! the signalfd the init waits on, and kill(2) for the one caller that signals by number (the
//! init forwarding to its own command; everything else signals through a pidfd, `kernel::pidfd`).
//! May use: libc, nix, std and kernel::{errno, fdio, process}.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::kernel::errno::check;
use crate::kernel::fdio::poll_in;
use crate::kernel::process::Pid;

/// SIGRTMIN as glibc, Docker and the shells number it, so that `RTMIN+3` means 37 here as in
/// `kill -s RTMIN+3`. musl, which this binary is built with, keeps 34 for itself as well (its
/// SIGRTMIN is 35): `first_catchable_rt` is where the signals the init can block start.
const RTMIN: i32 = 34;

/// The first real-time signal the C library leaves to the program (32 up to it are its own).
pub fn first_catchable_rt() -> i32 {
    libc::SIGRTMIN()
}

pub fn signal_name(sig: i32) -> String {
    match nix::sys::signal::Signal::try_from(sig) {
        Ok(s) => s.as_str().to_string(),
        Err(_) if sig >= RTMIN => format!("SIGRTMIN+{}", sig - RTMIN),
        Err(_) => format!("signal {sig}"),
    }
}

/// Parse "USR1", "SIGUSR1", "10" or "RTMIN+3".
pub fn parse_signal(s: &str) -> Option<i32> {
    if let Ok(n) = s.parse::<i32>() {
        return (1..=libc::SIGRTMAX()).contains(&n).then_some(n);
    }
    let up = s.to_ascii_uppercase();
    let name = up.strip_prefix("SIG").unwrap_or(&up);
    if let Some(rest) = name.strip_prefix("RTMIN") {
        let off = if rest.is_empty() { 0 } else { rest.strip_prefix('+')?.parse().ok()? };
        let n = RTMIN + off;
        return (n <= libc::SIGRTMAX()).then_some(n);
    }
    (1..=31).find(|&n| signal_name(n) == format!("SIG{name}"))
}

/// Every disposition back to SIG_DFL, 1 to 64, including those the C library keeps for itself
/// (its wrappers refuse them, so this uses the raw syscall). For a child about to exec.
pub fn reset_all_dispositions() {
    #[repr(C)]
    struct KernelSigaction {
        handler: usize,
        flags: u64,
        restorer: usize,
        mask: u64,
    }
    let act = KernelSigaction { handler: libc::SIG_DFL, flags: 0, restorer: 0, mask: 0 };
    for sig in 1..=64 {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            // SAFETY: a valid kernel sigaction for SIG_DFL; the old action is not read.
            unsafe {
                libc::syscall(libc::SYS_rt_sigaction, sig, &act as *const KernelSigaction, 0usize, 8usize);
            }
        }
    }
}

/// Block every signal in the calling thread; returns the previous mask.
pub fn block_all_signals() -> io::Result<libc::sigset_t> {
    // SAFETY: plain sigset manipulation on local storage.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        let r = libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        Ok(old)
    }
}

/// Unblock every signal in the calling thread (a forked helper that must die of SIGTERM like any
/// other process when the init shuts down).
pub fn unblock_all_signals() -> io::Result<()> {
    // SAFETY: plain sigset manipulation on local storage.
    unsafe {
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        let r = libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
    }
    Ok(())
}

/// Is `sig` pending (blocked and not yet read) for this process?
#[cfg(test)]
pub fn signal_pending(sig: i32) -> bool {
    // SAFETY: sigpending fills a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigpending(&mut set) == 0 && libc::sigismember(&set, sig) == 1
    }
}

/// Is any signal other than `except` pending (blocked and not yet read) for this process?
pub fn other_signal_pending(except: i32) -> bool {
    // SAFETY: sigpending fills a local set; sigismember only reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        if libc::sigpending(&mut set) != 0 {
            return false;
        }
        (1..=libc::SIGRTMAX()).any(|s| s != except && libc::sigismember(&set, s) == 1)
    }
}

/// A signalfd over every signal; the caller has blocked them.
pub struct SignalFd(OwnedFd);

impl SignalFd {
    pub fn new() -> io::Result<SignalFd> {
        // SAFETY: the set lives on the stack for the call only.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            let fd = check(libc::signalfd(-1, &all, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) as _)?;
            Ok(SignalFd(OwnedFd::from_raw_fd(fd as RawFd)))
        }
    }

    /// Wait until a signal is pending or the timeout passes (None = forever).
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<bool> {
        poll_in(self.0.as_raw_fd(), timeout)
    }

    /// The next pending signal with where it came from, or None when none is pending.
    pub fn read(&self) -> io::Result<Option<(i32, Origin)>> {
        // SAFETY: signalfd_siginfo is plain data; read fills at most its size.
        unsafe {
            let mut info: libc::signalfd_siginfo = std::mem::zeroed();
            let n = libc::read(
                self.0.as_raw_fd(),
                &mut info as *mut _ as *mut libc::c_void,
                std::mem::size_of::<libc::signalfd_siginfo>(),
            );
            if n < 0 {
                let e = io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::EAGAIN) => Ok(None),
                    Some(libc::EINTR) => Ok(None),
                    _ => Err(e),
                };
            }
            let origin = match info.ssi_code {
                libc::SI_USER | libc::SI_TKILL => {
                    Origin::Sent(Sender { pid: info.ssi_pid as Pid, uid: info.ssi_uid })
                }
                libc::SI_KERNEL => Origin::Kernel,
                _ => Origin::Unnamed,
            };
            Ok(Some((info.ssi_signo as i32, origin)))
        }
    }
}

/// Where a signal came from, as far as the kernel vouches for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Sent by kill, tgkill or a pidfd (SI_USER, SI_TKILL): the kernel wrote the sender.
    Sent(Sender),
    /// Sent by the kernel itself (SI_KERNEL): a terminal's hangup or its keys, a file owner's
    /// SIGIO or SIGURG.
    Kernel,
    /// Anything else, which names no sender the kernel vouches for: a queued signal (its pid and
    /// UID are whatever its sender wrote), a poll signal chosen with F_SETSIG.
    Unnamed,
}

/// Who sent a signal, as the kernel wrote it: its pid in the receiver's PID namespace (0 for a
/// sender outside it) and its real UID in the receiver's user namespace (the overflow UID,
/// 65534, for one the namespace does not map).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sender {
    pub pid: Pid,
    pub uid: u32,
}

/// Signal a process or a process group (negative) with kill(2).
/// Only the init's forwarding to its own command uses this; everything that acts on observed
/// processes goes through a pidfd (`freeze::target::Handle`).
pub fn kill(pid: Pid, sig: i32) -> io::Result<()> {
    // SAFETY: plain syscall.
    check(unsafe { libc::kill(pid, sig) } as _).map(|_| ())
}

/// kill(-1, sig): every process the caller may signal in its PID namespace, except itself.
pub fn kill_all(sig: i32) -> io::Result<()> {
    kill(-1, sig)
}

/// Take a pending (blocked) `sig` without waiting; thread-directed ones go first.
pub fn take_pending(sig: i32) -> bool {
    // SAFETY: a local signal set and timeout; sigtimedwait only dequeues.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        libc::sigtimedwait(&set, std::ptr::null_mut(), &zero) == sig
    }
}

/// Restore a signal mask `block_all_signals` returned.
pub fn set_signal_mask(mask: &libc::sigset_t) -> io::Result<()> {
    // SAFETY: a valid mask from pthread_sigmask.
    let r = unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, mask, std::ptr::null_mut()) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok(())
}

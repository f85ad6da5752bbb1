//! The one place that talks to the kernel directly. Everything above reads like the contract;
//! everything here checks the return value of the call it makes.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

pub type Pid = i32;

fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

pub fn getpid() -> Pid {
    // SAFETY: getpid cannot fail.
    unsafe { libc::getpid() }
}

pub fn signal_name(sig: i32) -> String {
    match nix::sys::signal::Signal::try_from(sig) {
        Ok(s) => s.as_str().to_string(),
        Err(_) if sig >= libc::SIGRTMIN() => format!("SIGRTMIN+{}", sig - libc::SIGRTMIN()),
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
        let n = libc::SIGRTMIN() + off;
        return (n <= libc::SIGRTMAX()).then_some(n);
    }
    (1..=31).find(|&n| signal_name(n) == format!("SIG{name}"))
}

/// Every disposition back to SIG_DFL, 1 to 64, including the two glibc keeps for itself
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

    /// The next pending signal with its sender's pid, or None when none is pending.
    pub fn read(&self) -> io::Result<Option<(i32, Pid)>> {
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
            Ok(Some((info.ssi_signo as i32, info.ssi_pid as Pid)))
        }
    }
}

fn poll_in(fd: RawFd, timeout: Option<Duration>) -> io::Result<bool> {
    let ms = match timeout {
        None => -1,
        Some(d) => d.as_millis().min(i32::MAX as u128) as i32,
    };
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINTR) {
            return Ok(false);
        }
        return Err(e);
    }
    Ok(r > 0)
}

pub enum Reaped {
    Exited(Pid, i32),
    Signaled(Pid, i32),
}

/// Reap one child without blocking. Ok(None): children exist but none has exited;
/// Err with ECHILD: no children at all.
pub fn reap_one() -> io::Result<Option<Reaped>> {
    let mut status = 0;
    // SAFETY: status is a valid out pointer.
    let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        return Ok(None);
    }
    if libc::WIFEXITED(status) {
        Ok(Some(Reaped::Exited(pid, libc::WEXITSTATUS(status))))
    } else if libc::WIFSIGNALED(status) {
        Ok(Some(Reaped::Signaled(pid, libc::WTERMSIG(status))))
    } else {
        // Stopped/continued are not reported without WUNTRACED; treat as nothing reaped.
        Ok(None)
    }
}

/// Blocking wait for one specific child, for subcommands that run a helper.
pub fn wait_child(pid: Pid) -> io::Result<i32> {
    loop {
        let mut status = 0;
        // SAFETY: status is a valid out pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        if libc::WIFEXITED(status) {
            return Ok(libc::WEXITSTATUS(status));
        }
        if libc::WIFSIGNALED(status) {
            return Ok(128 + libc::WTERMSIG(status));
        }
    }
}

/// Signal a process or a process group (negative) with kill(2).
/// Only the init's forwarding to its own command uses this; everything that acts on observed
/// processes goes through a pidfd (`procs::Handle`).
pub fn kill(pid: Pid, sig: i32) -> io::Result<()> {
    // SAFETY: plain syscall.
    check(unsafe { libc::kill(pid, sig) } as _).map(|_| ())
}

/// kill(-1, sig): every process the caller may signal in its PID namespace, except itself.
pub fn kill_all(sig: i32) -> io::Result<()> {
    kill(-1, sig)
}

pub fn pidfd_open(pid: Pid) -> io::Result<OwnedFd> {
    // SAFETY: raw syscall returning a new fd we own.
    let fd = check(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: the kernel just gave us this descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

pub fn pidfd_send_signal(fd: &OwnedFd, sig: i32) -> io::Result<()> {
    // SAFETY: raw syscall on a pidfd we own.
    check(unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    })
    .map(|_| ())
}

/// setresuid for the calling thread only (the raw syscall, not glibc's all-threads wrapper).
pub fn thread_setresuid(r: u32, e: u32, s: u32) -> io::Result<()> {
    // SAFETY: raw syscall; it changes only this thread's credentials.
    check(unsafe { libc::syscall(libc::SYS_setresuid, r, e, s) }).map(|_| ())
}

pub fn thread_getresuid() -> io::Result<(u32, u32, u32)> {
    let (mut r, mut e, mut s) = (0u32, 0u32, 0u32);
    // SAFETY: three valid out pointers.
    check(unsafe { libc::syscall(libc::SYS_getresuid, &mut r, &mut e, &mut s) })?;
    Ok((r, e, s))
}

type CredJob = (Vec<u32>, i32, std::sync::mpsc::Sender<io::Result<()>>);

/// A thread of the init kept for one job: switch *its own* credentials to a sandbox UID (saved
/// UID kept 0), send a signal to every process that UID may signal, switch back and prove it is
/// root again. The process's own credentials never change. It is started before the command
/// runs, so a fork bomb that exhausts a pids limit cannot keep it from existing at freeze time.
pub struct CredThread {
    jobs: std::sync::mpsc::Sender<CredJob>,
}

impl CredThread {
    pub fn start() -> io::Result<CredThread> {
        let (tx, rx) = std::sync::mpsc::channel::<CredJob>();
        std::thread::Builder::new().name("quiesce-cred".into()).stack_size(64 * 1024).spawn(move || {
            for (uids, sig, reply) in rx {
                let _ = reply.send(kill_all_as_here(&uids, sig));
            }
        })?;
        Ok(CredThread { jobs: tx })
    }

    pub fn kill_all_as(&self, uids: &[u32], sig: i32) -> io::Result<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.jobs
            .send((uids.to_vec(), sig, tx))
            .map_err(|_| io::Error::other("credential thread is gone"))?;
        rx.recv().map_err(|_| io::Error::other("credential thread is gone"))?
    }
}

fn kill_all_as_here(uids: &[u32], sig: i32) -> io::Result<()> {
    for &uid in uids {
        thread_setresuid(uid, uid, 0)
            .map_err(|e| io::Error::new(e.kind(), format!("switch thread to uid {uid}: {e}")))?;
        let sent = kill_all(sig);
        thread_setresuid(0, 0, 0)?;
        if thread_getresuid()? != (0, 0, 0) {
            return Err(io::Error::other("credential switch back to root did not take"));
        }
        match sent {
            Ok(()) => {}
            // ESRCH: no process of that UID is left.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

pub fn set_child_subreaper() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    check(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } as _).map(|_| ())
}

pub fn set_not_dumpable() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    check(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } as _).map(|_| ())
}

pub fn isatty(fd: RawFd) -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(fd) == 1 }
}

pub fn getrandom(buf: &mut [u8]) -> io::Result<()> {
    getrandom::getrandom(buf).map_err(|e| io::Error::other(format!("getrandom: {e}")))
}

/// Inode of a namespace link such as /proc/1/ns/pid: the namespace's identity.
pub fn ns_inode(path: &str) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::metadata(path)?.ino())
}

/// Is `path` a mounted procfs?
pub fn is_procfs(path: &str) -> io::Result<bool> {
    let c = CString::new(path).map_err(|_| io::Error::other("path with NUL"))?;
    // SAFETY: valid C string and out struct.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        check(libc::statfs(c.as_ptr(), &mut st) as _)?;
        Ok(st.f_type == libc::PROC_SUPER_MAGIC)
    }
}

/// Exit now without running destructors (used in a forked child).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns.
    unsafe { libc::_exit(code) }
}

fn setfsuid(id: u32) -> u32 {
    // SAFETY: raw syscall with an integer; it changes only this thread's credentials.
    unsafe { libc::syscall(libc::SYS_setfsuid, id) as u32 }
}

fn setfsgid(id: u32) -> u32 {
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_setfsgid, id) as u32 }
}

/// This thread's filesystem UID and GID: setfs*id with an invalid id changes nothing and
/// returns the current one.
fn fs_ids() -> (u32, u32) {
    (setfsuid(u32::MAX), setfsgid(u32::MAX))
}

/// Run `f` with this thread's filesystem UID and GID switched to `uid` and `gid`, then switch
/// back and prove it. Only file access checks change: real, effective and saved IDs (signals,
/// process limits) stay. Ok(None): the switch did not take (no CAP_SETUID/CAP_SETGID), `f` did
/// not run. Err: the switch back did not take, and this thread must do nothing more.
pub fn as_fs_user<T>(uid: u32, gid: u32, f: impl FnOnce() -> T) -> io::Result<Option<T>> {
    let before = fs_ids();
    setfsgid(gid);
    setfsuid(uid);
    let out = (fs_ids() == (uid, gid)).then(f);
    setfsuid(before.0);
    setfsgid(before.1);
    let now = fs_ids();
    if now != before {
        return Err(io::Error::other(format!("filesystem ids {now:?} after switching back to {before:?}")));
    }
    Ok(out)
}

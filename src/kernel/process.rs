//! This process and the processes it starts: its ids, fork and the shared-memory spawn, its own
//! session (setsid), exit, the
//! prctl flags it holds (dumpable, subreaper, parent-death signal, no_new_privs, its name), its
//! process-count limit, the CPUs it may run on and the boot clock a process's start time is counted in.
//! May use: libc, std and kernel::errno.

use std::io;

use crate::kernel::errno::check;

pub type Pid = i32;

pub fn getpid() -> Pid {
    // SAFETY: getpid cannot fail.
    unsafe { libc::getpid() }
}

pub fn getpgrp() -> Pid {
    // SAFETY: getpgrp cannot fail.
    unsafe { libc::getpgrp() }
}

/// The calling thread's id.
pub fn gettid() -> Pid {
    // SAFETY: gettid cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as Pid }
}

/// fork(2). The child must make only syscalls on memory prepared before the fork: other threads
/// may hold locks (the allocator's) that nobody releases in the child.
pub fn fork() -> io::Result<Pid> {
    // SAFETY: see above; callers keep to it.
    check(unsafe { libc::fork() } as _).map(|p| p as Pid)
}

/// Die with SIGKILL when the parent dies.
pub fn set_parent_death_kill() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    check(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) } as _).map(|_| ())
}

pub fn set_child_subreaper() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    check(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } as _).map(|_| ())
}

/// The host's fs.suid_dumpable (None: unreadable).
pub fn suid_dumpable() -> Option<u8> {
    std::fs::read_to_string("/proc/sys/fs/suid_dumpable").ok()?.trim().parse().ok()
}

/// Whether this process runs with no_new_privs: set, it is inherited by every child and by every
/// process an engine enters into the container, and no setuid binary raises anyone's privilege.
pub fn no_new_privs() -> io::Result<bool> {
    // SAFETY: prctl with integer arguments.
    check(unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) } as _).map(|v| v == 1)
}

pub fn getppid() -> Pid {
    // SAFETY: getppid cannot fail.
    unsafe { libc::getppid() }
}

/// RLIMIT_NPROC, soft and hard, set to `n`: once this process runs as another user, neither it
/// nor anything it starts may fork while that user's real UID has `n` processes.
pub fn set_nproc_limit(n: u64) -> io::Result<()> {
    let r = libc::rlimit { rlim_cur: n as libc::rlim_t, rlim_max: n as libc::rlim_t };
    // SAFETY: a valid rlimit struct, read by the kernel.
    check(unsafe { libc::setrlimit(libc::RLIMIT_NPROC, &r) } as _).map(|_| ())
}

/// Make this process, and what it starts, the OOM killer's first choice (oom_score_adj 1000):
/// raising it needs no privilege, and only CAP_SYS_RESOURCE may lower it below where it was.
pub fn oom_first() -> io::Result<()> {
    std::fs::write("/proc/self/oom_score_adj", "1000")
}

/// Run this thread, and every process it starts, at the idle CPU policy (SCHED_IDLE), with no
/// way back for them: RLIMIT_NICE goes to 0 (soft and hard) first, and then the kernel lets a
/// thread leave SCHED_IDLE only with CAP_SYS_NICE (`can_nice`: its nice value must be within
/// what RLIMIT_NICE allows, and 0 allows none). Lowering needs no privilege. Err names the step.
pub fn idle_for_good() -> Result<(), String> {
    let none = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: a valid rlimit struct, read by the kernel.
    check(unsafe { libc::setrlimit(libc::RLIMIT_NICE, &none) } as _)
        .map_err(|e| format!("RLIMIT_NICE 0: {e}"))?;
    // SAFETY: sched_param is plain integers (musl adds fields of its own); all zero is priority 0.
    let param: libc::sched_param = unsafe { std::mem::zeroed() };
    // The system call itself: musl's sched_setscheduler is a stub that fails with ENOSYS (POSIX
    // means the process, Linux changes one thread).
    // SAFETY: pid 0 is this thread; a valid sched_param, read by the kernel.
    check(unsafe { libc::syscall(libc::SYS_sched_setscheduler, 0, libc::SCHED_IDLE, &param) } as _)
        .map(|_| ())
        .map_err(|e| format!("SCHED_IDLE: {e}"))
}

/// Name this process (its comm, 15 bytes at most, as ps shows it).
pub fn set_name(name: &str) -> io::Result<()> {
    let mut buf = [0u8; 16];
    let n = name.len().min(15);
    buf[..n].copy_from_slice(&name.as_bytes()[..n]);
    // SAFETY: prctl reads a NUL-terminated name of at most 16 bytes from the local buffer.
    check(unsafe { libc::prctl(libc::PR_SET_NAME, buf.as_ptr(), 0, 0, 0) } as _).map(|_| ())
}

pub fn set_not_dumpable() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    check(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } as _).map(|_| ())
}

/// Stack for a `spawn_shared` child: its steps are a few syscalls on prepared data.
const SHARED_CHILD_STACK: usize = 32 * 1024;

/// Start a child that shares this process's memory until it execs or exits, and wait for that
/// (clone with CLONE_VM|CLONE_VFORK, as posix_spawn does): unlike fork, nothing is copied, so the
/// start costs no page-table copy and no copy-on-write faults afterwards. The calling thread is
/// suspended meanwhile; other threads run on. `child` runs in the new process on a stack of its
/// own and must keep to syscalls on data prepared before the call: no allocation, no locks (the
/// heap and every lock are the parent's, possibly held by another thread). What it writes to
/// captured variables is visible here once this returns. Its return value is its exit status.
/// Call it from the main thread: the child's stack is a buffer in this frame.
pub fn spawn_shared<F: FnMut() -> i32>(child: &mut F) -> io::Result<Pid> {
    extern "C" fn trampoline<F: FnMut() -> i32>(arg: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `arg` is the `&mut F` passed to clone below, alive until clone returns, and
        // this process is the only one running it meanwhile (the parent thread is suspended).
        let child = unsafe { &mut *(arg as *mut F) };
        exit_now(child())
    }
    // Every signal blocked across the clone, by the kernel call: the C library's full set leaves
    // out the signals it keeps for itself, and no handler of the parent may run on the child's
    // stack in the parent's memory. The child sets its own mask before it execs.
    let all: u64 = !0;
    let mut old: u64 = 0;
    // SAFETY: rt_sigprocmask with valid 8-byte sets.
    check(unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &all as *const u64,
            &mut old as *mut u64,
            8usize,
        )
    })?;
    // No allocation and no zeroing: the child writes what it uses.
    let mut stack = std::mem::MaybeUninit::<[u8; SHARED_CHILD_STACK]>::uninit();
    // SAFETY: the buffer is this frame's and unused by the suspended parent; it outlives the
    // child's use of it (the parent resumes only once the child has exec'd or exited). The top
    // is aligned down to 16 bytes for the ABI.
    let pid = unsafe {
        let top = (stack.as_mut_ptr() as *mut u8).add(SHARED_CHILD_STACK);
        let top = top.sub(top as usize % 16);
        libc::clone(
            trampoline::<F>,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            child as *mut F as *mut libc::c_void,
        )
    };
    let cloned = check(pid as _).map(|p| p as Pid);
    // SAFETY: as above; restores the caller's mask.
    check(unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &old as *const u64,
            std::ptr::null_mut::<u64>(),
            8usize,
        )
    })?;
    cloned
}

/// Make this process the leader of a new session and process group, with no terminal.
pub fn setsid() -> io::Result<()> {
    // SAFETY: setsid takes no arguments.
    check(unsafe { libc::setsid() } as libc::c_long)?;
    Ok(())
}

/// Exit now without running destructors (used in a forked child).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns.
    unsafe { libc::_exit(code) }
}

/// CPUs this process may run on (1 when that cannot be told).
pub fn cpus() -> usize {
    // SAFETY: a local CPU set filled by the kernel, then only counted.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return 1;
        }
        (libc::CPU_COUNT(&set) as usize).max(1)
    }
}

/// Clock ticks since boot, as /proc/PID/stat counts a process's start time (field 22).
pub fn boot_ticks() -> io::Result<u64> {
    // SAFETY: a local timespec filled by the kernel; sysconf reads a constant.
    let (ts, hz) = unsafe {
        let mut ts: libc::timespec = std::mem::zeroed();
        check(libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) as _)?;
        (ts, libc::sysconf(libc::_SC_CLK_TCK))
    };
    if hz <= 0 {
        return Err(io::Error::other("sysconf(_SC_CLK_TCK) failed"));
    }
    let hz = hz as u64;
    Ok(ts.tv_sec as u64 * hz + ts.tv_nsec as u64 * hz / 1_000_000_000)
}

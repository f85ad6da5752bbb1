//! Process descriptors: a pidfd names one kernel pid object, which a reused number can never
//! alias, so every signal to an observed process goes through one. Open (a process or any task),
//! signal (the process or its group), ask whether it still holds its pid, and its pidfs identity.
//! May use: libc, std and kernel::{errno, process, stat}.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::kernel::errno::check;
use crate::kernel::process::Pid;
use crate::kernel::stat::fstat;

/// A pidfd of the process `pid` (a thread-group leader; `pidfd_open_task` takes any thread).
pub fn pidfd_open(pid: Pid) -> io::Result<OwnedFd> {
    pidfd_open_flags(pid, 0)
}

/// Signal the whole process group led by the pidfd's process (PIDFD_SIGNAL_PROCESS_GROUP,
/// Linux 6.9): the group is named by the leader's kernel pid object, which a reused number can
/// never alias. EINVAL on older kernels.
pub fn pidfd_send_signal_group(fd: &OwnedFd, sig: i32) -> io::Result<()> {
    const PIDFD_SIGNAL_PROCESS_GROUP: u32 = 1 << 2;
    send_signal(fd, sig, PIDFD_SIGNAL_PROCESS_GROUP)
}

/// Signal the pidfd's process (all its threads), and no other: its group is left alone.
pub fn pidfd_send_signal(fd: &OwnedFd, sig: i32) -> io::Result<()> {
    send_signal(fd, sig, 0)
}

/// pidfd_send_signal(2) with `flags`, no siginfo: the two wrappers above are its only callers.
fn send_signal(fd: &OwnedFd, sig: i32, flags: u32) -> io::Result<()> {
    // SAFETY: raw syscall on a pidfd we own.
    check(unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            flags,
        )
    })
    .map(|_| ())
}

/// PIDFD_THREAD (Linux 6.9): the pidfd may name any thread, not only a thread-group leader.
const PIDFD_THREAD: libc::c_long = libc::O_EXCL as libc::c_long;

fn pidfd_open_flags(pid: Pid, flags: libc::c_long) -> io::Result<OwnedFd> {
    // SAFETY: raw syscall returning a new fd we own.
    let fd = check(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, flags) })?;
    // SAFETY: the kernel just gave us this descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// A pidfd of the task with id `tid`, a thread or a thread-group leader (only a leader before
/// Linux 6.9).
pub fn pidfd_open_task(tid: Pid) -> io::Result<OwnedFd> {
    match pidfd_open_flags(tid, PIDFD_THREAD) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => pidfd_open_flags(tid, 0),
        r => r,
    }
}

/// Does the pidfd's task still hold its pid: alive, or a zombie nobody has reaped? Signal 0
/// checks without sending; the kernel answers ESRCH once the task is released. Any other answer
/// is not a yes.
pub fn pidfd_attached(fd: &OwnedFd) -> bool {
    pidfd_send_signal(fd, 0).is_ok()
}

/// The pidfs inode number of a pidfd (Linux 6.9): one per kernel pid object, never given to
/// another while the system runs, and on 64-bit kernels given out in increasing order, so it
/// orders any two processes by creation. None where pidfds are anonymous inodes (older kernels).
pub fn pidfd_inode(fd: &OwnedFd) -> io::Result<Option<u64>> {
    const PID_FS_MAGIC: u64 = 0x5049_4446;
    // SAFETY: a local statfs filled by the kernel for a descriptor we own.
    let kind = unsafe {
        let mut s: libc::statfs = std::mem::zeroed();
        check(libc::fstatfs(fd.as_raw_fd(), &mut s) as _)?;
        s.f_type as u64
    };
    if kind != PID_FS_MAGIC {
        return Ok(None);
    }
    fstat(fd).map(|st| Some(st.st_ino))
}

//! Credentials: the effective user and groups of this process, and the calling thread's own
//! switches (setresuid for the kill(-1) as each sandbox UID, setfs*id for reads as another user),
//! each switched back and proven before anything else runs on the thread.
//! May use: libc, std and kernel::{errno, process}.

use std::io;

use crate::kernel::errno::{check, errno_now};
use crate::kernel::process::set_not_dumpable;

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

/// One switch: this thread's real and effective UID become `uid` (saved UID stays 0), it sends
/// `sig` with kill(-1) `sweeps` times (at least once) — reaching exactly the processes that UID
/// may signal — switches back and proves it is root again. Only syscalls and no allocation: it
/// also runs in a forked child. Returns 0 or an errno; ESRCH (nothing of that UID is left)
/// counts as success.
pub fn kill_all_as_uid(uid: u32, sig: i32, sweeps: u32) -> i32 {
    if thread_setresuid(uid, uid, 0).is_err() {
        return errno_now();
    }
    // Each switch resets the dumpable flag of the whole process's memory (the signing key's) to
    // the host's fs.suid_dumpable: set it back at once, while this thread holds the sandbox UID.
    // A failure here sends nothing, but the switch back below still runs and is still checked.
    let mut sent_err = match set_not_dumpable() {
        Ok(()) => 0,
        Err(e) => e.raw_os_error().unwrap_or(libc::EPERM),
    };
    for _ in 0..if sent_err == 0 { sweeps.max(1) } else { 0 } {
        // SAFETY: plain syscall.
        if unsafe { libc::kill(-1, sig) } < 0 {
            sent_err = errno_now();
            break;
        }
    }
    // The way back is always allowed (the saved UID is 0); only the kernel's allocation of the
    // new credentials can fail it, so it is tried again a few times before it is reported.
    if !switch_back_to_root() {
        return errno_now();
    }
    if let Err(e) = set_not_dumpable() {
        return e.raw_os_error().unwrap_or(libc::EPERM);
    }
    match thread_getresuid() {
        Ok((0, 0, 0)) => {}
        // EPERM: "not root again" is the closest errno; the caller fails the freeze.
        _ => return libc::EPERM,
    }
    if sent_err == libc::ESRCH {
        0
    } else {
        sent_err
    }
}

/// setresuid(0, 0, 0) for this thread, tried up to 3 times; true once it took.
pub fn switch_back_to_root() -> bool {
    (0..3).any(|_| thread_setresuid(0, 0, 0).is_ok())
}

/// Is `gid` this process's effective group or one of its supplementary groups?
pub fn in_group(gid: u32) -> bool {
    // SAFETY: getegid cannot fail; getgroups fills at most the buffer it is given.
    unsafe {
        if libc::getegid() == gid {
            return true;
        }
        let mut groups = [0 as libc::gid_t; 256];
        let n = libc::getgroups(groups.len() as i32, groups.as_mut_ptr());
        n > 0 && groups[..n as usize].contains(&gid)
    }
}

pub fn geteuid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
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

/// Make the calling thread `uid`:`gid` for good, with no supplementary groups, keeping in its
/// effective set only those of `keep` it is permitted: a thread that answers "could this user
/// write there?" with access(2) (which checks the real IDs and, for a UID that is not root, no
/// capability at all) while it still lists directories the user could not. Raw syscalls: only
/// this thread changes, and it must end once done.
pub fn thread_become(uid: u32, gid: u32, keep: &[caps::Capability]) -> io::Result<()> {
    let permitted = caps::read(None, caps::CapSet::Permitted).map_err(|e| io::Error::other(e.to_string()))?;
    // SAFETY (whole block): raw syscalls with integer arguments and a NULL list.
    unsafe {
        check(libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()))?;
        check(libc::syscall(libc::SYS_setresgid, gid, gid, gid))?;
        check(libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) as _)?;
        check(libc::syscall(libc::SYS_setresuid, uid, uid, uid))?;
    }
    set_not_dumpable()?;
    let effective: caps::CapsHashSet = keep.iter().copied().filter(|c| permitted.contains(c)).collect();
    caps::set(None, caps::CapSet::Effective, &effective).map_err(|e| io::Error::other(e.to_string()))?;
    match thread_getresuid()? {
        (r, e, s) if r == uid && e == uid && s == uid => Ok(()),
        ids => Err(io::Error::other(format!("thread UIDs {ids:?} after becoming {uid}"))),
    }
}

/// Whether this thread's real user may access the file `fd` is open on (O_PATH will do) as
/// `mode` asks (W_OK, R_OK): faccessat2 on the descriptor itself, so the answer is the inode's
/// own (its mode bits and ACL), whatever the paths that lead to it, and for a UID that is not
/// root no capability counts. Err: the kernel has no faccessat2 (before 5.8).
pub fn may_access_fd(fd: &std::os::fd::OwnedFd, mode: i32) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: an empty path on a descriptor this process holds.
    let r = unsafe {
        libc::syscall(libc::SYS_faccessat2, fd.as_raw_fd(), c"".as_ptr(), mode, libc::AT_EMPTY_PATH)
    };
    if r == 0 {
        return Ok(true);
    }
    match errno_now() {
        libc::EACCES | libc::EROFS | libc::ETXTBSY | libc::EPERM => Ok(false),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

/// In a child process that does nothing else after: become real and saved UID `outsider`,
/// effective UID `uid` (for good: no switch back; asking again for the same IDs is allowed
/// without privilege), then kill(-1) with `sig` `sweeps` times,
/// `gap` apart. kill(-1) reaches a process whose real or saved UID is the sender's real or
/// effective one: every process of `uid`, none of root's, and none of `outsider`'s if it has
/// none. And no process of `uid` may signal this one, which is neither its real nor its saved
/// UID: the processes being killed cannot stop their killer. Only syscalls. Returns 0 or the
/// errno of the switch or of the first failed kill (ESRCH, nothing to reach, is no failure).
pub fn kill_sweeps_from(outsider: u32, uid: u32, sig: i32, sweeps: u32, gap: std::time::Duration) -> i32 {
    // SAFETY: raw syscall with integer arguments; this thread is the process's only one.
    if unsafe { libc::syscall(libc::SYS_setresuid, outsider, uid, outsider) } != 0 {
        return errno_now();
    }
    let pause = libc::timespec { tv_sec: 0, tv_nsec: gap.subsec_nanos() as libc::c_long };
    for _ in 0..sweeps.max(1) {
        // SAFETY: plain syscalls; nanosleep reads a local timespec.
        unsafe {
            if libc::kill(-1, sig) < 0 && errno_now() != libc::ESRCH {
                return errno_now();
            }
            libc::nanosleep(&pause, std::ptr::null_mut());
        }
    }
    0
}

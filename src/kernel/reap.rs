//! Reaping children with waitpid(2): any exited child for the init's loop, one given child with
//! or without waiting for it.
//! May use: libc, std and kernel::process.

use std::io;

use crate::kernel::process::Pid;

/// How a child reaped by `reap_one` ended, with its pid: the init's loop tells the command's
/// exit code from its signal, and any other child by its pid.
pub enum Reaped {
    Exited(Pid, i32),
    Signaled(Pid, i32),
}

/// Reap one child without blocking. Ok(None): children exist but none has exited;
/// Err with ECHILD: no children at all. Any child, for the init's loop; `try_reap` and
/// `wait_child` take one child by its pid and answer with its exit code alone.
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

/// Blocking wait for one specific child, for subcommands that run a helper: its exit code
/// (128 + signal). Unlike `try_reap`, it waits, through EINTR, until the child has ended.
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

/// Reap the child `pid` if it has exited, without waiting: its exit code (128 + signal). For the
/// init's loop, which must never block on one child; `wait_child` waits.
pub fn try_reap(pid: Pid) -> io::Result<Option<i32>> {
    let mut status = 0;
    // SAFETY: status is a valid out pointer.
    let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    if r == 0 {
        return Ok(None);
    }
    if libc::WIFSIGNALED(status) {
        return Ok(Some(128 + libc::WTERMSIG(status)));
    }
    Ok(Some(libc::WEXITSTATUS(status)))
}

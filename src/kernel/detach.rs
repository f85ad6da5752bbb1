//! Starting a process that outlives the one that starts it: fork; the child calls setsid and
//! forks again, then exits; the grandchild (in a session of its own but not its leader, so no
//! terminal can become its controlling one) takes its standard descriptors and the ones it keeps
//! at 3, 4, ..., closes every other, moves to / and execs. Its parent gone, it belongs to the
//! nearest subreaper or to PID 1 of its namespace. Between the fork and the exec only
//! async-signal-safe calls run, on data prepared before the fork.
//! May use: libc, std and kernel::{errno, process}.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use crate::kernel::process::{self, Pid};

/// The intermediate child's exit codes, for its starter to name what failed.
pub const SETSID_FAILED: i32 = 3;
pub const FORK_FAILED: i32 = 4;

/// Lowest number the grandchild moves its descriptors to before it puts them in place: no
/// descriptor it keeps can be overwritten by another's move.
const SPARE_FDS: libc::c_int = 64;

/// Descriptors the grandchild puts in place at most (0, 1, 2 and those kept): its moves use a
/// fixed array, as nothing may be allocated after the fork.
const MAX_FDS: usize = 8;

/// Everything the grandchild needs, made before the fork.
pub struct Detach {
    exe: CString,
    /// Owns the strings `argv_ptrs` and `env_ptrs` point into.
    #[allow(dead_code)]
    strings: Vec<CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    env_ptrs: Vec<*const libc::c_char>,
    /// 0, 1 and 2, then the descriptors kept at 3, 4, ... in order.
    fds: Vec<OwnedFd>,
    /// Written to the descriptor at `report_at` when the exec fails.
    exec_failed: Vec<u8>,
    report_at: libc::c_int,
    /// One past the highest descriptor this process may hold (its RLIMIT_NOFILE, capped): where
    /// close_range is missing, the grandchild closes each one below it.
    fd_limit: libc::c_int,
}

/// The highest descriptor count the fallback closes one by one.
const MAX_CLOSE: libc::rlim_t = 1 << 20;

fn cstring(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::other("an argument or variable holds a NUL byte"))
}

impl Detach {
    /// `exe` run with `argv` and this process's environment; `stdin`, `out` (stdout and stderr)
    /// and `keep` (at 3, 4, ...) its descriptors. `report`: the index in `keep` of a descriptor
    /// that is told `exec_failed` when the exec fails.
    pub fn new(
        exe: &str,
        argv: &[String],
        stdin: OwnedFd,
        out: OwnedFd,
        keep: Vec<OwnedFd>,
        report: usize,
        exec_failed: &str,
    ) -> io::Result<Detach> {
        let err = out.try_clone()?;
        let mut strings = Vec::new();
        for a in argv {
            strings.push(cstring(a.as_bytes())?);
        }
        let nargs = strings.len();
        for (k, v) in std::env::vars_os() {
            strings.push(cstring(&[k.as_bytes(), b"=", v.as_bytes()].concat())?);
        }
        let ptrs = |s: &[CString]| {
            s.iter().map(|c| c.as_ptr()).chain(std::iter::once(std::ptr::null())).collect::<Vec<_>>()
        };
        let (argv_ptrs, env_ptrs) = (ptrs(&strings[..nargs]), ptrs(&strings[nargs..]));
        let mut fds = vec![stdin, out, err];
        fds.extend(keep);
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: a valid pointer to a struct getrlimit fills.
        crate::kernel::errno::check(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } as _)?;
        let fd_limit = lim.rlim_cur.min(MAX_CLOSE) as libc::c_int;
        if fds.len() > MAX_FDS {
            return Err(io::Error::other(format!("at most {} descriptors are kept", MAX_FDS - 3)));
        }
        Ok(Detach {
            exe: cstring(exe.as_bytes())?,
            argv_ptrs,
            env_ptrs,
            strings,
            fds,
            exec_failed: exec_failed.as_bytes().to_vec(),
            report_at: 3 + report as libc::c_int,
            fd_limit,
        })
    }

    /// Start it; returns the intermediate child's pid, which the caller reaps (it exits at once).
    pub fn spawn(&self) -> io::Result<Pid> {
        let child = process::fork()?;
        if child > 0 {
            return Ok(child);
        }
        // SAFETY: setsid and fork take no pointer; _exit never returns.
        unsafe {
            if libc::setsid() < 0 {
                libc::_exit(SETSID_FAILED);
            }
            match libc::fork() {
                0 => self.grandchild(),
                n if n < 0 => libc::_exit(FORK_FAILED),
                _ => libc::_exit(0),
            }
        }
    }

    /// The grandchild: its descriptors in place, every other closed, at /, then the exec.
    fn grandchild(&self) -> ! {
        // SAFETY: async-signal-safe calls on descriptors and data made before the fork.
        unsafe {
            let mut spare = [0 as libc::c_int; MAX_FDS];
            let n = self.fds.len().min(spare.len());
            for (s, fd) in spare.iter_mut().zip(&self.fds) {
                *s = libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD, SPARE_FDS);
                if *s < 0 {
                    libc::_exit(127);
                }
            }
            for (to, &from) in spare[..n].iter().enumerate() {
                if libc::dup2(from, to as libc::c_int) < 0 {
                    libc::_exit(127);
                }
            }
            // A descriptor left open would keep the exec's pipes alive, and the exec would not end.
            if libc::syscall(libc::SYS_close_range, n as u32, u32::MAX, 0u32) != 0 {
                // Kernels before 5.9: one close per descriptor this process may hold (most are
                // not open, and say EBADF, which is the point).
                for fd in n as libc::c_int..self.fd_limit {
                    libc::close(fd);
                }
            }
            if libc::chdir(c"/".as_ptr()) == 0 {
                libc::execve(self.exe.as_ptr(), self.argv_ptrs.as_ptr(), self.env_ptrs.as_ptr());
            }
            let m = &self.exec_failed;
            // Best effort, the last act: a start that hears nothing says the sidecar ended.
            libc::write(self.report_at, m.as_ptr() as *const libc::c_void, m.len());
            libc::_exit(127)
        }
    }
}

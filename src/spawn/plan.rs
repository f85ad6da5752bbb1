//! Starting a command: PATH lookup, a clean signal state, an optional drop to a sandbox user
//! (tagged so that its whole lineage stays recognisable), and exec.

use crate::kernel::users::User;
use crate::kernel::{
    fdio,
    process::{self, Pid},
    reap, signal,
};
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;

/// Processes a handed-over service's user may have at once: a service forks workers, never a bomb.
pub const SERVICE_NPROC: u64 = 256;

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Who the command runs as, and whether setuid binaries may raise its privilege.
#[derive(Debug, Clone)]
pub struct Drop {
    pub user: User,
    pub groups: Vec<u32>,
    pub allow_setuid: bool,
    /// What to write to /proc/self/loginuid first (the audit-session lineage tag).
    pub tag: Tag,
}

/// The lineage tag a command is started with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tag {
    None,
    /// The user's UID where the kernel takes it: a sandbox user's command is the sandbox's by its
    /// UID as well, and history follows it where the tag cannot be written.
    UserUid,
    /// This value, or the command does not run: in a sandbox of lineage alone, an untagged
    /// command would be no sandbox process at all.
    Required(u32),
}

/// Everything prepared before the child starts, so that it only makes syscalls.
pub struct Plan {
    name: String,
    candidates: Vec<CString>,
    /// Owns the strings that `argv_ptrs` points into.
    #[allow(dead_code)]
    argv: Vec<CString>,
    /// NULL-terminated pointers into `argv`, made beforehand: the child must not allocate.
    argv_ptrs: Vec<*const libc::c_char>,
    /// The lineage tag's text, made beforehand for the same reason.
    tag_text: String,
    drop: Option<Drop>,
    own_pgroup: bool,
    take_tty: bool,
    /// A session of its own (a service handed over: no terminal, no group of the caller's), at
    /// most `SERVICE_NPROC` processes of its user.
    own_session: bool,
    /// The OOM killer's first choice (oom_score_adj 1000): a sandbox's command or a service, so
    /// that at a memory limit they go before the init.
    oom_first: bool,
    /// The errno of a refused oom_score_adj (0: taken), written by a child sharing this memory:
    /// an init without privilege (not root, or not dumpable to itself) is still started, and
    /// says so, as `quiesce exec` does.
    oom_refused: std::sync::atomic::AtomicI32,
    /// The directory to start in, entered after the drop (so as the user it runs as).
    cwd: Option<CString>,
    /// Descriptors for its stdin and its stdout and stderr (a service: never the caller's own,
    /// which a service could read the tests' input from or write their results to).
    stdio: Option<(i32, i32)>,
    /// The environment, NULL-terminated pointers into `env`; None: this process's own.
    #[allow(dead_code)]
    env: Vec<CString>,
    env_ptrs: Option<Vec<*const libc::c_char>>,
    /// A Landlock ruleset to enforce on itself last before the exec (a service handed over):
    /// the descriptor, open in the caller until the start.
    landlock: Option<i32>,
    /// A seccomp program installed right after (the caller keeps its filter alive).
    seccomp: Option<libc::sock_fprog>,
}

impl Plan {
    pub fn new(cmd: &[String], drop: Option<Drop>) -> io::Result<Plan> {
        let name = cmd.first().ok_or_else(|| io::Error::other("no command given: add one after --"))?.clone();
        let cstr = |s: &[u8]| {
            CString::new(s).map_err(|_| io::Error::other(format!("argument of '{name}' contains a NUL byte")))
        };
        let argv = cmd.iter().map(|a| cstr(a.as_bytes())).collect::<io::Result<Vec<_>>>()?;
        let candidates = if name.contains('/') {
            vec![cstr(name.as_bytes())?]
        } else {
            let path = std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into());
            path.as_bytes()
                .split(|&b| b == b':')
                .map(|d| if d.is_empty() { &b"."[..] } else { d })
                .map(|d| cstr(&[d, b"/", name.as_bytes()].concat()))
                .collect::<io::Result<Vec<_>>>()?
        };
        let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
        argv_ptrs.push(std::ptr::null());
        let tag_text = match drop.as_ref().map(|d| (d.tag, d.user.uid)) {
            Some((Tag::Required(t), _)) => t.to_string(),
            Some((Tag::UserUid, uid)) => uid.to_string(),
            _ => String::new(),
        };
        Ok(Plan {
            name,
            candidates,
            argv,
            argv_ptrs,
            tag_text,
            drop,
            own_pgroup: false,
            take_tty: false,
            own_session: false,
            oom_first: false,
            oom_refused: std::sync::atomic::AtomicI32::new(0),
            cwd: None,
            stdio: None,
            env: Vec::new(),
            env_ptrs: None,
            landlock: None,
            seccomp: None,
        })
    }

    /// Run `exe` itself, not the first argument looked up on PATH (argv[0] stays as given), in
    /// `cwd`, with exactly `env`, in a session of its own: a service started again as recorded.
    /// Its stdin and output go to `stdin` and `out` (open until the start), and no other
    /// descriptor of the caller's reaches it.
    pub fn recorded(
        mut self,
        exe: &str,
        cwd: &str,
        env: &[String],
        stdin: &std::os::fd::OwnedFd,
        out: &std::os::fd::OwnedFd,
    ) -> io::Result<Plan> {
        use std::os::fd::AsRawFd;
        self.stdio = Some((stdin.as_raw_fd(), out.as_raw_fd()));
        let cstr = |s: &str| {
            CString::new(s)
                .map_err(|_| io::Error::other(format!("'{}' contains a NUL byte", s.escape_debug())))
        };
        self.candidates = vec![cstr(exe)?];
        self.cwd = Some(cstr(cwd)?);
        self.env = env.iter().map(|e| cstr(e)).collect::<io::Result<Vec<_>>>()?;
        let mut ptrs: Vec<*const libc::c_char> = self.env.iter().map(|e| e.as_ptr()).collect();
        ptrs.push(std::ptr::null());
        self.env_ptrs = Some(ptrs);
        self.own_session = true;
        self.oom_first = true;
        Ok(self)
    }

    /// Enforce the Landlock ruleset `ruleset` (kept open by the caller until the start) on it
    /// and all it starts, after its drop and no_new_privs, just before the exec: a start that
    /// cannot enforce it fails.
    /// And the seccomp filter `filter` (kept alive by the caller until the start) after it.
    pub fn confined(
        mut self,
        ruleset: &crate::kernel::landlock::Ruleset,
        filter: &crate::kernel::seccomp::Filter,
    ) -> Plan {
        self.landlock = Some(ruleset.raw());
        self.seccomp = Some(filter.prog());
        self
    }

    /// The OOM killer takes it, and all it starts, first (`oom_first`).
    pub fn oom_first(mut self) -> Plan {
        self.oom_first = true;
        self
    }

    /// Run in a process group of its own, in the terminal's foreground when stdin is a TTY.
    pub fn own_pgroup(mut self) -> Plan {
        self.own_pgroup = true;
        self.take_tty = fdio::isatty(0);
        self
    }

    /// Exit code and one line for an exec failure.
    pub fn failure(&self, errno: i32) -> (i32, String) {
        let (code, what) = match errno {
            libc::ENOENT | libc::ENOTDIR => (127, "not found (check the name and PATH)".to_string()),
            libc::EACCES => (126, "permission denied (is it executable?)".to_string()),
            e => (126, io::Error::from_raw_os_error(e).to_string()),
        };
        (code, format!("quiesce: cannot run '{}': {what}", self.name))
    }

    /// In the process that will become the command. Returns only on failure, with the errno
    /// and the step that failed.
    fn prepare_and_exec(&self) -> (i32, &'static str) {
        // SAFETY (whole block): plain syscalls on local data in the process about to exec.
        unsafe {
            if self.own_session {
                if libc::setsid() < 0 {
                    return (errno(), "setsid");
                }
                let r = libc::rlimit { rlim_cur: SERVICE_NPROC, rlim_max: SERVICE_NPROC };
                if libc::setrlimit(libc::RLIMIT_NPROC, &r) != 0 {
                    return (errno(), "setrlimit RLIMIT_NPROC");
                }
            }
            // Raised as root before the drop: only CAP_SYS_RESOURCE lowers it again.
            if self.oom_first {
                let fd = libc::open(c"/proc/self/oom_score_adj".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                let n = if fd < 0 { -1 } else { libc::write(fd, b"1000".as_ptr() as *const libc::c_void, 4) };
                let err = errno();
                if fd >= 0 {
                    libc::close(fd);
                }
                if n != 4 {
                    // A service is started by root, which is never refused: there it is a failure.
                    if self.own_session {
                        return (err, "oom_score_adj");
                    }
                    self.oom_refused.store(err, std::sync::atomic::Ordering::Relaxed);
                }
            }
            if self.own_pgroup {
                libc::setpgid(0, 0);
                // TTOU is still blocked here, so a background tcsetpgrp is allowed.
                if self.take_tty && libc::tcsetpgrp(0, libc::getpid()) != 0 {
                    return (errno(), "tcsetpgrp");
                }
            }
            if let Some(d) = &self.drop {
                match d.tag {
                    Tag::None => {}
                    // Where the kernel refuses, history follows the command (see `Tag`).
                    Tag::UserUid => _ = write_loginuid(&self.tag_text),
                    Tag::Required(_) => {
                        if !write_loginuid(&self.tag_text) {
                            return (errno(), "write the lineage tag to /proc/self/loginuid");
                        }
                    }
                }
                // Raw syscalls: the C library's wrappers change every thread of the process
                // (they signal the others and wait), and this process shares its memory, thread
                // list included, with the init until the exec; the kernel call changes this one.
                let (uid, gid) = (d.user.uid as libc::c_long, d.user.gid as libc::c_long);
                if libc::syscall(libc::SYS_setgroups, d.groups.len(), d.groups.as_ptr()) != 0 {
                    return (errno(), "setgroups");
                }
                if libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0 {
                    return (errno(), "setresgid");
                }
                if libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0 {
                    return (errno(), "setresuid");
                }
                // A credential change resets the dumpable flag of the memory, and this memory is
                // the init's (its signing key included) until the exec: non-dumpable again at once.
                if libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 {
                    return (errno(), "dumpable");
                }
                if !d.allow_setuid && libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    return (errno(), "no_new_privs");
                }
            }
            if self.own_session {
                // After the drop, which clears it: a service whose starter is killed dies too.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return (errno(), "parent-death signal");
                }
            }
            if let Some((stdin, out)) = self.stdio {
                if libc::dup2(stdin, 0) < 0 || libc::dup2(out, 1) < 0 || libc::dup2(out, 2) < 0 {
                    return (errno(), "dup2 its stdin and output");
                }
                // Closed at the exec, not now: the starter learns of the exec by its pipe's close.
                if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) != 0 {
                    return (errno(), "close_range");
                }
            }
            if let Some(dir) = &self.cwd {
                if libc::chdir(dir.as_ptr()) != 0 {
                    return (errno(), "chdir to its recorded directory");
                }
            }
            if let Some(fd) = self.landlock {
                match crate::kernel::landlock::restrict_self(fd) {
                    0 => {}
                    e => return (e, "landlock_restrict_self"),
                }
            }
            if let Some(prog) = &self.seccomp {
                match crate::kernel::seccomp::install(prog) {
                    0 => {}
                    e => return (e, "seccomp"),
                }
            }
            // A clean signal state: default dispositions everywhere (including any SIG_IGN the
            // init inherited), then an empty mask.
            signal::reset_all_dispositions();
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());

            let argv = &self.argv_ptrs;
            let mut saw_eacces = false;
            let mut last = libc::ENOENT;
            for c in &self.candidates {
                match &self.env_ptrs {
                    Some(env) => libc::execve(c.as_ptr(), argv.as_ptr(), env.as_ptr()),
                    None => libc::execv(c.as_ptr(), argv.as_ptr()),
                };
                last = errno();
                match last {
                    libc::ENOENT | libc::ENOTDIR => continue,
                    // EACCES from a directory on PATH the user may not search is "not there";
                    // only a file that exists but may not be executed is "permission denied".
                    libc::EACCES => {
                        let mut st: libc::stat = std::mem::zeroed();
                        if libc::stat(c.as_ptr(), &mut st) == 0 {
                            saw_eacces = true;
                        }
                        last = libc::ENOENT;
                    }
                    _ => break,
                }
            }
            if last == libc::ENOENT && saw_eacces {
                last = libc::EACCES;
            }
            (last, "exec")
        }
    }

    /// Replace this process with the command (for `quiesce exec`).
    pub fn exec_in_place(&self) -> i32 {
        let (err, step) = self.prepare_and_exec();
        if step == "exec" {
            let (code, line) = self.failure(err);
            eprintln!("{line}");
            code
        } else {
            eprintln!(
                "quiesce: cannot run '{}': {step} failed: {}",
                self.name,
                io::Error::from_raw_os_error(err)
            );
            126
        }
    }

    /// Start it in a forked child (not one sharing this memory, whose start suspends the caller
    /// until its exec: a process of the user it drops to may stop it before that, and the caller
    /// with it). Ok once its exec happened, within `within`; Err with the step that failed, the
    /// child then gone.
    pub fn spawn_forked(&self, within: std::time::Duration) -> Result<Pid, String> {
        let (r, w) = fdio::pipe().map_err(|e| format!("pipe: {e}"))?;
        let pid = process::fork().map_err(|e| format!("fork: {e}"))?;
        if pid == 0 {
            use std::os::fd::AsRawFd;
            drop(r);
            let (err, step) = self.prepare_and_exec();
            let mut msg = [0u8; 68];
            msg[..4].copy_from_slice(&err.to_ne_bytes());
            let n = step.len().min(64);
            msg[4..4 + n].copy_from_slice(&step.as_bytes()[..n]);
            let _ = fdio::write(w.as_raw_fd(), &msg[..4 + n]);
            process::exit_now(126);
        }
        drop(w);
        let said = match fdio::wait_readable(std::os::fd::AsRawFd::as_raw_fd(&r), within) {
            Ok(true) => {
                let mut buf = [0u8; 68];
                match fdio::read_some(&r, &mut buf) {
                    Ok(0) => return Ok(pid),
                    Ok(n) if n >= 4 => {
                        let e = i32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]);
                        let step = String::from_utf8_lossy(&buf[4..n]).into_owned();
                        match step.as_str() {
                            "exec" => self.failure(e).1,
                            _ => format!("{step} failed: {}", io::Error::from_raw_os_error(e)),
                        }
                    }
                    Ok(_) => "a short report from its child".to_string(),
                    Err(e) => format!("its child's report: {e}"),
                }
            }
            Ok(false) => format!("its child did not exec within {within:?} (stopped?)"),
            Err(e) => format!("waiting for its child: {e}"),
        };
        signal::kill(pid, libc::SIGKILL).ok();
        let _ = reap::wait_child(pid);
        Err(said)
    }

    /// Start the command. Returns the child's pid once the exec has happened or failed; a
    /// failure is printed here and the child exits 127 or 126 so its status tells the same story.
    /// The child shares the init's memory until it execs (`process::spawn_shared`): what it prepares
    /// is all syscalls on this plan, made before the call, and a failure it meets is handed back
    /// in `failed` and said through `say` (the init's: a line that never blocks it).
    pub fn spawn(&self, say: fn(std::fmt::Arguments)) -> io::Result<Pid> {
        let mut failed: Option<(i32, &'static str)> = None;
        let pid = process::spawn_shared(&mut || {
            let (err, step) = self.prepare_and_exec();
            failed = Some((err, step));
            match (step, err) {
                ("exec", libc::ENOENT | libc::ENOTDIR) => 127,
                _ => 126,
            }
        })?;
        match self.oom_refused.load(std::sync::atomic::Ordering::Relaxed) {
            0 => {}
            e => log::warn!(
                "cannot raise '{}''s oom_score_adj to 1000 ({}): at a memory limit the OOM killer may take the init",
                self.name,
                io::Error::from_raw_os_error(e)
            ),
        }
        if self.drop.is_some() {
            // The child's credential changes reset the shared memory's dumpable flag; a drop that
            // failed half-way left it as the host's fs.suid_dumpable says.
            if let Err(e) = process::set_not_dumpable() {
                log::error!("cannot mark the init non-dumpable again after starting '{}': {e}", self.name);
            }
        }
        if self.own_pgroup {
            // Both sides set the group, so a signal forwarded right away already finds it.
            // SAFETY: setpgid on our own child; EACCES after its exec is harmless.
            unsafe { libc::setpgid(pid, pid) };
        }
        if let Some((err, step)) = failed {
            // The child may already have run something that stopped the output: never block.
            if step == "exec" {
                say(format_args!("{}", self.failure(err).1));
            } else {
                say(format_args!(
                    "quiesce: cannot run '{}': {step} failed: {}",
                    self.name,
                    io::Error::from_raw_os_error(err)
                ));
            }
        }
        Ok(pid)
    }
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// Mark this process and all its descendants as a sandbox launch: an unset audit login UID may
/// be written once without privilege, the kernel then opens a new audit session, and nothing
/// without CAP_AUDIT_CONTROL can change either again. Returns whether the tag took.
pub fn tag_lineage(uid: u32) -> bool {
    write_loginuid(&uid.to_string())
}

fn write_loginuid(text: &str) -> bool {
    // SAFETY: open/write/close on a path literal and a local buffer.
    unsafe {
        let fd = libc::open(c"/proc/self/loginuid".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return false;
        }
        let n = libc::write(fd, text.as_ptr() as *const libc::c_void, text.len());
        libc::close(fd);
        n == text.len() as isize
    }
}

/// Does the audit tag work here? Checked from a throwaway child so the caller stays untagged,
/// with a UID the tag will write: the kernel reads a loginuid in the writer's user namespace, so
/// under a remapping (rootless Podman) a UID without a mapping there is refused while a sandbox
/// UID, which must be mapped to run at all, is taken.
pub fn lineage_available(uid: u32) -> bool {
    // Made here: the child shares this process's memory and must not allocate.
    let text = uid.to_string();
    match process::spawn_shared(&mut || if write_loginuid(&text) { 0 } else { 1 }) {
        Ok(pid) => matches!(reap::wait_child(pid), Ok(0)),
        Err(_) => false,
    }
}

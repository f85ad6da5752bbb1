//! Test harness: the real binary as PID 1 of a fresh PID namespace, real processes, real UIDs.
//! Every container is ended by killing its PID 1, which ends the whole namespace. Every wait and
//! read here has a bound, so a broken init fails a test instead of hanging the run.
#![allow(dead_code)]

pub mod adversary;
pub mod pidmax;
pub mod services;
pub mod trace;

use std::ffi::OsStr;
use std::io::{BufRead, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// The bound on one command a test runs inside or beside a container. A freeze has its own
/// budget (10 s by default); this only turns a hang into a failure.
pub const CMD_TIMEOUT: Duration = Duration::from_secs(120);
/// The bound on a workload reaching its ready state.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest a container may live. A test thread can wait where no timeout of its own reaches
/// (a file lookup queued in the kernel behind thousands of sandbox processes): past this, a
/// watchdog kills the init, which ends the namespace and with it whatever held the test.
pub const CONTAINER_BUDGET: Duration = Duration::from_secs(300);

pub fn quiesce() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_quiesce"))
}

/// The adversary binary's path as a string, for argument lists.
pub fn adv() -> String {
    adversary().to_str().unwrap().to_string()
}

/// A container whose command is a root service, with `uid` as the sandbox user, run with
/// no-new-privileges as the docs ask.
pub fn sandbox(uid: u32, extra: &[&str]) -> Container {
    sandbox_with(uid, extra, false)
}

/// The same where setuid binaries work (Docker's default: no no-new-privileges).
pub fn sandbox_setuid(uid: u32, extra: &[&str]) -> Container {
    sandbox_with(uid, extra, true)
}

fn sandbox_with(uid: u32, extra: &[&str], setuid: bool) -> Container {
    let u = uid.to_string();
    let mut args = vec!["--sandbox-user", &u];
    args.extend_from_slice(extra);
    let mut c =
        Container::start_with(Opts { init_args: args, setuid, ..Default::default() }, &["sleep", "1000000"]);
    c.wait_published();
    c
}

/// What `--security-opt no-new-privileges` does to a process the engine starts: set before exec,
/// inherited by everything it starts.
pub fn no_new_privs(c: &mut Command) {
    use std::os::unix::process::CommandExt;
    unsafe {
        c.pre_exec(|| {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The same inside the pids cgroup `cg` (the init and everything it starts count against it).
pub fn sandbox_in(cg: &PidsCgroup, uid: u32, extra: &[&str]) -> Container {
    sandbox_in_with(cg, uid, extra, false)
}

/// The same where setuid binaries work.
pub fn sandbox_in_setuid(cg: &PidsCgroup, uid: u32, extra: &[&str]) -> Container {
    sandbox_in_with(cg, uid, extra, true)
}

fn sandbox_in_with(cg: &PidsCgroup, uid: u32, extra: &[&str], setuid: bool) -> Container {
    let u = uid.to_string();
    let mut args = vec!["--sandbox-user", &u];
    args.extend_from_slice(extra);
    let enter = cg.enter();
    let mut c = Container::start_with(
        Opts { init_args: args, prefix: vec!["sh", "-c", &enter, "sh"], setuid, ..Default::default() },
        &["sleep", "1000000"],
    );
    c.wait_published();
    c
}

/// A setuid-root copy of the adversary in the container's directory, as a sandbox user would
/// find one.
pub fn setuid_copy(c: &Container) -> String {
    use std::os::unix::fs::PermissionsExt;
    assert!(
        c.setuid,
        "a setuid binary does nothing in a container with no-new-privileges: start it with setuid"
    );
    let p = c.path("adversary-suid");
    copy_executable(&adversary(), &p);
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o4755)).unwrap();
    p.to_str().unwrap().to_string()
}

/// Copy an executable that is exec'd next by a separate `cp`: a copy written by this test
/// process holds a write descriptor for a moment, and a fork by another test thread in that
/// moment keeps it open until that child's exec, which makes the next exec of the copy fail
/// with ETXTBSY (seen once in CI: `setpriv: failed to execute ...: Text file busy`).
pub fn copy_executable(from: &Path, to: &Path) {
    let out = Command::new("cp").arg(from).arg(to).output().expect("cp runs");
    assert!(out.status.success(), "cp {} {}: {out:?}", from.display(), to.display());
}

pub fn adversary() -> PathBuf {
    quiesce().parent().unwrap().join("examples").join("adversary")
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A scratch directory, removed with everything in it when dropped.
pub struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<OsStr> for Scratch {
    fn as_ref(&self) -> &OsStr {
        self.0.as_os_str()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            if e.kind() != std::io::ErrorKind::NotFound {
                // A directory left behind fails the test, unless it is failing already.
                let msg = format!("harness: cannot remove {}: {e}", self.0.display());
                if std::thread::panicking() {
                    eprintln!("{msg}");
                } else {
                    panic!("{msg}");
                }
            }
        }
    }
}

/// A scratch directory anyone may write in (sandbox UIDs create ready files there).
/// A name is never reused: a test binary in another PID namespace can have this one's pid, and
/// removing "its" directory would pull the state dir from under a running init.
pub fn scratch(tag: &str) -> Scratch {
    let base = std::env::temp_dir();
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let d = (0..100)
        .map(|_| {
            base.join(format!(
                "quiesce-t-{}-{}-{}-{:x}",
                tag,
                std::process::id(),
                SEQ.fetch_add(1, Ordering::SeqCst),
                nanos
            ))
        })
        .find(|d| match std::fs::create_dir(d) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
            Err(e) => panic!("harness: cannot create {}: {e}", d.display()),
        })
        .expect("harness: 100 scratch names taken");
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
    Scratch(d)
}

/// A test that cannot run here says so where the summary of `scripts/test` will count it: the
/// test runner hides the output of passing tests, and a skip must never read as a pass.
pub fn skip(test: &str, reason: &str) {
    eprintln!("skipped: {test}: {reason}");
    if let Some(log) = std::env::var_os("QUIESCE_SKIP_LOG") {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&log)
            .unwrap_or_else(|e| panic!("QUIESCE_SKIP_LOG {}: {e}", Path::new(&log).display()));
        // One write per line: O_APPEND keeps lines from parallel tests whole.
        f.write_all(format!("{test}: {reason}\n").as_bytes()).expect("write QUIESCE_SKIP_LOG");
    }
}

/// A process the test started; killed and reaped when dropped, so none is left behind.
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn guard(mut c: Command) -> Guard {
    Guard(c.spawn().expect("spawn"))
}

pub fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let until = Instant::now() + timeout;
    while Instant::now() < until {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}

fn drain(mut r: impl Read + Send + 'static) -> Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        let _ = tx.send(buf);
    });
    rx
}

/// Like `Command::output`, with a bound: a command that does not finish (and close its output)
/// within `timeout` is killed and fails the test.
pub fn output_within(cmd: &mut Command, timeout: Duration) -> Output {
    let what = format!("{cmd:?}");
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    let out = drain(child.stdout.take().unwrap());
    let err = drain(child.stderr.take().unwrap());
    let until = Instant::now() + timeout;
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if Instant::now() >= until {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let rest = until.saturating_duration_since(Instant::now()).max(Duration::from_secs(5));
    let stdout = out.recv_timeout(rest).unwrap_or_else(|_| panic!("{what} exited; its stdout stayed open"));
    let stderr = err.recv_timeout(rest).unwrap_or_else(|_| panic!("{what} exited; its stderr stayed open"));
    Output { status, stdout, stderr }
}

/// `output_within` with the default bound.
pub fn output(cmd: &mut Command) -> Output {
    output_within(cmd, CMD_TIMEOUT)
}

/// Lines of a child's output, each read with a deadline.
pub struct Lines {
    rx: Receiver<std::io::Result<String>>,
    what: String,
}

impl Lines {
    pub fn new(r: impl Read + Send + 'static, what: &str) -> Lines {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(r).lines() {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Lines { rx, what: what.to_string() }
    }

    /// The next line; fails the test if none comes within `timeout`.
    pub fn next_within(&self, timeout: Duration) -> String {
        match self.rx.recv_timeout(timeout) {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => panic!("reading {}: {e}", self.what),
            Err(RecvTimeoutError::Timeout) => panic!("no line from {} within {timeout:?}", self.what),
            Err(RecvTimeoutError::Disconnected) => panic!("{} closed its output", self.what),
        }
    }
}

/// One /proc/PID/stat line, the fields the tests look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    pub state: char,
    pub ppid: i32,
    pub pgrp: i32,
    pub session: i32,
    pub start_time: u64,
}

impl Stat {
    pub fn parse(line: &str) -> Option<Stat> {
        let rest = &line[line.rfind(')')? + 1..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        Some(Stat {
            state: f.first()?.chars().next()?,
            ppid: f.get(1)?.parse().ok()?,
            pgrp: f.get(2)?.parse().ok()?,
            session: f.get(3)?.parse().ok()?,
            start_time: f.get(19)?.parse().ok()?,
        })
    }

    /// Neither a zombie nor being reaped.
    pub fn live(&self) -> bool {
        !matches!(self.state, 'Z' | 'X')
    }
}

/// Is the host process `pid` (started at `start_time`) gone or dead? A recycled pid counts as gone.
pub fn host_dead(pid: i32, start_time: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().and_then(|l| Stat::parse(&l)) {
        None => true,
        Some(s) => s.start_time != start_time || !s.live(),
    }
}

/// A workload started inside a container; `pid` is its pid in the namespace (from its ready file).
pub struct Workload {
    pub pid: i32,
    _guard: Guard,
}

pub struct Container {
    unshare: Child,
    /// PID 1 of the namespace, as the host sees it; 0 if it exited before the harness saw it.
    pub init: i32,
    /// A pidfd of the init: signals reach it and nothing else, even once its pid is recycled.
    pidfd: Option<OwnedFd>,
    pub dir: PathBuf,
    pub state: PathBuf,
    exited: Option<ExitStatus>,
    /// Setuid binaries work in it (no no_new_privs on the init, nor on what is entered into it).
    pub setuid: bool,
    /// Dropped with the container: tells the watchdog it is no longer needed.
    _watchdog: Option<mpsc::Sender<()>>,
    // Last: removed after Drop has ended the namespace.
    _scratch: Scratch,
}

pub struct Opts<'a> {
    pub init_args: Vec<&'a str>,
    pub stdout: Stdio,
    pub stdin: Stdio,
    pub env: Vec<(&'a str, String)>,
    /// The command is an adversary mode: wait for its ready file before returning.
    pub ready: bool,
    /// A command that execs `unshare ...` (e.g. setpriv dropping a capability, a shell that
    /// writes a loginuid first).
    pub prefix: Vec<&'a str>,
    /// PID 1 of the namespace is a shell that starts the init in the background and forwards
    /// nothing, as a pod's pause process or a wrapper script would.
    pub shell_pid1: bool,
    /// A command that runs the init inside the namespace (e.g. setpriv); it must exec it.
    pub wrap: Vec<&'a str>,
    /// The init is this copy of the binary, under the name an engine mounts it at
    /// (`/sbin/docker-init`, `/run/podman-init`), started as an engine starts it: `PATH -- CMD`,
    /// the state dir given only through QUIESCE_STATE_DIR.
    pub init_bin: Option<PathBuf>,
    /// The namespaces get a user namespace of their own whose UIDs and GIDs 0..N map to the same
    /// ids outside, as a rootless engine's do (root is mapped, anything from N up is not).
    pub userns: Option<u32>,
    /// Setuid binaries work: the container runs without no-new-privileges (Docker's default).
    /// Off, the init and everything entered into the container run with no_new_privs, as
    /// `--security-opt no-new-privileges` makes them.
    pub setuid: bool,
}

impl Default for Opts<'_> {
    fn default() -> Self {
        Opts {
            init_args: vec![],
            stdout: Stdio::null(),
            stdin: Stdio::null(),
            env: vec![],
            ready: false,
            prefix: vec![],
            shell_pid1: false,
            wrap: vec![],
            init_bin: None,
            userns: None,
            setuid: false,
        }
    }
}

/// The child of `upid` that runs the init binary named `comm` (or the shell's child, through a
/// shell as PID 1), if it has exec'd yet.
fn init_of(upid: u32, through_shell: bool, comm: &str) -> Option<i32> {
    let first = |p: &str| -> Option<String> {
        let kids = std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).ok()?;
        kids.split_whitespace().next().map(str::to_string)
    };
    let mut k = first(&upid.to_string())?;
    if through_shell {
        k = first(&k)?;
    }
    let seen = std::fs::read_to_string(format!("/proc/{k}/comm")).ok()?;
    (seen.trim() == comm).then(|| k.parse().ok()).flatten()
}

fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn pidfd_signal(fd: &OwnedFd, sig: i32) -> std::io::Result<()> {
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl Container {
    /// Kill the init once `budget` has passed, unless the returned sender is dropped first.
    pub fn kill_after(&self, budget: Duration) -> mpsc::Sender<()> {
        let fd =
            self.pidfd.as_ref().expect("no init to watch").try_clone().expect("duplicate the init's pidfd");
        watchdog(fd, self.init, budget)
    }
}

fn watchdog(fd: OwnedFd, init: i32, budget: Duration) -> mpsc::Sender<()> {
    let (tx, rx) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        if let Err(RecvTimeoutError::Timeout) = rx.recv_timeout(budget) {
            eprintln!("harness: the container of init {init} outlived {budget:?}: killing its init");
            if let Err(e) = pidfd_signal(&fd, libc::SIGKILL) {
                eprintln!("harness: cannot kill init {init}: {e}");
            }
        }
    });
    tx
}

impl Container {
    /// `quiesce --state-dir DIR/state INIT_ARGS -- CMD` as PID 1 of a new PID namespace.
    pub fn start(init_args: &[&str], cmd: &[&str]) -> Container {
        Container::start_with(Opts { init_args: init_args.to_vec(), ..Default::default() }, cmd)
    }

    pub fn start_with(o: Opts, cmd: &[&str]) -> Container {
        let scratch = scratch("ctr");
        let dir = scratch.to_path_buf();
        let state = dir.join("state");
        let ready = dir.join("ready-cmd");
        let mut c = match o.prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg("unshare");
                c
            }
            None => Command::new("unshare"),
        };
        if o.userns.is_some() {
            c.arg("--user");
        }
        c.args(["--pid", "--fork", "--mount-proc", "--kill-child"]);
        if o.userns.is_some() {
            // Hold the command until the harness has written the maps (bounded: 10 s).
            c.args([
                "sh",
                "-c",
                "i=0; while [ -z \"$(cat /proc/self/uid_map)\" ] && [ $i -lt 1000 ]; do \
                 sleep 0.01; i=$((i+1)); done; exec \"$@\"",
                "sh",
            ]);
        }
        // In a user namespace of its own the command gets its capabilities from the exec that
        // follows the map: no_new_privs comes after that, as an engine sets it last.
        if o.userns.is_some() && !o.setuid {
            c.args(["setpriv", "--no-new-privs"]);
        }
        if o.shell_pid1 {
            c.args(["sh", "-c", "\"$@\" & wait", "sh"]);
        }
        c.args(&o.wrap);
        match &o.init_bin {
            Some(bin) => c.arg(bin).env("QUIESCE_STATE_DIR", &state),
            None => c.arg(quiesce()).arg("--state-dir").arg(&state),
        };
        // The kernel keeps the first 15 bytes of the file name as comm.
        let comm: String = o
            .init_bin
            .as_deref()
            .and_then(Path::file_name)
            .map_or("quiesce".into(), |n| n.to_string_lossy().chars().take(15).collect());
        c.args(&o.init_args)
            .arg("--")
            .args(cmd)
            .env("ADV", adversary())
            .env("Q", quiesce())
            .env("D", &dir)
            .stdin(o.stdin)
            .stdout(o.stdout)
            .stderr(Stdio::inherit());
        if o.ready {
            c.env("ADV_READY", &ready);
        }
        for (k, v) in &o.env {
            c.env(k, v);
        }
        if !o.setuid && o.userns.is_none() {
            no_new_privs(&mut c);
        }
        let unshare = c.spawn().expect("spawn unshare");
        let upid = unshare.id();
        // From here a failure drops the container, which ends unshare and its namespace.
        let mut ctr = Container {
            unshare,
            init: 0,
            pidfd: None,
            dir,
            state,
            exited: None,
            setuid: o.setuid,
            _watchdog: None,
            _scratch: scratch,
        };
        if let Some(n) = o.userns {
            let ours = std::fs::read_link("/proc/self/ns/user").unwrap();
            let until = Instant::now() + Duration::from_secs(10);
            while std::fs::read_link(format!("/proc/{upid}/ns/user")).ok().as_ref() == Some(&ours) {
                assert!(Instant::now() < until, "unshare made no user namespace within 10 s");
                std::thread::sleep(Duration::from_millis(5));
            }
            for map in ["uid_map", "gid_map"] {
                std::fs::write(format!("/proc/{upid}/{map}"), format!("0 0 {n}\n"))
                    .unwrap_or_else(|e| panic!("cannot write the user namespace's {map}: {e}"));
            }
        }
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            // A command that ends at once may take its init along before we look.
            if let Some(s) = ctr.unshare.try_wait().expect("try_wait unshare") {
                ctr.exited = Some(s);
                break;
            }
            if let Some(pid) = init_of(upid, o.shell_pid1, &comm) {
                let fd = pidfd_open(pid);
                // The pidfd names the process we saw only if it is still unshare's quiesce child.
                if fd.is_some() && init_of(upid, o.shell_pid1, &comm) == Some(pid) {
                    ctr.init = pid;
                    ctr.pidfd = fd;
                    ctr._watchdog = Some(ctr.kill_after(CONTAINER_BUDGET));
                    break;
                }
            }
            assert!(Instant::now() < until, "the init did not start within 10 s");
            std::thread::sleep(Duration::from_millis(5));
        }
        // An init with a sandbox user makes its state dir's results/ once it takes requests; a
        // freeze sent before that is refused ("is the init running?"). Bounded, and not asserted:
        // a test may start an init that refuses its state dir on purpose.
        let sandboxed = o.init_args.iter().any(|a| a.starts_with("--sandbox-user"))
            || o.env.iter().any(|(k, _)| *k == "QUIESCE_SANDBOX_USER");
        let until = Instant::now() + Duration::from_secs(10);
        while sandboxed && !ctr.state.join("results").exists() && ctr.alive() {
            if Instant::now() >= until {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if o.ready {
            let until = Instant::now() + READY_TIMEOUT;
            while !ready.exists() {
                assert!(ctr.alive(), "the command {cmd:?} ended before it was ready");
                assert!(Instant::now() < until, "the command {cmd:?} was not ready within {READY_TIMEOUT:?}");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        ctr
    }

    /// A PID namespace whose PID 1 is `pid1` (e.g. `sleep infinity`, which never reaps), not
    /// quiesce, with no-new-privileges: the sandbox of a provider whose init is its own. `state`
    /// is where a sidecar started into it is told to keep its state; nothing runs there yet.
    pub fn foreign(pid1: &[&str]) -> Container {
        Container::foreign_as(None, pid1)
    }

    /// `foreign`, with PID 1 run as `uid` (a container run with `--user`) when one is given.
    pub fn foreign_as(uid: Option<u32>, pid1: &[&str]) -> Container {
        let scratch = scratch("foreign");
        let dir = scratch.to_path_buf();
        let mut c = Command::new("unshare");
        c.args(["--pid", "--fork", "--mount-proc", "--kill-child"]);
        if let Some(u) = uid {
            c.args(["--setuid", &u.to_string(), "--setgid", &u.to_string()]);
        }
        c.args(pid1).stdin(Stdio::null()).stdout(Stdio::null());
        no_new_privs(&mut c);
        let unshare = c.spawn().expect("spawn unshare");
        let upid = unshare.id();
        let comm: String =
            Path::new(pid1[0]).file_name().unwrap().to_string_lossy().chars().take(15).collect();
        let mut ctr = Container {
            unshare,
            init: 0,
            pidfd: None,
            state: dir.join("state"),
            dir,
            exited: None,
            setuid: false,
            _watchdog: None,
            _scratch: scratch,
        };
        wait_for("the foreign PID 1 to start", Duration::from_secs(10), || {
            let Some(pid) = init_of(upid, false, &comm) else { return false };
            ctr.pidfd = pidfd_open(pid);
            ctr.init = pid;
            ctr.pidfd.is_some() && init_of(upid, false, &comm) == Some(pid)
        });
        ctr._watchdog = Some(ctr.kill_after(CONTAINER_BUDGET));
        ctr
    }

    /// Run a command inside the namespace, as `docker exec` would (root unless wrapped).
    pub fn exec<S: AsRef<str>>(&self, args: &[S]) -> Output {
        output(&mut self.exec_cmd(args))
    }

    /// Like `docker exec -u UID`: entered from outside, switched to `uid` (no lineage tag).
    pub fn exec_as_cmd(&self, uid: u32, args: &[&str]) -> Command {
        let u = uid.to_string();
        let mut full = vec!["setpriv", "--reuid", &u, "--regid", &u, "--clear-groups"];
        full.extend_from_slice(args);
        self.exec_cmd(&full)
    }

    pub fn exec_as(&self, uid: u32, args: &[&str]) -> Output {
        output(&mut self.exec_as_cmd(uid, args))
    }

    /// Like `docker exec`: join the namespace's PID and mount namespaces, fork, and have the
    /// outside parent wait for the inside child without mirroring its stops (nsenter mirrors
    /// them, which a freeze would turn into a stopped waiter that never reaps).
    pub fn exec_cmd<S: AsRef<str>>(&self, args: &[S]) -> Command {
        use std::os::unix::process::CommandExt;
        assert!(self.init > 0, "no namespace to enter: the init exited before the harness saw it");
        let mut c = Command::new(args[0].as_ref());
        c.args(args[1..].iter().map(AsRef::as_ref));
        // As the image's default state dir would be: `quiesce exec` records its launches there.
        c.env("ADV", adversary())
            .env("Q", quiesce())
            .env("D", &self.dir)
            .env("QUIESCE_STATE_DIR", &self.state);
        let pidns = std::ffi::CString::new(format!("/proc/{}/ns/pid", self.init)).unwrap();
        let mntns = std::ffi::CString::new(format!("/proc/{}/ns/mnt", self.init)).unwrap();
        // A user namespace of the container's own is joined first, as engines do: its root then
        // owns the PID and mount namespaces joined next, and the command's IDs are the mapped ones.
        let userns = format!("/proc/{}/ns/user", self.init);
        let own_userns = std::fs::read_link(&userns).ok() != std::fs::read_link("/proc/self/ns/user").ok();
        let userns = std::ffi::CString::new(userns).unwrap();
        if !self.setuid {
            no_new_privs(&mut c);
        }
        unsafe {
            c.pre_exec(move || {
                // No allocation here: this runs between fork and exec.
                let joins = [
                    (own_userns, &userns, libc::CLONE_NEWUSER),
                    (true, &pidns, libc::CLONE_NEWPID),
                    (true, &mntns, libc::CLONE_NEWNS),
                ];
                for (path, kind) in joins.into_iter().filter(|j| j.0).map(|j| (j.1, j.2)) {
                    let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
                    if fd < 0 || libc::setns(fd, kind) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    libc::close(fd);
                }
                let child = libc::fork();
                if child < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if child == 0 {
                    return Ok(());
                }
                // The waiter must not hold std's exec-status channel open, or spawn() would
                // block until the inner command exits.
                libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
                let mut st = 0;
                while libc::waitpid(child, &mut st, 0) < 0 {
                    if *libc::__errno_location() != libc::EINTR {
                        libc::_exit(127);
                    }
                }
                let code = if libc::WIFEXITED(st) { libc::WEXITSTATUS(st) } else { 128 + libc::WTERMSIG(st) };
                libc::_exit(code);
            });
        }
        c
    }

    /// Start `cmd` (an adversary mode) with a ready file and wait until it says it is ready.
    /// Fails at once if it ends first: an adversary that could not reach its state exits non-zero.
    pub fn start_ready(&self, cmd: Command, what: &str) -> Workload {
        self.try_start_ready(cmd, what)
            .unwrap_or_else(|s| panic!("workload {what} ended ({s}) before it was ready"))
    }

    /// Like `start_ready`, for a workload that may be killed before it is ready (by a freeze).
    pub fn try_start_ready(&self, mut cmd: Command, what: &str) -> Result<Workload, ExitStatus> {
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let ready = self.dir.join(format!("ready-{n}"));
        cmd.env("ADV_READY", &ready).stdin(Stdio::null()).stdout(Stdio::null());
        let mut child = Guard(cmd.spawn().unwrap_or_else(|e| panic!("cannot start {what}: {e}")));
        let until = Instant::now() + READY_TIMEOUT;
        while !ready.exists() {
            if let Some(s) = child.0.try_wait().expect("try_wait") {
                return Err(s);
            }
            assert!(Instant::now() < until, "workload {what} was not ready within {READY_TIMEOUT:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
        let text = read(&ready);
        let pid = text.trim().parse().unwrap_or_else(|_| panic!("ready file of {what} says '{text}'"));
        Ok(Workload { pid, _guard: child })
    }

    /// Start a workload as `uid` through `quiesce exec`, and wait until it says it is ready.
    pub fn launch(&self, uid: u32, args: &[&str]) -> Workload {
        self.launch_with(uid, &[], args)
    }

    pub fn launch_with(&self, uid: u32, exec_args: &[&str], args: &[&str]) -> Workload {
        self.launch_bin(uid, exec_args, adversary().to_str().unwrap(), args)
    }

    /// Like `launch`, with `quiesce exec` options and another binary (e.g. a setuid copy).
    pub fn launch_bin(&self, uid: u32, exec_args: &[&str], bin: &str, args: &[&str]) -> Workload {
        let uid_s = uid.to_string();
        let q = quiesce();
        let mut full: Vec<&str> = vec![q.to_str().unwrap(), "exec", "--user", &uid_s];
        full.extend_from_slice(exec_args);
        full.push("--");
        full.push(bin);
        full.extend_from_slice(args);
        self.start_ready(self.exec_cmd(&full), &format!("{args:?} as {uid}"))
    }

    /// Run the adversary as root inside the container (not a sandbox launch), ready-waited.
    pub fn launch_root(&self, args: &[&str]) -> Workload {
        let a = adversary();
        let mut full = vec![a.to_str().unwrap()];
        full.extend_from_slice(args);
        self.start_ready(self.exec_cmd(&full), &format!("{args:?} as root"))
    }

    /// Signal the init. Only ever the init: never a pid <= 0, never a recycled pid.
    pub fn signal(&self, sig: i32) {
        let fd = self.pidfd.as_ref().expect("cannot signal the init: it exited before the harness saw it");
        if let Err(e) = pidfd_signal(fd, sig) {
            panic!("cannot signal the init (signal {sig}): {e}");
        }
    }

    /// `exec_cmd(args)`, moved into the pids cgroup `cg` before it runs `args`.
    pub fn exec_in<S: AsRef<str>>(&self, cg: &PidsCgroup, args: &[S]) -> Command {
        let enter = cg.enter();
        let mut full = vec!["sh", "-c", enter.as_str(), "sh"];
        full.extend(args.iter().map(AsRef::as_ref));
        self.exec_cmd(&full)
    }

    /// A freeze fails ("is the init running?") when asked for before the init has published its
    /// sandbox: wait for the file it writes last, as an orchestrator's readiness check would.
    pub fn wait_published(&mut self) {
        let until = Instant::now() + Duration::from_secs(10);
        while !self.state.join("sandbox.json").exists() {
            assert!(self.alive(), "the init ended before it published its sandbox");
            assert!(Instant::now() < until, "the init did not publish its sandbox within 10 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A freeze asked for as `docker kill -s USR1` asks (a signal from outside: no process in
    /// the namespace), then its final status once written (within `within`), and how long that
    /// took.
    pub fn freeze_by_signal(&self, within: Duration) -> (serde_json::Value, Duration) {
        let before = self.status_file()["id"].clone();
        let started = Instant::now();
        self.signal(libc::SIGUSR1);
        let mut st = serde_json::Value::Null;
        wait_for("the freeze to end", within, || {
            st = self.status_file();
            st["id"] != before && matches!(st["state"].as_str(), Some("quiescent" | "failed"))
        });
        (st, started.elapsed())
    }

    /// A freeze by a bare signal, as `docker kill -s USR1` asks for one, as (0 for quiescent else
    /// 1, its final status): where a launch can become root unseen no client is the init's own,
    /// and this is the way to freeze there.
    pub fn freeze_bare(&self) -> (i32, serde_json::Value) {
        let (st, _) = self.freeze_by_signal(Duration::from_secs(120));
        (if st["state"] == "quiescent" { 0 } else { 1 }, st)
    }

    /// `quiesce freeze --wait --json --nonce NONCE [--timeout SECS]` inside the namespace.
    pub fn freeze_cmd(&self, nonce: &str, timeout: Option<u32>) -> Command {
        let st = self.state.to_str().unwrap().to_string();
        let q = quiesce();
        let mut args =
            vec![q.to_str().unwrap(), "freeze", "--state-dir", &st, "--wait", "--json", "--nonce", nonce];
        let t = timeout.map(|t| t.to_string());
        if let Some(t) = &t {
            args.extend_from_slice(&["--timeout", t]);
        }
        self.exec_cmd(&args)
    }

    /// `quiesce freeze --wait --json` from inside; returns (exit code, status JSON).
    pub fn freeze(&self, nonce: &str) -> (i32, serde_json::Value) {
        self.freeze_within(nonce, None)
    }

    /// Like `freeze`, the client giving up after `timeout` seconds.
    pub fn freeze_within(&self, nonce: &str, timeout: Option<u32>) -> (i32, serde_json::Value) {
        let out = output(&mut self.freeze_cmd(nonce, timeout));
        // No status printed: what the client said instead, so the failing assertion shows it.
        let v = serde_json::from_slice(&out.stdout).unwrap_or_else(
            |_| serde_json::json!({ "client_stderr": String::from_utf8_lossy(&out.stderr).to_string() }),
        );
        (out.status.code().unwrap_or(-1), v)
    }

    /// `quiesce verify` from inside with extra args; returns the output.
    pub fn verify(&self, args: &[&str]) -> Output {
        let st = self.state.to_str().unwrap().to_string();
        let q = quiesce();
        let mut full = vec![q.to_str().unwrap(), "verify", "--state-dir", &st];
        full.extend_from_slice(args);
        self.exec(&full)
    }

    /// Processes of the namespace, as (pid, uid, state, comm), as `quiesce ps` reports them.
    pub fn processes(&self) -> Vec<(i32, u32, char, String)> {
        let q = quiesce();
        let out = self.exec(&[q.to_str().unwrap(), "ps", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
        v["processes"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|p| {
                        (
                            p["pid"].as_i64().unwrap() as i32,
                            p["uids"][0].as_u64().unwrap() as u32,
                            p["state"].as_str().unwrap().chars().next().unwrap(),
                            p["comm"].as_str().unwrap().to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The namespace's own /proc, read from the host through its PID 1: pids are the namespace's.
    pub fn proc_dir(&self) -> PathBuf {
        assert!(self.init > 0, "no namespace /proc: the init exited before the harness saw it");
        PathBuf::from(format!("/proc/{}/root/proc", self.init))
    }

    /// /proc/PID/FILE of the namespace; None if unreadable (gone).
    pub fn proc_read(&self, pid: i32, file: &str) -> Option<String> {
        std::fs::read_to_string(self.proc_dir().join(pid.to_string()).join(file)).ok()
    }

    pub fn stat(&self, pid: i32) -> Option<Stat> {
        Stat::parse(&self.proc_read(pid, "stat")?)
    }

    /// The fields of one line of /proc/PID/status, e.g. `Uid` -> [real, effective, saved, fs].
    pub fn status_line(&self, pid: i32, key: &str) -> Option<Vec<String>> {
        let s = self.proc_read(pid, "status")?;
        let line = s.lines().find(|l| l.split(':').next() == Some(key))?;
        Some(line.split_once(':')?.1.split_whitespace().map(str::to_string).collect())
    }

    /// Every pid of the namespace.
    pub fn pids(&self) -> Vec<i32> {
        let Ok(rd) = std::fs::read_dir(self.proc_dir()) else { return vec![] };
        rd.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect()
    }

    /// Children of `pid`, from every one of its threads.
    pub fn children_of(&self, pid: i32) -> Vec<i32> {
        let tasks = self.proc_dir().join(pid.to_string()).join("task");
        let Ok(rd) = std::fs::read_dir(tasks) else { return vec![] };
        let mut kids: Vec<i32> = rd
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
            .flat_map(|s| s.split_whitespace().filter_map(|k| k.parse().ok()).collect::<Vec<i32>>())
            .collect();
        kids.sort();
        kids
    }

    /// Live processes of the namespace whose real UID (of the leader) is `uid`.
    pub fn live_of_uid(&self, uid: u32) -> Vec<i32> {
        let u = uid.to_string();
        // One read per process (status has both the state and the uid): under a fork bomb this
        // count is what a heavy test waits on.
        let mut v: Vec<i32> = self
            .pids()
            .into_iter()
            .filter(|&p| {
                let Some(s) = self.proc_read(p, "status") else { return false };
                let field = |k: &str| {
                    s.lines().find_map(|l| l.strip_prefix(k)?.strip_prefix(':')?.split_whitespace().next())
                };
                !matches!(field("State"), None | Some("Z" | "X")) && field("Uid") == Some(u.as_str())
            })
            .collect();
        v.sort();
        v
    }

    /// The host's pid of the namespace's `pid` (and its start time), from the host's /proc.
    pub fn host_pid(&self, pid: i32) -> Option<(i32, u64)> {
        let ns = std::fs::read_link(format!("/proc/{}/ns/pid", self.init)).ok()?;
        for e in std::fs::read_dir("/proc").ok()?.flatten() {
            let Some(h) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
            if std::fs::read_link(format!("/proc/{h}/ns/pid")).ok().as_ref() != Some(&ns) {
                continue;
            }
            let status = std::fs::read_to_string(format!("/proc/{h}/status")).unwrap_or_default();
            let nspid = status.lines().find(|l| l.starts_with("NSpid:")).unwrap_or_default();
            if nspid.split_whitespace().last() == Some(&pid.to_string()) {
                let st = Stat::parse(&std::fs::read_to_string(format!("/proc/{h}/stat")).ok()?)?;
                return Some((h, st.start_time));
            }
        }
        None
    }

    pub fn status_file(&self) -> serde_json::Value {
        std::fs::read(self.state.join("status.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(serde_json::Value::Null)
    }

    pub fn marker_exists(&self) -> bool {
        self.state.join("quiescence.jws").exists()
    }

    /// The claims of the marker the last freeze signed (Null when there is none).
    pub fn marker_claims(&self) -> serde_json::Value {
        use base64::Engine;
        let m = read(&self.state.join("quiescence.jws"));
        m.split('.')
            .nth(1)
            .and_then(|p| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(p.trim()).ok())
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(serde_json::Value::Null)
    }

    /// Wait for the init to exit; None on timeout.
    pub fn wait(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if self.exited.is_some() {
            return self.exited;
        }
        let until = Instant::now() + timeout;
        while Instant::now() < until {
            if let Some(s) = self.unshare.try_wait().unwrap() {
                self.exited = Some(s);
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }

    pub fn wait_code(&mut self, timeout: Duration) -> i32 {
        let s = self.wait(timeout).expect("init did not exit in time");
        use std::os::unix::process::ExitStatusExt;
        s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))
    }

    pub fn alive(&mut self) -> bool {
        if self.exited.is_some() {
            return false;
        }
        match self.unshare.try_wait().unwrap() {
            Some(s) => {
                self.exited = Some(s);
                false
            }
            None => true,
        }
    }

    /// The command's standard output (started with `stdout: Stdio::piped()`), line by line.
    pub fn stdout_lines(&mut self) -> Lines {
        Lines::new(self.unshare.stdout.take().expect("the container's stdout is not piped"), "the command")
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        // Killing PID 1 ends every process of the namespace, and PID 1 exits (its pidfd turns
        // readable) only once all of them are gone: wait for that, bounded, so that nothing still
        // writes into the scratch directory while it is removed.
        // The init's locator (`/run/quiesce-inits`) is on the host's /run here: it goes with the
        // namespace, as a container's /run would.
        // Only this init's: another namespace may have the inode by the time this one is gone.
        let locator = (self.init > 0)
            .then(|| std::fs::metadata(format!("/proc/{}/ns/pid", self.init)).ok())
            .flatten()
            .map(|m| format!("/run/quiesce-inits/pidns-{}.json", std::os::unix::fs::MetadataExt::ino(&m)))
            .and_then(|l| Some((l, self.stat(1)?.start_time)));
        let state = self.state.clone();
        if let Some(fd) = &self.pidfd {
            let _ = pidfd_signal(fd, libc::SIGKILL);
            let until = Instant::now() + Duration::from_secs(30);
            loop {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    eprintln!("harness: the namespace of init {} did not end within 30 s", self.init);
                    break;
                }
                let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                let r = unsafe { libc::poll(&mut p, 1, left.as_millis().min(1000) as i32) };
                if r > 0 || (r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR)) {
                    break;
                }
            }
        }
        // unshare ends with its child; it is killed (and --kill-child ends the rest) only if not.
        let until = Instant::now() + Duration::from_secs(10);
        while matches!(self.unshare.try_wait(), Ok(None)) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
        if let Some((l, start)) = locator {
            let ours = std::fs::read_to_string(&l)
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .is_some_and(|v| {
                    // The init's (PID 1), or a sidecar's, which keeps its state in this container's.
                    v["start_time"].as_u64() == Some(start)
                        || v["state_dir"].as_str().map(Path::new) == Some(&state)
                });
            if ours {
                let _ = std::fs::remove_file(l);
            }
        }
    }
}

pub fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// `quiesce verify ... -- echo scored` let its command run: it printed "scored". A failure shows
/// `what` (which verify), and verify's exit code, output and refusal.
#[track_caller]
pub fn assert_scored(out: &Output, what: &str) {
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "scored",
        "{what}: verify did not run the command (exit {:?}): {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// A Kubernetes Secret volume in `d`: `fill` writes `files` into the real directory
/// `..2026_11_30_x`; each is made 0400 (defaultMode) and reached as `FILE -> ..data/FILE`,
/// `..data -> ..2026_11_30_x`; the volume root is sticky and world-writable, as Kubernetes makes
/// it, the rest root's and 0755. Returns the volume.
pub fn secret_volume(d: &Path, files: &[&str], fill: impl FnOnce(&Path)) -> PathBuf {
    use std::os::unix::fs::symlink;
    let vol = d.join("secret");
    let real = vol.join("..2026_11_30_x");
    std::fs::create_dir_all(&real).unwrap();
    chmod(d, 0o755);
    chmod(&vol, 0o1777);
    fill(&real);
    chmod(&real, 0o755);
    for f in files {
        chmod(&real.join(f), 0o400);
        symlink(format!("..data/{f}"), vol.join(f)).unwrap();
    }
    symlink("..2026_11_30_x", vol.join("..data")).unwrap();
    vol
}

pub fn chmod(p: &Path, m: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
}

/// A pids cgroup of the test's own (cgroup v1's pids hierarchy or v2's), removed when dropped,
/// once the namespace inside it has ended.
pub struct PidsCgroup(pub PathBuf);

impl PidsCgroup {
    pub fn new(tag: &str, max: u32) -> Option<PidsCgroup> {
        let v1 = Path::new("/sys/fs/cgroup/pids");
        let v2 = Path::new("/sys/fs/cgroup");
        let base = if v1.join("cgroup.procs").exists() {
            v1
        } else if read(&v2.join("cgroup.subtree_control")).split_whitespace().any(|c| c == "pids") {
            v2
        } else {
            return None;
        };
        let dir = base.join(format!("quiesce-test-{tag}-{}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        let g = PidsCgroup(dir);
        std::fs::write(g.0.join("pids.max"), max.to_string()).ok()?;
        Some(g)
    }

    pub fn current(&self) -> u32 {
        read(&self.0.join("pids.current")).trim().parse().unwrap_or(0)
    }

    /// A shell prefix (`sh -c THIS sh CMD...`) that moves itself into the cgroup, then execs CMD.
    pub fn enter(&self) -> String {
        format!("echo $$ > {} && exec \"$@\"", self.0.join("cgroup.procs").display())
    }
}

impl Drop for PidsCgroup {
    fn drop(&mut self) {
        // Its last tasks are released a little after the namespace's PID 1 is reaped.
        let until = Instant::now() + Duration::from_secs(10);
        while std::fs::remove_dir(&self.0).is_err() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

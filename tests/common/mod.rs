//! Test harness: the real binary as PID 1 of a fresh PID namespace, real processes, real UIDs.
//! Every container is ended by killing its PID 1, which ends the whole namespace.
#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub fn quiesce() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_quiesce"))
}

pub fn adversary() -> PathBuf {
    quiesce().parent().unwrap().join("examples").join("adversary")
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A scratch directory anyone may write in (sandbox UIDs create ready files there).
pub fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "quiesce-t-{}-{}-{}",
        tag,
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
    d
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

pub struct Container {
    unshare: Child,
    /// PID 1 of the namespace, as the host sees it.
    pub init: i32,
    pub dir: PathBuf,
    pub state: PathBuf,
    exited: Option<ExitStatus>,
}

pub struct Opts<'a> {
    pub init_args: Vec<&'a str>,
    pub stdout: Stdio,
    pub stdin: Stdio,
    pub env: Vec<(&'a str, String)>,
    /// A command that execs `unshare ...` (e.g. setpriv dropping a capability).
    pub prefix: Vec<&'a str>,
    /// PID 1 of the namespace is a shell that starts the init in the background and forwards
    /// nothing, as a pod's pause process or a wrapper script would.
    pub shell_pid1: bool,
    /// A command that runs the init (e.g. setpriv dropping capabilities); it must exec it.
    pub wrap: Vec<&'a str>,
}

impl Default for Opts<'_> {
    fn default() -> Self {
        Opts {
            init_args: vec![],
            stdout: Stdio::null(),
            stdin: Stdio::null(),
            env: vec![],
            prefix: vec![],
            shell_pid1: false,
            wrap: vec![],
        }
    }
}

impl Container {
    /// `quiesce --state-dir DIR/state INIT_ARGS -- CMD` as PID 1 of a new PID namespace.
    pub fn start(init_args: &[&str], cmd: &[&str]) -> Container {
        Container::start_with(Opts { init_args: init_args.to_vec(), ..Default::default() }, cmd)
    }

    pub fn start_with(o: Opts, cmd: &[&str]) -> Container {
        let dir = scratch("ctr");
        let state = dir.join("state");
        let mut c = match o.prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg("unshare");
                c
            }
            None => Command::new("unshare"),
        };
        c.args(["--pid", "--fork", "--mount-proc", "--kill-child"]);
        if o.shell_pid1 {
            c.args(["sh", "-c", "\"$@\" & wait", "sh"]);
        }
        c.args(&o.wrap)
            .arg(quiesce())
            .arg("--state-dir")
            .arg(&state)
            .args(&o.init_args)
            .arg("--")
            .args(cmd)
            .env("ADV", adversary())
            .env("Q", quiesce())
            .env("D", &dir)
            .stdin(o.stdin)
            .stdout(o.stdout)
            .stderr(Stdio::inherit());
        for (k, v) in &o.env {
            c.env(k, v);
        }
        let mut unshare = c.spawn().expect("spawn unshare");
        let upid = unshare.id();
        let mut init = 0;
        wait_for("the init to start", Duration::from_secs(10), || {
            // A command that ends at once may take its init along before we look.
            if matches!(unshare.try_wait(), Ok(Some(_))) {
                return true;
            }
            let kids =
                |p: &str| std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap_or_default();
            let mut k = kids(&upid.to_string()).split_whitespace().next().map(str::to_string);
            if o.shell_pid1 {
                k = k.and_then(|sh| kids(&sh).split_whitespace().next().map(str::to_string));
            }
            if let Some(k) = k {
                let comm = std::fs::read_to_string(format!("/proc/{k}/comm")).unwrap_or_default();
                if comm.trim() == "quiesce" {
                    init = k.parse().unwrap();
                    return true;
                }
            }
            false
        });
        let exited = unshare.try_wait().ok().flatten();
        Container { unshare, init, dir, state, exited }
    }

    /// Run a command inside the namespace, as `docker exec` would (root unless wrapped).
    pub fn exec(&self, args: &[&str]) -> Output {
        self.exec_cmd(args).output().expect("nsenter")
    }

    /// Like `docker exec`: join the namespace's PID and mount namespaces, fork, and have the
    /// outside parent wait for the inside child without mirroring its stops (nsenter mirrors
    /// them, which a freeze would turn into a stopped waiter that never reaps).
    pub fn exec_cmd(&self, args: &[&str]) -> Command {
        use std::os::unix::process::CommandExt;
        let mut c = Command::new(args[0]);
        c.args(&args[1..]);
        c.env("ADV", adversary()).env("Q", quiesce()).env("D", &self.dir);
        let pidns = std::ffi::CString::new(format!("/proc/{}/ns/pid", self.init)).unwrap();
        let mntns = std::ffi::CString::new(format!("/proc/{}/ns/mnt", self.init)).unwrap();
        unsafe {
            c.pre_exec(move || {
                for (path, kind) in [(&pidns, libc::CLONE_NEWPID), (&mntns, libc::CLONE_NEWNS)] {
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

    /// Start a workload as `uid` through `quiesce exec`, and wait until it says it is ready.
    pub fn launch(&self, uid: u32, args: &[&str]) -> Guard {
        self.launch_with(uid, &[], args)
    }

    pub fn launch_with(&self, uid: u32, exec_args: &[&str], args: &[&str]) -> Guard {
        self.launch_bin(uid, exec_args, adversary().to_str().unwrap(), args)
    }

    /// Like `launch`, with `quiesce exec` options and another binary (e.g. a setuid copy).
    pub fn launch_bin(&self, uid: u32, exec_args: &[&str], bin: &str, args: &[&str]) -> Guard {
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let ready = self.dir.join(format!("ready-{n}"));
        let uid_s = uid.to_string();
        let q = quiesce();
        let mut full: Vec<&str> = vec![q.to_str().unwrap(), "exec", "--user", &uid_s];
        full.extend_from_slice(exec_args);
        full.push("--");
        full.push(bin);
        full.extend_from_slice(args);
        let mut c = self.exec_cmd(&full);
        c.env("ADV_READY", &ready).stdin(Stdio::null()).stdout(Stdio::null());
        let child = Guard(c.spawn().expect("launch"));
        wait_for(&format!("workload {args:?} to be ready"), Duration::from_secs(30), || ready.exists());
        child
    }

    pub fn signal(&self, sig: i32) {
        unsafe { libc::kill(self.init, sig) };
    }

    /// `quiesce freeze --wait --json` from inside; returns (exit code, status JSON).
    pub fn freeze(&self, nonce: &str) -> (i32, serde_json::Value) {
        let st = self.state.to_str().unwrap().to_string();
        let q = quiesce();
        let out = self.exec(&[
            q.to_str().unwrap(),
            "freeze",
            "--state-dir",
            &st,
            "--wait",
            "--json",
            "--nonce",
            nonce,
        ]);
        let v = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
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

    /// Processes of the namespace, as (pid, uid, state, comm), read from the host side.
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

    pub fn status_file(&self) -> serde_json::Value {
        std::fs::read(self.state.join("status.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(serde_json::Value::Null)
    }

    pub fn marker_exists(&self) -> bool {
        self.state.join("quiescence.jws").exists()
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
        self.unshare.try_wait().unwrap().is_none()
    }

    pub fn take_stdout(&mut self) -> Option<std::process::ChildStdout> {
        self.unshare.stdout.take()
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if self.exited.is_none() {
            // Killing PID 1 ends every process of the namespace.
            unsafe { libc::kill(self.init, libc::SIGKILL) };
            let _ = self.unshare.kill();
            let _ = self.unshare.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

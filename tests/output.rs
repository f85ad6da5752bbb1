//! The init's output can never stall it: a terminal whose output the command stopped
//! (`tcflow(TCOOFF)`, as under `docker run -t`), and a pipe nobody reads.

mod common;
use common::*;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the init may take to answer; far above what it needs, far below "forever".
const BOUND: Duration = Duration::from_secs(20);

/// The real binary as PID 1 of a new PID namespace, with the stdio the test gives it.
struct Init {
    unshare: Child,
    pid: i32,
    dir: Scratch,
    state: PathBuf,
    exited: Option<ExitStatus>,
}

impl Init {
    /// `stdio`: the init's stdin, stdout, stderr (the command inherits them). `ctty`: make stdin
    /// the session's controlling terminal first, as a container engine does with `-t`.
    fn start(args: &[&str], cmd: &[&str], stdio: [Stdio; 3], ctty: bool) -> Init {
        let dir = scratch("out");
        let state = dir.join("state");
        let mut c = Command::new("unshare");
        c.args(["--pid", "--fork", "--mount-proc", "--kill-child"])
            .arg(quiesce())
            .arg("--state-dir")
            .arg(&state)
            .args(args)
            .arg("--")
            .args(cmd);
        Init::launch(c, dir, state, stdio, ctty)
    }

    /// Start `c` (which makes the namespace and ends up exec'ing the init) in `dir`.
    fn launch(mut c: Command, dir: Scratch, state: PathBuf, stdio: [Stdio; 3], ctty: bool) -> Init {
        let [i, o, e] = stdio;
        c.env("ADV_READY", dir.join("ready")).env("Q", quiesce()).stdin(i).stdout(o).stderr(e);
        if ctty {
            unsafe {
                c.pre_exec(|| {
                    if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let unshare = c.spawn().expect("spawn unshare");
        let upid = unshare.id();
        let mut pid = 0;
        wait_for("the init to start", BOUND, || {
            let kids = read(&PathBuf::from(format!("/proc/{upid}/task/{upid}/children")));
            if let Some(k) = kids.split_whitespace().next() {
                if read(&PathBuf::from(format!("/proc/{k}/comm"))).trim() == "quiesce" {
                    pid = k.parse().unwrap();
                    return true;
                }
            }
            false
        });
        let init = Init { unshare, pid, dir, state, exited: None };
        wait_for("the command to be ready", BOUND, || init.dir.join("ready").exists());
        init
    }

    fn signal(&self, sig: i32) {
        unsafe { libc::kill(self.pid, sig) };
    }

    /// `quiesce freeze --wait` from inside the namespace, bounded by its own --timeout.
    fn freeze(&self) -> (i32, String) {
        let out = Command::new("nsenter")
            .args(["-t", &self.pid.to_string(), "-p", "-m", "--"])
            .arg(quiesce())
            .arg("freeze")
            .arg("--state-dir")
            .arg(&self.state)
            .args(["--wait", "--timeout", "15"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn wait(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let until = Instant::now() + timeout;
        while self.exited.is_none() && Instant::now() < until {
            self.exited = self.unshare.try_wait().unwrap();
            std::thread::sleep(Duration::from_millis(10));
        }
        self.exited
    }

    /// SIGTERM ends the init, within the bound.
    fn terminate(&mut self) {
        self.signal(libc::SIGTERM);
        assert!(self.wait(BOUND).is_some(), "SIGTERM did not end the init within {BOUND:?}");
    }
}

impl Drop for Init {
    fn drop(&mut self) {
        if self.exited.is_none() {
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
            let _ = self.unshare.kill();
            let _ = self.unshare.wait();
        }
    }
}

fn openpty() -> (OwnedFd, OwnedFd) {
    let (mut m, mut s) = (0, 0);
    let r =
        unsafe { libc::openpty(&mut m, &mut s, std::ptr::null_mut(), std::ptr::null(), std::ptr::null()) };
    assert_eq!(r, 0, "openpty: {}", std::io::Error::last_os_error());
    unsafe { (OwnedFd::from_raw_fd(m), OwnedFd::from_raw_fd(s)) }
}

fn stdio(fd: &OwnedFd) -> Stdio {
    Stdio::from(fd.try_clone().unwrap())
}

/// Everything the master side shows, collected by a thread until the terminal closes.
fn collect(master: OwnedFd) -> Arc<Mutex<String>> {
    let seen = Arc::new(Mutex::new(String::new()));
    let s = seen.clone();
    std::thread::spawn(move || {
        let mut f = std::fs::File::from(master);
        let mut buf = [0u8; 4096];
        while let Ok(n) = f.read(&mut buf) {
            if n == 0 {
                break;
            }
            s.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    seen
}

/// The init and its command on one terminal; the command stops its output (TCOOFF).
fn on_a_stopped_terminal(slave: &OwnedFd) -> Init {
    let adv = adversary();
    Init::start(
        &["-vv", "--sandbox-user", "4261"],
        &[adv.to_str().unwrap(), "tcooff"],
        [stdio(slave), stdio(slave), stdio(slave)],
        true,
    )
}

#[test]
fn a_terminal_the_command_stopped_does_not_stall_the_init() {
    let (_master, slave) = openpty();
    let mut init = on_a_stopped_terminal(&slave);
    // Nobody reads the master, and output is stopped: every log line of the freeze must go
    // somewhere that cannot block.
    let (code, out) = init.freeze();
    assert_eq!(code, 0, "the freeze did not complete: {out}");
    assert!(out.starts_with("quiescent"), "{out}");
    init.terminate();
}

#[test]
fn a_terminal_started_again_gets_the_count_of_dropped_lines() {
    let (master, slave) = openpty();
    let seen = collect(master);
    let mut init = on_a_stopped_terminal(&slave);
    let (code, out) = init.freeze();
    assert_eq!(code, 0, "the freeze did not complete: {out}");
    assert!(!seen.lock().unwrap().contains("freeze requested"), "output was stopped");
    assert_eq!(unsafe { libc::tcflow(slave.as_raw_fd(), libc::TCOON) }, 0);
    // The next line says first how many were dropped.
    let (code, out) = init.freeze();
    assert_eq!(code, 0, "{out}");
    wait_for("the count of dropped lines", BOUND, || seen.lock().unwrap().contains("log lines dropped"));
    init.terminate();
}

fn fionread(fd: &OwnedFd) -> i32 {
    let mut n: libc::c_int = 0;
    assert_eq!(unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut n) }, 0);
    n
}

/// Fill `r`'s other end, the init's stderr, with the init's own debug lines (one per forwarded
/// SIGWINCH) until at least `full_at` bytes wait and no more line fits (a pipe fills page by
/// page and a socket counts each send's overhead, so some bytes stay free), and more were
/// logged than it took.
fn fill(init: &Init, r: &OwnedFd, full_at: i32) {
    let (mut last, mut unchanged, mut sent) = (0, 0, 0);
    while !(last >= full_at && unchanged >= 500) {
        init.signal(libc::SIGWINCH);
        sent += 1;
        assert!(sent < 200_000, "the output did not fill: {last} bytes");
        std::thread::sleep(Duration::from_micros(200));
        let n = fionread(r);
        unchanged = if n == last { unchanged + 1 } else { 0 };
        last = n;
    }
}

/// Drain `r`; the next lines report what was dropped.
fn dropped_lines_are_reported(init: &Init, r: OwnedFd) {
    assert_eq!(unsafe { libc::fcntl(r.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) }, 0);
    let mut f = std::fs::File::from(r);
    let mut buf = vec![0u8; 1 << 20];
    let mut later = String::new();
    wait_for("the count of dropped lines", BOUND, || {
        init.signal(libc::SIGWINCH);
        while let Ok(n) = f.read(&mut buf) {
            if n == 0 {
                break;
            }
            later.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        later.contains("log lines dropped")
    });
}

/// The init's stderr is `w`, whose other end `r` nobody reads: fill it, freeze, see the count
/// of dropped lines once it is drained; SIGTERM ends the init.
fn full_output_does_not_stall_the_init(r: OwnedFd, w: OwnedFd, full_at: i32) {
    let mut init = Init::start(
        &["-vv", "--sandbox-user", "4262"],
        &["sh", "-c", "touch \"$ADV_READY\"; exec sleep 1000000"],
        [Stdio::null(), Stdio::null(), Stdio::from(w)],
        false,
    );
    fill(&init, &r, full_at);
    let (code, out) = init.freeze();
    assert_eq!(code, 0, "the freeze did not complete: {out}");
    dropped_lines_are_reported(&init, r);
    init.terminate();
}

#[test]
fn a_pipe_nobody_reads_does_not_stall_the_init() {
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    assert!(unsafe { libc::fcntl(r.as_raw_fd(), libc::F_GETPIPE_SZ) } >= 65536);
    full_output_does_not_stall_the_init(r, w, 60_000);
}

#[test]
fn a_socket_nobody_reads_does_not_stall_the_init() {
    // As journald's stream socket or a log agent's would be.
    let mut fds = [0; 2];
    let r = unsafe {
        libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr())
    };
    assert_eq!(r, 0);
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // Each small send costs the socket far more than its bytes: it is full at about 10 KiB.
    full_output_does_not_stall_the_init(r, w, 4096);
}

#[test]
fn a_pipe_nobody_reads_does_not_stall_an_init_that_cannot_reopen_stderr() {
    // Without /proc stderr cannot be re-opened: a thread of the init's own then writes, and
    // the init never waits.
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let dir = scratch("noproc");
    let state = dir.join("state");
    let mut c = Command::new("unshare");
    c.args(["--mount", "--pid", "--fork", "--kill-child", "sh", "-c"]).arg(
        "mount -t tmpfs tmpfs /proc && exec \"$Q\" -vv -- sh -c 'touch \"$ADV_READY\"; exec sleep 1000000'",
    );
    let mut init = Init::launch(c, dir, state, [Stdio::null(), Stdio::null(), Stdio::from(w)], false);
    fill(&init, &r, 60_000);
    // With the pipe still full, SIGTERM is handled: forwarded to the command, which ends.
    init.terminate();
    drop(r);
}

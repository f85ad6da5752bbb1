//! Freeze requests: which signals may ask for one, and that every request gets its own answer.

mod common;
use common::*;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

#[test]
fn freeze_signals_a_sandbox_or_job_control_can_send_are_refused() {
    for sig in ["CONT", "SIGTSTP", "TTIN", "TTOU", "CHLD", "KILL", "STOP", "18", "32"] {
        let d = scratch("sig");
        let out = Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "--kill-child"])
            .arg(quiesce())
            .arg("--state-dir")
            .arg(d.join("state"))
            .args(["--sandbox-user", "4242", "--freeze-signal", sig, "--", "echo", "ran"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{sig}: {err}");
        assert!(out.stdout.is_empty(), "{sig}: the command ran");
        assert_eq!(err.lines().count(), 1, "{sig}: {err}");
        assert!(err.contains("--freeze-signal") && err.contains("use USR1"), "{sig}: {err}");
        std::fs::remove_dir_all(d).unwrap();
    }
    // The client refuses them too, before writing any request.
    let out = Command::new(quiesce()).args(["freeze", "--freeze-signal", "CONT"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    // USR2 and real-time signals are fine.
    for sig in ["USR2", "RTMIN+3"] {
        // Ready once it has published its sandbox (a freeze asked for earlier finds no results/).
        let mut c = sandbox(4242, &["--freeze-signal", sig]);
        let st = c.state.to_str().unwrap().to_string();
        let q = quiesce();
        let out =
            c.exec(&[q.to_str().unwrap(), "freeze", "--state-dir", &st, "--wait", "--freeze-signal", sig]);
        assert_eq!(out.status.code(), Some(0), "{sig}: {}", String::from_utf8_lossy(&out.stderr));
        c.signal(libc::SIGTERM);
        c.wait_code(T);
    }
}

/// `quiesce freeze --wait --json --nonce NONCE`, started and left running.
fn client(c: &Container, nonce: &str) -> Child {
    let mut cmd = c.freeze_cmd(nonce, Some(20));
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.spawn().unwrap()
}

/// The client's exit code and the status it printed.
fn result(ch: Child) -> (i32, serde_json::Value) {
    let out = ch.wait_with_output().unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (out.status.code().unwrap_or(-1), v)
}

/// Some file of the state dir (or a directory in it) holds a request carrying `nonce`.
fn request_written(state: &Path, nonce: &str) -> bool {
    let needle = format!("\"nonce\":\"{nonce}\"");
    let mut dirs = vec![state.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if read(&p).contains(&needle) {
                return true;
            }
        }
    }
    false
}

fn own_result(nonce: &str, (code, st): &(i32, serde_json::Value)) {
    assert_eq!(*code, 0, "{nonce}: {st}");
    assert_eq!(st["nonce"], *nonce, "{nonce} got another client's result: {st}");
    assert_eq!(st["state"], "quiescent", "{st}");
}

#[test]
fn back_to_back_freeze_requests_each_get_their_own_result() {
    let mut c = Container::start(&["--sandbox-user", "4243"], &["sleep", "1000000"]);
    let _w = c.launch(4243, &["sleepers", "3"]);
    // The init is held (stopped from outside its namespace) while both clients ask, so that
    // the second request is written before the init reads the first.
    unsafe { libc::kill(c.init, libc::SIGSTOP) };
    let a = client(&c, "first");
    wait_for("the first request", T, || request_written(&c.state, "first"));
    let b = client(&c, "second");
    wait_for("the second request", T, || request_written(&c.state, "second"));
    unsafe { libc::kill(c.init, libc::SIGCONT) };
    let (ra, rb) = (result(a), result(b));
    own_result("first", &ra);
    own_result("second", &rb);
    assert_ne!(ra.1["request_id"], rb.1["request_id"]);
    assert_ne!(ra.1["id"], rb.1["id"], "one freeze per request");
    // Requests are taken away; results stay for their clients.
    assert_eq!(std::fs::read_dir(c.state.join("requests")).unwrap().count(), 0);
    let results = std::fs::read_dir(c.state.join("results")).unwrap().count();
    assert_eq!(results, 2);
    c.signal(libc::SIGTERM);
    c.wait_code(T);
}

#[test]
fn concurrent_freeze_requests_each_get_their_own_result() {
    let mut c = Container::start(&["--sandbox-user", "4244"], &["sleep", "1000000"]);
    let _w = c.launch(4244, &["sleepers", "3"]);
    let nonces: Vec<String> = (0..6).map(|i| format!("client-{i}")).collect();
    let kids: Vec<Child> = nonces.iter().map(|n| client(&c, n)).collect();
    for (n, k) in nonces.iter().zip(kids) {
        own_result(n, &result(k));
    }
    c.signal(libc::SIGTERM);
    c.wait_code(T);
}

#[test]
fn a_bare_signal_freezes_once_with_no_nonce() {
    let mut c = Container::start(&["--sandbox-user", "4245"], &["sleep", "1000000"]);
    let _w = c.launch(4245, &["sleepers", "3"]);
    // As `docker kill -s USR1` does: a signal from outside the namespace, no request file.
    c.signal(libc::SIGUSR1);
    wait_for("the bare freeze", T, || c.status_file()["state"] == "quiescent");
    let st = c.status_file();
    assert!(st["nonce"].is_null() && st["request_id"].is_null(), "{st}");
    assert_eq!(std::fs::read_dir(c.state.join("results")).unwrap().count(), 0);
    c.signal(libc::SIGTERM);
    c.wait_code(T);
}

#[test]
fn freeze_finds_the_init_when_a_shell_is_pid_1() {
    // A shell as PID 1 that forwards nothing, as a pod's pause process: `quiesce freeze` must
    // reach the init through the pid it published, not PID 1.
    let uid = 4751;
    let u = uid.to_string();
    let c = Container::start_with(
        Opts { init_args: vec!["--sandbox-user", &u], shell_pid1: true, ..Default::default() },
        &["sleep", "1000000"],
    );
    let _w = c.launch(uid, &["sleepers", "20"]);
    let (code, st) = c.freeze("n-1");
    assert_eq!(code, 0, "{st}");
    assert_eq!(st["state"], "quiescent");
    assert_eq!(st["killed"], 21, "{st}");
    let out = c.verify(&["--nonce", "n-1", "--", "echo", "scored"]);
    assert_scored(&out, "verify with the freeze's nonce");
}

// The state dir in a parent anyone may write in (a Kubernetes emptyDir is 0777): the sandbox
// user renames the state dir away and puts its own directory or a link under the name. The
// intake and the client must go on working with the directory the init opened, and touch
// nothing at the path.

/// `args` run on the host as `uid` with no groups: the sandbox user's moves.
fn as_agent(uid: u32, args: &[&str]) {
    let u = uid.to_string();
    let out =
        output(Command::new("setpriv").args(["--reuid", &u, "--regid", &u, "--clear-groups"]).args(args));
    assert!(out.status.success(), "{args:?} as {uid}: {}", String::from_utf8_lossy(&out.stderr));
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A container whose directory is a 0777 volume (as an emptyDir without the pod's chmod), its
/// init published, a workload of `uid` running.
fn emptydir_container(uid: u32, shell_pid1: bool) -> (Container, Workload) {
    let u: &'static str = Box::leak(uid.to_string().into_boxed_str());
    let c = Container::start_with(
        Opts {
            init_args: vec!["--sandbox-user", u],
            prefix: vec!["sh", "-c", "chmod 0777 \"$D\" && exec \"$@\"", "sh"],
            shell_pid1,
            ..Default::default()
        },
        &["sleep", "1000000"],
    );
    wait_for("the init's sandbox.json", T, || c.state.join("sandbox.json").exists());
    let w = c.launch(uid, &["sleepers", "2"]);
    (c, w)
}

/// Files of root's under `dir/sub`, as a directory of root's the link may point at holds.
fn root_files(dir: &Path, sub: &str, n: usize) {
    let d = dir.join(sub);
    std::fs::create_dir_all(&d).unwrap();
    for i in 0..n {
        let f = d.join(format!("{i:032x}.json"));
        std::fs::write(&f, "{}").unwrap();
        let t = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + i as u64);
        std::fs::File::options().write(true).open(&f).unwrap().set_modified(t).unwrap();
    }
}

fn count(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|r| r.count()).unwrap_or(0)
}

/// A pipe whose buffer is full: whoever gets its write end as stderr blocks at its first message
/// until the read end is drained.
fn full_pipe() -> (std::fs::File, std::os::fd::OwnedFd) {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    let (r, w) = unsafe { (std::fs::File::from_raw_fd(fds[0]), std::os::fd::OwnedFd::from_raw_fd(fds[1])) };
    assert_eq!(unsafe { libc::fcntl(fds[1], libc::F_SETFL, libc::O_NONBLOCK) }, 0);
    for chunk in [4096, 1] {
        let buf = vec![b'.'; chunk];
        // Bounded: a pipe holds at most 1 MiB unless raised by hand.
        for _ in 0..(1 << 20) {
            if unsafe { libc::write(fds[1], buf.as_ptr() as *const libc::c_void, chunk) } < 0 {
                assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EAGAIN));
                break;
            }
        }
    }
    assert_eq!(unsafe { libc::fcntl(fds[1], libc::F_SETFL, 0) }, 0);
    (r, w)
}

/// `pid` holds a descriptor of `dir` and sits in write(2) on its stderr.
fn blocked_on_stderr_holding(pid: u32, dir: &Path) -> bool {
    let holds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l == dir));
    let call = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
    holds && call.starts_with(&format!("{} 0x2 ", libc::SYS_write))
}

/// 1. The init clears what an earlier init left in requests/ and results/ through the state dir
///    it opened: a link put in its place between the open and the clearing leads nowhere.
#[test]
fn stale_intake_is_cleared_in_the_opened_state_dir_not_at_the_path() {
    let uid = 4761;
    let u = uid.to_string();
    let d = scratch("intake-stale");
    let vol = d.join("vol");
    std::fs::create_dir(&vol).unwrap();
    chmod(&vol, 0o777);
    let (state, moved, victim) = (vol.join("state"), vol.join("moved"), d.join("victim"));
    for f in ["requests/old/deeper/f", "requests/0000", "results/0.json"] {
        let p = state.join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, "stale").unwrap();
    }
    chmod(&state, 0o755);
    root_files(&victim, "requests", 3);
    root_files(&victim, "results", 3);
    let (r, w) = full_pipe();
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc", "--kill-child"])
        .arg(quiesce())
        .arg("--state-dir")
        .arg(&state)
        .args(["--sandbox-user", &u, "--", "sleep", "1000000"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(w));
    let init = guard(cmd);
    let upid = init.0.id();
    // Its first message is the warning about the 0777 parent, said once the state dir is open
    // and before the stale intake is cleared: the full pipe holds the init right there.
    wait_for("the init holding its state dir, blocked on stderr", T, || {
        let kids = std::fs::read_to_string(format!("/proc/{upid}/task/{upid}/children")).unwrap_or_default();
        kids.split_whitespace().filter_map(|k| k.parse().ok()).any(|k| blocked_on_stderr_holding(k, &state))
    });
    as_agent(uid, &["mv", s(&state), s(&moved)]);
    as_agent(uid, &["ln", "-s", s(&victim), s(&state)]);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut r = r;
        let mut all = Vec::new();
        let _ = std::io::Read::read_to_end(&mut r, &mut all);
        let _ = tx.send(all);
    });
    wait_for("sandbox.json in the moved state dir", T, || moved.join("sandbox.json").exists());
    assert_eq!(count(&victim.join("requests")), 3, "the init cleared requests/ through the planted link");
    assert_eq!(count(&victim.join("results")), 3, "the init cleared results/ through the planted link");
    assert_eq!(count(&moved.join("requests")), 0, "the stale requests/ (nested) was not cleared");
    assert_eq!(count(&moved.join("results")), 0, "the stale results/ was not cleared");
    drop(init);
    let err = rx.recv_timeout(T).expect("the init's stderr closes once its namespace ends");
    let err = String::from_utf8_lossy(&err);
    assert!(err.contains("rename the state dir"), "{}", err.trim_start_matches('.'));
}

/// 2. Requests are listed through the opened state dir: the sandbox user's directory at the path
///    neither hides a client's request nor feeds the init names of its own.
#[test]
fn requests_are_listed_in_the_opened_state_dir_not_at_the_path() {
    let uid = 4762;
    let (mut c, _w) = emptydir_container(uid, false);
    let (state, moved) = (c.state.clone(), c.path("moved"));
    as_agent(uid, &["mv", s(&state), s(&moved)]);
    let forged = "00000000000000010000000000000001";
    as_agent(
        uid,
        &[
            "sh",
            "-c",
            "mkdir -p \"$1/requests\" && printf '{\"nonce\":\"forged\",\"request_id\":\"%s\"}' \"$2\" > \"$1/requests/$2\"",
            "sh",
            s(&state),
            forged,
        ],
    );
    // A client that opened the state dir before the move writes its request there, and
    // signals the init itself (a request is taken only on its own client's signal).
    let script = r#"id=$(printf '%016x%08x%08x' 2 $$ 2)
printf '{"nonce":"n-real","request_id":"%s","pid":%d}' "$id" $$ > "$1/requests/.tmp" &&
mv "$1/requests/.tmp" "$1/requests/$id" && echo "$id" && kill -USR1 1"#;
    let out = c.exec(&["sh", "-c", script, "sh", s(&moved)]);
    assert!(out.status.success(), "{out:?}");
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let status = moved.join("status.json");
    wait_for("a finished freeze", T, || {
        serde_json::from_str::<serde_json::Value>(&read(&status))
            .is_ok_and(|v| v["state"] == "quiescent" || v["state"] == "failed")
    });
    let st: serde_json::Value = serde_json::from_str(&read(&status)).unwrap();
    assert_eq!(st["nonce"], "n-real", "the request in the opened state dir was not taken: {st}");
    // The result is written after the status.
    let answer = moved.join("results").join(format!("{id}.json"));
    wait_for("the request's result", T, || answer.exists());
    let res: serde_json::Value = serde_json::from_str(&read(&answer)).unwrap_or_default();
    assert_eq!((res["state"].as_str(), res["nonce"].as_str()), (Some("quiescent"), Some("n-real")), "{res}");
    assert!(!moved.join("results").join(format!("{forged}.json")).exists(), "a forged name was answered");
    assert_eq!(count(&state.join("requests")), 1, "the init touched the sandbox user's directory");
    c.signal(libc::SIGTERM);
    c.wait_code(T);
}

/// 3. Old results are pruned through the opened state dir: when a link to a directory of root's
///    is put at the path while a `quiesce freeze` request is being taken, the answer's pruning
///    deletes nothing there, and a client at the path refuses rather than report success.
#[test]
fn results_are_pruned_in_the_opened_state_dir_not_at_the_path() {
    let uid = 4763;
    let (mut c, _w) = emptydir_container(uid, false);
    let (state, moved, victim) = (c.state.clone(), c.path("moved"), c.path("victim"));
    root_files(&victim, "results", 70);
    root_files(&state, "results", 70);
    let (st, mv, vi) = (state.clone(), moved.clone(), victim.clone());
    let swap = move || {
        as_agent(uid, &["mv", s(&st), s(&mv)]);
        as_agent(uid, &["ln", "-s", s(&vi), s(&st)]);
    };
    let init = c.init;
    let Some((stop, held)) = hold_first_open(&state.join("requests"), move |p| p == init, swap) else {
        skip("results_are_pruned_in_the_opened_state_dir_not_at_the_path", "fanotify is not available here");
        return;
    };
    let q = quiesce();
    let client = |dir: &Path, nonce: &str| {
        c.exec(&[
            s(&q),
            "freeze",
            "--state-dir",
            s(dir),
            "--wait",
            "--json",
            "--timeout",
            "20",
            "--nonce",
            nonce,
        ])
    };
    // The init is held as it reads the request it took; the swap runs then.
    let out = client(&state, "n-held");
    let _ = stop.send(());
    assert!(held.join().unwrap(), "the init read no request in the held directory");
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    // The init prunes right after it wrote the result the client saw.
    wait_for("the prune after the answer", T, || {
        count(&victim.join("results")) < 70 || count(&moved.join("results")) <= 64
    });
    assert_eq!(count(&victim.join("results")), 70, "the init pruned the directory the link points at");
    assert_eq!(out.status.code(), Some(0), "{st} {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(st["nonce"], "n-held");
    assert_eq!(count(&moved.join("results")), 64, "the opened state dir's results were not pruned");
    assert!(moved.join("results").join(format!("{}.json", st["request_id"].as_str().unwrap())).exists());
    let out = client(&state, "n-path");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "the client used the linked state dir: {err}");
    assert!(out.stdout.is_empty(), "the client printed a status: {err}");
    assert!(err.contains(s(&state)) && err.contains("symlink") && err.lines().count() == 1, "{err}");
    assert_eq!(count(&victim.join("results")), 70);
    c.signal(libc::SIGTERM);
    c.wait_code(T);
}

/// Every open of a file in `dir` waits for this test's word (fanotify permission events); the
/// first one by a process `by` picks (host pids) runs `first` before it goes on.
/// None: fanotify is not available here.
fn hold_first_open(
    dir: &Path,
    by: impl Fn(i32) -> bool + Send + 'static,
    first: impl FnOnce() + Send + 'static,
) -> Option<(std::sync::mpsc::Sender<()>, std::thread::JoinHandle<bool>)> {
    use std::os::fd::FromRawFd;
    let fan = unsafe {
        libc::fanotify_init(
            libc::FAN_CLASS_CONTENT | libc::FAN_CLOEXEC,
            (libc::O_RDONLY | libc::O_CLOEXEC) as u32,
        )
    };
    if fan < 0 {
        return None;
    }
    let fan = unsafe { std::os::fd::OwnedFd::from_raw_fd(fan) };
    let path = std::ffi::CString::new(s(dir)).unwrap();
    let mask = libc::FAN_OPEN_PERM | libc::FAN_EVENT_ON_CHILD;
    let r = unsafe {
        use std::os::fd::AsRawFd;
        libc::fanotify_mark(fan.as_raw_fd(), libc::FAN_MARK_ADD, mask, libc::AT_FDCWD, path.as_ptr())
    };
    assert_eq!(r, 0, "fanotify_mark {}: {}", dir.display(), std::io::Error::last_os_error());
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let h = std::thread::spawn(move || {
        use std::os::fd::AsRawFd;
        let mut first = Some(first);
        let until = std::time::Instant::now() + Duration::from_secs(120);
        let mut buf = vec![0u8; 4096];
        let size = std::mem::size_of::<libc::fanotify_event_metadata>();
        while rx.try_recv().is_err() && std::time::Instant::now() < until {
            let mut pfd = libc::pollfd { fd: fan.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            if unsafe { libc::poll(&mut pfd, 1, 50) } <= 0 {
                continue;
            }
            let n = unsafe { libc::read(fan.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
            let mut off = 0;
            while n > 0 && off + size <= n as usize {
                let m: libc::fanotify_event_metadata =
                    unsafe { std::ptr::read_unaligned(buf[off..].as_ptr() as *const _) };
                if by(m.pid) {
                    if let Some(f) = first.take() {
                        f();
                    }
                }
                let resp = libc::fanotify_response { fd: m.fd, response: libc::FAN_ALLOW };
                unsafe {
                    libc::write(
                        fan.as_raw_fd(),
                        &resp as *const _ as *const libc::c_void,
                        std::mem::size_of::<libc::fanotify_response>(),
                    );
                    libc::close(m.fd);
                }
                off += (m.event_len as usize).max(size);
            }
        }
        // Closing the group lets any open still held go on.
        first.is_none()
    });
    Some((tx, h))
}

/// 4. `quiesce freeze` opens the state dir once and signals the init it names there: a swap
///    after the client opened it neither sends the signal to PID 1 (a shell here, as a pod's
///    pause process) nor loses the answer; and a client that meets the sandbox user's
///    directory at the path refuses it, whatever it says about pids and results.
#[test]
fn the_client_keeps_to_the_state_dir_it_opened() {
    let uid = 4764;
    let (c, w) = emptydir_container(uid, true);
    let (state, moved) = (c.state.clone(), c.path("moved"));
    let (st, mv) = (state.clone(), moved.clone());
    let pid = w.pid;
    let swap = move || {
        as_agent(uid, &["mv", s(&st), s(&mv)]);
        // The sandbox user's own state dir: its own pid as the init, an answer for any request.
        let script = "mkdir -p \"$1/requests\" \"$1/results\" && \
                      printf '{\"uids\":[],\"lineage\":false,\"pid\":%s,\"start_time\":0}' \"$2\" > \"$1/sandbox.json\"";
        as_agent(uid, &["sh", "-c", script, "sh", s(&st), &pid.to_string()]);
    };
    let init = c.init;
    let Some((stop, held)) = hold_first_open(&state.join("requests"), move |p| p != init, swap) else {
        skip("the_client_keeps_to_the_state_dir_it_opened", "fanotify is not available here");
        return;
    };
    // The client is held while it writes its request, after it opened the state dir; the swap
    // runs then.
    let out =
        c.exec(&[s(&quiesce()), "freeze", "--state-dir", s(&state), "--wait", "--json", "--timeout", "10"]);
    let _ = stop.send(());
    assert!(held.join().unwrap(), "the client wrote no request in the held directory");
    assert!(moved.join("sandbox.json").exists() && state.join("sandbox.json").exists(), "no swap");
    let res: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert_eq!(
        (out.status.code(), res["state"].as_str()),
        (Some(0), Some("quiescent")),
        "{res} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answered = moved.join("results").join(format!("{}.json", res["request_id"].as_str().unwrap_or("-")));
    assert!(answered.exists(), "the client's answer is not the init's");
    // The sandbox user's directory at the path is refused, with the pid it names.
    let out =
        c.exec(&[s(&quiesce()), "freeze", "--state-dir", s(&state), "--wait", "--json", "--timeout", "5"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(out.stdout.is_empty(), "a status from the sandbox user's directory was printed: {err}");
    assert!(
        err.contains(s(&state)) && err.contains(&format!("uid {uid}")) && err.lines().count() == 1,
        "{err}"
    );
}

#[test]
fn freeze_json_carries_the_marker_of_its_own_freeze_and_null_when_it_failed() {
    let uid = 4785;
    let c = sandbox(uid, &["--freeze-timeout", "3"]);
    let _w = c.launch(uid, &["sleepers", "3"]);
    let (code, st) = c.freeze("with-marker");
    assert_eq!((code, st["state"].as_str()), (0, Some("quiescent")), "{st}");
    // The marker is the file the freeze signed, names this freeze, and verifies on its own.
    let jws = st["marker"].as_str().unwrap_or_else(|| panic!("no marker in the freeze's JSON: {st}"));
    assert_eq!(jws, read(&c.state.join("quiescence.jws")).trim(), "{st}");
    assert_eq!(c.marker_claims()["jti"], st["id"], "{st}");
    let copy = c.dir.join("marker-from-json.jws");
    std::fs::write(&copy, jws).unwrap();
    let out = c.verify(&["--marker", s(&copy), "--nonce", "with-marker", "--", "echo", "scored"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    // A failed freeze carries the key, as null: /proc hidden by an empty tmpfs fails the walk.
    let out = c.exec(&["mount", "-t", "tmpfs", "none", "/proc"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (code, st) = c.freeze("no-marker");
    assert_eq!(c.exec(&["umount", "/proc"]).status.code(), Some(0));
    assert_eq!((code, st["state"].as_str()), (1, Some("failed")), "{st}");
    assert!(st.as_object().is_some_and(|o| o.contains_key("marker")) && st["marker"].is_null(), "{st}");
}

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
        let mut c =
            Container::start(&["--sandbox-user", "4242", "--freeze-signal", sig], &["sleep", "1000000"]);
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
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "scored",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

//! Faults a host throws at the init, the real binary as PID 1: its state dir's file system full
//! or remounted read-only, the init stopped and continued from outside mid-freeze, /proc
//! replaced under it. For each: the init lives, no marker vouches for a freeze that did not
//! prove its sandbox empty, the failure is bounded and named, and the next freeze works once
//! the fault is gone.

mod common;
use common::*;
use std::path::PathBuf;
use std::time::Duration;

/// The sandbox user of a container of this file; each test its own.
fn container(uid: u32, size_kb: u32) -> Container {
    container_with(uid, size_kb, false)
}

/// `shell_pid1`: the init is not PID 1 (a shell is), as a sidecar or a subreaper runs.
fn container_with(uid: u32, size_kb: u32, shell_pid1: bool) -> Container {
    let u = uid.to_string();
    // Inside the container's own mount namespace: the state dir on a small tmpfs of its own, the
    // init's log in the scratch dir (the host's file system), where a test reads what it said.
    let wrap = format!(
        "mkdir -p \"$D/state\" && mount -t tmpfs -o size={size_kb}k,mode=755 quiesce-state \"$D/state\" \
         && exec \"$@\" 2>>\"$D/init.log\""
    );
    let mut c = Container::start_with(
        Opts {
            init_args: vec!["-v", "--sandbox-user", &u],
            wrap: vec!["sh", "-c", &wrap, "sh"],
            shell_pid1,
            ..Default::default()
        },
        &["sleep", "1000000"],
    );
    wait_for("the init to publish its sandbox", Duration::from_secs(10), || {
        state_file(&c, "sandbox.json").is_some()
    });
    assert!(c.alive(), "the init ended at start: {}", log(&c));
    c
}

/// The state dir as the init sees it (its mount namespace), read from the host.
fn state_path(c: &Container, name: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{}/root{}", c.init, c.state.join(name).display()))
}

fn state_file(c: &Container, name: &str) -> Option<Vec<u8>> {
    std::fs::read(state_path(c, name)).ok()
}

fn log(c: &Container) -> String {
    std::fs::read_to_string(c.dir.join("init.log")).unwrap_or_default()
}

/// Wait until the init's log says `what`; the log from then on.
fn wait_log(c: &Container, what: &str, within: Duration) -> String {
    let until = std::time::Instant::now() + within;
    while !log(c).contains(what) {
        assert!(
            std::time::Instant::now() < until,
            "the init did not log '{what}' within {within:?}: {}",
            log(c)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    log(c)
}

fn quiescent(c: &Container, uid: u32, nonce: &str) {
    let (code, st) = c.freeze(nonce);
    assert_eq!(code, 0, "freeze {nonce}: {st}\n{}", log(c));
    assert_eq!(st["state"], "quiescent", "{st}");
    assert!(c.live_of_uid(uid).is_empty(), "a sandbox process outlived a quiescent freeze");
    assert_scored(&c.verify(&["--nonce", nonce, "--", "echo", "scored"]), nonce);
}

/// In the container's mount namespace, as root.
fn sh(c: &Container, script: &str) {
    let out = c.exec(&["sh", "-c", script]);
    assert!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_full_state_dir_fails_the_freeze_unsigned_and_the_next_one_works() {
    let uid = 4611;
    let mut c = container(uid, 512);
    let _w = c.launch(uid, &["sleepers", "5"]);
    quiescent(&c, uid, "f-1");
    // More processes than the first freeze killed: this marker's evidence needs more room than
    // removing the first one frees.
    let _w = c.launch(uid, &["sleepers", "300"]);
    // Full to the last page; `dd` ends at ENOSPC, which is what this wants.
    let _ = c.exec(&["sh", "-c", "dd if=/dev/zero of=\"$D/state/filler\" bs=4k 2>/dev/null"]);
    // Asked for as `docker kill -s USR1` does: nothing needs writing before it runs.
    c.signal(libc::SIGUSR1);
    let said = wait_log(&c, "cannot write the marker", Duration::from_secs(60));
    assert!(said.contains("No space left on device"), "{said}");
    assert!(c.live_of_uid(uid).is_empty(), "the freeze killed nothing");
    // The first freeze's marker went before any signal; the second's could not be written.
    assert!(state_file(&c, "quiescence.jws").is_none(), "a marker is readable after a failed freeze");
    // Nor is a status that could not be written left to say an earlier state (this freeze's
    // "freezing", or the first one's "quiescent"): it says "failed", or there is none. Which
    // of the two depends on the room the failed marker's write gave back.
    let st: Option<serde_json::Value> =
        state_file(&c, "status.json").and_then(|b| serde_json::from_slice(&b).ok());
    assert!(st.as_ref().is_none_or(|s| s["state"] == "failed"), "a stale status: {st:?}");
    assert_eq!(verify_code(&c), 10, "verify with no marker: {}", log(&c));
    assert!(c.alive(), "the init died of a full state dir");
    sh(&c, "rm \"$D/state/filler\"");
    let _w = c.launch(uid, &["sleepers", "5"]);
    quiescent(&c, uid, "f-3");
}

#[test]
fn a_read_only_state_dir_fails_the_freeze_before_a_signal_and_the_next_one_works() {
    let uid = 4612;
    let mut c = container(uid, 2048);
    let _w = c.launch(uid, &["sleepers", "5"]);
    quiescent(&c, uid, "r-1");
    let w = c.launch(uid, &["sleepers", "5"]);
    sh(&c, "mount -o remount,ro \"$D/state\"");
    c.signal(libc::SIGUSR1);
    let said = wait_log(&c, "cannot remove the old marker", Duration::from_secs(30));
    assert!(said.contains("Read-only file system"), "{said}");
    // The freeze stopped before it sent a signal: the sandbox lives, and the old marker, which
    // a read-only file system keeps, does not let the verifier through.
    assert!(c.live_of_uid(uid).contains(&w.pid), "the sandbox was killed by a freeze that could not sign");
    let out = c.verify(&["--", "echo", "scored"]);
    assert_eq!(
        out.status.code(),
        Some(16),
        "verify beside a live sandbox: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(c.alive(), "the init died of a read-only state dir");
    sh(&c, "mount -o remount,rw \"$D/state\"");
    quiescent(&c, uid, "r-2");
}

#[test]
fn an_init_stopped_and_continued_mid_freeze_ends_the_freeze_truthfully() {
    let uid = 4613;
    let mut c = container(uid, 4096);
    let _w = c.launch(uid, &["sleepers", "500"]);
    c.signal(libc::SIGUSR1);
    // Stopped while it stops, walks or kills, for longer than any of its steps takes here.
    std::thread::sleep(Duration::from_millis(20));
    c.signal(libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(3));
    c.signal(libc::SIGCONT);
    wait_for("the freeze to end", Duration::from_secs(120), || {
        let st: serde_json::Value =
            state_file(&c, "status.json").and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
        matches!(st["state"].as_str(), Some("quiescent" | "failed"))
    });
    let st: serde_json::Value = serde_json::from_slice(&state_file(&c, "status.json").unwrap()).unwrap();
    if st["state"] == "quiescent" {
        assert!(c.live_of_uid(uid).is_empty(), "quiescent beside a live sandbox: {st}");
    } else {
        assert!(state_file(&c, "quiescence.jws").is_none(), "a marker beside a failed freeze: {st}");
    }
    assert!(c.alive(), "the init died of a stop");
    let _w = c.launch(uid, &["sleepers", "5"]);
    quiescent(&c, uid, "s-2");
}

#[test]
fn proc_replaced_under_the_init_does_not_hide_the_sandbox() {
    let uid = 4614;
    let mut c = container(uid, 2048);
    let _w = c.launch(uid, &["sleepers", "5"]);
    // An empty /proc over the real one, in the init's mount namespace: had the init looked
    // through the path, it would see no process and could sign. The sandbox is checked from
    // the host's /proc.
    sh(&c, "mount -t tmpfs -o size=64k fake /proc");
    c.signal(libc::SIGUSR1);
    wait_for("the freeze to end", Duration::from_secs(60), || {
        log(&c).contains("quiescent,") || log(&c).contains("failed")
    });
    let host_alive = host_live_of_uid(&c, uid);
    if log(&c).contains("quiescent,") {
        assert!(host_alive.is_empty(), "quiescent beside {host_alive:?}: {}", log(&c));
    } else {
        assert!(state_file(&c, "quiescence.jws").is_none(), "a marker beside a failed freeze: {}", log(&c));
    }
    assert!(c.alive(), "the init died with /proc replaced");
    sh(&c, "umount /proc");
    let _w = c.launch(uid, &["sleepers", "5"]);
    quiescent(&c, uid, "p-2");
}

/// Live processes of the container's PID namespace with real UID `uid`, from the host's /proc.
fn host_live_of_uid(c: &Container, uid: u32) -> Vec<i32> {
    let ns = std::fs::read_link(format!("/proc/{}/ns/pid", c.init)).expect("the init's pid namespace");
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(h) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        if std::fs::read_link(format!("/proc/{h}/ns/pid")).ok().as_ref() != Some(&ns) {
            continue;
        }
        let Ok(s) = std::fs::read_to_string(format!("/proc/{h}/status")) else { continue };
        let field =
            |k: &str| s.lines().find_map(|l| l.strip_prefix(k)?.strip_prefix(':')?.split_whitespace().next());
        if !matches!(field("State"), None | Some("Z" | "X")) && field("Uid") == Some(uid.to_string().as_str())
        {
            v.push(h);
        }
    }
    v
}

fn verify_code(c: &Container) -> i32 {
    c.verify(&["--", "echo", "scored"]).status.code().unwrap_or(-1)
}

#[test]
fn a_credential_helper_killed_or_stopped_fails_one_freeze_at_most_and_the_next_works() {
    let uid = 4615;
    // Not PID 1: the init signals as the sandbox UID through a helper process, which anything
    // of the host's (or a sandbox process, in its switched instant) can kill or stop.
    let mut c = container_with(uid, 2048, true);
    for (sig, name) in [(libc::SIGKILL, "killed"), (libc::SIGSTOP, "stopped")] {
        let helper = credential_helper(&c);
        assert_eq!(unsafe { libc::kill(helper, sig) }, 0, "signal the credential helper {helper}");
        let _w = c.launch(uid, &["sleepers", "5"]);
        let (code, st) = c.freeze_within(&format!("h-{name}"), Some(60));
        if sig == libc::SIGKILL {
            // Known gone at the freeze's start: replaced before it is asked.
            assert_eq!(code, 0, "helper {name}: {st}\n{}", log(&c));
            assert!(c.live_of_uid(uid).is_empty(), "helper {name}: quiescent beside a live sandbox: {st}");
        } else {
            // Stopped, it is asked and does not answer: this freeze fails, within its bound.
            let why = st["reason"].as_str().unwrap_or_default();
            assert!(why.contains("credential helper"), "helper {name}: {st}\n{}", log(&c));
            assert!(state_file(&c, "quiescence.jws").is_none(), "helper {name}: a marker beside {st}");
        }
        assert!(c.alive(), "the init died of its helper {name}");
        assert_ne!(credential_helper(&c), helper, "the {name} helper is still the one in use");
        let _w = c.launch(uid, &["sleepers", "5"]);
        quiescent(&c, uid, &format!("h-{name}-after"));
    }
}

/// The host pid of the init's credential helper: its child that runs the init's own binary.
fn credential_helper(c: &Container) -> i32 {
    let kids = std::fs::read_dir(format!("/proc/{}/task", c.init))
        .expect("the init's threads")
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|k| k.split_whitespace().filter_map(|p| p.parse::<i32>().ok()).collect::<Vec<_>>());
    let helpers: Vec<i32> = kids
        .filter(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|n| n.trim() == "quiesce"))
        .collect();
    assert_eq!(helpers.len(), 1, "one credential helper: {helpers:?}");
    helpers[0]
}

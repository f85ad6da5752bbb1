//! The adversarial suite: real hostile processes under real UIDs in a real PID namespace.
//! Each test uses its own sandbox UID so that per-UID process limits never mix.

mod common;
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::time::Duration;

/// A container whose command is a root service, with `uid` as the sandbox user.
fn sandbox(uid: u32, extra: &[&str]) -> Container {
    let u = uid.to_string();
    let mut args = vec!["--sandbox-user", &u];
    args.extend_from_slice(extra);
    Container::start(&args, &["sleep", "1000000"])
}

/// Live sandbox processes as `quiesce ps` sees them right now.
fn live_sandbox(c: &Container, uid: u32) -> Vec<String> {
    let q = quiesce();
    let out = c.exec(&[q.to_str().unwrap(), "ps", "--json", "--sandbox-user", &uid.to_string()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ps --json");
    v["processes"]
        .as_array()
        .unwrap()
        .iter()
        // Z and X are dead (X: being reaped right now).
        .filter(|p| p["sandbox"].as_bool() == Some(true) && !matches!(p["state"].as_str(), Some("Z" | "X")))
        .map(|p| format!("{} {} {}", p["pid"], p["state"], p["comm"]))
        .collect()
}

/// Freeze, then demand: quiescent, a marker, zero live sandbox processes, verify passes.
fn freeze_clean(c: &Container, uid: u32) -> serde_json::Value {
    let (code, st) = c.freeze("n-1");
    assert_eq!(code, 0, "freeze failed: {st}");
    assert_eq!(st["state"], "quiescent");
    assert!(c.marker_exists());
    let left = live_sandbox(c, uid);
    assert!(left.is_empty(), "survivors: {left:?}");
    let out = c.verify(&["--nonce", "n-1", "--sandbox-user", &uid.to_string(), "--", "echo", "scored"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "scored",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    st
}

/// The plain case: one workload as `uid`, then a clean freeze.
fn one_workload(uid: u32, args: &[&str]) {
    let c = sandbox(uid, &[]);
    let _w = c.launch(uid, args);
    freeze_clean(&c, uid);
}

/// A setuid-root copy of the adversary, as a sandbox user would find one.
fn setuid_copy(c: &Container) -> String {
    let p = c.path("adversary-suid");
    std::fs::copy(adversary(), &p).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o4755)).unwrap();
    p.to_str().unwrap().to_string()
}

fn adv() -> String {
    adversary().to_str().unwrap().to_string()
}

/// Run the adversary as root inside the container (not a sandbox launch), ready-waited.
fn launch_root(c: &Container, args: &[&str]) -> Guard {
    let ready = c.path(&format!("ready-root-{}", args[0]));
    let a = adv();
    let mut full = vec![a.as_str()];
    full.extend_from_slice(args);
    let mut cmd = c.exec_cmd(&full);
    cmd.env("ADV_READY", &ready).stdout(Stdio::null());
    let child = guard(cmd);
    wait_for("root workload", Duration::from_secs(20), || ready.exists());
    child
}

#[test]
fn t01_fork_bomb_still_forking() {
    let uid = 4301;
    let c = sandbox(uid, &[]);
    let _w = c.launch(uid, &["bomb", "2000"]);
    std::thread::sleep(Duration::from_millis(300));
    let st = freeze_clean(&c, uid);
    assert!(st["killed"].as_u64().unwrap() > 50, "{st}");
}

#[test]
fn t01b_fork_bomb_while_the_init_tracks_constantly() {
    // With the CPU shared among 2,000 forkers, a history refresh takes seconds; a freeze request
    // must interrupt it rather than wait behind it.
    let uid = 4331;
    let c = sandbox(uid, &["--track-interval", "0.05"]);
    let _w = c.launch(uid, &["bomb", "2000"]);
    std::thread::sleep(Duration::from_millis(500));
    freeze_clean(&c, uid);
}

#[test]
fn t02_five_thousand_sleepers() {
    let uid = 4302;
    let c = sandbox(uid, &[]);
    let _w = c.launch(uid, &["sleepers", "5000"]);
    let st = freeze_clean(&c, uid);
    assert!(st["killed"].as_u64().unwrap() >= 5001, "{st}");
}

#[test]
fn t03_double_fork_setsid_setpgid() {
    one_workload(4303, &["daemon"]);
}

#[test]
fn t04_ignores_and_blocks_every_signal() {
    one_workload(4304, &["ignore"]);
}

#[test]
fn t05_fifty_threads_that_keep_cloning() {
    one_workload(4305, &["threads", "50"]);
}

#[test]
fn t06_one_thread_with_other_credentials() {
    let uid = 4306;
    let c = sandbox(uid, &[]);
    let _w = launch_root(&c, &["thread-uid", &uid.to_string()]);
    assert!(!live_sandbox(&c, uid).is_empty(), "the root process with a sandbox thread must count");
    freeze_clean(&c, uid);
}

#[test]
fn t07_setuid_root_helper() {
    let uid = 4307;
    let c = sandbox(uid, &[]);
    let suid = setuid_copy(&c);
    let _w = c.launch_bin(uid, &["--allow-setuid"], &suid, &["pause"]);
    freeze_clean(&c, uid);
}

#[test]
fn t08_full_escapee_by_lineage() {
    let uid = 4308;
    let c = sandbox(uid, &[]);
    let suid = setuid_copy(&c);
    let _w = c.launch_bin(uid, &["--allow-setuid"], &suid, &["escape", "0"]);
    // Root for good, reparented to PID 1: only the lineage tag still says where it came from.
    let escaped = root_orphans(&c);
    assert_eq!(escaped.len(), 1, "{escaped:?}");
    assert_eq!(escaped[0]["reasons"], serde_json::json!(["lineage"]));
    freeze_clean(&c, uid);
}

#[test]
fn t08b_full_escapee_by_history_without_lineage() {
    let uid = 4318;
    let c = sandbox(uid, &["--no-lineage", "--track-interval", "0.1"]);
    let suid = setuid_copy(&c);
    // The escape happens 600 ms in, after the init has seen the process as a sandbox descendant.
    let _w = c.launch_bin(uid, &["--allow-setuid", "--no-lineage"], &suid, &["escape", "600"]);
    // Now root for good, reparented to PID 1, no loginuid: only the init's history knows it,
    // and `ps` (a separate process without that history) does not.
    let escaped = root_orphans(&c);
    assert_eq!(escaped.len(), 1, "{escaped:?}");
    assert_eq!(escaped[0]["sandbox"], false);
    let st = freeze_clean(&c, uid);
    let pid = escaped[0]["pid"].as_i64().unwrap();
    let marker = read(&c.state.join("quiescence.jws"));
    let payload = marker.split('.').nth(1).unwrap();
    let claims = decode_claims(payload);
    let killed = claims["processes"].as_array().unwrap().iter().find(|p| p["pid"].as_i64() == Some(pid));
    assert_eq!(killed.expect("escapee in the marker")["reason"], serde_json::json!(["history"]), "{st}");
}

/// Root processes whose parent is PID 1 and whose command is the adversary.
fn root_orphans(c: &Container) -> Vec<serde_json::Value> {
    let q = quiesce();
    let st = c.state.to_str().unwrap().to_string();
    let out = c.exec(&[q.to_str().unwrap(), "ps", "--json", "--state-dir", &st]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["ppid"] == 1 && p["uids"] == serde_json::json!([0]) && p["comm"] == "adversary-suid")
        .cloned()
        .collect()
}

fn decode_claims(b64: &str) -> serde_json::Value {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(b64).unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

#[test]
fn t09_injected_from_outside_mid_freeze() {
    let uid = 4309;
    let c = sandbox(uid, &[]);
    let _w = c.launch(uid, &["sleepers", "1500"]);
    // Injected from outside the tree, as `docker exec -u` does: its parent is outside the namespace.
    let u = uid.to_string();
    let inject = |c: &Container| {
        let mut cmd =
            c.exec_cmd(&["setpriv", "--reuid", &u, "--regid", &u, "--clear-groups", &adv(), "pause"]);
        cmd.stdout(Stdio::null());
        guard(cmd)
    };
    let mut injected = vec![inject(&c)];
    std::thread::sleep(Duration::from_millis(200));
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (code, st) = std::thread::scope(|s| {
        let injector = s.spawn(|| {
            let mut more = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) && more.len() < 200 {
                more.push(inject(&c));
                std::thread::sleep(Duration::from_millis(2));
            }
            more
        });
        let r = c.freeze("n-1");
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        injected.extend(injector.join().unwrap());
        r
    });
    assert_eq!(code, 0, "{st}");
    // Whatever was injected after the proof is caught by verify's live probe; nothing else lives.
    let left = live_sandbox(&c, uid);
    let out = c.verify(&["--nonce", "n-1", "--", "echo", "scored"]);
    if left.is_empty() {
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    } else {
        assert_eq!(out.status.code(), Some(16), "{left:?}");
        assert!(out.stdout.is_empty());
    }
    drop(injected);
}

#[test]
fn t10_processes_that_restart_each_other() {
    one_workload(4310, &["restart"]);
}

#[test]
fn t11_stopped_process_and_a_sigcont_looper() {
    let uid = 4311;
    let c = sandbox(uid, &[]);
    let _a = c.launch(uid, &["stopped"]);
    let _b = c.launch(uid, &["sleepers", "200"]);
    let _d = c.launch(uid, &["sigcont"]);
    freeze_clean(&c, uid);
}

#[test]
fn t12_ptrace_attached_pair() {
    one_workload(4312, &["ptrace"]);
}

#[test]
fn t13_vfork_parent_and_child() {
    one_workload(4313, &["vfork"]);
}

#[test]
fn t14_writer_stops_for_good_once_the_marker_exists() {
    let uid = 4314;
    let c = sandbox(uid, &[]);
    let file = c.path("work.log");
    let _w = c.launch(uid, &["writer", file.to_str().unwrap()]);
    std::thread::sleep(Duration::from_millis(100));
    freeze_clean(&c, uid);
    let size = std::fs::metadata(&file).unwrap().len();
    assert!(size > 0);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(std::fs::metadata(&file).unwrap().len(), size, "the file changed after the marker");
}

#[test]
fn t15_spoofed_names_are_not_matched_by_name() {
    let uid = 4315;
    let c = sandbox(uid, &[]);
    let _w = c.launch(uid, &["spoof"]);
    let st = freeze_clean(&c, uid);
    assert!(st["killed"].as_u64().unwrap() >= 1);
    // The init, named quiesce too, is alive and well.
    assert!(read(std::path::Path::new(&format!("/proc/{}/stat", c.init))).contains("(quiesce)"));
}

#[test]
fn t16_sandbox_attacks_pid_1_during_the_freeze() {
    let uid = 4316;
    let mut c = sandbox(uid, &[]);
    let _b = c.launch(uid, &["sleepers", "100"]);
    let _a = c.launch(uid, &["attack-init"]);
    freeze_clean(&c, uid);
    assert!(c.alive());
    assert!(!read(std::path::Path::new(&format!("/proc/{}/stat", c.init))).contains(") T "));
}

#[test]
fn t17_unreaped_zombie_does_not_block_success() {
    let uid = 4317;
    let c = sandbox(uid, &[]);
    let _r = launch_root(&c, &["zombie-root", &uid.to_string()]);
    let _w = c.launch(uid, &["zombie"]);
    freeze_clean(&c, uid);
}

#[test]
fn t18_unreadable_proc_is_a_bounded_failure_without_marker() {
    let uid = 4320;
    let c = sandbox(uid, &["--freeze-timeout", "3"]);
    let _w = c.launch(uid, &["sleepers", "10"]);
    // An empty tmpfs over the namespace's /proc: every read now fails or shows nothing.
    let out = c.exec(&["mount", "-t", "tmpfs", "none", "/proc"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (code, st) = c.freeze("n-1");
    assert_eq!(code, 1, "{st}");
    assert_eq!(st["state"], "failed");
    assert!(st["reason"].as_str().unwrap().contains("/proc"), "{st}");
    assert!(!c.marker_exists());
    let out = c.exec(&["umount", "/proc"]);
    assert!(out.status.success());
    let out = c.verify(&["--", "echo", "scored"]);
    assert_eq!(out.status.code(), Some(10));
    assert!(out.stdout.is_empty());
}

#[test]
fn t19_without_sandbox_user_usr1_reaches_the_command() {
    let uid = 4319;
    let a = adv();
    let mut c =
        Container::start_with(Opts { stdout: Stdio::piped(), ..Default::default() }, &[&a, "signals"]);
    let _w = c.launch(uid, &["pause"]);
    let mut out = std::io::BufReader::new(c.take_stdout().unwrap());
    std::thread::sleep(Duration::from_millis(200));
    c.signal(libc::SIGUSR1);
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "got 10");
    assert_eq!(live_sandbox(&c, uid).len(), 1, "nothing may be killed without a sandbox user");
    assert!(!c.state.join("status.json").exists());
}

#[test]
fn t20_nested_user_and_pid_namespace() {
    let uid = 4321;
    let c = sandbox(uid, &[]);
    let probe =
        c.exec(&["setpriv", "--reuid", &uid.to_string(), "unshare", "--user", "--pid", "--fork", "true"]);
    if !probe.status.success() {
        eprintln!("skipped: this kernel refuses unprivileged user namespaces");
        return;
    }
    let _w = c.launch(uid, &["userns"]);
    freeze_clean(&c, uid);
}

#[test]
fn t21_root_service_survives_untouched() {
    let uid = 4322;
    let mut c = sandbox(uid, &[]);
    let _svc = launch_root(&c, &["sleepers", "3"]);
    let _w = c.launch(uid, &["sleepers", "50"]);
    let root_adv = |c: &Container| -> Vec<i32> {
        c.processes().iter().filter(|p| p.1 == 0 && p.2 != 'Z' && p.3 == "adversary").map(|p| p.0).collect()
    };
    let before = root_adv(&c);
    assert_eq!(before.len(), 4, "{before:?}");
    freeze_clean(&c, uid);
    assert_eq!(root_adv(&c), before);
    assert!(c.alive());
}

#[test]
fn t22_leader_thread_exited() {
    one_workload(4323, &["leader-exit"]);
}

#[test]
fn second_freeze_works_like_the_first() {
    let uid = 4324;
    let c = sandbox(uid, &[]);
    let _w = c.launch(uid, &["sleepers", "5"]);
    let a = freeze_clean(&c, uid);
    let _w2 = c.launch(uid, &["sleepers", "5"]);
    let b = freeze_clean(&c, uid);
    assert_ne!(a["id"], b["id"]);
}

#[test]
fn init_stays_up_after_its_sandboxed_command_dies_until_term() {
    let uid = 4325;
    let u = uid.to_string();
    let a = adv();
    let mut c = Container::start(&["--sandbox-user", &u, "--run-as", &u], &[&a, "sleepers", "20"]);
    std::thread::sleep(Duration::from_millis(300));
    freeze_clean(&c, uid);
    std::thread::sleep(Duration::from_millis(300));
    assert!(c.alive(), "the verifier needs the container");
    c.signal(libc::SIGTERM);
    assert_eq!(c.wait_code(Duration::from_secs(10)), 137);
}

#[test]
fn after_freeze_exit_opts_out() {
    let uid = 4326;
    let u = uid.to_string();
    let a = adv();
    let mut c = Container::start(
        &["--sandbox-user", &u, "--run-as", &u, "--after-freeze", "exit"],
        &[&a, "sleepers", "5"],
    );
    std::thread::sleep(Duration::from_millis(300));
    // The container ends with the freeze, so trigger it the way `docker kill -s USR1` does.
    c.signal(libc::SIGUSR1);
    assert_eq!(c.wait_code(Duration::from_secs(10)), 137);
    assert_eq!(c.status_file()["state"], "quiescent");
}

#[test]
fn docker_kill_style_signal_freezes_without_a_request() {
    let uid = 4327;
    let c = sandbox(uid, &[]);
    let _w = c.launch(uid, &["sleepers", "20"]);
    c.signal(libc::SIGUSR1);
    wait_for("quiescent status", Duration::from_secs(15), || c.status_file()["state"] == "quiescent");
    assert_eq!(c.status_file()["nonce"], serde_json::Value::Null);
    assert!(live_sandbox(&c, uid).is_empty());
}

#[test]
fn t23_uninterruptible_sleep_is_a_bounded_failure_naming_the_survivor() {
    let uid = 4328;
    if !std::path::Path::new("/dev/fuse").exists() {
        eprintln!("skipped: no /dev/fuse on this machine");
        return;
    }
    let c = sandbox(uid, &["--freeze-timeout", "2"]);
    let mnt = c.path("fuse");
    std::fs::create_dir(&mnt).unwrap();
    let _d = launch_root(&c, &["fuse-daemon", mnt.to_str().unwrap()]);
    let _v = c.launch(uid, &["fuse-victim", mnt.join("x").to_str().unwrap()]);
    // The victim is now waiting for an answer that never comes (S until a signal, then D).
    std::thread::sleep(Duration::from_millis(300));
    let (code, st) = c.freeze("n-1");
    assert_eq!(code, 1, "{st}");
    assert_eq!(st["state"], "failed");
    let survivors = st["survivors"].as_array().unwrap();
    assert_eq!(survivors.len(), 1, "{st}");
    assert_eq!(survivors[0]["uid"], uid);
    assert_eq!(survivors[0]["state"], "D");
    assert!(!c.marker_exists());
    let out = c.verify(&["--", "echo", "scored"]);
    assert_eq!(out.status.code(), Some(10));
}

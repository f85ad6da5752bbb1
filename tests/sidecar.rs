//! `quiesce sidecar`: the init started by one exec into a PID namespace whose PID 1 is not
//! quiesce (`sleep infinity`, which never reaps), detached from that exec. Its ready line, its
//! place in the process tree, its idempotence (one init however many starts), each refusal
//! before anything detaches, freezes and verifies against hostile workloads over many rounds
//! with the zombies it cannot reap, and its stop.

mod common;
use common::*;
use std::process::Output;
use std::time::Duration;

const UID: u32 = 4242;

fn sidecar_cmd(c: &Container, extra: &[&str]) -> Vec<String> {
    let q = quiesce();
    let st = c.state.to_str().unwrap();
    let mut v: Vec<String> =
        [q.to_str().unwrap(), "sidecar", "--sandbox-user", &UID.to_string(), "--state-dir", st]
            .iter()
            .map(|s| s.to_string())
            .collect();
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// `quiesce sidecar` entered from outside, as an exec starts it; its output once it exited.
fn start(c: &Container, extra: &[&str]) -> Output {
    c.exec(&sidecar_cmd(c, extra))
}

/// The ready line of a start that succeeded.
fn ready(out: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "start failed: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(text.lines().count(), 1, "not one line: {text}");
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// The namespace's processes running the sidecar (not zombies).
fn sidecars(c: &Container) -> Vec<i32> {
    let mut v: Vec<i32> = c
        .pids()
        .into_iter()
        .filter(|&p| {
            // Its own helpers (the credential switcher) share its command line; they are its children.
            c.proc_read(p, "cmdline").is_some_and(|l| l.contains("\0sidecar\0--detached\0"))
                && c.stat(p).is_some_and(|s| s.live() && s.ppid == 1)
        })
        .collect();
    v.sort();
    v
}

/// A refusal: exit 2, one line on stderr that starts as the sidecar's and says `what`, nothing
/// on stdout, and nothing started.
#[track_caller]
fn assert_refused(out: &Output, what: &str, c: Option<&Container>) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("quiesce sidecar: ") && err.contains(what), "wanted '{what}': {err}");
    if let Some(c) = c {
        assert!(sidecars(c).is_empty(), "a sidecar runs after a refusal: {err}");
        assert!(!c.state.join("sidecar.json").exists(), "{err}");
    }
}

#[test]
fn a_start_prints_the_ready_line_and_leaves_a_detached_sidecar() {
    let c = Container::foreign(&["sleep", "infinity"]);
    // The exec in a session of its own, as an engine's exec runs: it leaves a descriptor open
    // (fd 7), which the sidecar must not keep, and once the start is over, hangs up its whole
    // process group (the shell ignores it), which must not reach the sidecar.
    let leak = c.path("leaked-fd");
    std::fs::write(&leak, "x").unwrap();
    let script = r#"exec 7<"$0"; "$@"; s=$?; trap '' HUP; kill -HUP 0; exit $s"#;
    let mut full = vec!["setsid".to_string(), "-w".into(), "sh".into(), "-c".into(), script.into()];
    full.push(leak.display().to_string());
    full.extend(sidecar_cmd(&c, &[]));
    let out = c.exec(&full);
    let r = ready(&out);
    assert_eq!(r["sidecar"], "quiesce");
    assert_eq!(r["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(r["started"], true);
    assert_eq!(r["sandbox_uids"], serde_json::json!([UID]));
    assert!(r["lineage"].is_boolean(), "{r}");
    assert_eq!(r["state_dir"], std::fs::canonicalize(&c.state).unwrap().to_str().unwrap());
    assert_eq!(r["public_key"], read(&c.state.join("signing.pub")), "the key is not signing.pub's");
    let file: serde_json::Value = serde_json::from_str(&read(&c.state.join("sidecar.json"))).unwrap();
    assert_eq!(file, r, "sidecar.json is not the ready line");
    let pid = r["pid"].as_i64().unwrap() as i32;
    assert_eq!(sidecars(&c), vec![pid]);
    let st = c.stat(pid).expect("the sidecar is gone");
    assert_eq!(st.start_time, r["start_time"].as_u64().unwrap());
    assert_eq!(st.ppid, 1, "the sidecar's parent is not the namespace's PID 1");
    assert_ne!(st.session, pid, "the sidecar leads its session: a terminal could become its own");
    assert_eq!(st.pgrp, st.session, "the sidecar is not in the process group its session began with");
    assert!(c.stat(st.session).is_none(), "the session's first process (the start's child) is still there");
    let tty: i64 = {
        let l = c.proc_read(pid, "stat").unwrap();
        l[l.rfind(')').unwrap() + 2..].split(' ').nth(4).unwrap().parse().unwrap()
    };
    assert_eq!(tty, 0, "the sidecar has a controlling terminal");
    let fd = |n: i32| std::fs::read_link(c.proc_dir().join(format!("{pid}/fd/{n}"))).ok();
    assert_eq!(fd(0), Some("/dev/null".into()));
    assert_eq!(fd(1), Some(c.state.join("sidecar.log")));
    assert_eq!(fd(2), Some(c.state.join("sidecar.log")));
    let fds: Vec<_> = std::fs::read_dir(c.proc_dir().join(format!("{pid}/fd")))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .collect();
    assert!(!fds.contains(&leak), "the sidecar kept the exec's fd 7: {fds:?}");
    assert_eq!(fds.iter().filter(|p| **p == c.state.join("sidecar.lock")).count(), 1, "{fds:?}");
    let cwd = std::fs::read_link(c.proc_dir().join(format!("{pid}/cwd"))).unwrap();
    assert_eq!(cwd, std::path::Path::new("/"));

    // A hangup sent to the sidecar itself is dropped too.
    let _ = c.exec(&["kill", "-HUP", &pid.to_string()]);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(sidecars(&c), vec![pid], "a hangup ended the sidecar");
}

#[test]
fn a_second_start_answers_for_the_running_sidecar_and_two_at_once_make_one() {
    let c = Container::foreign(&["sleep", "infinity"]);
    let first = ready(&start(&c, &[]));
    let again = ready(&start(&c, &[]));
    assert_eq!(again["started"], false);
    for k in ["pid", "start_time", "public_key", "state_dir", "sandbox_uids"] {
        assert_eq!(again[k], first[k], "{k}");
    }
    assert_eq!(sidecars(&c).len(), 1);

    for round in 0..3 {
        let c = Container::foreign(&["sleep", "infinity"]);
        let cmds: Vec<_> = (0..2).map(|_| c.exec_cmd(&sidecar_cmd(&c, &[]))).collect();
        let threads: Vec<_> =
            cmds.into_iter().map(|mut cmd| std::thread::spawn(move || output(&mut cmd))).collect();
        let lines: Vec<serde_json::Value> = threads.into_iter().map(|t| ready(&t.join().unwrap())).collect();
        assert_eq!(lines[0]["pid"], lines[1]["pid"], "round {round}: two sidecars answered");
        assert_eq!(lines[0]["public_key"], lines[1]["public_key"], "round {round}");
        let started = lines.iter().filter(|l| l["started"] == true).count();
        assert_eq!(started, 1, "round {round}: {lines:?}");
        assert_eq!(sidecars(&c).len(), 1, "round {round}");
    }
}

#[test]
fn each_refusal_is_one_line_before_anything_starts() {
    let c = Container::foreign(&["sleep", "infinity"]);
    let q = quiesce();
    let st = c.state.to_str().unwrap().to_string();
    let base = |extra: &[&str]| {
        let mut v = vec![q.to_str().unwrap().to_string(), "sidecar".into(), "--state-dir".into(), st.clone()];
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let u = UID.to_string();
    assert_refused(&c.exec(&base(&[])), "no sandbox user: add --sandbox-user", Some(&c));
    assert_refused(&c.exec(&base(&["--sandbox-user", "root"])), "root", Some(&c));
    assert_refused(
        &c.exec(&base(&["--sandbox-user", &u, "sleep", "1"])),
        "unexpected argument 'sleep'",
        Some(&c),
    );
    assert_refused(
        &c.exec(&base(&["--sandbox-user", &u, "--freeze-signal", "KILL"])),
        "--freeze-signal",
        Some(&c),
    );
    let argv = base(&["--sandbox-user", &u]);
    let as_user: Vec<&str> = argv.iter().map(String::as_str).collect();
    assert_refused(&c.exec_as(UID, &as_user), "a freeze needs root", Some(&c));
    let mut no_kill = vec!["setpriv", "--inh-caps=-all", "--bounding-set=-kill"];
    no_kill.extend(as_user.iter());
    assert_refused(&c.exec(&no_kill), "CAP_KILL", Some(&c));

    // A /proc that is no procfs (a mount namespace of its own, with a tmpfs there).
    let script = r#"mount -t tmpfs tmpfs /proc && exec "$@""#;
    let mut full = vec!["unshare", "--mount", "sh", "-c", script, "sh"];
    full.extend(as_user.iter());
    assert_refused(&c.exec(&full), "/proc is not a mounted proc file system", Some(&c));

    // A read-only mount over the state dir's parent, and one remounted read-only under it.
    let ro = c.path("ro").display().to_string();
    let script = r#"mkdir -p "$1" && mount -t tmpfs -o ro tmpfs "$1" && shift && exec "$@""#;
    let mut full = vec!["sh", "-c", script, "sh", &ro, q.to_str().unwrap(), "sidecar", "--sandbox-user", &u];
    let in_ro = format!("{ro}/state");
    full.extend(["--state-dir", &in_ro]);
    assert_refused(&c.exec(&full), "read-only file system", Some(&c));
    let ro2 = c.path("ro2").display().to_string();
    let script = r#"mkdir -p "$1" && mount -t tmpfs tmpfs "$1" && mkdir -m 755 "$1/state" && mount -o remount,ro "$1" && shift && exec "$@""#;
    let in_ro2 = format!("{ro2}/state");
    let full = vec![
        "sh",
        "-c",
        script,
        "sh",
        &ro2,
        q.to_str().unwrap(),
        "sidecar",
        "--sandbox-user",
        &u,
        "--state-dir",
        &in_ro2,
    ];
    assert_refused(&c.exec(&full), "is on a read-only mount", Some(&c));

    // A PID namespace of its own with the host's /proc: another namespace's processes.
    let d = scratch("sidecar-foreign-proc");
    let state = d.join("state");
    let out = output(std::process::Command::new("unshare").args(["--pid", "--fork"]).arg(&q).args([
        "sidecar",
        "--sandbox-user",
        &u,
        "--state-dir",
        state.to_str().unwrap(),
    ]));
    assert_refused(&out, "belongs to another PID namespace", None);
    assert!(!state.join("sidecar.json").exists());
}

#[test]
fn a_pid_1_of_the_sandbox_user_and_a_running_sidecar_of_other_users_are_refused() {
    // kill(-1) skips PID 1 and an init ignores SIGKILL from inside: every freeze would fail on it.
    let c = Container::foreign_as(Some(UID), &["sleep", "infinity"]);
    assert_refused(&start(&c, &[]), "PID 1 of this namespace runs as sandbox UID 4242", Some(&c));

    // A running sidecar answers a second start only for the users it guards.
    let c = Container::foreign(&["sleep", "infinity"]);
    let first = ready(&start(&c, &[]));
    let out = start(&c, &["--sandbox-user", "4243"]);
    assert_refused(&out, "for sandbox UIDs [4242], not [4242, 4243]", None);
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("kill -TERM {}", first["pid"])));
    assert_eq!(sidecars(&c).len(), 1);
}

#[test]
fn an_init_already_in_the_namespace_is_named_and_no_second_one_starts() {
    // quiesce as PID 1.
    let c = sandbox(UID, &[]);
    let elsewhere = c.path("elsewhere");
    let q = quiesce();
    let out = c.exec(&[
        q.to_str().unwrap(),
        "sidecar",
        "--sandbox-user",
        "4242",
        "--state-dir",
        elsewhere.to_str().unwrap(),
    ]);
    let named = format!("quiesce is already PID 1 of this PID namespace (state dir {}", c.state.display());
    assert_refused(&out, &named, None);
    assert!(!elsewhere.exists(), "the refused start made its state dir");

    // quiesce as a plain init (not PID 1) with another state dir, and with the same one.
    let f = Container::foreign(&["sleep", "infinity"]);
    let other = f.path("other-state");
    let q = quiesce();
    let init = guard(f.exec_cmd(&[
        q.to_str().unwrap(),
        "--sandbox-user",
        "4242",
        "--state-dir",
        other.to_str().unwrap(),
        "--",
        "sleep",
        "1000000",
    ]));
    wait_for("the plain init's sandbox.json", Duration::from_secs(10), || {
        other.join("sandbox.json").exists()
    });
    let out = start(&f, &[]);
    assert_refused(&out, "an init of quiesce already runs in this PID namespace (pid ", Some(&f));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("state dir {}", other.display())));
    assert!(!f.state.exists(), "the refused start made its state dir");
    let full =
        [q.to_str().unwrap(), "sidecar", "--sandbox-user", "4242", "--state-dir", other.to_str().unwrap()];
    let out = f.exec(&full);
    assert_refused(&out, "already runs", Some(&f));
    drop(init);
}

/// A fresh hostile workload of the sandbox user, each through `quiesce exec` (entered from
/// outside): a double-forked setsid daemon, a loop that ignores SIGTERM (and every signal it
/// can), and a setsid double-forked writer. Returns the writer's file.
fn workload(c: &Container, round: usize) -> std::path::PathBuf {
    let u = UID.to_string();
    let q = quiesce();
    let a = adv();
    let w = c.path(&format!("written-{round}"));
    let mut ws = vec![c.launch(UID, &["daemon"]), c.launch(UID, &["ignore"])];
    let writer = r#"setsid sh -c '"$0" writer "$1" & exit 0' "$0" "$@"; exec sleep 1000000"#;
    let cmd = c.exec_cmd(&[
        q.to_str().unwrap(),
        "exec",
        "--user",
        &u,
        "--",
        "sh",
        "-c",
        writer,
        &a,
        w.to_str().unwrap(),
    ]);
    ws.push(c.start_ready(cmd, "setsid writer"));
    // The exec waiters go with the freeze's kill; the guards only reap them.
    std::mem::forget(ws);
    w
}

#[test]
fn freezes_and_verifies_round_after_round_beside_a_pid_1_that_never_reaps() {
    let c = Container::foreign(&["sleep", "infinity"]);
    let r = ready(&start(&c, &[]));
    let sidecar = r["pid"].as_i64().unwrap() as i32;
    let mut zombies_before = 0;
    for round in 0..5 {
        let written = workload(&c, round);
        let live = c.live_of_uid(UID);
        assert!(live.len() >= 6, "round {round}: {live:?}");
        let nonce = format!("round-{round}");
        let (code, st) = c.freeze(&nonce);
        assert_eq!(code, 0, "round {round}: {st}");
        assert_eq!(st["state"], "quiescent", "round {round}: {st}");
        assert!(c.live_of_uid(UID).is_empty(), "round {round}: {:?}", c.live_of_uid(UID));
        // What the freeze killed stays as PID 1's zombies: counted, never reaped.
        let zombies =
            st["unreaped_zombies"].as_u64().unwrap_or_else(|| panic!("round {round}: no count: {st}"));
        assert!(zombies > zombies_before, "round {round}: {zombies} after {zombies_before}: {st}");
        zombies_before = zombies;
        let size = std::fs::metadata(&written).map(|m| m.len()).unwrap_or(0);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            std::fs::metadata(&written).map(|m| m.len()).unwrap_or(0),
            size,
            "round {round}: still written"
        );
        let out = c.verify(&["--nonce", &nonce, "--", "echo", "scored"]);
        assert_scored(&out, &format!("round {round}"));
    }
    assert_eq!(sidecars(&c), vec![sidecar], "the sidecar did not live through the rounds");
}

#[test]
fn sigterm_stops_it_with_exit_0_and_a_new_start_follows() {
    let c = Container::foreign(&["sleep", "infinity"]);
    let r = ready(&start(&c, &["-v"]));
    let pid = r["pid"].as_i64().unwrap() as i32;
    let _ = c.exec(&["kill", "-TERM", &pid.to_string()]);
    wait_for("the sidecar to end", Duration::from_secs(10), || c.stat(pid).is_none_or(|s| !s.live()));
    // PID 1 never reaps it: its exit status stays in its stat line (field 52, as waitpid says it).
    let l = c.proc_read(pid, "stat").expect("the sidecar's zombie is gone");
    let code: i32 = l[l.rfind(')').unwrap() + 2..].split_whitespace().next_back().unwrap().parse().unwrap();
    assert_eq!(code, 0, "exit status {code:#x}");
    let file: serde_json::Value = serde_json::from_str(&read(&c.state.join("sidecar.json"))).unwrap();
    assert_eq!(file["stopped"], true, "{file}");
    assert_eq!(file["pid"], pid);
    assert!(read(&c.state.join("sidecar.log")).contains("sidecar stopped"));
    // Its zombie answers nothing: a freeze says it is gone at once, and a launch finds no init
    // to record with (it runs, as beside no init), instead of waiting on it.
    let t = std::time::Instant::now();
    let (code, st) = c.freeze_within("after-stop", Some(30));
    assert_ne!(code, 0, "{st}");
    assert!(st["client_stderr"].as_str().unwrap_or_default().contains("is gone"), "{st}");
    let q = quiesce();
    let out = c.exec(&[q.to_str().unwrap(), "exec", "--user", &UID.to_string(), "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(t.elapsed() < Duration::from_secs(10), "waited {:?} on a stopped sidecar", t.elapsed());
    // Its zombie holds no lock, and its locator names no live process: a new start starts.
    let again = ready(&start(&c, &[]));
    assert_eq!(again["started"], true);
    assert_ne!(again["pid"], pid);
}

#[test]
fn a_fork_loop_launched_with_nproc_stops_at_its_cap_and_root_still_forks_and_freezes() {
    // A UID of this test's own: RLIMIT_NPROC counts the UID's processes on the whole host.
    let uid = 4917u32;
    let u = uid.to_string();
    let c = Container::foreign(&["sleep", "infinity"]);
    let q = quiesce();
    let st = c.state.to_str().unwrap();
    ready(&c.exec(&[q.to_str().unwrap(), "sidecar", "--sandbox-user", &u, "--state-dir", st]));
    for bad in ["0", "-3", "many"] {
        let out = c.exec(&[q.to_str().unwrap(), "exec", "--user", &u, "--nproc", bad, "--", "true"]);
        assert_eq!(out.status.code(), Some(2), "--nproc {bad}: {}", String::from_utf8_lossy(&out.stderr));
    }
    // Every process forks as fast as it can; it asks for a cap of 1000 itself, which the hard
    // limit of 50 refuses. Ready once the first fork fails.
    let a = adv();
    let cmd = c.exec_cmd(&[
        q.to_str().unwrap(),
        "exec",
        "--user",
        &u,
        "--nproc",
        "50",
        "--",
        &a,
        "bomb-flat",
        "1000",
    ]);
    let _w = c.start_ready(cmd, "fork loop under --nproc 50");
    // A fork that fails at the cap may have held a count for an instant: the 50th comes soon.
    let mut most = 0;
    wait_for("the fork loop to reach 50 processes", Duration::from_secs(10), || {
        most = most.max(c.live_of_uid(uid).len());
        most >= 50
    });
    for _ in 0..10 {
        most = most.max(c.live_of_uid(uid).len());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(most, 50, "the UID's processes under --nproc 50");
    let root = c.exec(&["sh", "-c", "sleep 0 & wait; echo forked"]);
    assert_eq!(String::from_utf8_lossy(&root.stdout).trim(), "forked", "root could not fork");
    let (code, st) = c.freeze("nproc");
    assert_eq!(code, 0, "{st}");
    assert_eq!(st["state"], "quiescent", "{st}");
    assert!(st["killed"].as_u64().unwrap() >= 50, "{st}");
    assert!(c.live_of_uid(uid).is_empty());
}

#[test]
fn a_lock_held_with_no_sidecar_behind_it_is_refused_within_the_wait_naming_the_log() {
    let c = Container::foreign(&["sleep", "infinity"]);
    std::fs::create_dir(&c.state).unwrap();
    chmod(&c.state, 0o755);
    let lock = c.state.join("sidecar.lock");
    // The holder waits for the lock (no -n): a probe below holds it for an instant, and a
    // non-blocking holder that met one would give up and leave the lock free.
    let _holder = guard(c.exec_cmd(&["flock", lock.to_str().unwrap(), "sleep", "60"]));
    wait_for("flock to hold the lock", Duration::from_secs(10), || {
        c.exec(&["flock", "-n", lock.to_str().unwrap(), "true"]).status.code() == Some(1)
    });
    let t = std::time::Instant::now();
    let out = start(&c, &[]);
    assert_refused(&out, "sidecar.lock is held, but no running sidecar answered", Some(&c));
    assert!(String::from_utf8_lossy(&out.stderr).contains("sidecar.log"));
    let waited = t.elapsed();
    assert!((Duration::from_secs(9)..Duration::from_secs(20)).contains(&waited), "{waited:?}");
}

#[test]
fn the_detached_form_run_by_hand_is_refused() {
    let c = Container::foreign(&["sleep", "infinity"]);
    let mut argv = sidecar_cmd(&c, &[]);
    argv.insert(2, "--detached".into());
    // No descriptors at 3 and 4.
    let out = c.exec(&argv);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("start it with `quiesce sidecar`"));
    // Descriptors there, but not the held lock: the error goes to fd 4 as a start would read it.
    std::fs::create_dir(&c.state).unwrap();
    chmod(&c.state, 0o755);
    let said = c.path("said");
    let script = r#"exec 3<>"$0" 4>"$1"; shift; exec "$@""#;
    let mut full = vec!["sh".to_string(), "-c".into(), script.into()];
    full.push(c.path("not-the-lock").display().to_string());
    full.push(said.display().to_string());
    full.extend(argv);
    let out = c.exec(&full);
    assert_eq!(out.status.code(), Some(2));
    let line = read(&said);
    assert!(line.starts_with("quiesce sidecar: fd 3 is not the held lock"), "{line}");
    assert!(sidecars(&c).is_empty() && !c.state.join("sidecar.json").exists());
}

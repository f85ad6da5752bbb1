//! quiesce as the engine's own init (`docker run --init` with a daemon `init-path`, `podman run
//! --init --init-path`): the engine mounts the binary under its own name, starts it as
//! `PATH -- CMD`, configures it only through the container's environment, and the harness runs the
//! subcommands through that same path.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

/// A client command run beside the init through the engine's path, with the container's
/// environment (engines give `exec` sessions the variables the container was started with).
fn client(c: &Container, bin: &Path, env: &[(&str, String)], args: &[&str]) -> Command {
    let mut full = vec![bin.to_str().unwrap()];
    full.extend_from_slice(args);
    let mut cmd = c.exec_cmd(&full);
    cmd.env("QUIESCE_STATE_DIR", &c.state);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

#[test]
fn subcommands_work_under_the_path_the_engine_mounts_the_init_at() {
    for (name, uid) in [("docker-init", 4291), ("podman-init", 4292)] {
        let dir = scratch("inject");
        let bin = dir.join(name);
        copy_executable(&quiesce(), &bin);
        let env = vec![("QUIESCE_SANDBOX_USER", uid.to_string())];
        let c = Container::start_with(
            Opts { init_bin: Some(bin.clone()), env: env.clone(), ..Default::default() },
            &["sleep", "1000000"],
        );
        let argv = c.proc_read(1, "cmdline").unwrap_or_default();
        let want = format!("{}\0--\0sleep\01000000\0", bin.display());
        assert_eq!(argv, want, "{name}: PID 1 is not started as an engine starts its init");

        // A tagged launch through the engine's path, and a plain process of the UID (`exec -u`).
        let u = uid.to_string();
        let a = adv();
        let tagged = client(&c, &bin, &env, &["exec", "--user", &u, "--", &a, "sleepers", "3"]);
        let _w = c.start_ready(tagged, &format!("{name} exec"));
        let plain = c.exec_as_cmd(uid, &[&a, "sleepers", "2"]);
        let _p = c.start_ready(plain, &format!("{name}: setpriv as {uid}"));

        let ps = output(&mut client(&c, &bin, &env, &["ps", "--json"]));
        let v: serde_json::Value = serde_json::from_slice(&ps.stdout)
            .unwrap_or_else(|e| panic!("{name} ps --json: {e}: {}", String::from_utf8_lossy(&ps.stderr)));
        let live = v["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["sandbox"] == true && p["state"] != "Z")
            .count();
        assert_eq!(live, 7, "{name} ps: {v}");

        let out = output(&mut client(&c, &bin, &env, &["freeze", "--wait", "--json", "--nonce", "inj-1"]));
        let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{name} freeze: {st} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(st["state"], "quiescent", "{name}: {st}");
        assert_eq!(st["killed"], 7, "{name}: {st}");
        assert!(c.live_of_uid(uid).is_empty(), "{name}: {:?}", c.live_of_uid(uid));

        let out =
            output(&mut client(&c, &bin, &env, &["verify", "--nonce", "inj-1", "--", "echo", "scored"]));
        assert_scored(&out, &format!("{name} verify"));

        // The live probe still works through that path: a process started after the freeze fails
        // verify, and the verifier never runs.
        let _late = c.start_ready(c.exec_as_cmd(uid, &[&a, "sleepers", "0"]), &format!("{name}: late"));
        let out =
            output(&mut client(&c, &bin, &env, &["verify", "--nonce", "inj-1", "--", "echo", "scored"]));
        assert_eq!(out.status.code(), Some(16), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(out.stdout.is_empty(), "{name}: the verifier ran");
    }
}

#[test]
fn in_a_user_namespace_lineage_tags_with_the_mapped_sandbox_uid_and_a_freeze_proves() {
    // As under rootless Podman: the init is root of a user namespace whose map covers the
    // sandbox UID and not much else (no mapping for high IDs).
    let uid = 4293;
    let u = uid.to_string();
    let c = Container::start_with(
        Opts { init_args: vec!["--sandbox-user", &u], userns: Some(65536), ..Default::default() },
        &["sleep", "1000000"],
    );
    let map = c.proc_read(1, "uid_map").unwrap_or_default();
    assert_eq!(map.split_whitespace().collect::<Vec<_>>(), ["0", "0", "65536"], "not in the user namespace");
    if c.proc_read(1, "loginuid").is_some_and(|l| l.trim() != "4294967295") {
        skip(
            "in_a_user_namespace_lineage_tags_with_the_mapped_sandbox_uid_and_a_freeze_proves",
            "the test runs with a loginuid of its own, which the init inherits (lineage off)",
        );
        return;
    }
    let file = c.state.join("sandbox.json");
    wait_for("sandbox.json", READY_TIMEOUT, || file.exists());
    let published: serde_json::Value = serde_json::from_str(&read(&file)).unwrap();
    assert_eq!(published["lineage"], true, "lineage off in a user namespace: {published}");

    let _tagged = c.launch(uid, &["sleepers", "3"]);
    let a = adv();
    let _plain = c.start_ready(c.exec_as_cmd(uid, &[&a, "sleepers", "1"]), "plain");
    let q = quiesce();
    let st = c.state.to_str().unwrap().to_string();
    let ps = c.exec(&[q.to_str().unwrap(), "ps", "--json", "--state-dir", &st]);
    let v: serde_json::Value = serde_json::from_slice(&ps.stdout).unwrap();
    let by_lineage = v["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["reasons"].as_array().is_some_and(|r| r.iter().any(|x| x == "lineage")))
        .count();
    assert_eq!(by_lineage, 4, "{v}");

    let (code, st) = c.freeze("userns-1");
    assert_eq!(code, 0, "{st}");
    assert_eq!(st["state"], "quiescent", "{st}");
    assert_eq!(st["killed"], 6, "{st}");
    let out = c.verify(&["--nonce", "userns-1", "--", "echo", "scored"]);
    assert_scored(&out, "verify in a user namespace");
}

/// `quiesce exec` tells the init about its launch, and runs the command only once the init has
/// taken the record: a launch the init does not know of could escape unseen. It refuses when it
/// cannot send the record.
#[test]
fn exec_runs_the_command_only_once_the_init_holds_its_launch_record() {
    let uid = 4293;
    let c = sandbox(uid, &[]);
    // The init held (stopped from outside its namespace): the command must wait.
    unsafe { libc::kill(c.init, libc::SIGSTOP) };
    let ran = c.path("ran");
    let q = quiesce();
    let script = format!("'{}' exec --user {uid} -- touch '{}'", q.display(), ran.display());
    let mut waiting = c.exec_cmd(&["sh", "-c", &script]).spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let early = ran.exists();
    unsafe { libc::kill(c.init, libc::SIGCONT) };
    assert!(!early, "the command ran before the init took its launch record");
    wait_for("the command to run once its record was taken", std::time::Duration::from_secs(10), || {
        ran.exists()
    });
    assert!(waiting.wait().unwrap().success());
    // No requests/ to send the record through (as after a swap of the state dir): never run.
    std::fs::remove_dir_all(c.state.join("requests")).unwrap();
    let never = c.path("never");
    let out = c.exec(&[
        q.to_str().unwrap(),
        "exec",
        "--user",
        &uid.to_string(),
        "--",
        "touch",
        never.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("requests") && err.lines().count() == 1, "{err}");
    assert!(!never.exists(), "the command ran without its launch recorded");
}

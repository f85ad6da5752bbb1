//! The defaults score no verifier beside a live agent process: a marker signed where a setuid
//! binary could make a sandbox process root is refused unless the orchestrator accepts exactly
//! that (z01); a root escapee's forged freeze client, riding the orchestrator's bare signal,
//! asking itself, or a `quiesce exec` on its way to running the escapee's code, gets no marker
//! (z02, z05); a `quiesce exec` pointed at no state dir still records its
//! launch with the init it finds, and refuses to run beside one it cannot reach (z03); a sandbox
//! process cannot see a freeze coming in `requests/` (z04).
mod common;
use common::*;
use std::path::Path;
use std::time::Duration;

/// Lines in `file` now, then again after a while: whether something still appends to it.
fn still_written(file: &Path) -> bool {
    let before = read(file).lines().count();
    std::thread::sleep(Duration::from_millis(300));
    read(file).lines().count() > before
}

/// A setuid-root copy of the adversary, in a container with or without no-new-privileges.
fn suid_binary(c: &Container) -> String {
    use std::os::unix::fs::PermissionsExt;
    let p = c.path("adversary-suid");
    copy_executable(&adversary(), &p);
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o4755)).unwrap();
    p.to_str().unwrap().to_string()
}

/// The way harnesses run agents: the init with its default flags, the agent entered with a plain
/// `docker exec -u`, a setuid-root binary in the image. Under Docker's defaults the agent becomes
/// root and leaves a writer whose parent is the outside; the freeze cannot tell it from a root
/// exec and signs, and plain verify must refuse that marker, naming the fix. With
/// no-new-privileges the escape fails, the freeze kills the writer, and plain verify scores.
#[test]
fn z01_a_marker_signed_where_setuid_works_is_refused_by_default() {
    for setuid in [true, false] {
        let uid = 4501;
        let c = if setuid { sandbox_setuid(uid, &[]) } else { sandbox(uid, &[]) };
        let suid = suid_binary(&c);
        let file = c.path("written");
        let _w =
            c.start_ready(c.exec_as_cmd(uid, &[&suid, "root-writer", file.to_str().unwrap()]), "root-writer");
        let escaped = read(&file).starts_with("escaped");
        assert_eq!(escaped, setuid, "the setuid binary works only without no-new-privileges");
        let (code, st) = c.freeze("n1");
        assert_eq!(code, 0, "setuid={setuid}: {st}");
        assert_eq!(c.marker_claims()["setuid"], setuid, "{}", c.marker_claims());
        let out = c.verify(&["--nonce", "n1", "--", "echo", "scored"]);
        let said = String::from_utf8_lossy(&out.stderr).to_string();
        if setuid {
            assert_eq!(out.status.code(), Some(18), "plain verify beside an escapee: {said}");
            assert!(!String::from_utf8_lossy(&out.stdout).contains("scored"));
            assert!(said.contains("setuid") && said.contains("no-new-privileges"), "{said}");
            assert!(said.contains("--accept-privilege-escalation"), "{said}");
            assert!(still_written(&file), "the refusal was right: the escapee's writer lives");
            // Accepted by name, the marker is checked as before (and scores: that is the risk
            // the option names).
            let out = c.verify(&["--nonce", "n1", "--accept-privilege-escalation", "--", "echo", "scored"]);
            assert_scored(&out, "verify with --accept-privilege-escalation");
        } else {
            assert_scored(&out, "verify of a marker signed with no-new-privileges");
            assert!(!still_written(&file), "the writer was the sandbox user's, and the freeze killed it");
        }
    }
}

/// A root escapee (`--no-lineage`, a setuid launch from outside) makes a child C whose parent is
/// the outside, gives C a writer child W, and has C exec the init's binary: as a plain init with
/// a request planted in its name for the orchestrator's bare signal to take (`bare`), or as a
/// real `quiesce freeze --wait` of its own (`client`). The kernel shows C as a client would be
/// (this binary, ppid 0, untraced); no marker may be signed while W lives.
#[test]
fn z02_a_forged_freeze_client_gets_no_marker() {
    for (uid, mode) in [(4502, "bare"), (4503, "client")] {
        let c = sandbox_setuid(uid, &["--no-lineage"]);
        let suid = setuid_copy(&c);
        let file = c.path("planted");
        let (st_dir, q) = (c.state.to_str().unwrap().to_string(), quiesce());
        let args = ["plant-client", &st_dir, q.to_str().unwrap(), file.to_str().unwrap(), mode];
        let w = c.launch_bin(uid, &["--allow-setuid", "--no-lineage"], &suid, &args);
        let fake = w.pid;
        wait_for("the forged client to run the init's binary", Duration::from_secs(10), || {
            c.proc_read(fake, "comm").is_some_and(|n| n.trim() == "quiesce") && file.exists()
        });
        let st = if mode == "bare" {
            std::thread::sleep(Duration::from_millis(300));
            c.freeze_by_signal(Duration::from_secs(60)).0
        } else {
            let mut st = serde_json::Value::Null;
            wait_for("the forged client's freeze to end", Duration::from_secs(60), || {
                st = c.status_file();
                st["nonce"] == "planted" && matches!(st["state"].as_str(), Some("quiescent" | "failed"))
            });
            st
        };
        assert!(still_written(&file), "{mode}: the forged client's writer lives throughout");
        assert_eq!(st["state"], "failed", "{mode}: FORGED: a marker was signed beside the writer: {st}");
        assert!(!c.marker_exists(), "{mode}: {st}");
        if mode == "bare" {
            assert_ne!(st["nonce"], "planted", "a bare signal took the planted request: {st}");
        }
        let named: Vec<i64> =
            st["survivors"].as_array().unwrap().iter().filter_map(|s| s["pid"].as_i64()).collect();
        assert!(named.contains(&(fake as i64)), "{mode}: the forged client {fake} is not named: {st}");
    }
}

/// `quiesce exec` pointed at a state dir where no init runs, while the init keeps its state
/// elsewhere: it finds the init through the namespace's locator and records the launch, so an
/// escape before any observation is refused as p16's is. With the init's state dir made unsafe,
/// it refuses to run the command rather than run it unrecorded.
#[test]
fn z03_a_launch_pointed_elsewhere_is_recorded_or_refused() {
    let uid = 4504;
    let u = uid.to_string();
    let c = sandbox_setuid(uid, &["--no-lineage", "--track-interval", "0.05"]);
    let suid = setuid_copy(&c);
    let status = c.state.join("status.json");
    let nowhere = c.path("no-init-here");
    let q = quiesce();
    let launch = |cmd: &[&str]| {
        let mut full = vec![
            q.to_str().unwrap(),
            "exec",
            "--state-dir",
            nowhere.to_str().unwrap(),
            "--user",
            &u,
            "--allow-setuid",
            "--no-lineage",
            "--",
        ];
        full.extend_from_slice(cmd);
        let mut c = c.exec_cmd(&full);
        c.env_remove("QUIESCE_STATE_DIR");
        c
    };
    let w =
        c.start_ready(launch(&[&suid, "cont-escape", status.to_str().unwrap(), "parent", "now"]), "escape");
    let child = w.pid;
    wait_for("the escapee's child to be root", Duration::from_secs(10), || {
        c.status_line(child, "Uid").is_some_and(|u| u.iter().all(|x| x == "0"))
    });
    std::thread::sleep(Duration::from_millis(200));
    let (code, st) = c.freeze("n-1");
    let alive = c.stat(child).is_some_and(|s| s.live());
    if code == 0 {
        assert!(!alive, "FORGED: a marker was signed while {child} lives: {st}");
    } else {
        assert!(!c.marker_exists());
        let reason = st["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("born since a launch that lineage does not follow"), "{st}");
        let named: Vec<i64> =
            st["survivors"].as_array().unwrap().iter().filter_map(|s| s["pid"].as_i64()).collect();
        assert!(named.contains(&(child as i64)), "{child} not named: {st}");
    }
    // The init is there, and its state dir cannot be trusted: no launch.
    chmod(&c.state, 0o777);
    let out = output(&mut launch(&["sh", "-c", "echo ran"]));
    chmod(&c.state, 0o755);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ran"), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("keeps its state in") && said.contains("--state-dir"), "{said}");
}

/// `requests/` and `results/` are root's alone: a sandbox process cannot watch a request being
/// taken (which comes before any other sign of a freeze).
#[test]
fn z04_a_sandbox_process_cannot_see_a_freeze_coming() {
    let uid = 4505;
    let c = sandbox(uid, &[]);
    for sub in ["requests", "results"] {
        let d = c.state.join(sub);
        let out = c.exec_as(uid, &["ls", d.to_str().unwrap()]);
        assert!(!out.status.success(), "the sandbox user lists {sub}/: {out:?}");
        assert!(c.exec(&["ls", d.to_str().unwrap()]).status.success(), "root lists {sub}/");
    }
    let (code, st) = c.freeze("n-z04");
    assert_eq!(code, 0, "{st}");
}

/// A root escapee makes a `quiesce exec` process P (ppid 0, this binary, no child, untraced) the
/// client of a freeze request it planted in P's name; P's signal for its own launch record takes
/// the planted freeze first, and once its record is taken P execs a root writer. P runs this
/// binary as `exec`, not as `freeze`: it is not the init's own, and no marker is signed.
#[test]
fn z05_a_quiesce_exec_process_is_no_freeze_client() {
    let uid = 4506;
    let c = sandbox_setuid(uid, &["--no-lineage"]);
    let suid = setuid_copy(&c);
    let file = c.path("exec-client");
    let (st_dir, q) = (c.state.to_str().unwrap().to_string(), quiesce());
    let args = ["exec-client", &st_dir, q.to_str().unwrap(), file.to_str().unwrap(), "n-z05"];
    let w = c.launch_bin(uid, &["--allow-setuid", "--no-lineage"], &suid, &args);
    let p = w.pid;
    let mut st = serde_json::Value::Null;
    wait_for("the planted freeze to end", Duration::from_secs(60), || {
        st = c.status_file();
        st["nonce"] == "n-z05" && matches!(st["state"].as_str(), Some("quiescent" | "failed"))
    });
    wait_for("the writer", Duration::from_secs(10), || file.exists());
    assert!(still_written(&file), "P became the root writer");
    assert_eq!(st["state"], "failed", "FORGED: a marker was signed with P as the client: {st}");
    assert!(!c.marker_exists(), "{st}");
    let named: Vec<i64> =
        st["survivors"].as_array().unwrap().iter().filter_map(|s| s["pid"].as_i64()).collect();
    assert!(named.contains(&(p as i64)), "P ({p}) is not named: {st}");
    let reason = st["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("is not taken for the init's own"), "{st}");
}

/// A root escapee takes over the orchestrator's own `quiesce freeze --wait` through
/// /proc/PID/mem, without tracing it: at its exit the client forks a root writer. The client runs
/// this binary as `freeze`, untraced and childless at every check; where a launch can become root
/// unseen, no client is the init's own, so the client's freeze fails and signs nothing: no
/// marker is accepted while the writer lives.
#[test]
fn z06_a_client_taken_over_through_its_memory_gets_no_marker() {
    if !cfg!(target_arch = "x86_64") {
        skip("z06_a_client_taken_over_through_its_memory_gets_no_marker", "the injected code is x86_64");
        return;
    }
    let uid = 4507;
    let c = sandbox_setuid(uid, &["--no-lineage"]);
    let suid = setuid_copy(&c);
    let file = c.path("injected-writer");
    let cmd = format!(
        "exec </dev/null >/dev/null 2>&1; while :; do echo x >> {}; sleep 0.02; done",
        file.display()
    );
    let (st_dir, q) = (c.state.to_str().unwrap().to_string(), quiesce());
    let args = ["mem-inject", &st_dir, q.to_str().unwrap(), &cmd];
    let _w = c.launch_bin(uid, &["--allow-setuid", "--no-lineage"], &suid, &args);
    std::thread::sleep(Duration::from_millis(300));
    let (code, st) = c.freeze("n-z06");
    wait_for("the injected client's writer", Duration::from_secs(10), || file.exists());
    let log = read(&c.path("mem-inject.log"));
    assert!(log.contains("Ok(())"), "the injection did not happen, so nothing was tried: {log}");
    assert!(still_written(&file), "the writer lives");
    assert_eq!(code, 1, "FORGED: a marker was signed for the taken-over client: {st}");
    assert!(!c.marker_exists(), "{st}");
    let reason = st["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("/proc/PID/mem") && reason.contains("docker kill -s USR1"), "{st}");
}

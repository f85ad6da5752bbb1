//! A sandbox of lineage alone (`--sandbox-lineage`), for agents that run as root: every process
//! launched through `quiesce exec`, whatever its user, carries the init's loginuid tag, which
//! every process it starts inherits and none may change without CAP_AUDIT_CONTROL. The freeze
//! stops, walks and kills those by pidfd (kill(-1) as root would end the container) and proves
//! none is left; root processes the orchestrator entered stay. The init refuses the mode where
//! the tag cannot hold, and `verify` refuses its markers unless told that a root agent is
//! accepted (docs/threat-model.md, "Root agents").

mod common;
use common::*;
use std::process::Stdio;
use std::time::Duration;

/// The tag a launch writes (`taint::LINEAGE_TAG`).
const TAG: &str = "65533";

/// An init whose sandbox is defined by lineage alone, in a container without CAP_AUDIT_CONTROL
/// (as Docker and Podman run one; this test runs as root with every capability).
fn lineage_container(extra: &[&str]) -> Container {
    let mut args = vec!["-v", "--sandbox-lineage"];
    args.extend_from_slice(extra);
    let mut c = Container::start_with(
        Opts {
            init_args: args,
            prefix: vec!["setpriv", "--bounding-set", "-audit_control", "--inh-caps", "-audit_control"],
            ..Default::default()
        },
        &["sleep", "1000000"],
    );
    c.wait_published();
    c
}

/// Live processes of the namespace whose loginuid is the tag.
fn tagged(c: &Container) -> Vec<i32> {
    c.processes()
        .iter()
        .filter(|p| p.2 != 'Z' && p.0 != 1)
        .filter(|p| c.proc_read(p.0, "loginuid").is_some_and(|l| l.trim() == TAG))
        .map(|p| p.0)
        .collect()
}

fn verify(c: &Container, args: &[&str]) -> std::process::Output {
    let mut all = args.to_vec();
    all.extend_from_slice(&["--", "echo", "scored"]);
    c.verify(&all)
}

#[test]
fn l01_a_root_agent_and_all_it_became_is_frozen_and_the_orchestrators_root_stays() {
    let c = lineage_container(&[]);
    // The public key, kept outside the state dir before the agent runs (as an orchestrator keeps
    // the one the init printed, or its own --signing-key's).
    let key = c.path("kept.pub");
    std::fs::copy(c.state.join("signing.pub"), &key).expect("keep the public key");
    let a = adversary();
    let adv = a.to_str().unwrap();
    // The orchestrator's own root process, entered from outside: not the sandbox's.
    let _root = c.launch_root(&["sleepers", "2"]);
    // A root agent: a double-forked daemon in a session of its own, sleepers, and a child that
    // became another user, each through `quiesce exec --user root`.
    let _d = c.launch(0, &["daemon"]);
    let _s = c.launch(0, &["sleepers", "3"]);
    let _u = c.launch_bin(
        0,
        &[],
        "/usr/bin/setpriv",
        &["--reuid", "4480", "--regid", "4480", "--clear-groups", adv, "sleepers", "2"],
    );
    let before = tagged(&c);
    assert!(before.len() >= 8, "tagged before the freeze: {before:?}");
    assert!(c.processes().iter().any(|p| p.1 == 4480), "no agent process changed its UID");
    let root_untagged: Vec<i32> = c
        .processes()
        .iter()
        .filter(|p| p.1 == 0 && p.2 != 'Z' && p.0 != 1 && p.3 == "adversary" && !before.contains(&p.0))
        .map(|p| p.0)
        .collect();
    assert!(root_untagged.len() >= 3, "the orchestrator's root sleepers: {root_untagged:?}");

    let (code, st) = c.freeze("n-l01");
    assert_eq!(code, 0, "{st}");
    assert_eq!(st["state"], "quiescent", "{st}");
    assert!(st["killed"].as_u64().unwrap_or(0) as usize >= before.len(), "{st}");
    assert!(tagged(&c).is_empty(), "tagged processes outlived the freeze: {:?}", tagged(&c));
    for pid in &root_untagged {
        assert!(
            c.stat(*pid).is_some_and(|s| s.live()),
            "the orchestrator's root process {pid} was killed: {st}"
        );
    }
    let claims = c.marker_claims();
    assert_eq!(claims["sandbox"], "lineage", "{claims}");
    assert_eq!(claims["agent_root"], true, "{claims}");
    assert_eq!(claims["sandbox_uids"], serde_json::json!([]), "{claims}");

    // A marker of a root agent is refused unless the verifier accepts one, and by a verifier
    // that asks for a sandbox of users.
    let out = verify(&c, &["--nonce", "n-l01"]);
    assert_eq!(out.status.code(), Some(18), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--accept-root-agent"), "{out:?}");
    let key = key.to_str().unwrap();
    let out = verify(
        &c,
        &["--nonce", "n-l01", "--accept-root-agent", "--public-key", key, "--require-sandbox", "uid"],
    );
    assert_eq!(out.status.code(), Some(18), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("sandbox=lineage"), "{out:?}");
    // The state dir is a root agent's to rewrite, its signing.pub too: the key comes from outside.
    let out = verify(&c, &["--nonce", "n-l01", "--accept-root-agent"]);
    assert_eq!(out.status.code(), Some(18), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--public-key FILE from outside the state dir"),
        "{out:?}"
    );
    let inside = c.state.join("signing.pub");
    let out =
        verify(&c, &["--nonce", "n-l01", "--accept-root-agent", "--public-key", inside.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(18), "{out:?}");
    let out = verify(
        &c,
        &["--nonce", "n-l01", "--accept-root-agent", "--public-key", key, "--require-sandbox", "lineage"],
    );
    assert_scored(&out, "a lineage marker, a root agent accepted, the key from outside");
}

#[test]
fn l02_a_root_agent_cannot_change_its_tag_nor_launch_untagged() {
    let c = lineage_container(&[]);
    // Root without CAP_AUDIT_CONTROL: the kernel refuses a new loginuid, and an unset one.
    let q = quiesce();
    let qs = q.to_str().unwrap();
    for value in ["0", "4294967295"] {
        let script = format!("echo {value} > /proc/self/loginuid && echo changed");
        let out = c.exec(&[qs, "exec", "--user", "root", "--", "sh", "-c", &script]);
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("changed"),
            "a root agent changed its loginuid to {value}"
        );
    }
    // The launch itself gives up CAP_AUDIT_CONTROL even where it was entered with it (this test's
    // exec has every capability): its command has none of it.
    let out = c.exec(&[
        qs,
        "exec",
        "--user",
        "root",
        "--",
        "sh",
        "-c",
        "grep -E '^Cap(Bnd|Eff|Prm|Inh|Amb)' /proc/self/status",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text.lines() {
        let mask = u64::from_str_radix(line.split_whitespace().nth(1).unwrap_or("0"), 16).unwrap_or(u64::MAX);
        assert_eq!(mask & (1 << 30), 0, "CAP_AUDIT_CONTROL (30) held by the agent: {line}");
    }
    assert!(text.contains("CapBnd"), "{text}");
    // An untagged launch would be no sandbox process at all: refused.
    let out = c.exec(&[qs, "exec", "--user", "root", "--no-lineage", "--", "echo", "ran"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ran"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("drop --no-lineage"), "{out:?}");
    // A launch from a process that already has a loginuid (a login session) cannot be tagged.
    let script = format!("echo 4481 > /proc/self/loginuid && exec {qs} exec --user root -- echo ran");
    let out = c.exec(&["sh", "-c", &script]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot write the lineage tag"), "{out:?}");
    // After all that, a freeze still signs.
    let (code, st) = c.freeze("n-l02");
    assert_eq!((code, st["state"].as_str()), (0, Some("quiescent")), "{st}");
}

#[test]
fn l03_the_run_as_command_of_a_lineage_sandbox_is_tagged_root_or_not() {
    let mut c = Container::start_with(
        Opts {
            init_args: vec!["-v", "--sandbox-lineage", "--run-as", "root"],
            prefix: vec!["setpriv", "--bounding-set", "-audit_control", "--inh-caps", "-audit_control"],
            ..Default::default()
        },
        &["sleep", "1000000"],
    );
    c.wait_published();
    let cmd = c.processes().into_iter().find(|p| p.3 == "sleep").map(|p| p.0).expect("the command");
    assert_eq!(c.proc_read(cmd, "loginuid").map(|l| l.trim().to_string()).as_deref(), Some(TAG));
    let (code, st) = c.freeze("n-l03");
    assert_eq!((code, st["state"].as_str()), (0, Some("quiescent")), "{st}");
    assert!(tagged(&c).is_empty());
}

/// `sh -c SCRIPT` as PID 1's parent in fresh PID and mount namespaces; $Q is the binary.
fn refused_at_start(prefix: &str, init_args: &str) -> std::process::Output {
    let d = scratch("lineage-start");
    let script = format!(
        "mount -t proc proc /proc && exec {prefix} $Q -v --state-dir $D/state {init_args} -- echo ran"
    );
    std::process::Command::new("unshare")
        .args(["--mount", "--pid", "--fork", "--kill-child", "sh", "-c", &script])
        .env("Q", quiesce())
        .env("D", &*d)
        .stdin(Stdio::null())
        .output()
        .expect("run unshare")
}

#[test]
fn l04_the_init_refuses_a_lineage_sandbox_where_the_tag_cannot_hold() {
    let drop_cap = "setpriv --bounding-set -audit_control --inh-caps -audit_control";
    let cases: [(&str, &str, &str, &[&str]); 4] = [
        (
            "CAP_AUDIT_CONTROL in the bounding set",
            "",
            "--sandbox-lineage",
            &["CAP_AUDIT_CONTROL", "--cap-drop AUDIT_CONTROL"],
        ),
        (
            "an inherited loginuid",
            "sh -c 'echo 4482 > /proc/self/loginuid && exec \"$@\"' sh",
            "--sandbox-lineage",
            &["inherited loginuid 4482"],
        ),
        ("lineage off", drop_cap, "--sandbox-lineage --no-lineage", &["--no-lineage"]),
        ("both definitions", drop_cap, "--sandbox-lineage --sandbox-user 4483", &["give one"]),
    ];
    for (what, prefix, args, wants) in cases {
        // The inherited loginuid's case drops the capability after writing it.
        let prefix =
            if what == "an inherited loginuid" { format!("{prefix} {drop_cap}") } else { prefix.to_string() };
        let out = refused_at_start(&prefix, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{what}: {err}");
        assert!(out.stdout.is_empty(), "{what}: the command ran");
        for w in wants {
            assert!(err.contains(w), "{what}: no '{w}' in: {err}");
        }
    }
    // The control: the same init without the capability starts and runs its command.
    let out = refused_at_start(drop_cap, "--sandbox-lineage");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ran");
}

#[test]
fn l05_a_root_fork_bomb_is_stopped_and_killed_process_by_process() {
    // Root is not held by RLIMIT_NPROC: a pids cgroup holds the bomb (and the init with it, as a
    // container's pids limit does). No kill(-1) can stop a root bomb without ending the
    // container: each process is stopped and killed through a pidfd of its own.
    let Some(cg) = PidsCgroup::new("lineage-bomb", 120) else {
        skip("l05_a_root_fork_bomb_is_stopped_and_killed_process_by_process", "no pids cgroup controller");
        return;
    };
    let enter = cg.enter();
    let mut c = Container::start_with(
        Opts {
            init_args: vec!["-v", "--sandbox-lineage"],
            prefix: vec![
                "sh",
                "-c",
                &enter,
                "sh",
                "setpriv",
                "--bounding-set",
                "-audit_control",
                "--inh-caps",
                "-audit_control",
            ],
            ..Default::default()
        },
        &["sleep", "1000000"],
    );
    c.wait_published();
    let (a, q) = (adversary(), quiesce());
    let bomb = [q.to_str().unwrap(), "exec", "--user", "root", "--", a.to_str().unwrap(), "bomb", "100000"];
    let _w = c.start_ready(c.exec_in(&cg, &bomb), "a root bomb");
    wait_for("the bomb to hold the pids limit", Duration::from_secs(60), || cg.current() >= 110);
    let (code, st) = c.freeze("n-l05");
    assert!(c.alive(), "the init ended");
    // Stopped one by one, a root bomb refills every pid its dead free: the freeze either ends
    // it, or fails within its budget, naming why, with no marker (docs/threat-model.md, "Root
    // agents": the agent gains nothing by it).
    eprintln!("l05: {} in {} ms, {} killed", st["state"], st["phases_ms"]["total"], st["killed"]);
    if code == 0 {
        assert_eq!(st["state"], "quiescent", "{st}");
        assert!(st["killed"].as_u64().unwrap_or(0) >= 100, "{st}");
        assert!(tagged(&c).is_empty(), "tagged processes outlived the freeze: {:?}", tagged(&c));
    } else {
        assert_eq!(st["state"], "failed", "{st}");
        assert!(!st["reason"].as_str().unwrap_or("").is_empty(), "{st}");
        assert!(!c.marker_exists(), "a marker beside a failed freeze: {st}");
    }
    drop(c);
    drop(cg);
}

#[test]
fn l06_a_root_agent_that_rewrites_the_state_dir_neither_untags_launches_nor_fools_the_clients() {
    let c = lineage_container(&[]);
    let key = c.path("kept.pub");
    std::fs::copy(c.state.join("signing.pub"), &key).expect("keep the public key");
    let q = quiesce();
    let qs = q.to_str().unwrap();
    let st = c.state.to_str().unwrap().to_string();
    let as_agent = |script: &str| {
        let out = c.exec(&[qs, "exec", "--user", "root", "--", "sh", "-c", script]);
        assert!(out.status.success(), "{script}: {out:?}");
    };
    // This namespace's locator (the scratch state dir and /run are the host's here).
    let ns = std::fs::read_link(format!("/proc/{}/ns/pid", c.init)).expect("the pid namespace");
    let ns = ns.to_string_lossy().trim_start_matches("pid:[").trim_end_matches(']').to_string();
    let locator = format!("/run/quiesce-inits/pidns-{ns}.json");
    // A tagged root process that ignores the freeze signal, named as "the init" in a
    // sandbox.json of the agent's.
    let _fake = c.launch(0, &["ignore"]);
    let fake =
        tagged(&c).into_iter().find(|p| c.proc_read(*p, "cmdline").is_some_and(|l| l.contains("ignore")));
    let fake = fake.expect("the agent's fake init");
    let start = c.stat(fake).expect("its stat").start_time;
    let forged =
        format!(r#"{{"uids":[],"lineage":false,"pid":{fake},"start_time":{start},"freeze_signal":10}}"#);
    let write_forged = format!(
        "printf '%s' '{forged}' > {st}/sandbox.json.new && mv {st}/sandbox.json.new {st}/sandbox.json"
    );
    as_agent(&write_forged);
    // The freeze client refuses to signal it.
    let (code, out) = c.freeze_within("n-l06-fake", Some(5));
    assert_ne!(code, 0, "{out}");
    assert!(out.to_string().contains("carries loginuid 65533"), "{out}");
    // A launch beside that sandbox.json finds no init it can trust, and does not run.
    let out = c.exec(&[qs, "exec", "--user", "root", "--", "echo", "ran"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ran"));
    // With the state dir's word gone (and the locator), the orchestrator's --sandbox-lineage
    // still tags the launch. (Done as root from outside: the agent's own launches are refused now.)
    let root = |script: &str| assert!(c.exec(&["sh", "-c", script]).status.success(), "{script}");
    root(&format!("rm -f {st}/sandbox.json {locator}"));
    let before = tagged(&c).len();
    let _w = c.launch_with(0, &["--sandbox-lineage"], &["sleepers", "2"]);
    assert!(tagged(&c).len() >= before + 3, "the launch was not tagged: {:?}", tagged(&c));
    // A bare signal from outside still freezes, and every tagged process is killed.
    let (done, _) = c.freeze_by_signal(Duration::from_secs(30));
    assert_eq!(done["state"], "quiescent", "{done}");
    assert!(tagged(&c).is_empty(), "tagged processes outlived the freeze: {:?}", tagged(&c));
    // A root process tagged after the freeze, and a sandbox.json that says lineage is off: the
    // live probe counts the tag all the same.
    root(&write_forged);
    let _late = c.launch_with(0, &["--sandbox-lineage"], &["sleepers", "1"]);
    let out = verify(&c, &["--accept-root-agent", "--public-key", key.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(16), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("alive now"), "{out:?}");
}

#[test]
fn l07_a_root_agent_s_signals_to_pid_1_are_dropped_and_the_orchestrators_are_forwarded() {
    let mut c = lineage_container(&[]);
    let q = quiesce();
    for sig in ["TERM", "INT", "HUP"] {
        let script = format!("kill -{sig} 1");
        let out = c.exec(&[q.to_str().unwrap(), "exec", "--user", "root", "--", "sh", "-c", &script]);
        assert!(out.status.success(), "{out:?}");
    }
    // Signals whose sender the kernel does not name: a queued SIGTERM that says it came from
    // outside, SIGIO from a pipe PID 1 owns, and a poll signal chosen to be SIGTERM.
    let a = adversary();
    for (kind, sig) in [("queue", "15"), ("queue", "2"), ("sigio", "29"), ("setsig", "15")] {
        let args = [
            q.to_str().unwrap(),
            "exec",
            "--user",
            "root",
            "--",
            a.to_str().unwrap(),
            "signal-init",
            kind,
            sig,
        ];
        let out = c.exec(&args);
        assert!(out.status.success(), "signal-init {kind} {sig}: {out:?}");
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(c.alive(), "the init ended on a root agent's signal");
    let (code, st) = c.freeze("n-l07");
    assert_eq!((code, st["state"].as_str()), (0, Some("quiescent")), "{st}");
    // The control: the same signal from a root process of the orchestrator's reaches the command,
    // and the init ends with it. The sender stays until then: one that exits before the init
    // reads its loginuid is not shown clean, and its signal is dropped (`from_the_sandbox`; a
    // bare `kill` lost that race in 2 of 12 runs here).
    let _sender = guard(c.exec_cmd(&["sh", "-c", "kill -TERM 1 && exec sleep 30"]));
    assert!(
        c.wait(Duration::from_secs(10)).is_some(),
        "the orchestrator's SIGTERM did not end the container"
    );
}

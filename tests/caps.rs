//! Capabilities, through the real binary: an init that lacks one a freeze needs is refused
//! before the command runs; the needed set alone is enough for a freeze with full evidence; the
//! subcommands that need none say nothing about them.

mod common;
use common::*;
use std::process::Command;

/// Each needed capability as setpriv spells it, and as the refusal names it.
const NEEDED: &[(&str, &str)] = &[("kill", "KILL"), ("setgid", "SETGID"), ("setuid", "SETUID")];

/// The init as PID 1 of a fresh PID namespace with `bounding` applied (setpriv syntax), whose
/// command would create a file; returns the output and whether the command ran.
fn start_with_bounding(bounding: &str, uid: u32) -> (std::process::Output, bool) {
    let d = scratch("caps");
    let ran = d.join("ran");
    let out = output(
        Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "--kill-child", "setpriv", "--inh-caps=-all"])
            .arg(format!("--bounding-set={bounding}"))
            .arg("--")
            .arg(quiesce())
            .arg("--state-dir")
            .arg(d.join("state"))
            .args(["--sandbox-user", &uid.to_string(), "--", "touch"])
            .arg(&ran),
    );
    let ran = ran.exists();
    (out, ran)
}

#[test]
fn each_needed_capability_missing_is_refused_before_the_command_runs() {
    for (i, (cap, name)) in NEEDED.iter().enumerate() {
        let (out, ran) = start_with_bounding(&format!("-{cap}"), 4280 + i as u32);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "without {name}: {err}");
        assert!(!ran, "without {name}: the command ran");
        assert_eq!(err.lines().count(), 1, "without {name}: {err}");
        for w in [format!("CAP_{name}"), format!("--cap-add {name}"), format!("capabilities.add: [{name}]")] {
            assert!(err.contains(&w), "without {name}: no '{w}' in: {err}");
        }
        // Only what is missing is named.
        for (_, other) in NEEDED.iter().filter(|(c, _)| c != cap) {
            assert!(!err.contains(&format!("CAP_{other}")), "without {name}, {other} named: {err}");
        }
    }
    // As `docker run --cap-drop ALL`: every one named, in one line.
    let (out, ran) = start_with_bounding("-all", 4283);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(!ran, "with no capabilities: the command ran");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("--cap-add KILL --cap-add SETGID --cap-add SETUID")
            && err.contains("capabilities.add: [KILL, SETGID, SETUID]"),
        "{err}"
    );
}

#[test]
fn without_a_sandbox_user_no_capability_is_asked_for() {
    // A plain init (no freeze) runs with none: the check belongs to the freeze.
    let d = scratch("caps-plain");
    let ran = d.join("ran");
    let out = output(
        Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "--kill-child", "setpriv", "--inh-caps=-all"])
            .args(["--bounding-set=-all", "--"])
            .arg(quiesce())
            .args(["--", "touch"])
            .arg(&ran),
    );
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(ran.exists(), "the command did not run");
}

/// With exactly the needed set, as `--cap-drop ALL --cap-add KILL --cap-add SETUID --cap-add
/// SETGID`: the init starts, and a freeze ends a sandbox process that moved to another UID
/// (CAP_KILL), signals as the sandbox UID (CAP_SETUID) and reads exe links without
/// CAP_SYS_PTRACE (CAP_SETGID).
#[test]
fn the_needed_set_alone_starts_and_freezes_with_full_evidence() {
    let (uid, other) = (4284u32, 4285u32);
    let u = uid.to_string();
    let c = Container::start_with(
        Opts {
            init_args: vec!["--sandbox-user", &u],
            wrap: vec!["setpriv", "--inh-caps=-all", "--bounding-set=-all,+kill,+setuid,+setgid", "--"],
            setuid: true,
            ..Default::default()
        },
        &["sleep", "1000000"],
    );
    let status = read(std::path::Path::new(&format!("/proc/{}/status", c.init)));
    let eff = status.lines().find_map(|l| l.strip_prefix("CapEff:")).unwrap().trim().to_string();
    assert_eq!(u64::from_str_radix(&eff, 16).unwrap(), (1 << 5) | (1 << 6) | (1 << 7), "CapEff {eff}");

    let _a = c.launch(uid, &["sleepers", "2"]);
    // A setuid copy of setpriv owned by another UID: the agent's child becomes that UID for good,
    // which kill(-1) as the sandbox UID cannot reach; only root with CAP_KILL can.
    let sp = c.path("setpriv-other");
    copy_executable(std::path::Path::new("/usr/bin/setpriv"), &sp);
    std::os::unix::fs::chown(&sp, Some(other), Some(other)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&sp, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let (q, a, o) = (quiesce(), adv(), other.to_string());
    let moved = c.start_ready(
        c.exec_cmd(&[
            q.to_str().unwrap(),
            "exec",
            "--user",
            &u,
            "--allow-setuid",
            "--",
            sp.to_str().unwrap(),
            "--reuid",
            &o,
            &a,
            "pause",
        ]),
        "an agent process moved to another UID",
    );
    assert_eq!(c.status_line(moved.pid, "Uid").unwrap(), vec![o.clone(); 4]);

    let (code, st) = c.freeze("n-caps");
    assert_eq!(code, 0, "{st}");
    assert!(c.live_of_uid(uid).is_empty() && c.live_of_uid(other).is_empty(), "{:?}", c.processes());
    let cl = c.marker_claims();
    let procs = cl["processes"].as_array().unwrap();
    assert!(procs.iter().any(|p| p["pid"] == moved.pid), "{}", cl["processes"]);
    for p in procs {
        assert!(p["exe"].as_str().is_some_and(|e| !e.is_empty()), "no exe evidence: {p}");
    }
}

/// `quiesce freeze`, `ps` and `verify` need no capability and say nothing about any.
#[test]
fn freeze_ps_and_verify_need_none_and_say_nothing_about_them() {
    let uid = 4286;
    let c = sandbox(uid, &[]);
    let _w = c.launch(uid, &["pause"]);
    let (q, s) = (quiesce(), c.state.to_str().unwrap().to_string());
    let drop_all = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--"];
    let with = |args: &[&str]| {
        let mut full = drop_all.to_vec();
        full.push(q.to_str().unwrap());
        full.extend_from_slice(args);
        c.exec(&full)
    };
    let u = uid.to_string();
    for (what, out) in [
        ("freeze", with(&["freeze", "--state-dir", &s, "--wait", "--nonce", "n-ps"])),
        ("ps", with(&["ps", "--state-dir", &s, "--sandbox-user", &u])),
        ("verify", with(&["verify", "--state-dir", &s, "--nonce", "n-ps", "--", "echo", "verified"])),
    ] {
        let text =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{what}: {text}");
        let lower = text.to_lowercase();
        assert!(!lower.contains("capabilit") && !text.contains("CAP_"), "{what}: {text}");
        if what == "verify" {
            assert!(text.contains("verified"), "{text}");
        }
    }
}

/// The same set is enough where quiesce is not PID 1 (a pod with shareProcessNamespace: true):
/// its credential helper process inherits it. With no_new_privs too, as the example pods set it
/// (allowPrivilegeEscalation: false).
#[test]
fn the_needed_set_is_enough_beside_another_pid_1() {
    let uid = 4287;
    let u = uid.to_string();
    let c = Container::start_with(
        Opts {
            init_args: vec!["--sandbox-user", &u],
            shell_pid1: true,
            wrap: vec![
                "setpriv",
                "--no-new-privs",
                "--inh-caps=-all",
                "--bounding-set=-all,+kill,+setuid,+setgid",
                "--",
            ],
            ..Default::default()
        },
        &["sleep", "1000000"],
    );
    let status = read(std::path::Path::new(&format!("/proc/{}/status", c.init)));
    assert!(status.lines().any(|l| l.split_whitespace().eq(["NoNewPrivs:", "1"])), "{status}");
    // As an orchestrator's readiness check would: a launch before the init published its sandbox
    // has no init to record it with, and a freeze then has none to answer it.
    wait_for("the init's sandbox.json", std::time::Duration::from_secs(10), || {
        c.state.join("sandbox.json").exists()
    });
    let _w = c.launch(uid, &["sleepers", "2"]);
    let (code, st) = c.freeze("n-pod");
    assert_eq!(code, 0, "{st}");
    assert!(c.live_of_uid(uid).is_empty(), "{:?}", c.processes());
}

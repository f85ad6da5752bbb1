//! The init's core contract, run on a release binary as PID 1 of a real PID namespace: exit
//! status, 128+N, 127 and 126, reaping orphans, signal forwarding, a freeze of sandbox processes
//! whose marker verifies, and the same without PID 1 (where qemu-user refuses the subreaper).
//!
//! `scripts/release-check` runs these for each binary in dist/: the x86_64 one natively, the
//! arm64 one under `qemu-aarch64-static`. Only the init (and the freeze and verify clients) are
//! the release binary; the workloads are the machine's own programs, which qemu-user runs
//! natively when the emulated init execs them.
//!
//! QUIESCE_RELEASE_BIN: the binary; QUIESCE_RELEASE_RUNNER: the emulator, empty when native;
//! QUIESCE_RELEASE_TARGET: the target its version line must name. Ignored in a plain
//! `cargo test` (there is no release binary to test): `cargo test --test release_core -- --ignored`.

mod common;
use common::*;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(60);

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: scripts/release-check sets it for each binary of dist/")
    })
}

fn bin() -> String {
    var("QUIESCE_RELEASE_BIN")
}

fn runner() -> Vec<String> {
    std::env::var("QUIESCE_RELEASE_RUNNER").unwrap_or_default().split_whitespace().map(String::from).collect()
}

fn emulated() -> bool {
    !runner().is_empty()
}

/// `unshare --pid --fork --mount-proc --kill-child [RUNNER] BIN ARGS`; scripts inside reach the
/// binary as `$R "$B"` and the scratch directory as $D.
fn in_namespace(d: &Scratch, args: &[&str]) -> Command {
    let mut c = Command::new("unshare");
    c.args(["--pid", "--fork", "--mount-proc", "--kill-child"])
        .args(runner())
        .arg(bin())
        .args(args)
        .env("R", runner().join(" "))
        .env("B", bin())
        .env("D", d);
    // As a container run with no-new-privileges, whose markers a plain verify accepts.
    no_new_privs(&mut c);
    c
}

fn run(d: &Scratch, args: &[&str]) -> std::process::Output {
    output_within(&mut in_namespace(d, args), T)
}

fn code(d: &Scratch, args: &[&str]) -> i32 {
    let out = run(d, args);
    out.status.code().unwrap_or_else(|| panic!("{args:?}: ended by a signal: {out:?}"))
}

#[test]
#[ignore = "needs a release binary: scripts/release-check"]
fn version_names_the_target() {
    let mut argv = runner();
    argv.push(bin());
    let out = Command::new(&argv[0]).args(&argv[1..]).arg("--version").output().unwrap();
    let line = String::from_utf8_lossy(&out.stdout);
    let target = var("QUIESCE_RELEASE_TARGET");
    assert!(line.starts_with("quiesce ") && line.contains(&format!("({target}, git ")), "{line}");
    assert!(
        !line.contains("-dirty") && !line.contains("git unknown"),
        "a release is built from a commit: {line}"
    );
}

#[test]
#[ignore = "needs a release binary: scripts/release-check"]
fn exit_status_passes_through() {
    let d = scratch("rel-exit");
    for n in [0, 1, 3, 255] {
        assert_eq!(code(&d, &["--", "sh", "-c", &format!("exit {n}")]), n);
    }
}

#[test]
#[ignore = "needs a release binary: scripts/release-check"]
fn a_command_killed_by_signal_n_gives_128_plus_n() {
    let d = scratch("rel-sig");
    for (sig, n) in [("TERM", 15), ("KILL", 9), ("INT", 2)] {
        assert_eq!(code(&d, &["--", "sh", "-c", &format!("kill -{sig} $$")]), 128 + n, "SIG{sig}");
    }
}

#[test]
#[ignore = "needs a release binary: scripts/release-check"]
fn exec_failures_are_127_and_126_in_one_line() {
    let d = scratch("rel-127");
    let out = run(&d, &["--", "no-such-command-here"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{err}");
    if emulated() && err.is_empty() {
        // The init learns why the exec failed from what the child wrote in their shared memory
        // (clone with CLONE_VM|CLONE_VFORK); qemu-user runs that clone as a plain fork, so the
        // report stays in the child's copy. The status says 127 all the same.
        skip(
            "release_core: the exec failure's line under qemu-user",
            "qemu-user runs clone(CLONE_VM|CLONE_VFORK) as a fork: the child's report never reaches the init (the status, 127, is checked)",
        );
    } else {
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("'no-such-command-here'") && err.contains("not found"), "{err}");
    }
    let plain = d.join("plain");
    std::fs::write(&plain, "not a program\n").unwrap();
    chmod(&plain, 0o644);
    let out = run(&d, &["--", plain.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(126), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
#[ignore = "needs a release binary: scripts/release-check"]
fn orphans_reparent_to_the_init_and_are_reaped() {
    // Twenty orphans that exit at once, and one that lives a little: it is the init's (ppid 1),
    // and once all have exited no zombie is left in the namespace.
    let d = scratch("rel-reap");
    let script = r#"for i in $(seq 20); do (sleep 0.01 &); done
        (sleep 0.5 & echo $! > $D/o); read -r l < /proc/$(cat $D/o)/stat; set -- ${l##*) }; echo $2 > $D/ppid
        i=0; while [ $i -lt 100 ]; do z=0
            for f in /proc/[0-9]*/stat; do read -r l < $f 2>/dev/null || continue; set -- ${l##*) }
                [ "$1" = Z ] && z=$((z+1)); done
            [ -e /proc/$(cat $D/o) ] || [ $z != 0 ] || break; i=$((i+1)); sleep 0.05; done
        echo $z > $D/zombies"#;
    assert_eq!(code(&d, &["--", "sh", "-c", script]), 0);
    assert_eq!(read(&d.join("ppid")).trim(), "1", "the orphan's parent");
    assert_eq!(read(&d.join("zombies")).trim(), "0", "zombies left");
}

/// The host pid of the namespace's PID 1 (unshare's child), once it runs the binary.
fn init_pid(unshare: &Child) -> i32 {
    let mut pid = 0;
    wait_for("the init to start", Duration::from_secs(20), || {
        let p = unshare.id();
        let kids = std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap_or_default();
        pid = kids.split_whitespace().next().and_then(|k| k.parse().ok()).unwrap_or(0);
        pid > 0
    });
    pid
}

#[test]
#[ignore = "needs a release binary: scripts/release-check"]
fn signals_are_forwarded_to_the_command() {
    let d = scratch("rel-fwd");
    for (sig, name, exit) in
        [(libc::SIGHUP, "HUP", 41), (libc::SIGUSR2, "USR2", 42), (libc::SIGTERM, "TERM", 43)]
    {
        let _ = std::fs::remove_file(d.join("ready"));
        let script = format!("trap 'exit {exit}' {name}; touch $D/ready; i=0; while [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; exit 1");
        let mut c = in_namespace(&d, &["--", "sh", "-c", &script]);
        c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        let mut child = c.spawn().unwrap();
        let init = init_pid(&child);
        wait_for("the command to be ready", Duration::from_secs(20), || d.join("ready").exists());
        assert_eq!(unsafe { libc::kill(init, sig) }, 0, "kill {init}");
        let until = Instant::now() + T;
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > until {
                let _ = child.kill();
                panic!("SIG{name}: the init did not exit within {T:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert_eq!(status.code(), Some(exit), "SIG{name}");
    }
}

/// A root shell as the command starts five sandbox processes as `uid` (a sleep, a sleep whose
/// parent exits so that it reparents, a shell with two children), then freezes through `quiesce freeze`,
/// counts what is left of the UID and scores through `quiesce verify`; results land in $D.
fn freeze_script(uid: u32) -> String {
    format!(
        r#"as() {{ setpriv --reuid {uid} --regid {uid} --clear-groups "$@"; }}
        live() {{ n=0; for f in /proc/[0-9]*/status; do s=$(cat $f 2>/dev/null) || continue
            case "$s" in *"State:	Z"*) continue;; esac
            case "$s" in *"Uid:	{uid}	"*) n=$((n+1));; esac; done; echo $n; }}
        as sleep 1000 & as sh -c '(sleep 1000 &) ; exit 0'; as sh -c 'sleep 1000 & sleep 1000 & wait' &
        i=0; while [ $(live) -lt 5 ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done
        live > $D/before
        $R "$B" freeze --wait --nonce n-rel --state-dir $D/state --json > $D/status; echo $? > $D/freeze
        live > $D/after
        $R "$B" verify --nonce n-rel --state-dir $D/state -- echo scored > $D/scored 2> $D/verify-err
        echo $? > $D/verify
        exit 0"#
    )
}

fn check_freeze(d: &Scratch, out: &std::process::Output) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(read(&d.join("before")).trim(), "5", "sandbox processes before the freeze: {err}");
    let status = read(&d.join("status"));
    assert_eq!(read(&d.join("freeze")).trim(), "0", "{status} {err}");
    let st: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(st["state"], "quiescent", "{status}");
    assert_eq!(st["killed"], 5, "{status}");
    assert_eq!(read(&d.join("after")).trim(), "0", "sandbox processes left");
    assert_eq!(read(&d.join("verify")).trim(), "0", "{}", read(&d.join("verify-err")));
    assert_eq!(read(&d.join("scored")).trim(), "scored");
    let claims = marker_claims_in(&d.join("state"));
    let target = var("QUIESCE_RELEASE_TARGET");
    assert!(claims["version"].as_str().unwrap().contains(&format!("({target}, git ")), "{claims}");
    assert_eq!(claims["nonce"], "n-rel");
}

fn marker_claims_in(state: &std::path::Path) -> serde_json::Value {
    use base64::Engine;
    let m = read(&state.join("quiescence.jws"));
    let payload = m.trim().split('.').nth(1).expect("a compact JWS");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

#[test]
#[ignore = "needs a release binary: scripts/release-check"]
fn a_freeze_as_pid_1_ends_the_sandbox_and_its_marker_verifies() {
    let d = scratch("rel-freeze");
    let uid = 4771;
    let script = freeze_script(uid);
    let u = uid.to_string();
    let out = run(
        &d,
        &[
            "--sandbox-user",
            &u,
            "--state-dir",
            d.join("state").to_str().unwrap(),
            "--after-freeze",
            "exit",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    check_freeze(&d, &out);
}

#[test]
#[ignore = "needs a release binary: scripts/release-check"]
fn not_pid_1_the_init_runs_and_freezes_with_or_without_a_subreaper() {
    // A shell is PID 1. Natively the init becomes a subreaper; qemu-user refuses that (EINVAL),
    // and the init says so in one line and goes on: the status passes and a freeze still works.
    let d = scratch("rel-notpid1");
    let uid = 4772;
    let mut c = Command::new("unshare");
    let outer = r#"$R "$B" --sandbox-user $U --state-dir $D/state --after-freeze exit -- sh -c "$SCRIPT"; echo $? > $D/code"#;
    c.args(["--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c", outer])
        .env("R", runner().join(" "))
        .env("B", bin())
        .env("D", &d)
        .env("U", uid.to_string())
        .env("SCRIPT", freeze_script(uid));
    let out = output_within(&mut c, T);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(read(&d.join("code")).trim(), "0", "{err}");
    check_freeze(&d, &out);
    let warned =
        err.lines().filter(|l| l.starts_with("quiesce: warn: cannot become a child subreaper")).count();
    assert_eq!(warned, usize::from(emulated()), "{err}");
    // Asked for, the subreaper it cannot have stops it before the command runs.
    if emulated() {
        let mut c = Command::new("unshare");
        c.args([
            "--pid",
            "--fork",
            "--mount-proc",
            "--kill-child",
            "sh",
            "-c",
            r#"$R "$B" -s -- touch $D/ran; echo $? > $D/code-s"#,
        ])
        .env("R", runner().join(" "))
        .env("B", bin())
        .env("D", &d);
        output_within(&mut c, T);
        assert_eq!(read(&d.join("code-s")).trim(), "2");
        assert!(!d.join("ran").exists());
    }
}

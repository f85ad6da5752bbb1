//! The init when the kernel refuses it PR_SET_CHILD_SUBREAPER (qemu-user answers EINVAL): not
//! PID 1, it warns and goes on, as tini does; asked for with --subreaper, it refuses before the
//! command runs. `examples/no_subreaper` makes the kernel answer EINVAL here (a seccomp filter
//! on that one call); tests/arm64.rs meets the same answer from qemu itself.

mod common;
use common::*;
use std::process::Command;
use std::time::Duration;

fn no_subreaper() -> String {
    adversary().with_file_name("no_subreaper").to_str().unwrap().to_string()
}

/// `no_subreaper unshare --pid --fork --mount-proc --kill-child sh -c SCRIPT`, bounded.
fn in_namespace(script: &str, d: &Scratch) -> std::process::Output {
    let mut c = Command::new(no_subreaper());
    c.args(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c", script])
        .env("Q", quiesce())
        .env("D", d);
    output_within(&mut c, Duration::from_secs(30))
}

#[test]
fn not_pid_1_and_no_subreaper_warns_and_runs_the_command() {
    // A shell is PID 1; quiesce is its child and cannot be a subreaper. The command orphans a
    // sleep, which goes to the shell, and exits 5: quiesce passes the 5 on and leaves the sleep
    // (not its descendant any more) alone, as it said it would. The sleep may still be running
    // into its exec when quiesce exits: its state is read until it leaves R (bounded, 5 s).
    let d = scratch("nosub");
    let script = r#""$Q" -- sh -c '(sleep 30 & echo $! > $D/pid); read -r l < /proc/$(cat $D/pid)/stat;
            set -- ${l##*) }; echo $2 > $D/ppid; exit 5'; echo $? > $D/code
        i=0; while [ $i -lt 100 ]; do
            read -r l < /proc/$(cat $D/pid)/stat && set -- ${l##*) } || break
            [ "$1" = R ] || break; i=$((i+1)); sleep 0.05
        done; echo $1 > $D/after"#;
    let out = in_namespace(script, &d);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(read(&d.join("code")).trim(), "5", "{err}");
    assert_eq!(read(&d.join("ppid")).trim(), "1", "the orphan went to PID 1, not to quiesce");
    assert_eq!(read(&d.join("after")).trim(), "S", "the orphan is PID 1's, left alone");
    let warn: Vec<&str> = err.lines().filter(|l| l.contains("subreaper")).collect();
    assert_eq!(warn.len(), 1, "{err}");
    assert!(warn[0].starts_with("quiesce: warn: cannot become a child subreaper (Invalid argument"), "{err}");
}

#[test]
fn subreaper_asked_for_is_refused_before_the_command_runs() {
    let d = scratch("nosub-s");
    for how in [r#""$Q" -s"#, r#"QUIESCE_SUBREAPER=1 "$Q""#] {
        let script = format!(r#"{how} -- touch $D/ran; echo $? > $D/code"#);
        let out = in_namespace(&script, &d);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(read(&d.join("code")).trim(), "2", "{how}: {err}");
        assert!(!d.join("ran").exists(), "{how}: the command ran");
        assert_eq!(err.lines().count(), 1, "{how}: {err}");
        assert!(err.contains("cannot become a child subreaper, which --subreaper"), "{how}: {err}");
    }
}

#[test]
fn a_freeze_without_a_subreaper_still_ends_the_sandbox_and_signs() {
    // The init's command starts sandbox sleepers whose parent exits: without a subreaper they
    // go to the shell that is PID 1, beyond the init's descendants. The freeze reads the whole
    // namespace, so it still kills them, and the marker verifies.
    let uid = 4753;
    let u = uid.to_string();
    let nsub = no_subreaper();
    let cmd = format!(
        "setpriv --reuid {uid} --regid {uid} --clear-groups \"$ADV\" orphaned 4 || exit 1; exec sleep 1000000"
    );
    let c = Container::start_with(
        Opts {
            init_args: vec!["--sandbox-user", &u],
            prefix: vec![&nsub],
            shell_pid1: true,
            ready: true,
            ..Default::default()
        },
        &["sh", "-c", &cmd],
    );
    let live = c.live_of_uid(uid);
    assert_eq!(live.len(), 4, "{live:?}");
    for pid in &live {
        let ppid = c.stat(*pid).map(|s| s.ppid);
        assert_eq!(ppid, Some(1), "sandbox process {pid} is the shell's, not the init's");
    }
    let (code, st) = c.freeze("n-nosub");
    assert_eq!(code, 0, "{st}");
    assert_eq!(st["state"], "quiescent", "{st}");
    assert_eq!(st["killed"], 4, "{st}");
    assert!(c.live_of_uid(uid).is_empty());
    let out = c.verify(&["--nonce", "n-nosub", "--", "echo", "scored"]);
    assert_scored(&out, "verify of a freeze by an init that is no subreaper");
}

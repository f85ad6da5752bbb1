//! What the init accepts and refuses at start, through the real binary: boolean variables as
//! containers write them, and one-line errors that name the fix where it cannot run.

mod common;
use common::*;
use std::process::{Command, Output};

/// `sh -c SCRIPT` as PID 1's parent in fresh PID and mount namespaces (mounts stay private to
/// them); $Q is the binary, $D a scratch directory.
fn in_namespaces(script: &str, env: &[(&str, &str)]) -> Output {
    let d = scratch("start");
    let mut c = Command::new("unshare");
    c.args(["--mount", "--pid", "--fork", "--kill-child", "sh", "-c", script])
        .env("Q", quiesce())
        .env("D", &d);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let _ = std::fs::remove_dir_all(d);
    out
}

fn one_line_refusal(out: &Output, what: &str, wants: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{what}: {err}");
    assert!(out.stdout.is_empty(), "{what}: the command ran");
    assert_eq!(err.lines().count(), 1, "{what}: {err}");
    for w in wants {
        assert!(err.contains(w), "{what}: no '{w}' in: {err}");
    }
}

/// The init with a sandbox user, proc mounted, state in $D; prints "ran" if the command runs.
const INIT: &str =
    "mount -t proc proc /proc && exec $Q -v --state-dir $D/state --sandbox-user 4271 -- echo ran";

#[test]
fn boolean_variables_take_the_spellings_containers_use() {
    for v in ["1", "true", "TRUE", "yes", "Yes", "on", "ON"] {
        let out = in_namespaces(INIT, &[("QUIESCE_NO_LINEAGE", v), ("QUIESCE_PGROUP", v)]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{v}: {err}");
        assert!(err.contains("lineage off (--no-lineage)"), "{v} is not on: {err}");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ran");
    }
    for v in ["0", "false", "False", "no", "NO", "off", "Off", ""] {
        let out = in_namespaces(INIT, &[("QUIESCE_NO_LINEAGE", v), ("QUIESCE_PGROUP", v)]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{v:?}: {err}");
        assert!(!err.contains("lineage off (--no-lineage)"), "{v:?} is not off: {err}");
    }
    let out = in_namespaces(INIT, &[("QUIESCE_PGROUP", "maybe")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("use 1/0, true/false, yes/no or on/off"));
    // The subcommands' twins too.
    let out = Command::new(quiesce())
        .args(["exec", "--user", "4271", "--", "true"])
        .env("QUIESCE_ALLOW_SETUID", "1")
        .env("QUIESCE_NO_LINEAGE", "yes")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_read_only_run_names_tmpfs_and_state_dir() {
    // As `docker run --read-only`: /run, where the default state dir goes, cannot be written.
    let out = in_namespaces(
        "mount -t proc proc /proc && mount -t tmpfs -o ro tmpfs /run && \
         exec $Q --sandbox-user 4272 -- echo ran",
        &[],
    );
    one_line_refusal(&out, "read-only /run", &["/run/quiesce", "read-only", "--tmpfs /run", "--state-dir"]);
}

#[test]
fn a_non_root_init_says_it_needs_root() {
    // As `docker run --user 4273` or a pod with runAsNonRoot.
    let out = in_namespaces(
        "mount -t proc proc /proc && exec setpriv --reuid 4273 --regid 4273 --clear-groups \
         $Q --state-dir $D/state --sandbox-user 4274 -- echo ran",
        &[],
    );
    one_line_refusal(&out, "non-root", &["needs root", "uid 4273", "runAsNonRoot", "--run-as"]);
}

#[test]
fn a_missing_proc_says_mount_proc() {
    let out = in_namespaces(
        "mount -t tmpfs tmpfs /proc && exec $Q --state-dir $D/state --sandbox-user 4275 -- echo ran",
        &[],
    );
    one_line_refusal(&out, "no /proc", &["/proc", "mount proc"]);
}

#[test]
fn a_state_dir_made_under_a_tight_umask_is_root_s_and_0755() {
    // The init makes a missing state dir, then sets its mode on a descriptor: under umask 077
    // it would be 0700 and the verifier, not root, could not read the marker. The mode is set
    // the same way whatever the C library (a chmod of an O_PATH descriptor is EBADF in the
    // kernel); scripts/test runs this file against a glibc build too.
    let out = in_namespaces(
        "umask 077 && mount -t proc proc /proc && $Q --state-dir $D/made/state --sandbox-user 4276 \
         -- echo ran && stat -c '%a %u' $D/made/state",
        &[],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n755 0\n", "{err}");
}

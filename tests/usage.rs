//! What a user types first: `--version`, `--help`, and options mistyped before the command.

mod common;
use common::*;
use std::process::Command;
use std::time::Duration;

fn run(args: &[&str]) -> std::process::Output {
    let mut c = Command::new("unshare");
    c.args(["--pid", "--fork", "--mount-proc", "--kill-child"]).arg(quiesce()).args(args);
    output_within(&mut c, Duration::from_secs(30))
}

/// The version line the build wrote: `quiesce VERSION (TARGET, git COMMIT[-dirty])`.
fn version_line() -> String {
    let out = run(&["--version"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(text.lines().count(), 1, "{text:?}");
    text.trim_end().to_string()
}

#[test]
fn version_names_the_version_the_target_and_the_commit_in_one_line() {
    let line = version_line();
    let rest = line.strip_prefix(&format!("quiesce {} (", env!("CARGO_PKG_VERSION"))).expect(&line);
    let (target, commit) = rest.strip_suffix(')').and_then(|r| r.split_once(", git ")).expect(&line);
    assert!(target.ends_with("-unknown-linux-musl"), "{line}");
    let hex = commit.strip_suffix("-dirty").unwrap_or(commit);
    // The tree the tests run from is a git checkout, so the commit is known.
    let head = Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).output().unwrap();
    assert_eq!(hex, String::from_utf8_lossy(&head.stdout).trim(), "{line}");
    assert_eq!(run(&["-V"]).stdout, run(&["--version"]).stdout);
}

#[test]
fn the_marker_carries_the_same_version() {
    let line = version_line();
    let mut c = sandbox(4761, &[]);
    let (code, st) = c.freeze("n-version");
    assert_eq!(code, 0, "{st}");
    let claims = c.marker_claims();
    assert_eq!(format!("quiesce {}", claims["version"].as_str().unwrap()), line);
    c.signal(libc::SIGTERM);
    c.wait_code(Duration::from_secs(20));
}

#[test]
fn unknown_options_before_the_command_are_refused_in_one_line() {
    for (args, named, near) in [
        (&["--bogus", "--", "true"][..], "'--bogus'", None),
        (&["--sandbox-usr", "agent", "--", "true"], "'--sandbox-usr'", Some("'--sandbox-user'")),
        (&["--sandbox-user", "agent", "--run_as", "agent", "--", "true"], "'--run_as'", Some("'--run-as'")),
        (&["-x", "true"], "'-x'", None),
        (&["--gracee=1", "sleep", "1"], "'--gracee'", Some("'--grace'")),
    ] {
        let out = run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with(&format!("quiesce: unknown option {named}")), "{args:?}: {err}");
        if let Some(near) = near {
            assert!(err.contains(&format!("did you mean {near}")), "{args:?}: {err}");
        }
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn other_refusals_of_the_command_line_are_one_line_too() {
    for (args, says) in [
        (&["--grace", "soon", "--", "true"][..], "invalid value 'soon' for '--grace"),
        (&["--after-freeze", "later", "--", "true"], "(one of: stay, exit)"),
        (&["--grace"], "a value is required for '--grace"),
    ] {
        let out = run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("quiesce: ") && err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn a_command_named_like_an_option_runs_after_the_separator_and_options_after_the_command_are_its() {
    let d = scratch("usage");
    let dash = d.join("-dash");
    std::fs::write(&dash, "#!/bin/sh\nexit 9\n").unwrap();
    chmod(&dash, 0o755);
    let mut c = Command::new("unshare");
    c.args(["--pid", "--fork", "--mount-proc", "--kill-child"]).arg(quiesce()).args(["--", "./-dash"]);
    c.current_dir(&d);
    assert_eq!(output_within(&mut c, Duration::from_secs(30)).status.code(), Some(9));
    // Without `--`, everything from the command on is the command's, options included.
    assert_eq!(run(&["sh", "-c", "exit 4", "--bogus"]).status.code(), Some(4));
    assert_eq!(run(&["-g", "sh", "-c", "exit 6", "-x"]).status.code(), Some(6));
}

#[test]
fn help_lists_the_options_and_exits_0() {
    let out = run(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("--sandbox-user <USER>") && text.contains("-V, --version"), "{text}");
}

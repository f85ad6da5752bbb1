//! The common init command line (`quiesce [a few options] -- COMMAND...`) read without building
//! clap's command: building it costs several times more than everything else the init does
//! before its command runs. clap stays the parser of record: this reader only accepts what it
//! understands completely and answers None for anything else, which then goes to clap, so flags,
//! errors, help and environment variables behave exactly as clap defines them. A property test
//! (`tests` below) checks that every line this reader accepts parses to the same InitArgs in clap.

use crate::cli::{args::InitArgs, args::SandboxArgs, args::StateArgs};
use std::ffi::OsStr;
use std::path::PathBuf;

/// Options that take a value here: each at most once, except --sandbox-user.
#[derive(Clone, Copy, PartialEq)]
enum Valued {
    SandboxUser,
    RunAs,
    StateDir,
    SigningKey,
}

fn valued(long: &str) -> Option<Valued> {
    Some(match long {
        "sandbox-user" => Valued::SandboxUser,
        "run-as" => Valued::RunAs,
        "state-dir" => Valued::StateDir,
        "signing-key" => Valued::SigningKey,
        _ => return None,
    })
}

/// Is any variable clap would read set? Every init option has a QUIESCE_* variable, and their
/// handling (empty values, delimiters, boolean spellings) is clap's alone. QUIESCE_LOG is read by
/// the logger, not by clap.
pub fn env_has_options(vars: impl IntoIterator<Item = impl AsRef<OsStr>>) -> bool {
    vars.into_iter().any(|k| {
        let k = k.as_ref().as_encoded_bytes();
        k.starts_with(b"QUIESCE_") && k != b"QUIESCE_LOG"
    })
}

/// A value this reader takes as clap would: not empty, no delimiter, not option-like.
fn plain_value(v: &str) -> bool {
    !v.is_empty() && !v.starts_with('-') && !v.contains(',')
}

/// InitArgs for `args` (without the program name), or None when clap must decide. `env_options`:
/// whether a QUIESCE_* option variable is set (see `env_has_options`).
pub fn parse(args: &[String], env_options: bool) -> Option<InitArgs> {
    if env_options {
        return None;
    }
    let mut a = InitArgs {
        verbose: 0,
        pgroup: false,
        subreaper: false,
        remap_exit: Vec::new(),
        grace: 3.0,
        sandbox: SandboxArgs { users: Vec::new() },
        sandbox_lineage: false,
        run_as: None,
        allow_setuid: false,
        freeze: Default::default(),
        after_freeze: "stay".into(),
        state: StateArgs { state_dir: PathBuf::from(crate::state::dir::DEFAULT_DIR) },
        attest: Default::default(),
        command: Vec::new(),
    };
    let mut seen_state_dir = false;
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_str();
        i += 1;
        if arg == "--" {
            let command = &args[i..];
            if command.is_empty() {
                return None;
            }
            a.command = command.to_vec();
            return Some(a);
        }
        // A switch given twice goes to clap, which decides what that means.
        let switch = |on: &mut bool| if std::mem::replace(on, true) { None } else { Some(()) };
        match arg {
            "-v" | "--verbose" => a.verbose += 1,
            "-vv" => a.verbose += 2,
            "-vvv" => a.verbose += 3,
            "-g" | "--pgroup" => switch(&mut a.pgroup)?,
            "-s" | "--subreaper" => switch(&mut a.subreaper)?,
            "--allow-setuid" => switch(&mut a.allow_setuid)?,
            "--no-lineage" => switch(&mut a.freeze.no_lineage)?,
            _ => {
                let long = arg.strip_prefix("--")?;
                let (name, value) = match long.split_once('=') {
                    Some((n, v)) => (n, v),
                    None => {
                        let v = args.get(i)?;
                        i += 1;
                        (long, v.as_str())
                    }
                };
                if !plain_value(value) {
                    return None;
                }
                match valued(name)? {
                    Valued::SandboxUser => a.sandbox.users.push(value.to_string()),
                    Valued::RunAs if a.run_as.is_none() => a.run_as = Some(value.to_string()),
                    Valued::SigningKey if a.freeze.signing_key.is_none() => {
                        a.freeze.signing_key = Some(value.into())
                    }
                    Valued::StateDir if !seen_state_dir => {
                        seen_state_dir = true;
                        a.state.state_dir = value.into();
                    }
                    _ => return None,
                }
            }
        }
        if a.verbose > 8 {
            return None;
        }
    }
    // No `--`: a command without it, or nothing at all, is clap's to read.
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use proptest::prelude::*;

    fn owned(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// The environment of this test process, as the binary would see it.
    fn env_options() -> bool {
        env_has_options(std::env::vars_os().map(|(k, _)| k))
    }

    /// clap's reading of the same line, or its error's kind.
    fn by_clap(args: &[String]) -> Result<String, clap::error::ErrorKind> {
        let argv = std::iter::once("quiesce".to_string()).chain(args.iter().cloned());
        InitArgs::try_parse_from(argv).map(|a| format!("{a:?}")).map_err(|e| e.kind())
    }

    /// Accepted by the quick reader implies the same InitArgs from clap.
    fn agrees(args: &[String]) -> Result<bool, String> {
        match parse(args, env_options()) {
            None => Ok(false),
            Some(quick) => match by_clap(args) {
                Ok(c) if c == format!("{quick:?}") => Ok(true),
                Ok(c) => Err(format!("{args:?}: quick {quick:?}, clap {c}")),
                Err(k) => Err(format!("{args:?}: quick {quick:?}, clap refused ({k:?})")),
            },
        }
    }

    #[test]
    fn the_common_lines_are_read_here_and_match_clap() {
        if env_options() {
            // Every line goes to clap then; nothing to compare.
            return;
        }
        for line in [
            &["--", "true"][..],
            &["--", "sh", "-c", "exit 3", "--help"],
            &["--sandbox-user", "4242", "--", "true"],
            &["--sandbox-user=4242", "--sandbox-user", "agent", "-v", "--", "ps", "--", "-x"],
            &["-vv", "-g", "-s", "--no-lineage", "--allow-setuid", "--", "true"],
            &["--run-as", "4242", "--state-dir", "/tmp/s", "--signing-key=/k.pem", "--", "true"],
            &["--verbose", "--pgroup", "--subreaper", "--", "verify"],
        ] {
            assert_eq!(agrees(&owned(line)), Ok(true), "{line:?}");
        }
    }

    #[test]
    fn anything_not_understood_goes_to_clap() {
        for line in [
            &[][..],
            &["--"],
            &["true"],
            &["-h"],
            &["--help", "--", "true"],
            &["--version"],
            &["-V", "--", "true"],
            &["--grace", "1", "--", "true"],
            &["-vg", "--", "true"],
            &["-vvvv", "--", "true"],
            &["-g", "-g", "--", "true"],
            &["--sandbox-user", "--", "true"],
            &["--sandbox-user", "4242,4243", "--", "true"],
            &["--sandbox-user=", "--", "true"],
            &["--run-as", "a", "--run-as", "b", "--", "true"],
            &["--state-dir"],
            &["--verbose=2", "--", "true"],
            &["--pgroup=true", "--", "true"],
            &["--sandbox", "4242", "--", "true"],
            &["-e", "1", "--", "true"],
        ] {
            assert!(parse(&owned(line), false).is_none(), "{line:?}");
        }
        assert!(parse(&owned(&["--", "true"]), true).is_none(), "a QUIESCE_* variable goes to clap");
    }

    /// Every variable clap reads for the init is one `env_has_options` notices.
    #[test]
    fn every_option_variable_of_clap_sends_the_line_to_clap() {
        use clap::CommandFactory;
        let cmd = InitArgs::command();
        let vars: Vec<_> = cmd.get_arguments().filter_map(|a| a.get_env()).collect();
        assert!(vars.len() >= 10, "{vars:?}");
        for v in vars {
            assert!(env_has_options([v]), "{v:?}");
        }
    }

    #[test]
    fn option_variables_are_noticed_but_not_the_log_level() {
        assert!(!env_has_options(["PATH", "HOME", "QUIESCE_LOG", "QUIESCE"]));
        assert!(env_has_options(["PATH", "QUIESCE_SANDBOX_USER"]));
        assert!(env_has_options(["QUIESCE_SOMETHING_NEW"]));
    }

    /// Words from every part of the surface: what the quick reader knows, what only clap knows,
    /// values of every shape, and commands named like options and subcommands.
    fn word() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => prop::sample::select(vec![
                "--", "-v", "-vv", "-vvv", "-vvvv", "--verbose", "-g", "--pgroup", "-s", "--subreaper",
                "--allow-setuid", "--no-lineage", "--sandbox-user", "--run-as", "--state-dir",
                "--signing-key", "--sandbox-user=4242", "--run-as=agent", "--state-dir=/s",
                "--signing-key=/k", "--sandbox-user=", "--sandbox-user=a,b", "--run-as=-1",
                "-h", "--help", "-V", "--version", "--grace", "--grace=2", "-e", "--remap-exit",
                "--track-interval", "--freeze-signal", "--after-freeze", "--freeze-timeout",
                "-vg", "-gs", "-x", "--x", "--verbose=1", "--pgroup=1", "--no-lineage=no",
                "--sandbox", "--state", "-", "", "=", "true", "sh", "4242", "agent", "/tmp/s",
                "a,b", "ps", "exec", "verify", "1", "-1",
            ]).prop_map(String::from),
            1 => "[-=a-z0-9,/ ]{0,12}",
        ]
    }

    /// The lines the properties below generate are often ones the quick reader accepts: a
    /// comparison that only ever met refusals would prove nothing.
    #[test]
    fn generated_lines_are_often_accepted() {
        use proptest::strategy::ValueTree;
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let lines = (prop::collection::vec(word(), 0..6), prop::collection::vec(word(), 1..4));
        let mut accepted = 0;
        for _ in 0..1000 {
            let (mut line, cmd) = lines.new_tree(&mut runner).expect("a generated line").current();
            line.push("--".into());
            line.extend(cmd);
            accepted += usize::from(parse(&line, false).is_some());
        }
        assert!(accepted >= 100, "only {accepted} of 1000 generated lines were accepted");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

        #[test]
        fn whatever_the_quick_reader_accepts_clap_reads_the_same(words in prop::collection::vec(word(), 0..8)) {
            prop_assert_eq!(agrees(&words).map(|_| ()), Ok(()));
        }

        #[test]
        fn lines_built_from_known_options_agree(
            opts in prop::collection::vec(word(), 0..6),
            cmd in prop::collection::vec(word(), 1..4),
        ) {
            let mut line = opts;
            line.push("--".into());
            line.extend(cmd);
            prop_assert_eq!(agrees(&line).map(|_| ()), Ok(()));
        }
    }
}

//! Command-line surface. Every init option can also come from a QUIESCE_* variable.

use clap::{ArgAction, Args, Parser};
use std::path::PathBuf;

pub const SUBCOMMANDS: &[&str] = &["ps", "exec", "freeze", "verify", "keygen", "sidecar"];

#[derive(Parser, Debug)]
#[command(
    name = "quiesce",
    version = env!("QUIESCE_VERSION"),
    about = "A container init that proves the sandbox user's processes are gone before the verifier runs",
    after_help = "Subcommands (run beside the init, e.g. with docker exec):\n  \
        quiesce ps       show every process and why it counts as a sandbox process\n  \
        quiesce exec     run a command as a sandbox user, tagged for tracking\n  \
        quiesce freeze   ask the init to freeze and wait for the result\n  \
        quiesce verify   check the signed marker, then run the verifier\n  \
        quiesce keygen   write an Ed25519 signing key pair\n  \
        quiesce sidecar  start an init beside a PID 1 that is not quiesce, detached\n\
        Run 'quiesce SUBCOMMAND --help' for each. A command named like a subcommand goes after --."
)]
pub struct InitArgs {
    /// More log output (-v info, -vv debug, -vvv trace); QUIESCE_LOG takes a level name
    #[arg(short, long, action = ArgAction::Count)]
    pub verbose: u8,

    /// Forward signals to the command's process group instead of the command alone
    #[arg(short = 'g', long, env = "QUIESCE_PGROUP", action = ArgAction::SetTrue, value_parser = boolish)]
    pub pgroup: bool,

    /// Register as a child subreaper (automatic when not PID 1)
    #[arg(short = 's', long, env = "QUIESCE_SUBREAPER", action = ArgAction::SetTrue, value_parser = boolish)]
    pub subreaper: bool,

    /// Treat this exit code of the command as 0 (repeatable)
    #[arg(
        short = 'e',
        long = "remap-exit",
        value_name = "CODE",
        env = "QUIESCE_REMAP_EXIT",
        value_delimiter = ','
    )]
    pub remap_exit: Vec<u8>,

    /// Seconds between SIGTERM and SIGKILL for processes left when the command exits
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 3.0,
        env = "QUIESCE_GRACE",
        allow_negative_numbers = true
    )]
    pub grace: f64,

    #[command(flatten)]
    pub sandbox: SandboxArgs,

    /// The sandbox is every launch (quiesce exec, --run-as), root included: for a root agent
    #[arg(long, env = "QUIESCE_SANDBOX_LINEAGE", action = ArgAction::SetTrue, value_parser = boolish)]
    pub sandbox_lineage: bool,

    /// Run the command as this user (name or UID), tagged as a sandbox launch
    #[arg(long, value_name = "USER", env = "QUIESCE_RUN_AS")]
    pub run_as: Option<String>,

    /// Let setuid binaries raise the privilege of --run-as commands (no_new_privs off)
    #[arg(long, env = "QUIESCE_ALLOW_SETUID", action = ArgAction::SetTrue, value_parser = boolish)]
    pub allow_setuid: bool,

    #[command(flatten)]
    pub freeze: FreezeSettings,

    /// After a freeze: stay up until SIGTERM (for the verifier) or exit once the command is gone
    #[arg(long, value_name = "WHAT", default_value = "stay", value_parser = ["stay", "exit"], env = "QUIESCE_AFTER_FREEZE")]
    pub after_freeze: String,

    #[command(flatten)]
    pub state: StateArgs,

    #[command(flatten)]
    pub attest: AttestArgs,

    /// The command and its arguments
    #[arg(trailing_var_arg = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

impl InitArgs {
    /// clap's reading of the init's line, with a refusal said in one line: an unknown option
    /// before the command is named (with the nearest known one), never run as the command.
    pub fn parse_or_refuse() -> InitArgs {
        use clap::error::{ContextKind, ContextValue, ErrorKind};
        let e = match InitArgs::try_parse() {
            Ok(a) => return a,
            Err(e) => e,
        };
        if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
            e.exit();
        }
        let arg = |k| match e.get(k) {
            Some(ContextValue::String(s)) => Some(s.clone()),
            Some(ContextValue::Strings(v)) => v.first().cloned(),
            _ => None,
        };
        let msg = match (e.kind(), arg(ContextKind::InvalidArg)) {
            (ErrorKind::UnknownArgument, Some(name)) => {
                let near = arg(ContextKind::SuggestedArg)
                    .map(|s| format!(" (did you mean '{s}'?)"))
                    .unwrap_or_default();
                format!(
                    "unknown option '{name}'{near}: see 'quiesce --help'; a command whose name starts \
                     with '-' goes after '--'"
                )
            }
            _ => {
                let text = e.render().to_string();
                let first = text.lines().next().unwrap_or("cannot read the command line");
                let valid = match e.get(ContextKind::ValidValue) {
                    Some(ContextValue::Strings(v)) if !v.is_empty() => format!(" (one of: {})", v.join(", ")),
                    _ => String::new(),
                };
                format!("{}{valid}: see 'quiesce --help'", first.trim_start_matches("error: "))
            }
        };
        eprintln!("quiesce: {msg}");
        std::process::exit(2);
    }
}

/// How an init tracks and freezes: the init's options and the sidecar's alike.
#[derive(Args, Debug, Clone)]
pub struct FreezeSettings {
    /// Do not tag sandbox launches with an audit session (tracking falls back to history)
    #[arg(long, env = "QUIESCE_NO_LINEAGE", action = ArgAction::SetTrue, value_parser = boolish)]
    pub no_lineage: bool,

    /// Seconds between process-table refreshes for history tracking (0 = only on SIGCHLD and at freeze)
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 1.0,
        env = "QUIESCE_TRACK_INTERVAL",
        allow_negative_numbers = true
    )]
    pub track_interval: f64,

    /// Signal that requests a freeze when a sandbox user is configured
    #[arg(long, value_name = "SIGNAL", default_value = "USR1", env = "QUIESCE_FREEZE_SIGNAL")]
    pub freeze_signal: String,

    /// Budget in seconds for one freeze, after which it fails
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 10.0,
        env = "QUIESCE_FREEZE_TIMEOUT",
        allow_negative_numbers = true
    )]
    pub freeze_timeout: f64,

    /// Ed25519 private key (PKCS#8 PEM, root-owned, mode 600); default: an ephemeral key
    #[arg(long, value_name = "FILE", env = "QUIESCE_SIGNING_KEY")]
    pub signing_key: Option<PathBuf>,
}

impl Default for FreezeSettings {
    /// What clap gives when none of these is named (quickargs' reading).
    fn default() -> FreezeSettings {
        FreezeSettings {
            no_lineage: false,
            track_interval: 1.0,
            freeze_signal: "USR1".into(),
            freeze_timeout: 10.0,
            signing_key: None,
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct SandboxArgs {
    /// Sandbox user, by name or UID (repeatable; comma-separated in the variable)
    #[arg(long = "sandbox-user", value_name = "USER", env = "QUIESCE_SANDBOX_USER", value_delimiter = ',')]
    pub users: Vec<String>,
}

/// What the init attests after each quiescent freeze (docs/attestation.md).
#[derive(Args, Debug, Clone)]
pub struct AttestArgs {
    /// Attest this tree after every quiescent freeze (repeatable; ':' between paths in the variable)
    #[arg(long = "attest", value_name = "PATH", env = "QUIESCE_ATTEST", value_delimiter = ':')]
    pub paths: Vec<PathBuf>,

    /// A tree under which `quiesce freeze --attest` may name more paths (repeatable; ':' between)
    #[arg(long = "attest-allow", value_name = "PATH", env = "QUIESCE_ATTEST_ALLOW", value_delimiter = ':')]
    pub allow: Vec<PathBuf>,

    /// Entries (of every kind) an attestation may meet, over all its paths
    #[arg(long, value_name = "N", default_value_t = 1_000_000, env = "QUIESCE_ATTEST_MAX_FILES")]
    pub attest_max_files: u64,

    /// Bytes of regular files (their sizes) an attestation may hash
    #[arg(long, value_name = "BYTES", default_value_t = 16 << 30, env = "QUIESCE_ATTEST_MAX_BYTES")]
    pub attest_max_bytes: u64,

    /// Directory levels below a named path an attestation may enter
    #[arg(long, value_name = "N", default_value_t = 256, env = "QUIESCE_ATTEST_MAX_DEPTH")]
    pub attest_max_depth: u32,

    /// Seconds an attestation may take, after which it fails and its worker is killed
    #[arg(long, value_name = "SECONDS", default_value_t = 300, env = "QUIESCE_ATTEST_TIMEOUT")]
    pub attest_timeout: u64,
}

impl Default for AttestArgs {
    /// What clap gives when no attest option is named (quickargs' reading).
    fn default() -> AttestArgs {
        let b = crate::attest::walk::Bounds::default();
        AttestArgs {
            paths: Vec::new(),
            allow: Vec::new(),
            attest_max_files: b.files,
            attest_max_bytes: b.bytes,
            attest_max_depth: b.depth,
            attest_timeout: b.seconds,
        }
    }
}

impl AttestArgs {
    pub fn bounds(&self) -> crate::attest::walk::Bounds {
        crate::attest::walk::Bounds {
            files: self.attest_max_files,
            bytes: self.attest_max_bytes,
            depth: self.attest_max_depth,
            seconds: self.attest_timeout,
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct StateArgs {
    /// State directory (status, marker, public key, requests)
    #[arg(long, value_name = "DIR", default_value = crate::state::dir::DEFAULT_DIR, env = "QUIESCE_STATE_DIR")]
    pub state_dir: PathBuf,
}

#[derive(Parser, Debug)]
#[command(name = "quiesce ps", about = "Show the process tree and what a freeze would end right now")]
pub struct PsArgs {
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    #[command(flatten)]
    pub state: StateArgs,
    /// JSON for machines
    #[arg(long)]
    pub json: bool,
}

#[derive(Parser, Debug)]
#[command(
    name = "quiesce exec",
    about = "Run a command in place as a sandbox user, tagged as a sandbox launch"
)]
pub struct ExecArgs {
    /// The user (name or UID)
    #[arg(short, long, value_name = "USER")]
    pub user: String,
    /// Let setuid binaries raise privilege (no_new_privs off)
    #[arg(long, env = "QUIESCE_ALLOW_SETUID", action = ArgAction::SetTrue, value_parser = boolish)]
    pub allow_setuid: bool,
    /// Do not tag the launch with an audit session
    #[arg(long, env = "QUIESCE_NO_LINEAGE", action = ArgAction::SetTrue, value_parser = boolish)]
    pub no_lineage: bool,
    /// Tag the launch for an init run with --sandbox-lineage, or do not run it
    #[arg(long, env = "QUIESCE_SANDBOX_LINEAGE", action = ArgAction::SetTrue, value_parser = boolish)]
    pub sandbox_lineage: bool,
    /// Cap the user's processes at N (RLIMIT_NPROC, soft and hard) for the command and all it starts
    #[arg(long, value_name = "N", env = "QUIESCE_EXEC_NPROC", value_parser = clap::value_parser!(u64).range(1..))]
    pub nproc: Option<u64>,
    /// Run at the normal CPU policy, not SCHED_IDLE (which lets the init and root go first)
    #[arg(long, env = "QUIESCE_EXEC_NO_IDLE", action = ArgAction::SetTrue, value_parser = boolish)]
    pub no_idle: bool,
    #[command(flatten)]
    pub state: StateArgs,
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(Parser, Debug)]
#[command(
    name = "quiesce freeze",
    about = "Ask the init (PID 1) to freeze, and with --wait report the result"
)]
pub struct FreezeArgs {
    #[command(flatten)]
    pub state: StateArgs,
    /// A value the marker must carry (from the orchestrator)
    #[arg(long)]
    pub nonce: Option<String>,
    /// Wait until the freeze is final; exit 0 only when quiescent
    #[arg(long)]
    pub wait: bool,
    /// Seconds to wait with --wait
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0)]
    pub timeout: f64,
    /// Signal to send to PID 1
    #[arg(long, value_name = "SIGNAL", default_value = "USR1", env = "QUIESCE_FREEZE_SIGNAL")]
    pub freeze_signal: String,
    /// Print the status as JSON
    #[arg(long)]
    pub json: bool,
    /// Attest this path too after this freeze (repeatable): within the init's --attest or
    /// --attest-allow trees
    #[arg(long = "attest", value_name = "PATH")]
    pub attest: Vec<String>,
}

#[derive(Parser, Debug)]
#[command(name = "quiesce verify", about = "Check the quiescence marker and a live probe, then run COMMAND")]
pub struct VerifyArgs {
    /// Public key (SPKI PEM); default: the state dir's signing.pub
    #[arg(long, value_name = "FILE")]
    pub public_key: Option<PathBuf>,
    /// Marker file; default: the state dir's quiescence.jws
    #[arg(long, value_name = "FILE")]
    pub marker: Option<PathBuf>,
    #[command(flatten)]
    pub state: StateArgs,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    /// The nonce the marker must carry
    #[arg(long)]
    pub nonce: Option<String>,
    /// Oldest acceptable marker, in seconds
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    pub max_age: u64,
    /// Skip the live probe for sandbox processes (not recommended)
    #[arg(long)]
    pub no_live_probe: bool,
    /// Refuse a marker from a freeze whose init did not follow launches by loginuid (lineage)
    #[arg(long)]
    pub require_lineage: bool,
    /// Kept for earlier command lines: a marker that says setuid=true (or does not say) is
    /// refused, whatever --accept-privilege-escalation or its variable says
    #[arg(long, hide = true)]
    pub require_no_setuid: bool,
    /// Accept a marker signed where a setuid binary could make a sandbox process root (the
    /// container ran without no-new-privileges): such a process can keep a root process of the
    /// container working for it, which no freeze can tell apart
    #[arg(long, env = "QUIESCE_ACCEPT_PRIVILEGE_ESCALATION", action = ArgAction::SetTrue, value_parser = boolish)]
    pub accept_privilege_escalation: bool,
    /// Accept a marker of a root agent's sandbox (sandbox=lineage); needs --public-key
    #[arg(long, env = "QUIESCE_ACCEPT_ROOT_AGENT", action = ArgAction::SetTrue, value_parser = boolish)]
    pub accept_root_agent: bool,
    /// Refuse a marker of the other sandbox mode
    #[arg(long, value_name = "MODE", value_parser = ["uid", "lineage"])]
    pub require_sandbox: Option<String>,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
    /// Require an attestation of the frozen trees that covers PATH (repeatable); without it, one
    /// is checked whenever the state dir holds one
    #[arg(long = "attest", value_name = "PATH")]
    pub attest: Vec<String>,
    /// Attestation file; default: the state dir's quiescence.intoto.jsonl
    #[arg(long, value_name = "FILE")]
    pub attestation: Option<PathBuf>,
    /// A path the orchestrator writes on purpose after the freeze: not compared (repeatable)
    #[arg(long = "attest-ignore", value_name = "PATH")]
    pub attest_ignore: Vec<String>,
    /// Start again, confined, the services the marker records before the command; stop them after
    #[arg(long)]
    pub hand_over: bool,
    /// The UID and GID the services run as
    #[arg(long, value_name = "UID", default_value_t = 65530)]
    pub service_user: u32,
    /// Seconds the services have to listen again
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub service_wait: u64,
    /// A path the services must not be able to write (repeatable)
    #[arg(long, value_name = "PATH")]
    pub protect: Vec<PathBuf>,
    /// Start the service on PORT as `sh -c COMMAND` (repeatable)
    #[arg(long = "service", value_name = "PORT=COMMAND")]
    pub service: Vec<String>,
    /// A path the services must not be able to read (repeatable)
    #[arg(long, value_name = "PATH")]
    pub hide: Vec<PathBuf>,
    /// Hand over only the services on PORT (repeatable)
    #[arg(long, value_name = "PORT")]
    pub port: Vec<u16>,
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(Parser, Debug)]
#[command(name = "quiesce keygen", about = "Write signing.key (0600) and signing.pub (SPKI PEM)")]
pub struct KeygenArgs {
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

#[derive(Parser, Debug)]
#[command(
    name = "quiesce sidecar",
    about = "Start the init beside a PID 1 that is not quiesce, detached from this exec; print its ready line"
)]
pub struct SidecarArgs {
    /// More log output in the sidecar's log (-v info, -vv debug, -vvv trace)
    #[arg(short, long, action = ArgAction::Count)]
    pub verbose: u8,

    #[command(flatten)]
    pub sandbox: SandboxArgs,

    #[command(flatten)]
    pub state: StateArgs,

    #[command(flatten)]
    pub freeze: FreezeSettings,

    #[command(flatten)]
    pub attest: AttestArgs,

    /// The detached sidecar itself, re-executed by its start with the lock at fd 3 and the
    /// ready pipe at fd 4: never given by hand
    #[arg(long, hide = true)]
    pub detached: bool,
}

impl SidecarArgs {
    /// The init's options these stand for: an init with no command, no --run-as, that stays.
    pub fn init_args(&self) -> InitArgs {
        InitArgs {
            verbose: self.verbose,
            pgroup: false,
            subreaper: true,
            remap_exit: Vec::new(),
            grace: 3.0,
            sandbox: self.sandbox.clone(),
            sandbox_lineage: false,
            run_as: None,
            allow_setuid: false,
            freeze: self.freeze.clone(),
            after_freeze: "stay".into(),
            state: self.state.clone(),
            attest: self.attest.clone(),
            command: Vec::new(),
        }
    }
}

/// A command line clap cannot read, refused in one line naming the help (help and version are
/// printed as clap prints them). Returns the exit code, 2.
pub fn refuse_in_one_line(e: clap::Error, who: &str) -> i32 {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        e.exit();
    }
    let text = e.render().to_string();
    let first = text.lines().next().unwrap_or("cannot read the command line");
    eprintln!("{who}: {}: see '{who} --help'", first.trim_start_matches("error: "));
    2
}

/// Boolean variables as containers write them: 1/0, true/false, yes/no, on/off, in any case;
/// an empty value is off, as if unset.
pub fn boolish(v: &str) -> Result<bool, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "" | "0" | "false" | "no" | "off" => Ok(false),
        _ => Err("not a boolean: use 1/0, true/false, yes/no or on/off".into()),
    }
}

pub fn seconds(what: &str, v: f64) -> Result<std::time::Duration, String> {
    if !v.is_finite() || !(0.0..=1e6).contains(&v) {
        return Err(format!("{what} {v} is out of range: give seconds from 0 to 1000000"));
    }
    Ok(std::time::Duration::from_secs_f64(v))
}

/// The freeze signal. Refused: signals that cannot be caught (KILL, STOP), SIGCHLD (reaping), and
/// every signal job control sends or that any process of the init's session may send without
/// permission (CONT): a sandbox process could otherwise request freezes, or a terminal could.
pub fn freeze_signal(name: &str) -> Result<i32, String> {
    let sig = crate::kernel::signal::parse_signal(name)
        .ok_or_else(|| format!("--freeze-signal '{name}' is not a signal: use e.g. USR1"))?;
    let why = match sig {
        libc::SIGKILL | libc::SIGSTOP => "cannot be caught",
        libc::SIGCHLD => "is how the init learns of exits",
        libc::SIGCONT => "may be sent by any process of the init's session, the sandbox's included",
        libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU => "is sent by job control",
        n if (32..crate::kernel::signal::first_catchable_rt()).contains(&n) => {
            "is kept by the C library for itself"
        }
        _ => return Ok(sig),
    };
    Err(format!(
        "--freeze-signal {} {why}: use USR1 (the default), USR2 or a real-time signal",
        crate::kernel::signal::signal_name(sig)
    ))
}

#[cfg(test)]
mod tests {
    use crate::kernel::signal::{first_catchable_rt, parse_signal, signal_name};

    #[test]
    fn real_time_signals_are_numbered_as_glibc_and_docker_number_them() {
        assert_eq!(parse_signal("RTMIN+3"), Some(37));
        assert_eq!(parse_signal("SIGRTMIN"), Some(34));
        assert_eq!(parse_signal("37"), Some(37));
        assert_eq!(parse_signal("RTMIN+31"), None);
        assert_eq!(signal_name(37), "SIGRTMIN+3");
        // The C library's own signals cannot be a freeze signal: the init could not block them.
        for sig in 32..first_catchable_rt() {
            let e = crate::cli::args::freeze_signal(&sig.to_string()).unwrap_err();
            assert!(e.contains("C library") && e.contains("use USR1"), "{e}");
        }
        assert!(crate::cli::args::freeze_signal(&first_catchable_rt().to_string()).is_ok());
    }
}

//! quiesce: a container init that proves the sandbox user's processes are gone.
//! Data flows one way: observe /proc (procs) → decide (taint) → act (freeze) → prove → sign (marker).

mod cli;
mod commands;
mod evidence;
mod freeze;
mod init;
mod marker;
mod procs;
mod spawn;
mod state;
mod sys;
mod taint;
mod users;
mod verify;

use clap::Parser;
use std::io::Write;
use std::time::Duration;

fn setup_logging(verbose: u8) {
    let level = match std::env::var("QUIESCE_LOG") {
        Ok(v) if !v.is_empty() => v,
        _ => match verbose {
            0 => "error",
            1 => "info",
            2 => "debug",
            _ => "trace",
        }
        .to_string(),
    };
    env_logger::Builder::new()
        .parse_filters(&level)
        .format(|buf, rec| writeln!(buf, "quiesce: {}: {}", rec.level().as_str().to_lowercase(), rec.args()))
        .init();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let sub = args.get(1).map(String::as_str).filter(|a| cli::SUBCOMMANDS.contains(a));
    let code = match sub {
        Some(name) => {
            let rest = std::iter::once(format!("quiesce {name}")).chain(args.iter().skip(2).cloned());
            subcommand(name, rest.collect())
        }
        None => run_init(cli::InitArgs::parse()),
    };
    std::process::exit(code);
}

fn subcommand(name: &str, argv: Vec<String>) -> i32 {
    setup_logging(0);
    match name {
        "ps" => commands::ps(cli::PsArgs::parse_from(argv)),
        "exec" => commands::exec(cli::ExecArgs::parse_from(argv)),
        "freeze" => commands::freeze(cli::FreezeArgs::parse_from(argv)),
        "keygen" => commands::keygen(cli::KeygenArgs::parse_from(argv)),
        _ => {
            let a = cli::VerifyArgs::parse_from(argv);
            match commands::resolve_uids(&a.sandbox.users) {
                Ok(uids) => verify::run(a, uids),
                Err(e) => {
                    eprintln!("quiesce verify: {e}");
                    verify::code::USAGE
                }
            }
        }
    }
}

fn fatal(msg: impl std::fmt::Display) -> i32 {
    eprintln!("quiesce: {msg}");
    2
}

/// Everything that can be refused is refused here, before the command runs.
fn run_init(a: cli::InitArgs) -> i32 {
    setup_logging(a.verbose);
    if a.command.is_empty() {
        return fatal("no command given: usage: quiesce [OPTIONS] [--] COMMAND [ARG...]");
    }
    // Before any thread exists: a thread with signals unblocked would take process-directed
    // signals, and PID 1 drops those it has no handler for.
    if let Err(e) = sys::block_all_signals() {
        return fatal(format!("cannot block signals: {e}"));
    }
    let grace = match cli::seconds("--grace", a.grace) {
        Ok(d) => d,
        Err(e) => return fatal(e),
    };
    // The private key must never land in a core dump; ptrace by a same-UID process is also refused.
    if let Err(e) = sys::set_not_dumpable() {
        return fatal(format!("cannot mark the init non-dumpable: {e}"));
    }
    if sys::getpid() != 1 || a.subreaper {
        if let Err(e) = sys::set_child_subreaper() {
            return fatal(format!("cannot become a child subreaper: {e}"));
        }
        log::debug!("not PID 1 (pid {}): registered as a child subreaper", sys::getpid());
    }
    let pw = users::read_passwd();
    let uids = match commands::resolve_uids(&a.sandbox.users) {
        Ok(u) => u,
        Err(e) => return fatal(e),
    };
    let drop = match &a.run_as {
        None => None,
        Some(spec) => match users::resolve(spec, &pw) {
            Ok(user) => {
                let groups = users::groups_of(&user, &users::read_group());
                Some(spawn::Drop { user, groups, allow_setuid: a.allow_setuid, tag: !a.no_lineage })
            }
            Err(e) => return fatal(format!("--run-as: {e}")),
        },
    };
    let sandbox = if uids.is_empty() {
        None
    } else {
        match setup_sandbox(&a, uids) {
            Ok(s) => Some(s),
            Err(e) => return fatal(e),
        }
    };
    // The key path is no business of the command's.
    std::env::remove_var("QUIESCE_SIGNING_KEY");
    let plan = match spawn::Plan::new(&a.command, drop) {
        Ok(p) => p.own_pgroup(),
        Err(e) => return fatal(e),
    };
    init::run(init::Config { plan, pgroup: a.pgroup, remap_exit: a.remap_exit.clone(), grace, sandbox })
}

fn setup_sandbox(a: &cli::InitArgs, uids: Vec<u32>) -> Result<init::Sandbox, String> {
    let freeze_signal = sys::parse_signal(&a.freeze_signal)
        .filter(|&s| s != libc::SIGKILL && s != libc::SIGSTOP && s != libc::SIGCHLD)
        .ok_or_else(|| {
            format!("--freeze-signal '{}' is not a catchable signal: use e.g. USR1", a.freeze_signal)
        })?;
    let timeout = cli::seconds("--freeze-timeout", a.freeze_timeout)?;
    let interval = cli::seconds("--track-interval", a.track_interval)?;
    let state = state::StateDir::create(&a.state.state_dir)?;
    evidence::start().map_err(|e| format!("cannot start the evidence reader thread: {e}"))?;
    let key = match &a.signing_key {
        Some(path) => marker::load_private(path)?,
        None => marker::generate().map_err(|e| format!("cannot make an ephemeral key: {e}"))?,
    };
    let pub_pem = marker::public_pem(&key.verifying_key()).map_err(|e| e.to_string())?;
    let write = |name: &str, data: &[u8]| {
        state
            .write_atomic(name, data, 0o644)
            .map_err(|e| format!("cannot write {name} in {}: {e}", state.path.display()))
    };
    // A marker or status from before this init started proves nothing about this one.
    for stale in [state::MARKER, state::STATUS, state::REQUEST] {
        state.remove(stale).map_err(|e| format!("cannot remove stale {stale}: {e}"))?;
    }
    write(state::PUBKEY, pub_pem.as_bytes())?;
    write(commands::SANDBOX_FILE, &serde_json::to_vec(&uids).map_err(|e| e.to_string())?)?;
    if a.no_lineage {
        log::info!("lineage tagging off (--no-lineage): tracking relies on uid, ancestry and history");
    } else if !spawn::lineage_available() {
        log::info!(
            "audit lineage unavailable here (no audit or a user namespace): tracking falls back to history"
        );
    }
    log::debug!("sandbox UIDs {uids:?}, freeze on {}", sys::signal_name(freeze_signal));
    Ok(init::Sandbox {
        policy: taint::Policy::new(uids),
        seen: Default::default(),
        state,
        key,
        freeze_signal,
        freeze: freeze::Config {
            cred: sys::CredThread::start().map_err(|e| format!("cannot start the credential thread: {e}"))?,
            timeout,
            stop_wait: Duration::from_millis(500),
        },
        after_freeze_exit: a.after_freeze == "exit",
        track_interval: (interval > Duration::ZERO).then_some(interval),
    })
}

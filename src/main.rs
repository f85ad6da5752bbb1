//! quiesce: a container init that proves the sandbox user's processes are gone.
//! Data flows one way: observe /proc (procs) → decide (taint) → act (freeze) → prove → sign (marker).

mod attest;
mod cli;
mod commands;
mod decide;
mod freeze;
mod init;
mod kernel;
mod marker;
mod observe;
mod record;
mod spawn;
mod state;
#[cfg(test)]
mod tests;

use clap::Parser;
use std::time::Duration;

fn main() {
    // Arguments that are not UTF-8 are refused in one line before anything starts (reading them
    // as strings would abort PID 1).
    let args: Vec<String> =
        match std::env::args_os().enumerate().map(|(i, a)| a.into_string().map_err(|a| (i, a))).collect() {
            Ok(a) => a,
            Err((i, a)) => {
                eprintln!(
                    "quiesce: argument {i} ({a:?}) is not valid UTF-8: quiesce takes UTF-8 arguments only"
                );
                std::process::exit(2);
            }
        };
    // The init's own attestation worker (init/attesting.rs): never an option an init takes.
    if args.len() == 2 && args[1] == attest::job::WORKER_FLAG {
        std::process::exit(attest::worker::main());
    }
    // verify's re-check of attested trees (attest/recheck.rs), likewise.
    if args.len() == 2 && args[1] == attest::recheck::RECHECK_FLAG {
        std::process::exit(attest::recheck::main());
    }
    let sub = args.get(1).map(String::as_str).filter(|a| cli::args::SUBCOMMANDS.contains(a));
    let code = match sub {
        Some(name) => {
            let rest = std::iter::once(format!("quiesce {name}")).chain(args.iter().skip(2).cloned());
            subcommand(name, rest.collect())
        }
        None => {
            let env_options = cli::quickargs::env_has_options(std::env::vars_os().map(|(k, _)| k));
            let quick = cli::quickargs::parse(args.get(1..).unwrap_or_default(), env_options);
            init::start::run_init(quick.unwrap_or_else(cli::args::InitArgs::parse_or_refuse))
        }
    };
    // Lines of the last moments (an exec failure's) may still be with the log writer thread.
    init::logging::drain(Duration::from_millis(200));
    std::process::exit(code);
}

fn subcommand(name: &str, argv: Vec<String>) -> i32 {
    if name == "sidecar" {
        // Its own logging: to stderr for the start, to its log file once detached.
        return match cli::args::SidecarArgs::try_parse_from(&argv) {
            Ok(a) => commands::sidecar::sidecar(a, &std::env::args().collect::<Vec<_>>()),
            Err(e) => cli::args::refuse_in_one_line(e, "quiesce sidecar"),
        };
    }
    let _ = init::logging::init(0, false);
    match name {
        "ps" => commands::ps::ps(cli::args::PsArgs::parse_from(argv)),
        "exec" => commands::exec::exec(cli::args::ExecArgs::parse_from(argv)),
        "freeze" => commands::freeze::freeze(cli::args::FreezeArgs::parse_from(argv)),
        "keygen" => commands::keygen::keygen(cli::args::KeygenArgs::parse_from(argv)),
        _ => {
            let a = cli::args::VerifyArgs::parse_from(argv);
            match kernel::users::resolve_uids(&a.sandbox.users) {
                Ok(uids) => commands::verify::run(a, uids),
                Err(e) => {
                    eprintln!("quiesce verify: {e}");
                    commands::verify::code::USAGE
                }
            }
        }
    }
}

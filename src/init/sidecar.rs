//! The sidecar once detached (re-executed by `quiesce sidecar` with its lock at fd 3 and its
//! ready pipe at fd 4, stdout and stderr on its log): set up exactly as the init sets up its
//! sandbox, say the ready line (or the one error line) through the pipe, then run the init's loop
//! with no command until SIGTERM or SIGINT.

use crate::init::{self, logging};
use crate::kernel::{fdio, flock, process, signal, stat, users};
use crate::observe::procs;
use crate::state::{self, sidecar::Ready};
use crate::{cli, marker};
use std::os::fd::{AsRawFd, OwnedFd};

/// Where the start left the lock (held) and the ready pipe's write end.
pub const LOCK_FD: i32 = 3;
pub const READY_FD: i32 = 4;

/// The detached sidecar's life; returns its exit code (0 once stopped, 2 when set-up failed).
pub fn run(a: &cli::args::SidecarArgs) -> i32 {
    let _ = logging::init(a.verbose, true);
    let ready = match fdio::take_inherited(READY_FD) {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!(
                "quiesce sidecar: no ready pipe at fd {READY_FD} ({e}): start it with `quiesce sidecar`"
            );
            return 2;
        }
    };
    let (cfg, mut line, _lock) = match set_up(a) {
        Ok(x) => x,
        Err(e) => {
            let text = format!("quiesce sidecar: {e}\n");
            eprint!("{text}");
            say(&ready, &text);
            return 2;
        }
    };
    log::info!("sidecar ready: pid {}, state dir {}", line.pid, line.state_dir);
    say(&ready, &format!("{}\n", line.line()));
    drop(ready);
    let code = init::run::run(cfg);
    line.stopped = true;
    let stopped = state::dir::StateDir::open(std::path::Path::new(&line.state_dir)).and_then(|d| {
        d.write_atomic(state::sidecar::READY_FILE, line.line().as_bytes(), 0o644).map_err(|e| e.to_string())
    });
    if let Err(e) = stopped {
        log::error!("cannot say in {} that the sidecar stopped: {e}", state::sidecar::READY_FILE);
    }
    log::info!("sidecar stopped");
    code
}

/// One write of the line to the start; a start that gave up (closed its end) is no error here.
fn say(ready: &OwnedFd, text: &str) {
    if let Err(e) = fdio::write(ready.as_raw_fd(), text.as_bytes()) {
        log::warn!("cannot tell the start: {e}");
    }
}

/// Everything the init does before its command runs, here without a command; then sidecar.json.
fn set_up(a: &cli::args::SidecarArgs) -> Result<(init::run::Config, Ready, OwnedFd), String> {
    let lock = hold_lock(a)?;
    take_own_name()?;
    // Dispositions an exec's parent ignored would survive into this process: an ignored SIGTERM
    // would never reach the signalfd. Before any thread exists, as in the init.
    signal::reset_all_dispositions();
    signal::block_all_signals().map_err(|e| format!("cannot block signals: {e}"))?;
    process::set_not_dumpable().map_err(|e| format!("cannot mark the sidecar non-dumpable: {e}"))?;
    process::set_child_subreaper().map_err(|e| format!("cannot become a child subreaper: {e}"))?;
    let uids = users::resolve_uids(&a.sandbox.users)?;
    if uids.is_empty() {
        return Err("no sandbox user: add --sandbox-user USER".into());
    }
    let sb = init::start::setup_sandbox(&a.init_args(), uids)?;
    // The key path is no business of anything the sidecar starts.
    std::env::remove_var("QUIESCE_SIGNING_KEY");
    let line = ready_line(&sb)?;
    sb.state
        .write_atomic(state::sidecar::READY_FILE, line.line().as_bytes(), 0o644)
        .map_err(|e| format!("cannot write {}: {e}", sb.state.file(state::sidecar::READY_FILE).display()))?;
    let cfg = init::run::Config {
        plan: None,
        pgroup: false,
        remap_exit: Vec::new(),
        grace: std::time::Duration::from_secs(3),
        sandbox: Some(sb),
    };
    Ok((cfg, line, lock))
}

/// Executed as /proc/self/exe, the kernel named it "exe": it takes its binary's name again.
fn take_own_name() -> Result<(), String> {
    let own = std::env::args().next().unwrap_or_default();
    let name = std::path::Path::new(&own).file_name().map(|n| n.to_string_lossy().into_owned());
    process::set_name(name.as_deref().unwrap_or("quiesce"))
        .map_err(|e| format!("cannot name the sidecar: {e}"))
}

/// What the harness keeps of this sidecar, from the sandbox as set up.
fn ready_line(sb: &init::run::Sandbox) -> Result<Ready, String> {
    let me = process::getpid();
    let start_time = procs::reader::Reader::default()
        .start_time(me)
        .map_err(|e| format!("cannot read the sidecar's own start time: {e}"))?
        .ok_or("cannot find the sidecar in /proc: mount proc for this PID namespace")?;
    let dir = std::fs::canonicalize(&sb.state.path).unwrap_or_else(|_| sb.state.path.clone());
    Ok(Ready {
        sidecar: "quiesce".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        pid: me,
        start_time,
        state_dir: dir.display().to_string(),
        public_key: marker::jws::public_pem(&sb.settings.key.verifying_key()),
        sandbox_uids: sb.tracking.policy.uids.clone(),
        lineage: sb.tracking.policy.lineage,
        started: true,
        stopped: false,
    })
}

/// The lock the start took is at fd 3 and held through it: the state dir's own lock file, which
/// this process may lock (it is the start's open file, or nobody holds it). The caller keeps it
/// for the sidecar's whole life; close-on-exec, it is never passed on.
fn hold_lock(a: &cli::args::SidecarArgs) -> Result<OwnedFd, String> {
    let state = state::dir::StateDir::open(&a.state.state_dir)?;
    let fd = fdio::take_inherited(LOCK_FD)
        .map_err(|e| format!("no lock at fd {LOCK_FD} ({e}): start it with `quiesce sidecar`"))?;
    let named = state
        .open_private(state::sidecar::LOCK, false)
        .map_err(|e| format!("cannot open {}: {e}", state.file(state::sidecar::LOCK).display()))?;
    let same = match (stat::fstat(&fd), stat::fstat(&named.into())) {
        (Ok(x), Ok(y)) => x.st_dev == y.st_dev && x.st_ino == y.st_ino,
        _ => false,
    };
    if !same || !flock::try_lock_exclusive(&fd).unwrap_or(false) {
        return Err(format!(
            "fd {LOCK_FD} is not the held lock {}: start it with `quiesce sidecar`",
            state.file(state::sidecar::LOCK).display()
        ));
    }
    Ok(fd)
}

//! `quiesce sidecar`: start the init beside a PID 1 that is not quiesce, by one exec that ends
//! once it is ready. Everything that can be refused is refused here, before anything detaches;
//! a sidecar already running with this state dir answers instead (its lock is held); otherwise
//! the start forks, the child setsid()s and forks the sidecar, which re-executes this binary
//! (init::sidecar) and says its ready line through a pipe, printed here.

use crate::cli::args::SidecarArgs;
use crate::init::{self, sidecar::LOCK_FD, sidecar::READY_FD};
use crate::kernel::{detach, detach::Detach, fdio, flock, process, reap};
use crate::observe::procs::{model::Detail, reader::Reader};
use crate::observe::proctrust;
use crate::state::{dir::StateDir, locator, published, sidecar};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// How long a start waits for a sidecar another start holds the lock for to say it is ready.
const ANSWER_WAIT: Duration = Duration::from_secs(10);
/// How long a start waits for the sidecar it started to say it is ready.
const READY_WAIT: Duration = Duration::from_secs(15);
/// The longest ready line read: a line, a key and a few numbers.
const MAX_LINE: usize = 64 * 1024;

pub fn sidecar(a: SidecarArgs, argv: &[String]) -> i32 {
    if a.detached {
        return init::sidecar::run(&a);
    }
    let _ = init::logging::init(a.verbose, false);
    match start(&a, argv) {
        Ok(line) => {
            println!("{line}");
            0
        }
        Err(e) => {
            eprintln!("quiesce sidecar: {e}");
            2
        }
    }
}

/// The ready line of the sidecar this start made, or of the one it found running.
fn start(a: &SidecarArgs, argv: &[String]) -> Result<String, String> {
    // It reads the signing key to check it: as the init, out of reach of a tracer or a core dump.
    process::set_not_dumpable().map_err(|e| format!("cannot mark this process non-dumpable: {e}"))?;
    can_run_here()?;
    let uids = check_options(a)?;
    refuse_sandbox_pid1(&uids)?;
    refuse_init_elsewhere(&a.state.state_dir)?;
    let state = StateDir::create(&a.state.state_dir)?;
    state.check_writable()?;
    let lock: OwnedFd = state
        .open_private(sidecar::LOCK, false)
        .map_err(|e| format!("cannot open {}: {e}", state.file(sidecar::LOCK).display()))?
        .into();
    if !locked(&lock, &state)? {
        if let Some(mut running) = answer_or_lock(&lock, &state)? {
            same_users(&running, &uids)?;
            running.started = false;
            return Ok(running.line());
        }
    }
    refuse_other_init(&state)?;
    detach(&state, lock, argv)
}

/// Root, the capabilities a freeze needs, and this PID namespace's own /proc.
fn can_run_here() -> Result<(), String> {
    init::start::can_freeze_here()?;
    proctrust::check(std::path::Path::new("/proc")).map_err(|e| {
        format!(
            "{e}: mount a proc of this PID namespace at /proc (a foreign /proc shows another \
             namespace's processes; enter the container's mount namespace with its PID namespace)"
        )
    })
}

/// The options the detached sidecar reads, refused here in one line rather than in its log;
/// the sandbox UIDs they name.
fn check_options(a: &SidecarArgs) -> Result<Vec<u32>, String> {
    if a.sandbox.users.is_empty() {
        return Err("no sandbox user: add --sandbox-user USER (or QUIESCE_SANDBOX_USER)".into());
    }
    let uids = crate::kernel::users::resolve_uids(&a.sandbox.users)?;
    crate::cli::args::freeze_signal(&a.freeze.freeze_signal)?;
    crate::cli::args::seconds("--freeze-timeout", a.freeze.freeze_timeout)?;
    crate::cli::args::seconds("--track-interval", a.freeze.track_interval)?;
    init::attesting::check_setup(&init::attesting::Setup {
        paths: a.attest.paths.clone(),
        allow: a.attest.allow.clone(),
        bounds: a.attest.bounds(),
    })?;
    if let Some(key) = &a.freeze.signing_key {
        crate::marker::jws::load_private(key)?;
    }
    Ok(uids)
}

/// A PID 1 that holds a sandbox UID (a container run as the agent's user) is out of every
/// freeze's reach: kill(-1) skips PID 1, and a namespace's init ignores SIGKILL from inside it.
/// Every freeze would fail on it after its whole budget; said once, here. Unknown is refused too.
fn refuse_sandbox_pid1(uids: &[u32]) -> Result<(), String> {
    let reader = Reader::default();
    let pid1 = reader.pass().and_then(|mut p| p.read(1, Detail::Light, None));
    let pid1 = match pid1 {
        Ok(Some(p)) => p,
        Ok(None) => return Err("/proc/1 is not there: mount a proc of this PID namespace at /proc".into()),
        Err(e) => return Err(format!("cannot read PID 1 of this namespace: {e}")),
    };
    let held = pid1.all_uids().find(|u| uids.contains(u));
    match held {
        Some(u) => Err(format!(
            "PID 1 of this namespace runs as sandbox UID {u}, which no freeze can kill (kill(-1) skips \
             PID 1): run the container's PID 1 as root (no --user) and the agent through quiesce exec"
        )),
        None => Ok(()),
    }
}

/// A sidecar started for other users guards their processes, not these: its line is no answer.
fn same_users(running: &sidecar::Ready, uids: &[u32]) -> Result<(), String> {
    let (mut want, mut have) = (uids.to_vec(), running.sandbox_uids.clone());
    want.sort_unstable();
    have.sort_unstable();
    if want == have {
        return Ok(());
    }
    Err(format!(
        "a sidecar already runs with this state dir for sandbox UIDs {have:?}, not {want:?}: stop it \
         (kill -TERM {}) or start this one for the same users",
        running.pid
    ))
}

fn locked(lock: &OwnedFd, state: &StateDir) -> Result<bool, String> {
    flock::try_lock_exclusive(lock)
        .map_err(|e| format!("cannot lock {}: {e}", state.file(sidecar::LOCK).display()))
}

/// Another start holds the lock: the sidecar it runs or is starting, once sidecar.json names it
/// live. None: the lock came free (that start gave up), and this start holds it now.
fn answer_or_lock(lock: &OwnedFd, state: &StateDir) -> Result<Option<sidecar::Ready>, String> {
    let until = Instant::now() + ANSWER_WAIT;
    loop {
        if let Some(r) = sidecar::read(state)?.filter(|r| !r.stopped && running(r.pid, r.start_time)) {
            return Ok(Some(r));
        }
        if locked(lock, state)? {
            return Ok(None);
        }
        if Instant::now() >= until {
            return Err(format!(
                "{} is held, but no running sidecar answered in {} within {} s: see {}",
                state.file(sidecar::LOCK).display(),
                state.file(sidecar::READY_FILE).display(),
                ANSWER_WAIT.as_secs(),
                state.file(sidecar::LOG).display()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Is `pid` the live process that started at `start_time`? A zombie is not: it runs nothing,
/// and under a PID 1 that never reaps, it stays.
fn running(pid: i32, start_time: u64) -> bool {
    pid > 0 && matches!(Reader::default().live_start_time(pid), Ok(Some(t)) if t == start_time)
}

/// Before anything is made: an init of quiesce this PID namespace's locator names, live, that
/// is PID 1 or keeps its state anywhere but `dir` (a dir not there yet is no one's). One with
/// `dir` may be the sidecar a start answers for; the lock decides (`refuse_other_init`).
fn refuse_init_elsewhere(dir: &std::path::Path) -> Result<(), String> {
    let ours = std::fs::canonicalize(dir).ok();
    match live_locator()? {
        Some(l) if l.pid == 1 || ours.as_deref() != Some(l.state_dir.as_path()) => Err(named(&l)),
        _ => Ok(()),
    }
}

/// With the lock held (no sidecar of this state dir runs): an init of quiesce that runs in this
/// PID namespace (its locator), or with this state dir (its sandbox.json), would race a second.
fn refuse_other_init(state: &StateDir) -> Result<(), String> {
    if let Some(l) = live_locator()? {
        return Err(named(&l));
    }
    if let Some(p) = published::published_in(state)?.filter(|p| running(p.pid, p.start_time)) {
        return Err(format!(
            "an init of quiesce already runs with state dir {} (pid {}): use it or stop it first",
            state.path.display(),
            p.pid
        ));
    }
    Ok(())
}

/// What this PID namespace's locator says, when it names a live process.
fn live_locator() -> Result<Option<locator::Locator>, String> {
    Ok(locator::find()?.filter(|l| running(l.pid, l.start_time)))
}

/// The refusal that names the init a locator names, and its state dir.
fn named(l: &locator::Locator) -> String {
    let dir = l.state_dir.display();
    if l.pid == 1 {
        return format!(
            "quiesce is already PID 1 of this PID namespace (state dir {dir}): freeze it with \
             `quiesce freeze --state-dir {dir}`; no sidecar is needed"
        );
    }
    format!(
        "an init of quiesce already runs in this PID namespace (pid {}, state dir {dir}): use \
         it (`--state-dir {dir}`) or stop it first",
        l.pid
    )
}

/// Start the sidecar, detached, with the lock held for it; its ready line once it says it.
fn detach(state: &StateDir, lock: OwnedFd, argv: &[String]) -> Result<String, String> {
    // An earlier sidecar's line names a process that is gone: no start may answer with it.
    state
        .remove(sidecar::READY_FILE)
        .map_err(|e| format!("cannot remove the old {}: {e}", sidecar::READY_FILE))?;
    let (ready_r, ready_w) = fdio::pipe().map_err(|e| format!("cannot make the ready pipe: {e}"))?;
    let d = plan(state, lock, ready_w, argv)?;
    let child = d.spawn().map_err(|e| format!("cannot fork the sidecar: {e}"))?;
    // Its copies of the lock and the pipe go: the sidecar holds its own, and the pipe's end
    // comes only once the sidecar has written or died.
    drop(d);
    first_child_ended(child)?;
    let log = state.file(sidecar::LOG);
    let line = read_line(&ready_r, READY_WAIT).map_err(|e| format!("{e}: see {}", log.display()))?;
    if line.starts_with('{') {
        Ok(line)
    } else {
        Err(line.trim_start_matches("quiesce sidecar: ").to_string())
    }
}

/// The sidecar's exec, prepared: this binary again through /proc/self/exe with the same
/// options, stdin from /dev/null, stdout and stderr to its log (emptied), the lock at fd 3 and
/// the ready pipe at fd 4.
fn plan(state: &StateDir, lock: OwnedFd, ready_w: OwnedFd, argv: &[String]) -> Result<Detach, String> {
    let log: OwnedFd = state
        .open_private(sidecar::LOG, true)
        .map_err(|e| format!("cannot open {}: {e}", state.file(sidecar::LOG).display()))?
        .into();
    let null: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| format!("cannot open /dev/null: {e}: the sidecar's stdin reads it"))?
        .into();
    let head =
        [argv.first().cloned().unwrap_or_else(|| "quiesce".into()), "sidecar".into(), "--detached".into()];
    let args: Vec<String> = head.into_iter().chain(argv.iter().skip(2).cloned()).collect();
    // Kept in this order, at LOCK_FD (3) and READY_FD (4).
    let keep = vec![lock, ready_w];
    let failed = "quiesce sidecar: cannot execute /proc/self/exe\n";
    Detach::new("/proc/self/exe", &args, null, log, keep, (READY_FD - LOCK_FD) as usize, failed)
        .map_err(|e| format!("cannot prepare the sidecar: {e}"))
}

/// The sidecar's first child ended as it should (it only calls setsid and forks).
fn first_child_ended(child: i32) -> Result<(), String> {
    match first_child_end(child)? {
        0 => Ok(()),
        detach::SETSID_FAILED => Err("setsid failed in the sidecar's first child".into()),
        detach::FORK_FAILED => Err("the sidecar's first child cannot fork: is a pids limit reached?".into()),
        c => Err(format!("the sidecar's first child ended with {c}")),
    }
}

/// The exit code of the sidecar's first child, which only calls setsid and forks.
fn first_child_end(child: i32) -> Result<i32, String> {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        match reap::try_reap(child) {
            Ok(Some(code)) => return Ok(code),
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(1)),
            Ok(None) => {
                return Err(format!("the sidecar's first child (pid {child}) did not end within 5 s"))
            }
            Err(e) => return Err(format!("cannot wait for the sidecar's first child: {e}")),
        }
    }
}

/// The first line on `fd` within `budget`.
fn read_line(fd: &OwnedFd, budget: Duration) -> Result<String, String> {
    let until = Instant::now() + budget;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.contains(&b'\n') {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("the sidecar did not say it was ready within {} s", budget.as_secs()));
        }
        if !fdio::wait_readable(fd.as_raw_fd(), left)
            .map_err(|e| format!("cannot wait for the sidecar: {e}"))?
        {
            continue;
        }
        let n =
            fdio::read_some(fd, &mut chunk).map_err(|e| format!("cannot read the sidecar's line: {e}"))?;
        if n == 0 {
            return Err("the sidecar ended before it said it was ready".into());
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_LINE {
            return Err(format!("the sidecar's line is longer than {MAX_LINE} bytes"));
        }
    }
    let text = String::from_utf8_lossy(&buf);
    Ok(text.lines().next().unwrap_or_default().to_string())
}

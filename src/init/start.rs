//! Start-up: everything that can be refused is refused before the command runs, and the sandbox
//! (state dir, key, evidence reader, credential switcher) is set up for the init's loop.

use crate::decide::{newcomers, taint};
use crate::freeze::{self, cred, readers};
use crate::init::{self, logging};
use crate::kernel::{capcheck, creds, process, signal, stat, users};
use crate::observe::procs;
use crate::state::{self, requests};
use crate::{cli, marker};
use std::time::Duration;

fn fatal(msg: impl std::fmt::Display) -> i32 {
    eprintln!("quiesce: {msg}");
    2
}

/// Everything that can be refused is refused here, before the command runs.
pub fn run_init(a: cli::args::InitArgs) -> i32 {
    let log_note = logging::init(a.verbose, true);
    if a.command.is_empty() {
        return fatal("no command given: usage: quiesce [OPTIONS] [--] COMMAND [ARG...]");
    }
    // Before any thread exists: a thread with signals unblocked would take process-directed
    // signals, and PID 1 drops those it has no handler for.
    if let Err(e) = signal::block_all_signals() {
        return fatal(format!("cannot block signals: {e}"));
    }
    let grace = match cli::args::seconds("--grace", a.grace) {
        Ok(d) => d,
        Err(e) => return fatal(e),
    };
    if let Err(e) = keep_out_of_dumps() {
        return fatal(e);
    }
    if process::getpid() != 1 || a.subreaper {
        if let Err(e) = become_subreaper(a.subreaper) {
            return fatal(e);
        }
    }
    let uids = match users::resolve_uids(&a.sandbox.users) {
        Ok(u) => u,
        Err(e) => return fatal(e),
    };
    let drop = match run_as(&a) {
        Ok(d) => d,
        Err(e) => return fatal(e),
    };
    if a.sandbox_lineage && !uids.is_empty() {
        return fatal(
            "--sandbox-lineage and --sandbox-user each define the sandbox: give one (--sandbox-lineage \
             when the agent may be root, --sandbox-user for an agent user)",
        );
    }
    let sandbox = if uids.is_empty() && !a.sandbox_lineage {
        None
    } else {
        match setup_sandbox(&a, uids) {
            Ok(s) => Some(s),
            Err(e) => return fatal(e),
        }
    };
    if let Some(note) = log_note {
        // Said before the command runs, when a blocking write cannot hang on what it does.
        eprintln!("quiesce: warn: {note}");
    }
    // The key path is no business of the command's.
    std::env::remove_var("QUIESCE_SIGNING_KEY");
    // A command run as the sandbox's user is the sandbox's: at a memory limit it goes first.
    let sandbox_command = drop.is_some();
    let plan = match crate::spawn::plan::Plan::new(&a.command, drop) {
        Ok(p) if sandbox_command => p.own_pgroup().oom_first(),
        Ok(p) => p.own_pgroup(),
        Err(e) => return fatal(e),
    };
    init::run::run(init::run::Config {
        plan: Some(plan),
        pgroup: a.pgroup,
        remap_exit: a.remap_exit.clone(),
        grace,
        sandbox,
    })
}

/// The private key must never land in a core dump; ptrace by a same-UID process is also refused.
fn keep_out_of_dumps() -> Result<(), String> {
    process::set_not_dumpable().map_err(|e| format!("cannot mark the init non-dumpable: {e}"))?;
    if process::suid_dumpable() == Some(1) {
        // Every credential switch resets the flag to this value until the init sets it back.
        log::warn!(
            "fs.suid_dumpable is 1: for an instant at each switch to a sandbox UID, that UID may trace \
             the init and read its signing key; set it to 0 or 2 on the host"
        );
    }
    Ok(())
}

/// Become the child subreaper (not PID 1, or `required` by --subreaper): an error only when
/// `required`, else a warning.
fn become_subreaper(required: bool) -> Result<(), String> {
    match process::set_child_subreaper() {
        Ok(()) => log::debug!("not PID 1 (pid {}): registered as a child subreaper", process::getpid()),
        Err(e) if required => {
            return Err(format!(
                "cannot become a child subreaper, which --subreaper (QUIESCE_SUBREAPER) asks for: \
                 {e}: run quiesce as PID 1, or without --subreaper"
            ))
        }
        // As tini does: the command's status, signals and the freeze (which covers the whole
        // PID namespace) do not need it; only orphans go elsewhere. qemu-user answers EINVAL.
        // Said at every verbosity, before the command runs.
        Err(e) => eprintln!(
            "quiesce: warn: cannot become a child subreaper ({e}): orphans of the command go to \
             PID 1 of this namespace, which must reap them, and are not ended when the command \
             exits; run quiesce as PID 1 to have both"
        ),
    }
    Ok(())
}

/// The user the command runs as (--run-as), with its groups; None: the init's own.
fn run_as(a: &cli::args::InitArgs) -> Result<Option<crate::spawn::plan::Drop>, String> {
    let Some(spec) = &a.run_as else { return Ok(None) };
    let user = users::resolve(spec, &users::read_passwd()).map_err(|e| format!("--run-as: {e}"))?;
    let groups = users::groups_of(&user, &users::read_group());
    let tag = if a.sandbox_lineage {
        crate::spawn::plan::Tag::Required(taint::LINEAGE_TAG)
    } else if a.freeze.no_lineage {
        crate::spawn::plan::Tag::None
    } else {
        crate::spawn::plan::Tag::UserUid
    };
    Ok(Some(crate::spawn::plan::Drop { user, groups, allow_setuid: a.allow_setuid, tag }))
}

/// Does a loginuid mark a sandbox launch here? Only where quiesce is the one that writes it:
/// an init that inherited a loginuid (started from a login session) passes it to every process
/// of the container, root ones included, and then it marks nothing.
fn lineage(off: bool, probe_uid: u32) -> bool {
    match lineage_unavailable(off, probe_uid) {
        None => true,
        Some(why) => {
            log::info!("{why}: tracking relies on uid, ancestry and history");
            false
        }
    }
}

/// Why a loginuid cannot mark sandbox launches here, if it cannot.
fn lineage_unavailable(off: bool, probe_uid: u32) -> Option<String> {
    if off {
        return Some("lineage off (--no-lineage)".into());
    }
    if let Some(inherited) = procs::reader::own_loginuid() {
        return Some(format!(
            "lineage unavailable: this init inherited loginuid {inherited} (started from a login \
             session), which every process here carries"
        ));
    }
    if !crate::spawn::plan::lineage_available(probe_uid) {
        return Some("lineage unavailable (no audit, or /proc/self/loginuid cannot be written here)".into());
    }
    None
}

/// A sandbox of lineage alone holds only where every launch is tagged and no process of the
/// container can change its tag (docs/threat-model.md, "Root agents").
fn lineage_only_refusal(off: bool) -> Option<String> {
    if let Some(why) = lineage_unavailable(off, taint::LINEAGE_TAG) {
        return Some(format!(
            "--sandbox-lineage needs lineage, and {why}: run the init as the container's PID 1 (not \
             from a login session), without --no-lineage, on a kernel with audit, or name the agent \
             user with --sandbox-user"
        ));
    }
    if capcheck::audit_control_possible() {
        return Some(
            "--sandbox-lineage: CAP_AUDIT_CONTROL is in this container's bounding set, and with it a \
             root agent can change the loginuid that makes it the sandbox's: drop it (docker run \
             --cap-drop AUDIT_CONTROL; Docker and Podman do not grant it unless asked)"
                .into(),
        );
    }
    None
}

/// What a freeze needs of the host: root, the capabilities it signals and reads with, and /proc.
pub fn can_freeze_here() -> Result<(), String> {
    if creds::geteuid() != 0 {
        return Err(format!(
            "a freeze needs root, and quiesce runs as uid {}: run the container as root (no \
             `--user`; a pod with runAsNonRoot cannot use quiesce as its init) with only the \
             capabilities it needs, and start the agent with --run-as or `quiesce exec --user`",
            creds::geteuid()
        ));
    }
    capcheck::check()?;
    if !stat::is_procfs("/proc").unwrap_or(false) {
        return Err("/proc is not a mounted proc file system, and a freeze reads every process from \
             it: mount proc at /proc (container engines do; with unshare use --mount-proc)"
            .into());
    }
    Ok(())
}

fn publish_locator(state: &state::dir::StateDir, me: process::Pid, start_time: u64) -> Result<(), String> {
    // `quiesce exec` finds this init's state dir here when it is not told it: a launch it cannot
    // record must not run unrecorded beside an init it missed. Written before sandbox.json:
    // whoever waits for that to start the agent finds this too.
    let located = state::locator::publish(&state::locator::Locator {
        // Absolute: the client runs from its own working directory.
        state_dir: std::fs::canonicalize(&state.path).unwrap_or_else(|_| state.path.clone()),
        pid: me,
        start_time,
    });
    match located {
        Ok(()) => Ok(()),
        Err(e) if state.path == std::path::Path::new(state::dir::DEFAULT_DIR) => {
            log::warn!("{e}: quiesce exec finds this init at the default state dir only");
            Ok(())
        }
        Err(e) => Err(format!(
            "{e}: quiesce exec would not find this init's state dir {}; make {} writable (a tmpfs on /run) \
                 or use the default state dir {}",
            state.path.display(),
            state::locator::LOCATOR_DIR,
            state::dir::DEFAULT_DIR
        )),
    }
}

/// The sandbox's side of the init, set up from `a`: shared by the init and the sidecar.
pub fn setup_sandbox(a: &cli::args::InitArgs, uids: Vec<u32>) -> Result<init::run::Sandbox, String> {
    can_freeze_here()?;
    let freeze_signal = cli::args::freeze_signal(&a.freeze.freeze_signal)?;
    let attest = init::attesting::Setup {
        paths: a.attest.paths.clone(),
        allow: a.attest.allow.clone(),
        bounds: a.attest.bounds(),
    };
    init::attesting::check_setup(&attest)?;
    let timeout = cli::args::seconds("--freeze-timeout", a.freeze.freeze_timeout)?;
    let interval = cli::args::seconds("--track-interval", a.freeze.track_interval)?;
    let state = open_state(&a.state.state_dir)?;
    readers::start().map_err(|e| format!("cannot start the evidence reader thread: {e}"))?;
    let key = signing_key(a.freeze.signing_key.as_deref())?;
    let pub_pem = marker::jws::public_pem(&key.verifying_key());
    // Synced once the command runs (init::run::run): no reader needs more than the rename.
    let mut unsynced = Vec::new();
    remove_stale(&state)?;
    let intake = requests::Intake::new(&state)?;
    unsynced.push(write_deferred(&state, state::dir::PUBKEY, pub_pem.as_bytes())?);
    let lineage = if a.sandbox_lineage {
        if let Some(why) = lineage_only_refusal(a.freeze.no_lineage) {
            return Err(why);
        }
        true
    } else {
        lineage(a.freeze.no_lineage, uids.first().copied().unwrap_or(u32::MAX - 1))
    };
    let me = process::getpid();
    let start_time = own_start_time(me)?;
    let tag = a.sandbox_lineage.then_some(taint::LINEAGE_TAG);
    let published =
        state::published::Published { uids: uids.clone(), lineage, tag, pid: me, start_time, freeze_signal };
    publish_locator(&state, me, start_time)?;
    let sandbox_json = serde_json::to_vec(&published).map_err(|e| e.to_string())?;
    unsynced.push(write_deferred(&state, state::published::SANDBOX_FILE, &sandbox_json)?);
    log::debug!("sandbox UIDs {uids:?}, freeze on {}", signal::signal_name(freeze_signal));
    let no_new_privs =
        process::no_new_privs().map_err(|e| format!("cannot read this init's no_new_privs: {e}"))?;
    // The command started with --run-as is a launch by the init itself.
    let unfollowed = a.run_as.is_some() && a.allow_setuid && !lineage && !no_new_privs;
    let launchers = launchers(start_time, unfollowed, lineage, no_new_privs);
    Ok(init::run::Sandbox {
        settings: init::run::Settings {
            key,
            freeze_signal,
            freeze: freeze::run::Config {
                cred: cred::Switcher::start()
                    .map_err(|e| format!("cannot start the credential switcher: {e}"))?,
                timeout,
                stop_wait: Duration::from_millis(500),
            },
            after_freeze_exit: a.after_freeze == "exit",
            track_interval: (interval > Duration::ZERO).then_some(interval),
            command_is_sandbox: a.run_as.is_some(),
            no_new_privs,
            attest,
        },
        tracking: init::tracking::Tracking {
            policy: if a.sandbox_lineage {
                taint::Policy::lineage_only(taint::LINEAGE_TAG)
            } else {
                taint::Policy::new(uids, lineage)
            },
            seen: Default::default(),
            launchers,
            tracked_at: None,
            oom: Default::default(),
        },
        state,
        unsynced,
        intake,
        worker: None,
        last: None,
    })
}

/// The state dir, made if need be; a parent others can write is warned of.
fn open_state(path: &std::path::Path) -> Result<state::dir::StateDir, String> {
    let state = state::dir::StateDir::create(path)?;
    if let Some(w) = state::dir::parent_warning(&state.path) {
        // Said at every verbosity: it is a setup to fix, and the command has not run yet.
        eprintln!("quiesce: warn: {w}");
    }
    Ok(state)
}

/// A marker or status from before this init started proves nothing about this one.
fn remove_stale(state: &state::dir::StateDir) -> Result<(), String> {
    for stale in [state::dir::MARKER, state::dir::ATTESTATION, state::dir::STATUS] {
        state.remove(stale).map_err(|e| format!("cannot remove stale {stale}: {e}"))?;
    }
    Ok(())
}

fn own_start_time(me: process::Pid) -> Result<u64, String> {
    Ok(procs::reader::Reader::default()
        .start_time(me)
        .map_err(|e| format!("cannot read this init's own start time: {e}"))?
        .ok_or("cannot find this init in /proc: mount proc for this PID namespace")?)
}

/// The key markers are signed with: the one at `path` (--signing-key), else an ephemeral one.
fn signing_key(path: Option<&std::path::Path>) -> Result<ed25519_dalek::SigningKey, String> {
    match path {
        Some(path) => marker::jws::load_private(path),
        None => marker::jws::generate().map_err(|e| format!("cannot make an ephemeral key: {e}")),
    }
}

/// Write `name` in the state dir, to be synced once the command runs.
fn write_deferred(state: &state::dir::StateDir, name: &str, data: &[u8]) -> Result<std::fs::File, String> {
    state
        .write_atomic_deferred(name, data, 0o644)
        .map_err(|e| format!("cannot write {name} in {}: {e}", state.path.display()))
}

/// The launchers known at start: the command, as a launch by the init (`unfollowed`: one whose
/// processes may become root unseen). Where lineage is off and setuid binaries work, says so.
fn launchers(start_time: u64, unfollowed: bool, lineage: bool, no_new_privs: bool) -> newcomers::Launchers {
    let mut launchers = newcomers::Launchers::default();
    launchers.add_command(start_time, unfollowed);
    if !lineage && !no_new_privs {
        log::warn!(
            "lineage is off and setuid binaries work here: a sandbox process that becomes root is told from root's \
             own only by observation and launch records (quiesce exec), and freezes refuse what they cannot tell apart; run the \
             container with no-new-privileges, or where lineage works"
        );
    }
    launchers
}

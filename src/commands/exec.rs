//! `quiesce exec`: start a command as a sandbox user, tagged so the init recognises its lineage,
//! and recorded with the init before the command runs.

use crate::cli::args::ExecArgs;
use crate::kernel::process::{self, Pid};
use crate::kernel::users;
use crate::observe::procs::reader::Reader;
use crate::spawn::plan::{self, Plan};
use crate::state::launches::Launch;
use crate::state::requests;
use crate::state::{dir::FreezeState, dir::StateDir, locator, published::published_in, published::Published};
use std::time::{Duration, Instant};

/// How long the launch waits, at most, for the init to take its record (a freeze in progress
/// holds it back for up to its own budget).
const RECORD_WAIT: Duration = Duration::from_secs(30);

pub fn exec(args: ExecArgs) -> i32 {
    // Root until the command's exec: a root escapee must not trace this process into asking for
    // a freeze, or into anything else, while it holds the init's attention. The exec makes the
    // command dumpable again as the kernel decides.
    if let Err(e) = process::set_not_dumpable() {
        eprintln!("quiesce exec: cannot mark this process non-dumpable: {e}");
        return 2;
    }
    let pw = users::read_passwd();
    let user = match users::resolve(&args.user, &pw) {
        Ok(u) => u,
        Err(e) => {
            eprintln!("quiesce exec: {e}");
            return 2;
        }
    };
    let groups = users::groups_of(&user, &users::read_group());
    let reader = Reader::default();
    let init = match init_dir(&args, &reader) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("quiesce exec: {e}");
            return 2;
        }
    };
    let tagged = match tag(&args, user.uid, init.as_ref().map(|(_, p)| p)) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("quiesce exec: {e}");
            return 2;
        }
    };
    if let Err(e) =
        init.map_or(Ok(()), |(dir, published)| record_launch(&args, &reader, dir, &published, tagged))
    {
        eprintln!("quiesce exec: {e}");
        return 2;
    }
    // A sandbox at a memory limit loses its own processes first, never the init: a container
    // whose processes are all smaller than the init would otherwise lose the init
    // (tests/faults.rs). Inherited by all the launch starts; the agent may lower it only to 0.
    if let Err(e) = process::oom_first() {
        log::warn!("cannot raise this launch's oom_score_adj to 1000 ({e}): at a memory limit the OOM killer may take the init");
    }
    if let Some(n) = args.nproc {
        // Set as root, before the drop: the user cannot raise it, and a fork bomb of the command
        // stops at N processes of its UID while root's execs still start.
        if let Err(e) = process::set_nproc_limit(n) {
            eprintln!("quiesce exec: cannot set --nproc {n} (RLIMIT_NPROC): {e}");
            return 2;
        }
    }
    if !args.no_idle {
        // The launch and all it starts run at SCHED_IDLE, which they cannot leave: under a fork
        // bomb of 2,000 at the normal policy, the init and a freeze client each waited seconds
        // for the CPU behind the forkers (`freeze --wait` came back 17.5 to 38.9 s after it was
        // asked, in runs of the bench's `bomb`). Idle threads still take every cycle nothing else
        // in the container wants. (A nice value of 19 instead did worse under the same bomb.)
        if let Err(e) = process::idle_for_good() {
            log::warn!("cannot run this launch at SCHED_IDLE ({e}): under a fork bomb of it the init and a freeze wait for the CPU");
        }
    }
    let drop = plan::Drop { user, groups, allow_setuid: args.allow_setuid, tag: plan::Tag::None };
    match Plan::new(&args.command, Some(drop)) {
        Ok(plan) => plan.exec_in_place(),
        Err(e) => {
            eprintln!("quiesce exec: {e}");
            2
        }
    }
}

/// Tag this process as a sandbox launch (its loginuid, which every process it starts inherits and
/// none may change without CAP_AUDIT_CONTROL): with the user's UID, or, where the init's sandbox
/// is defined by lineage alone, with the init's tag, whatever the user, root included. There an
/// untagged launch would be no sandbox process at all, so a launch that cannot be tagged, or that
/// could change its tag, does not run.
fn tag(args: &ExecArgs, uid: u32, published: Option<&Published>) -> Result<bool, String> {
    // The orchestrator's word first: with a root agent the state dir is the agent's to rewrite,
    // and a sandbox.json removed or rewritten must not make the next launch untagged.
    let asked = args.sandbox_lineage.then_some(crate::decide::taint::LINEAGE_TAG);
    let Some(t) = asked.or(published.and_then(|p| p.tag)) else {
        let tagged = !args.no_lineage && plan::tag_lineage(uid);
        if !args.no_lineage && !tagged {
            log::info!("audit lineage unavailable here; the init tracks this launch by history instead");
        }
        return Ok(tagged);
    };
    if args.no_lineage {
        return Err("the init's sandbox is every launch tagged with its lineage (--sandbox-lineage), and \
             --no-lineage would launch outside it: the command did not run; drop --no-lineage"
            .into());
    }
    crate::kernel::capcheck::drop_audit_control().map_err(|e| {
        format!(
            "{e}: with it a root command could change the lineage tag that makes it the sandbox's; \
             the command did not run; run the container without CAP_AUDIT_CONTROL (Docker and Podman \
             do not grant it) or give this process CAP_SETPCAP"
        )
    })?;
    if !plan::tag_lineage(t) {
        return Err(format!(
            "cannot write the lineage tag {t} to /proc/self/loginuid (already set: {}), and the init's \
             sandbox is every launch tagged with it (--sandbox-lineage): the command did not run; start \
             it from a process with no loginuid (docker exec, not a login session)",
            crate::observe::procs::reader::own_loginuid().map_or("no".into(), |u| u.to_string())
        ));
    }
    Ok(true)
}

/// The state dir of the init this launch must be recorded with, and what it published there:
/// the one named (--state-dir, QUIESCE_STATE_DIR, or the default) when an init published there,
/// else the one the init of this PID namespace names in its locator. None: no quiesce init with
/// a sandbox runs here, and there is no one to tell. An init that is there and cannot be reached
/// is an error: the command must not run unrecorded beside it.
fn init_dir(args: &ExecArgs, reader: &Reader) -> Result<Option<(StateDir, Published)>, String> {
    let named = &args.state.state_dir;
    let here = match StateDir::open(named) {
        Ok(d) => Some(d),
        Err(_) if std::fs::symlink_metadata(named).is_err() => None,
        // There but not to be trusted: never the same as none.
        Err(e) => return Err(e),
    };
    // An init's zombie (beside a PID 1 that never reaps) takes no record: no one is there. Nor
    // does a process carrying the lineage tag: every process of a root agent does (one that wrote
    // a sandbox.json of its own naming itself), and no init can (it never runs a launch's tag).
    let alive = |pid: Pid, start_time: u64| {
        reader.live_start_time(pid).ok().flatten() == Some(start_time) && !super::freeze::carries_tag(pid)
    };
    if let Some(d) = here {
        // What an init of an earlier container left in a kept directory names no one here.
        if let Some(p) = published_in(&d)?.filter(|p| alive(p.pid, p.start_time)) {
            return Ok(Some((d, p)));
        }
    }
    let Some(l) = locator::find()? else { return Ok(None) };
    if !alive(l.pid, l.start_time) {
        // What an earlier init of a namespace with this inode left: no one is there.
        return Ok(None);
    }
    let unreachable = |why: String| {
        format!(
            "the init of this container (pid {}) keeps its state in {}, and {why}: fix that, or pass its --state-dir",
            l.pid,
            l.state_dir.display()
        )
    };
    let d = StateDir::open(&l.state_dir).map_err(|e| unreachable(format!("it cannot be used: {e}")))?;
    // The init writes its locator just before sandbox.json: one starting up is waited for.
    let until = Instant::now() + STARTING;
    loop {
        match published_in(&d).map_err(|e| unreachable(format!("its sandbox.json cannot be used: {e}")))? {
            Some(p) if p.pid == l.pid && p.start_time == l.start_time => {
                log::info!("recording this launch in {} (the init's state dir)", l.state_dir.display());
                return Ok(Some((d, p)));
            }
            _ if Instant::now() < until && alive(l.pid, l.start_time) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            _ => return Err(unreachable(format!("that init published nothing there within {STARTING:?}"))),
        }
    }
}

/// How long a launch waits for an init that wrote its locator to publish its sandbox.
const STARTING: Duration = Duration::from_secs(10);

/// Tell the init about this launch and wait until it has taken the record: from then on nothing
/// the command does can keep the init from knowing it and its launcher (see `launches`).
fn record_launch(
    args: &ExecArgs,
    reader: &Reader,
    dir: StateDir,
    published: &Published,
    tagged: bool,
) -> Result<(), String> {
    let start =
        |pid: Pid| reader.start_time(pid).map_err(|e| format!("cannot read the start time of {pid}: {e}"));
    let pid = process::getpid();
    let start_time =
        start(pid)?.ok_or("cannot find this process in /proc: mount proc for this PID namespace")?;
    let (ppid, parent_start_time) = parent_identity(&start)?;
    let nnp = process::no_new_privs().map_err(|e| format!("cannot read no_new_privs: {e}"))?;
    let launch = Launch {
        pid,
        start_time,
        ppid,
        parent_start_time,
        lineage: published.lineage && tagged,
        setuid: args.allow_setuid && !nnp,
    };
    let results = dir.sub(requests::RESULTS)?;
    let id = requests::submit_launch(&dir, launch)?;
    let sig = if published.freeze_signal > 0 { published.freeze_signal } else { libc::SIGUSR1 };
    let until = Instant::now() + RECORD_WAIT;
    if let Err(e) = super::freeze::signal_until_taken(&dir, &id, sig, RECORD_WAIT) {
        return Err(format!("cannot tell the init about this launch: {e}: the command did not run"));
    }
    let mut pause = Duration::from_millis(1);
    while Instant::now() < until {
        if let Some(st) = requests::read_result(&results, &id)? {
            // Read once, by this client alone: the answer has done its job (the init prunes what
            // is left, so a failed removal costs nothing but a file).
            if let Err(e) = results.remove(&format!("{id}.json")) {
                log::debug!("cannot remove the answer {id}.json: {e}");
            }
            if st.state == FreezeState::LaunchRecorded {
                return Ok(());
            }
            return Err(format!("the init answered the launch record with '{}'", st.state));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
    let withdrawn = requests::withdraw(&dir, &id).err().map(|w| format!("; {w}")).unwrap_or_default();
    Err(format!(
        "the init did not take this launch's record within {RECORD_WAIT:?} (a freeze that does not end?): \
         the command did not run; retry{withdrawn}"
    ))
}

/// The parent and its start time, read until the two agree (a parent that exits between the
/// reads is replaced by the one this process was handed to); 0, 0 for a parent outside.
fn parent_identity(start: &dyn Fn(Pid) -> Result<Option<u64>, String>) -> Result<(Pid, u64), String> {
    for _ in 0..8 {
        let ppid = process::getppid();
        if ppid == 0 {
            return Ok((0, 0));
        }
        if let Some(t) = start(ppid)? {
            if process::getppid() == ppid {
                return Ok((ppid, t));
            }
        }
    }
    Err("the parent of this process kept changing: cannot record who launched it".into())
}

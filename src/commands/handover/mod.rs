//! `verify --hand-over`: the services the freeze killed, started again for the verifier's tests.
//!
//! Nothing is spared at the freeze (a listener can be a tamper daemon in disguise): the marker
//! still certifies that no sandbox process lives. Afterwards each process the marker records as
//! having listened on TCP is started again from its recorded executable, arguments, directory and
//! environment (or from the command the task declares for its port), as a service user that is
//! neither the agent's nor root: no supplementary groups, no capabilities, no_new_privs, a
//! session of its own. Before any starts, that user must be unable to write, and must not own,
//! anything under the paths the verifier protects (its tests, the reward, the workspace), nor
//! rename one through a parent; none of its processes may be alive. Each service must listen
//! again, as that user, within the wait; otherwise none runs and the command does not either.
//! Each runs in a Landlock domain of its own made before its exec (`commands::handover::confine`):
//! TCP bind to its own ports only and connect to the services' ports only, no signal or abstract
//! socket outside it, writes of contents and names only to the temporary directories (which must
//! hold no second name of a file its user may write: `links`); a kernel without it refuses the
//! hand-over. The kernel holds that for the services' whole life, so nothing is sampled while the
//! tests run; a port counts as listened on at the start only when its own service holds it.
//! What ran, and the domain, are written beside the marker (`handover.json`), and after the
//! command every process of the service user is killed.
//! Its rooms: `services` (which to start, from what), `confine` (their Landlock domain),
//! `protect` (the protected-path check), `links` (no hard link where they may write), `killer`
//! (the forked killer); here, the conductor.

pub mod confine;
pub mod killer;
pub mod links;
pub mod protect;
pub mod services;

use crate::cli::args::VerifyArgs;
use crate::commands::handover::{killer::Killer, services::Started};
use crate::kernel::{creds, process::Pid, reap};
use crate::marker::jws::Claims;
use crate::observe::procs::{model::Detail, reader::Reader};
use crate::state::dir::StateDir;
use serde::Serialize;
use std::time::{Duration, Instant};

/// The record's name in the state dir, beside the marker, and the services' output's.
pub const RECORD: &str = "handover.json";
pub const LOG: &str = "services.log";
/// Descriptors looked at per process of the service user.
const HELD_SCAN: usize = 4096;
/// How long a service's start may take until its exec.
const START_TIME: Duration = Duration::from_secs(5);
/// How long the services' end may take after the command.
const STOP_TIME: Duration = Duration::from_secs(5);

/// What `handover.json` says.
#[derive(Debug, Serialize)]
pub struct Record {
    /// The marker's freeze.
    pub jti: String,
    pub user: u32,
    pub group: u32,
    pub protected: Vec<String>,
    pub services: Vec<Started>,
    /// "ready" (all listen, the command runs), "failed" or "ended" (the command ended).
    pub state: &'static str,
    pub reason: Option<String>,
    pub ready_ms: Option<u64>,
    /// Processes of the service user killed once the command ended.
    pub stopped: Option<usize>,
    /// The Landlock domain each service ran in; None: refused before it was made.
    pub domain: Option<crate::commands::handover::confine::Domain>,
}

/// The services handed over, running while the verifier does.
pub struct Running {
    record: Record,
    dir: Option<StateDir>,
    children: Vec<Pid>,
    /// Started before any service: it stops them however verify ends.
    killer: Option<Killer>,
    /// The domain's rulesets (one per service) and seccomp filter, kept until every service has
    /// enforced them.
    ruleset: Option<(Vec<crate::kernel::landlock::Ruleset>, crate::kernel::seccomp::Filter)>,
}

/// Start every service and wait until each listens; Err: the line that says why none runs
/// (what did start is stopped, and the record says so).
pub fn start(args: &VerifyArgs, claims: &Claims, sandbox_uids: &[u32]) -> Result<Running, String> {
    let (uid, gid) = (args.service_user, args.service_user);
    // Before anything acts as that user: a failure below stops every process it has.
    if uid == 0 || claims.sandbox_uids.contains(&uid) || sandbox_uids.contains(&uid) {
        return Err(format!(
            "the service user {uid} is root or a sandbox user: name another with --service-user"
        ));
    }
    let dir = StateDir::open(&args.state.state_dir).ok();
    let mut run = Running {
        record: Record {
            jti: claims.jti.clone(),
            user: uid,
            group: gid,
            protected: args.protect.iter().map(|p| p.display().to_string()).collect(),
            services: Vec::new(),
            state: "failed",
            reason: None,
            ready_ms: None,
            stopped: None,
            domain: None,
        },
        dir,
        children: Vec::new(),
        killer: None,
        ruleset: None,
    };
    let began = Instant::now();
    let out = prepare(args, claims, &mut run).and_then(|()| launch(args, &mut run));
    match out {
        Ok(()) => {
            run.record.state = "ready";
            run.record.ready_ms = Some(began.elapsed().as_millis() as u64);
            write(&run)?;
            Ok(run)
        }
        Err(e) => {
            run.record.reason = Some(e.clone());
            run.record.stopped = Some(stop_all(&mut run).unwrap_or(0));
            // The refusal is what counts; a record that cannot be written is said beside it.
            if let Err(w) = write(&run) {
                return Err(format!("{e} ({w})"));
            }
            Err(e)
        }
    }
}

impl Running {
    /// Stop every process of the service user once the command ended, and record it. No port is
    /// looked at: the domain kept every service to its own ports for its whole life.
    pub fn end(mut self) -> Result<(), String> {
        let stopped = stop_all(&mut self);
        self.record.state = "ended";
        self.record.stopped = stopped.as_ref().ok().copied();
        if let Err(e) = &stopped {
            self.record.reason = Some(e.clone());
        }
        write(&self)?;
        stopped.map(drop)
    }
}

/// What the services are, and whether the protected paths are safe from their user.
fn prepare(args: &VerifyArgs, claims: &Claims, run: &mut Running) -> Result<(), String> {
    let uid = args.service_user;
    run.record.services = services::services(claims, &args.service, &args.port)?;
    // Before anything else: a kernel that cannot hold the services refuses the hand-over.
    let owned: Vec<Vec<u16>> = run.record.services.iter().map(|s| s.ports.clone()).collect();
    let (rulesets, filter, domain) = crate::commands::handover::confine::make(&owned)?;
    run.ruleset = Some((rulesets, filter));
    run.record.domain = Some(domain);
    let low = unprivileged_port_start();
    if let Some(p) = run.record.services.iter().flat_map(|s| s.ports.iter()).find(|&&p| u32::from(p) < low) {
        return Err(format!(
            "port {p} needs root here (net.ipv4.ip_unprivileged_port_start={low}), and services run as \
             user {uid}: run the container with --sysctl net.ipv4.ip_unprivileged_port_start=0"
        ));
    }
    // Its processes would count as the services', and be killed after the command: the user must
    // be the hand-over's alone (an earlier hand-over that was itself killed leaves some too).
    match killer::alive_of(uid)? {
        0 => {}
        n => {
            return Err(format!(
                "{n} process(es) of the service user {uid} are alive already: name a user of the \
                 hand-over's own with --service-user, or end them"
            ))
        }
    }
    protect::protected_safe(uid, uid, &args.protect, &args.hide)?;
    links::single_names(uid, uid, crate::commands::handover::confine::WRITE_DIRS)
}

/// The lowest port a user that is not root may bind in this network namespace.
fn unprivileged_port_start() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(1024)
}

/// Start each service and wait until every port listens as the service user, or fail.
fn launch(args: &VerifyArgs, run: &mut Running) -> Result<(), String> {
    let uid = args.service_user;
    let user = crate::kernel::users::User { name: "service".into(), uid, gid: uid, home: "/".into() };
    // Of several services, each must listen on its own ports itself (another could take one
    // unbound by listen() alone, as an ephemeral port): each starts with a loginuid write of its
    // own, which gives it an audit session the kernel keeps for all it starts.
    let several = run.record.services.len() > 1;
    let drop = crate::spawn::plan::Drop {
        user,
        groups: vec![],
        allow_setuid: false,
        tag: if several { crate::spawn::plan::Tag::Required(uid) } else { crate::spawn::plan::Tag::None },
    };
    // Hashed first: the wait is the services' own.
    for s in run.record.services.iter_mut() {
        s.exe_sha256 = digest(&s.exe);
    }
    let began = Instant::now();
    // Their stdin is empty and their output goes to a log of their own: the caller's descriptors
    // are the tests' input and results.
    let stdin = std::fs::File::open("/dev/null").map_err(|e| format!("/dev/null: {e}"))?;
    let log = match &run.dir {
        Some(d) => {
            d.open_private(LOG, true).map_err(|e| format!("cannot open {}: {e}", d.file(LOG).display()))?
        }
        None => return Err("no state dir to keep the services' output in (--state-dir)".into()),
    };
    let (stdin, log) = (std::os::fd::OwnedFd::from(stdin), std::os::fd::OwnedFd::from(log));
    let (rulesets, filter) = run.ruleset.take().ok_or("the services' Landlock domain was not made")?;
    run.killer = Some(Killer::start(uid)?);
    for (s, ruleset) in run.record.services.iter_mut().zip(&rulesets) {
        let plan = crate::spawn::plan::Plan::new(&s.argv, Some(drop.clone()))
            .and_then(|p| p.recorded(&s.exe, &s.cwd, &s.env, &stdin, &log))
            .map(|p| p.confined(ruleset, &filter))
            .map_err(|e| format!("cannot start the service on port {:?}: {e}", s.ports))?;
        let pid = plan.spawn_forked(START_TIME).map_err(|e| {
            let why =
                if several { " (each of several services needs a loginuid write of its own)" } else { "" };
            format!("cannot start the service on port {:?}: {e}{why}", s.ports)
        })?;
        s.pid = Some(pid);
        run.children.push(pid);
    }
    // After every start, not between two: the gap between one service's exec and the next's
    // stays as short as it was, since a service started first could rewrite the next one's
    // executable in it (its digest was taken before: attack_handover_2 y08). Read while each
    // child is unreaped: its pid is still its own.
    for s in run.record.services.iter_mut() {
        if let (true, Some(pid)) = (several, s.pid) {
            s.audit_session = Some(crate::observe::sockets::audit_session(pid).ok_or_else(|| {
                format!(
                    "cannot read the audit session of the service on port {:?} (/proc/{pid}/sessionid), \
                     which tells it from the other services: hand over on a kernel built with CONFIG_AUDIT",
                    s.ports
                )
            })?);
        }
    }
    let until = began + Duration::from_secs(args.service_wait);
    let mut exited: Vec<(usize, i32)> = Vec::new();
    loop {
        let (listening, _) = crate::observe::sockets::listening()
            .map_err(|e| format!("cannot read the socket tables: {e}"))?;
        let held = held_by(uid)?;
        // A port counts only as its owner's: of several services, held by a process of its session.
        let up = |p: u16, session: Option<u32>| {
            listening.iter().any(|l| {
                l.at.port == p
                    && match session {
                        None => theirs(l, uid, &held),
                        Some(s) => held.iter().any(|&(i, h)| i == l.inode && h == Some(s)),
                    }
            })
        };
        let waiting: Vec<u16> = run
            .record
            .services
            .iter()
            .flat_map(|s| s.ports.iter().copied().filter(move |&p| !up(p, s.audit_session)))
            .collect();
        if waiting.is_empty() {
            return Ok(());
        }
        for (i, s) in run.record.services.iter().enumerate() {
            let Some(pid) = s.pid else { continue };
            if exited.iter().any(|&(j, _)| j == i) {
                continue;
            }
            if let Ok(Some(code)) = reap::try_reap(pid) {
                exited.push((i, code));
                // A daemon's first process exits 0 once its child listens; anything else is a failure now.
                if code != 0 {
                    return Err(format!(
                        "the service on port {:?} ({}) exited with status {code} before it listened, \
                         as user {uid}; its output is in {}",
                        s.ports,
                        s.argv.join(" ").escape_debug(),
                        run.dir.as_ref().map(|d| d.file(LOG).display().to_string()).unwrap_or_default()
                    ));
                }
            }
        }
        if Instant::now() >= until {
            return Err(format!(
                "port(s) {waiting:?} not listened on by user {uid} within --service-wait {} s{}",
                args.service_wait,
                if exited.is_empty() {
                    String::new()
                } else {
                    " (a service's first process exited 0)".into()
                }
            ));
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// sha256 of a regular file, read within a bound of time; None when it cannot be read.
fn digest(path: &str) -> Option<String> {
    use sha2::Digest;
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    // A regular file only, looked at before it is opened (a device's open acts), and then
    // non-blocking: a FIFO swapped in must not hold verify.
    if !std::fs::metadata(path).ok()?.is_file() {
        return None;
    }
    let mut f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path).ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let until = Instant::now() + Duration::from_secs(10);
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match f.read(&mut buf).ok()? {
            0 => return Some(crate::state::dir::hex(&h.finalize())),
            n => h.update(&buf[..n]),
        }
        if Instant::now() >= until {
            return None;
        }
    }
}

/// Kill every process of the service user until none is left alive, within `STOP_TIME`, and reap
/// the services' first processes; Ok: how many were alive at first.
fn stop_all(run: &mut Running) -> Result<usize, String> {
    let uid = run.record.user;
    let until = Instant::now() + STOP_TIME;
    let Some(killer) = run.killer.take() else {
        // Nothing was started.
        return Ok(0);
    };
    let mut first = None;
    let out = loop {
        reap_children(&run.children);
        let alive = match killer::alive_but(uid, killer.pid) {
            Ok(n) => n,
            Err(e) => break Err(e),
        };
        first.get_or_insert(alive);
        if alive == 0 {
            break Ok(first.unwrap_or(0));
        }
        if Instant::now() >= until {
            break Err(format!(
                "{alive} process(es) of the service user {uid} still alive after {STOP_TIME:?}"
            ));
        }
        if let Err(e) = killer.sweep(until) {
            break Err(e);
        }
    };
    killer.finish(Instant::now() + Duration::from_secs(1));
    reap_children(&run.children);
    out
}

/// A socket is the one service's when a process of its holds it, or when its user made it (one
/// in flight in a message, or held by a process that hides its descriptors).
fn theirs(l: &crate::observe::sockets::Listening, uid: u32, held: &[(u64, Option<u32>)]) -> bool {
    l.uid == uid || held.iter().any(|&(i, _)| i == l.inode)
}

/// The sockets the processes of `uid` in this PID namespace hold (their descriptors, read with
/// that user's filesystem IDs where root may not): a socket is the services' by who holds it,
/// not by the UID that made it, which another namespace sharing the network may share. Each with
/// the audit session of the process holding it.
fn held_by(uid: u32) -> Result<Vec<(u64, Option<u32>)>, String> {
    let snap = Reader::default().snapshot(Detail::Light).map_err(|e| format!("cannot read /proc: {e}"))?;
    let mut out = Vec::new();
    for p in snap.values().filter(|p| p.alive() && p.all_uids().any(|u| u == uid)) {
        let session = crate::observe::sockets::audit_session(p.pid);
        let scan = || crate::observe::sockets::socket_inodes(p.pid, HELD_SCAN);
        let found = match scan() {
            Ok(f) => f,
            Err(_) => creds::as_fs_user(uid, uid, scan)
                .map_err(|e| format!("filesystem ids: {e}"))?
                .and_then(Result::ok)
                .unwrap_or_default(),
        };
        out.extend(found.into_iter().map(|i| (i, session)));
    }
    Ok(out)
}

fn reap_children(children: &[Pid]) {
    for &pid in children {
        let _ = reap::try_reap(pid);
    }
}

fn write(run: &Running) -> Result<(), String> {
    let text = serde_json::to_vec_pretty(&run.record)
        .map_err(|e| format!("cannot write the hand-over record: {e}"))?;
    let dir = run.dir.as_ref().ok_or("no state dir to write the hand-over record in (--state-dir)")?;
    dir.write_atomic(RECORD, &text, 0o644)
        .map_err(|e| format!("cannot write {}: {e}", dir.file(RECORD).display()))
}

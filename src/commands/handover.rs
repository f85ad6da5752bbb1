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
//! Each runs in a Landlock domain made before its exec (`commands::confine`): TCP bind and
//! connect to the services' ports only, no signal or abstract socket outside it, writes only to
//! the temporary directories; a kernel without it refuses the hand-over. The kernel holds that
//! for the services' whole life, so nothing is sampled while the tests run.
//! What ran, and the domain, are written beside the marker (`handover.json`), and after the
//! command every process of the service user is killed.

use crate::cli::args::VerifyArgs;
use crate::freeze::evidence::{Evidence, Service};
use crate::kernel::{creds, process::Pid, reap};
use crate::marker::jws::Claims;
use crate::observe::procs::{model::Detail, reader::Reader};
use crate::state::dir::StateDir;
use serde::Serialize;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The record's name in the state dir, beside the marker, and the services' output's.
pub const RECORD: &str = "handover.json";
pub const LOG: &str = "services.log";
/// Descriptors looked at per process of the service user.
const HELD_SCAN: usize = 4096;
/// How long a service's start may take until its exec.
const START_TIME: Duration = Duration::from_secs(5);
/// Entries looked at under the protected paths, and how long that may take.
const PROTECT_ENTRIES: usize = 200_000;
const PROTECT_TIME: Duration = Duration::from_secs(20);
/// How long the services' end may take after the command.
const STOP_TIME: Duration = Duration::from_secs(5);
/// The environment a declared service gets.
const PLAIN_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// One service as started, for the record.
#[derive(Debug, Serialize)]
pub struct Started {
    /// The killed process it stands for; None: declared for a port nothing listened on.
    pub was_pid: Option<i32>,
    pub argv: Vec<String>,
    pub exe: String,
    /// sha256 of the executable file as it was when started (a script's interpreter: the
    /// attestation covers the scripts of the trees it names).
    pub exe_sha256: Option<String>,
    pub cwd: String,
    /// The names of its environment's variables (their values may be secrets).
    pub env_names: Vec<String>,
    pub ports: Vec<u16>,
    /// Started from `--service PORT=COMMAND`, not from its record.
    pub declared: bool,
    pub pid: Option<i32>,
    #[serde(skip)]
    env: Vec<String>,
}

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
    pub domain: Option<crate::commands::confine::Domain>,
}

/// The services handed over, running while the verifier does.
pub struct Running {
    record: Record,
    dir: Option<StateDir>,
    children: Vec<Pid>,
    /// Started before any service: it stops them however verify ends.
    killer: Option<Killer>,
    /// The domain's ruleset, open until every service has enforced it.
    ruleset: Option<crate::kernel::landlock::Ruleset>,
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
    run.record.services = services(claims, &args.service, &args.port)?;
    // Before anything else: a kernel that cannot hold the services refuses the hand-over.
    let ports: Vec<u16> = run.record.services.iter().flat_map(|s| s.ports.iter().copied()).collect();
    let (ruleset, domain) = crate::commands::confine::make(&ports)?;
    run.ruleset = Some(ruleset);
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
    match alive_of(uid)? {
        0 => {}
        n => {
            return Err(format!(
                "{n} process(es) of the service user {uid} are alive already: name a user of the \
                 hand-over's own with --service-user, or end them"
            ))
        }
    }
    protected_safe(uid, uid, &args.protect, &args.hide)
}

/// The services to start: each recorded one not already covered by an earlier one (a worker
/// sharing its master's socket), with the declared ones in place of those on their ports.
fn services(claims: &Claims, declared: &[String], named: &[u16]) -> Result<Vec<Started>, String> {
    let mut decl: Vec<(u16, &str)> = Vec::new();
    for d in declared {
        let parsed = d.split_once('=').and_then(|(p, c)| Some((p.trim().parse::<u16>().ok()?, c)));
        match parsed {
            Some((p, c)) if p > 0 && !c.trim().is_empty() => decl.push((p, c)),
            _ => return Err(format!("--service '{}' is not PORT=COMMAND", d.escape_debug())),
        }
    }
    let mut recorded: Vec<&Service> = claims.services.iter().collect();
    recorded.sort_by_key(|s| s.start_time);
    let mut out: Vec<Started> = Vec::new();
    for s in recorded {
        let ports: Vec<u16> = s.listen.iter().map(|e| e.port).collect();
        if ports.iter().all(|p| out.iter().any(|o| o.ports.contains(p))) {
            continue;
        }
        // With --port, only the services on the ports named come back: one the agent left on a
        // port the tests bind themselves stays dead.
        if !named.is_empty() && !ports.iter().any(|p| named.contains(p)) {
            continue;
        }
        if let Some(p) = ports.iter().find(|p| !named.is_empty() && !named.contains(p)) {
            return Err(format!(
                "the service pid {} listened on port {p} as well as on a port --port names: it cannot \
                 come back without it; declare its start with --service",
                s.pid
            ));
        }
        let evidence = claims.processes.iter().find(|e| (e.pid, e.start_time) == (s.pid, s.start_time));
        let own = decl.iter().find(|(p, _)| ports.contains(p));
        let mut started = match own {
            Some(&(_, cmd)) => declared_start(cmd),
            None => recorded_start(s, evidence)?,
        };
        started.was_pid = Some(s.pid);
        for p in ports {
            if !started.ports.contains(&p) {
                started.ports.push(p);
            }
        }
        out.push(started);
    }
    for &(p, cmd) in &decl {
        if !out.iter().any(|o| o.ports.contains(&p)) {
            let mut s = declared_start(cmd);
            s.ports.push(p);
            out.push(s);
        }
    }
    Ok(out)
}

/// The task's own start: from `/` with a plain PATH, never the agent's recorded directory or
/// environment (whose PATH could lead the task's command to the agent's files).
fn declared_start(cmd: &str) -> Started {
    let env = vec![PLAIN_ENV.to_string()];
    Started {
        was_pid: None,
        argv: vec!["/bin/sh".into(), "-c".into(), cmd.to_string()],
        exe: "/bin/sh".into(),
        exe_sha256: None,
        cwd: "/".to_string(),
        env_names: names(&env),
        ports: Vec::new(),
        declared: true,
        pid: None,
        env,
    }
}

/// A recorded service as it ran, or the reason it cannot be started again from its record.
fn recorded_start(s: &Service, e: Option<&Evidence>) -> Result<Started, String> {
    let ports: Vec<String> = s.listen.iter().map(|l| l.port.to_string()).collect();
    let why = |what: &str| {
        format!(
            "the service pid {} on port {} cannot be started again: {what}; declare its start with \
             --service {}=COMMAND",
            s.pid,
            ports.join(","),
            ports.first().map(String::as_str).unwrap_or("PORT")
        )
    };
    let e = e.ok_or_else(|| why("its process is not in the marker"))?;
    let argv = match (&e.cmdline, e.truncated || s.truncated) {
        (_, true) => return Err(why("its record was cut to its bound")),
        (Some(a), false) if !a.is_empty() => a.clone(),
        _ => return Err(why("its command line was not recorded")),
    };
    let exe = match &e.exe {
        Some(x) if x.ends_with(" (deleted)") => return Err(why("its executable was deleted")),
        Some(x) => x.clone(),
        None => return Err(why("its executable was not recorded")),
    };
    let cwd = s.cwd.clone().ok_or_else(|| why("its working directory was not recorded"))?;
    if cwd.ends_with(" (deleted)") {
        return Err(why("its working directory was deleted"));
    }
    let env = s.env.clone().ok_or_else(|| why("its environment was not recorded"))?;
    Ok(Started {
        was_pid: Some(s.pid),
        argv,
        exe,
        exe_sha256: None,
        cwd,
        env_names: names(&env),
        ports: Vec::new(),
        declared: false,
        pid: None,
        env,
    })
}

fn names(env: &[String]) -> Vec<String> {
    env.iter().map(|v| v.split_once('=').map_or(v.as_str(), |(n, _)| n).to_string()).collect()
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
    let drop = crate::init::spawn::Drop {
        user,
        groups: vec![],
        allow_setuid: false,
        tag: crate::init::spawn::Tag::None,
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
    let ruleset = run.ruleset.take().ok_or("the services' Landlock domain was not made")?;
    run.killer = Some(Killer::start(uid)?);
    for s in run.record.services.iter_mut() {
        let plan = crate::init::spawn::Plan::new(&s.argv, Some(drop.clone()))
            .and_then(|p| p.recorded(&s.exe, &s.cwd, &s.env, &stdin, &log))
            .map(|p| p.confined(&ruleset))
            .map_err(|e| format!("cannot start the service on port {:?}: {e}", s.ports))?;
        let pid = plan
            .spawn_forked(START_TIME)
            .map_err(|e| format!("cannot start the service on port {:?}: {e}", s.ports))?;
        s.pid = Some(pid);
        run.children.push(pid);
    }
    let until = began + Duration::from_secs(args.service_wait);
    let mut exited: Vec<(usize, i32)> = Vec::new();
    loop {
        let (listening, _) = crate::observe::sockets::listening()
            .map_err(|e| format!("cannot read the socket tables: {e}"))?;
        let held = held_by(uid)?;
        let up = |p: u16| listening.iter().any(|l| l.at.port == p && theirs(l, uid, &held));
        let waiting: Vec<u16> =
            run.record.services.iter().flat_map(|s| s.ports.iter().copied()).filter(|&p| !up(p)).collect();
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

/// The services' killer: a child forked before any service starts (so a pids limit they fill
/// cannot keep it from existing), root and waiting until asked. Each byte verify writes asks
/// for a burst of kill(-1) as the service user (`creds::kill_sweeps_from`: the services cannot
/// stop it), answered by a byte back; when verify's end of the pipe closes (verify ended, even
/// by SIGKILL) it sweeps once more and exits. No service can outlive its verify.
struct Killer {
    pid: Pid,
    ask: std::os::fd::OwnedFd,
    done: std::os::fd::OwnedFd,
}

/// A UID with no process, for the killer's real and saved IDs: far from any a system assigns.
fn outsider(uid: u32) -> u32 {
    uid ^ 0x4000_0000
}

impl Killer {
    fn start(uid: u32) -> Result<Killer, String> {
        use crate::kernel::fdio;
        use std::os::fd::AsRawFd;
        if alive_of(outsider(uid))? != 0 {
            return Err(format!("processes of UID {} are alive: name another --service-user", outsider(uid)));
        }
        let (ask_r, ask) = fdio::pipe().map_err(|e| format!("pipe: {e}"))?;
        let (done, done_w) = fdio::pipe().map_err(|e| format!("pipe: {e}"))?;
        let pid =
            crate::kernel::process::fork().map_err(|e| format!("cannot start the services' killer: {e}"))?;
        if pid == 0 {
            drop(ask);
            drop(done);
            // A session of its own: a signal to verify's group (timeout(1) sends one) leaves it
            // to do its last sweep once verify is gone.
            // SAFETY: setsid has no arguments.
            if unsafe { libc::setsid() } < 0 {
                crate::kernel::process::exit_now(
                    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO),
                );
            }
            let mut byte = [0u8; 1];
            loop {
                let last = !matches!(fdio::read_some(&ask_r, &mut byte), Ok(1));
                // The same IDs again on every burst: allowed, each being one it holds already.
                let e =
                    creds::kill_sweeps_from(outsider(uid), uid, libc::SIGKILL, 20, Duration::from_millis(5));
                if e != 0 || last {
                    crate::kernel::process::exit_now(e);
                }
                if fdio::write(done_w.as_raw_fd(), b"k").is_err() {
                    crate::kernel::process::exit_now(0);
                }
            }
        }
        drop(ask_r);
        drop(done_w);
        Ok(Killer { pid, ask, done })
    }

    /// One burst, waited for until `until`.
    fn sweep(&self, until: Instant) -> Result<(), String> {
        use crate::kernel::fdio;
        use std::os::fd::AsRawFd;
        fdio::write(self.ask.as_raw_fd(), b"k").map_err(|e| format!("the services' killer is gone: {e}"))?;
        let left = until.saturating_duration_since(Instant::now());
        match fdio::wait_readable(self.done.as_raw_fd(), left) {
            Ok(true) => match fdio::read_some(&self.done, &mut [0u8; 1]) {
                Ok(1) => Ok(()),
                _ => Err("the services' killer ended".into()),
            },
            _ => Err("the services' killer did not answer in time".into()),
        }
    }

    /// Close the pipe (a last burst) and reap it.
    fn finish(self, until: Instant) {
        let Killer { pid, ask, done } = self;
        drop(ask);
        drop(done);
        while Instant::now() < until {
            if !matches!(reap::try_reap(pid), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        crate::kernel::signal::kill(pid, libc::SIGKILL).ok();
        let _ = reap::wait_child(pid);
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
        let alive = match alive_but(uid, killer.pid) {
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

/// A socket is the services' when a process of theirs holds it, or when their user made it
/// (one in flight in a message, or held by a process that hides its descriptors).
fn theirs(l: &crate::observe::sockets::Listening, uid: u32, held: &std::collections::HashSet<u64>) -> bool {
    l.uid == uid || held.contains(&l.inode)
}

/// The sockets the processes of `uid` in this PID namespace hold (their descriptors, read with
/// that user's filesystem IDs where root may not): a socket is the services' by who holds it,
/// not by the UID that made it, which another namespace sharing the network may share.
fn held_by(uid: u32) -> Result<std::collections::HashSet<u64>, String> {
    let snap = Reader::default().snapshot(Detail::Light).map_err(|e| format!("cannot read /proc: {e}"))?;
    let mut out = std::collections::HashSet::new();
    for p in snap.values().filter(|p| p.alive() && p.all_uids().any(|u| u == uid)) {
        let scan = || crate::observe::sockets::socket_inodes(p.pid, HELD_SCAN);
        let found = match scan() {
            Ok(f) => f,
            Err(_) => creds::as_fs_user(uid, uid, scan)
                .map_err(|e| format!("filesystem ids: {e}"))?
                .and_then(Result::ok)
                .unwrap_or_default(),
        };
        out.extend(found);
    }
    Ok(out)
}

/// Processes alive (not zombies) with `uid` among their UIDs; an unreadable /proc is an error.
fn alive_of(uid: u32) -> Result<usize, String> {
    alive_but(uid, 0)
}

/// The same, leaving out `but` (the killer, whose effective UID is the user's).
fn alive_but(uid: u32, but: Pid) -> Result<usize, String> {
    let snap = Reader::default().snapshot(Detail::Light).map_err(|e| format!("cannot read /proc: {e}"))?;
    Ok(snap.values().filter(|p| p.pid != but && p.alive() && p.all_uids().any(|u| u == uid)).count())
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

/// Refuse when the service user could write or owns anything under a protected path, or could
/// move one through a parent it may write that is not sticky. Checked on a thread that has
/// become that user (so access(2) answers for it, groups included), keeping only the right to
/// list what it could not.
fn protected_safe(uid: u32, gid: u32, paths: &[PathBuf], hidden: &[PathBuf]) -> Result<(), String> {
    let (paths, hidden) = (paths.to_vec(), hidden.to_vec());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("quiesce-protect".into())
        .spawn(move || {
            let keep = [caps::Capability::CAP_DAC_READ_SEARCH, caps::Capability::CAP_DAC_OVERRIDE];
            let out = match creds::thread_become(uid, gid, &keep) {
                Ok(()) => check_paths(uid, gid, &paths, libc::W_OK)
                    .and_then(|()| check_paths(uid, gid, &hidden, libc::R_OK)),
                Err(e) => Err(format!("cannot check the protected paths as user {uid}: {e}")),
            };
            let _ = tx.send(out);
        })
        .map_err(|e| format!("cannot start the protected-path check: {e}"))?;
    match rx.recv_timeout(PROTECT_TIME) {
        Ok(r) => r,
        Err(_) => Err(format!(
            "the protected-path check did not finish within {PROTECT_TIME:?} (at most {PROTECT_ENTRIES} entries)"
        )),
    }
}

/// Walk `paths` for an inode the user may access as `access` asks (W_OK: --protect, R_OK: --hide).
fn check_paths(uid: u32, gid: u32, paths: &[PathBuf], access: i32) -> Result<(), String> {
    let mut walk = Walk {
        uid,
        gid,
        access,
        until: Instant::now() + PROTECT_TIME,
        seen: std::collections::HashSet::new(),
        todo: Vec::new(),
    };
    for root in paths {
        walk.tree(root)?;
    }
    Ok(())
}

/// The protected walk: every inode under the paths (a link's target too, with its parents), each
/// judged by its own owner, mode and ACL, so that neither a path the user cannot reach nor a
/// second name of the file hides a writable one.
struct Walk {
    uid: u32,
    gid: u32,
    /// W_OK or R_OK: what the user may not do to any inode of the tree.
    access: i32,
    until: Instant,
    /// (device, inode) already judged: a loop of links, or a second name, is walked once.
    seen: std::collections::HashSet<(u64, u64)>,
    todo: Vec<PathBuf>,
}

impl Walk {
    fn tree(&mut self, root: &Path) -> Result<(), String> {
        use std::os::unix::fs::MetadataExt;
        let abs = std::path::absolute(root).map_err(|e| format!("protected path {}: {e}", root.display()))?;
        let mut hops = 0;
        let top = self.resolve(&abs, root, &mut hops)?;
        self.todo.push(top);
        while let Some(p) = self.todo.pop() {
            if self.seen.len() + self.todo.len() > PROTECT_ENTRIES || Instant::now() >= self.until {
                return Err(format!(
                    "more under the protected paths than the check looks at ({PROTECT_ENTRIES} entries or \
                     {PROTECT_TIME:?}): protect less"
                ));
            }
            let m =
                std::fs::symlink_metadata(&p).map_err(|e| format!("protected path {}: {e}", p.display()))?;
            if m.file_type().is_symlink() {
                // What it leads to is what a reader gets: every step of the way judged, then the
                // target walked as if protected itself.
                let mut hops = 0;
                let target = self.resolve(&p, root, &mut hops)?;
                let t = std::fs::metadata(&target).map_err(|e| format!("{}: {e}", target.display()))?;
                if !self.seen.contains(&(t.dev(), t.ino())) {
                    self.todo.push(target);
                }
                continue;
            }
            if !self.seen.insert((m.dev(), m.ino())) {
                continue;
            }
            if self.owned(&m) || self.may(&p, self.access)? {
                let (verb, not, flag) = if self.access == libc::R_OK {
                    ("read", "readable", "hide")
                } else {
                    ("write", "writable", "protect")
                };
                return Err(format!(
                    "the service user {} may {verb} {} (--{flag} {}): make it not {not} by that user, or \
                     {flag} less",
                    self.uid,
                    p.display(),
                    root.display()
                ));
            }
            if m.is_dir() {
                for entry in std::fs::read_dir(&p).map_err(|e| format!("{}: {e}", p.display()))? {
                    if self.todo.len() + self.seen.len() > PROTECT_ENTRIES {
                        break;
                    }
                    self.todo.push(entry.map_err(|e| format!("{}: {e}", p.display()))?.path());
                }
            }
        }
        Ok(())
    }

    /// Where the absolute path `p` leads, following its links one step at a time, and judging
    /// each directory passed through (one the user owns, or may write without the sticky bit,
    /// lets it replace what follows) and each entry on the way (one it owns it may change). A
    /// link into a directory the user may write, anywhere on the way, is refused as surely as
    /// one in the protected tree.
    fn resolve(&mut self, p: &Path, root: &Path, hops: &mut u32) -> Result<PathBuf, String> {
        use std::path::Component;
        let mut cur = PathBuf::from("/");
        for c in p.components() {
            match c {
                Component::Normal(name) => {
                    self.passable(&cur, p, root)?;
                    let next = cur.join(name);
                    let m = std::fs::symlink_metadata(&next).map_err(|e| {
                        format!(
                            "{} (on the way to {}, protected: {}): {e}; a path to nothing could be made \
                             by the service: remove the link",
                            next.display(),
                            p.display(),
                            root.display()
                        )
                    })?;
                    if self.owned(&m) {
                        return Err(format!(
                            "the service user {} owns {} (on the way to {}, protected: {})",
                            self.uid,
                            next.display(),
                            p.display(),
                            root.display()
                        ));
                    }
                    if m.file_type().is_symlink() {
                        *hops += 1;
                        if *hops > 40 {
                            return Err(format!(
                                "{}: too many links (protected: {})",
                                p.display(),
                                root.display()
                            ));
                        }
                        let t = std::fs::read_link(&next).map_err(|e| format!("{}: {e}", next.display()))?;
                        cur = self.resolve(&cur.join(t), root, hops)?;
                    } else {
                        cur = next;
                    }
                }
                Component::ParentDir => {
                    cur.pop();
                }
                Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            }
        }
        Ok(cur)
    }

    /// A directory on the way: not the user's, and not writable by it unless sticky.
    fn passable(&self, dir: &Path, p: &Path, root: &Path) -> Result<(), String> {
        let m = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let sticky = m.permissions().mode() & 0o1000 != 0;
        if self.owned(&m) || (!sticky && self.may(dir, libc::W_OK)?) {
            return Err(format!(
                "the service user {} may write {}, on the way to {} (protected: {}): it could replace \
                 what follows; make it not writable by that user",
                self.uid,
                dir.display(),
                p.display(),
                root.display()
            ));
        }
        Ok(())
    }

    fn owned(&self, m: &std::fs::Metadata) -> bool {
        use std::os::unix::fs::MetadataExt;
        m.uid() == self.uid || (m.gid() == self.gid && m.mode() & 0o020 != 0)
    }

    /// The inode at `p` (a last link not followed) by its own permissions.
    fn may(&self, p: &Path, access: i32) -> Result<bool, String> {
        let fd = crate::kernel::dirfd::openat(None, p, libc::O_PATH | libc::O_NOFOLLOW)
            .map_err(|e| format!("{}: {e}", p.display()))?;
        creds::may_access_fd(&fd, access)
            .map_err(|e| format!("cannot judge {} as the service user: {e}", p.display()))
    }
}

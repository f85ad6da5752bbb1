//! The small subcommands that run beside the init: ps, exec, freeze, keygen.

use crate::cli::{ExecArgs, FreezeArgs, KeygenArgs, PsArgs};
use crate::files::FileError;
use crate::procs::{Detail, Reader, Snapshot};
use crate::requests;
use crate::spawn::{self, Plan};
use crate::state::{self, StateDir};
use crate::sys::{self, Pid};
use crate::taint::{Policy, Tainted};
use crate::users;
use serde::Serialize;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

pub const SANDBOX_FILE: &str = "sandbox.json";

/// What the running init tells the subcommands beside it about its sandbox.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Published {
    pub uids: Vec<u32>,
    /// Whether a loginuid marks a sandbox launch in this container (see taint::Policy).
    pub lineage: bool,
    /// The init's pid and start time in this PID namespace: where `freeze` sends its signal when
    /// the init is not PID 1, checked against the start time so a reused pid is never signalled.
    #[serde(default)]
    pub pid: i32,
    #[serde(default)]
    pub start_time: u64,
}

/// What the init using `dir` published. None: nothing (no init with a sandbox here, or one still
/// starting). An error: a sandbox.json is there but cannot be trusted (not root's, writable by
/// others, a link, not what an init writes), which is never the same as none.
pub fn published_in(dir: &StateDir) -> Result<Option<Published>, String> {
    match dir.read(SANDBOX_FILE) {
        Ok(b) => serde_json::from_slice::<Published>(&b).map(Some).map_err(|e| {
            format!(
                "{}: not what a quiesce init publishes ({e}): remove it",
                dir.file(SANDBOX_FILE).display()
            )
        }),
        Err(FileError::Missing(_)) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// The sandbox the running init published, for advice only (which UIDs `ps` marks, whether a
/// loginuid counts): None when there is no init here or what is there cannot be trusted.
pub fn published(state_dir: &Path) -> Option<Published> {
    StateDir::open(state_dir).ok().and_then(|d| published_in(&d).ok().flatten())
}

pub fn resolve_uids(specs: &[String]) -> Result<Vec<u32>, String> {
    if specs.is_empty() {
        return Ok(Vec::new());
    }
    let pw = users::read_passwd();
    let mut out = Vec::new();
    for s in specs {
        let u = users::resolve_sandbox(s, &pw)?.uid;
        if !out.contains(&u) {
            out.push(u);
        }
    }
    Ok(out)
}

#[derive(Serialize)]
struct PsRow<'a> {
    pid: Pid,
    ppid: Pid,
    user: String,
    uids: Vec<u32>,
    state: char,
    /// A zombie leader with a live thread is alive; so is one read mid-exec (see procs).
    alive: bool,
    comm: &'a str,
    cmdline: &'a [String],
    depth: usize,
    sandbox: bool,
    reasons: Vec<&'static str>,
}

fn tree_order(snap: &Snapshot) -> Vec<(Pid, usize)> {
    let mut kids: BTreeMap<Pid, Vec<Pid>> = BTreeMap::new();
    let mut roots = Vec::new();
    for p in snap.procs.values() {
        if snap.procs.contains_key(&p.ppid) && p.ppid != p.pid {
            kids.entry(p.ppid).or_default().push(p.pid);
        } else {
            roots.push(p.pid);
        }
    }
    let mut out = Vec::new();
    let mut stack: Vec<(Pid, usize)> = roots.into_iter().rev().map(|p| (p, 0)).collect();
    while let Some((pid, d)) = stack.pop() {
        if out.len() > snap.procs.len() {
            break;
        }
        out.push((pid, d));
        if let Some(k) = kids.get(&pid) {
            stack.extend(k.iter().rev().map(|&c| (c, d + 1)));
        }
    }
    out
}

pub fn ps(args: PsArgs) -> i32 {
    let published = published(&args.state.state_dir);
    // Without word from an init, a loginuid counts: better a process shown as sandbox too many.
    let lineage = published.as_ref().is_none_or(|p| p.lineage);
    let uids = match resolve_uids(&args.sandbox.users) {
        Ok(u) if u.is_empty() => published.map(|p| p.uids).unwrap_or_default(),
        Ok(u) => u,
        Err(e) => {
            eprintln!("quiesce ps: {e}");
            return 2;
        }
    };
    let snap = match Reader::default().snapshot(Detail::Full) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("quiesce ps: {e}");
            return 1;
        }
    };
    let tainted: Tainted = Policy::new(uids.clone(), lineage).classify(&snap);
    let pw = users::read_passwd();
    let rows: Vec<PsRow> = tree_order(&snap)
        .into_iter()
        .filter_map(|(pid, depth)| snap.procs.get(&pid).map(|p| (p, depth)))
        .map(|(p, depth)| {
            let mut all: Vec<u32> = p.all_uids().collect();
            all.sort();
            all.dedup();
            let reasons: Vec<&'static str> =
                tainted.get(&p.pid).map(|r| r.iter().map(|x| x.as_str()).collect()).unwrap_or_default();
            PsRow {
                pid: p.pid,
                ppid: p.ppid,
                user: users::resolve(&p.uid().to_string(), &pw)
                    .map(|u| u.name)
                    .unwrap_or_else(|_| p.uid().to_string()),
                uids: all,
                state: p.state,
                alive: p.alive(),
                comm: &p.comm,
                cmdline: &p.cmdline,
                depth,
                sandbox: !reasons.is_empty(),
                reasons,
            }
        })
        .collect();
    if args.json {
        let doc = serde_json::json!({ "sandbox_uids": uids, "processes": rows });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
        return 0;
    }
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let header = ("PID", "PPID", "USER", "S", "SANDBOX");
    // A closed pipe (ps | head) ends the listing quietly.
    if writeln!(
        out,
        "{:>7} {:>7} {:<10} {:<2} {:<24} COMMAND",
        header.0, header.1, header.2, header.3, header.4
    )
    .is_err()
    {
        return 0;
    }
    for r in &rows {
        let cmd = if r.cmdline.is_empty() { format!("[{}]", r.comm) } else { r.cmdline.join(" ") };
        let cmd: String = cmd.chars().map(|c| if c.is_control() { '?' } else { c }).collect();
        let reasons = if r.reasons.is_empty() { "-".to_string() } else { r.reasons.join(",") };
        let line = writeln!(
            out,
            "{:>7} {:>7} {:<10} {:<2} {:<24} {}{}",
            r.pid,
            r.ppid,
            r.user,
            r.state,
            reasons,
            "  ".repeat(r.depth.min(20)),
            cmd
        );
        if line.is_err() {
            return 0;
        }
    }
    0
}

pub fn exec(args: ExecArgs) -> i32 {
    let pw = users::read_passwd();
    let user = match users::resolve(&args.user, &pw) {
        Ok(u) => u,
        Err(e) => {
            eprintln!("quiesce exec: {e}");
            return 2;
        }
    };
    let groups = users::groups_of(&user, &users::read_group());
    if !args.no_lineage && !spawn::tag_lineage(user.uid) {
        log::info!("audit lineage unavailable here; the init tracks this launch by history instead");
    }
    let drop = spawn::Drop { user, groups, allow_setuid: args.allow_setuid, tag: false };
    match Plan::new(&args.command, Some(drop)) {
        Ok(plan) => plan.exec_in_place(),
        Err(e) => {
            eprintln!("quiesce exec: {e}");
            2
        }
    }
}

/// Signal the init wherever it runs: PID 1, or the pid it published in sandbox.json when it is
/// not PID 1 (a pod's pause process or a wrapper shell is PID 1 there). sandbox.json is read
/// through the state dir the client opened once, never its path again: in a parent others may
/// write in, the path may lead to the sandbox user's directory by now. The published start time
/// must match, so a pid reused since is never signalled; a pidfd closes the gap between the check
/// and the signal. PID 1 is signalled only when nothing is published: a sandbox.json that cannot
/// be trusted is refused, not read as "the init is PID 1".
fn signal_init(dir: &StateDir, sig: i32) -> Result<(), String> {
    let published = published_in(dir).map_err(|e| format!("{e} (no signal sent)"))?;
    let Some(p) = published.filter(|p| p.pid > 1) else {
        return sys::kill(1, sig)
            .map_err(|e| format!("cannot signal PID 1: {e} (run this as root inside the container)"));
    };
    let gone = || {
        format!(
            "the init that published {} (pid {}) is gone: is quiesce running with this --state-dir?",
            SANDBOX_FILE, p.pid
        )
    };
    let fd = sys::pidfd_open(p.pid).map_err(|_| gone())?;
    match Reader::default().start_time(p.pid) {
        Ok(Some(t)) if t == p.start_time => {}
        _ => return Err(gone()),
    }
    sys::pidfd_send_signal(&fd, sig).map_err(|e| {
        format!("cannot signal the init (pid {}): {e} (run this as root inside the container)", p.pid)
    })
}

pub fn freeze(args: FreezeArgs) -> i32 {
    // The client is root and alive for exactly the length of every freeze: a root escapee must
    // not be able to ptrace it into forking a process the freeze cannot tell from the client's.
    if let Err(e) = sys::set_not_dumpable() {
        eprintln!("quiesce freeze: cannot mark this process non-dumpable: {e}");
        return 2;
    }
    let sig = match crate::cli::freeze_signal(&args.freeze_signal) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("quiesce freeze: {e}");
            return 2;
        }
    };
    let dir = match StateDir::open(&args.state.state_dir) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("quiesce freeze: {e}");
            return 2;
        }
    };
    let limit = match crate::cli::seconds("--timeout", args.timeout) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("quiesce freeze: {e}");
            return 2;
        }
    };
    let results = match dir.sub(requests::RESULTS) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("quiesce freeze: {e}");
            return 2;
        }
    };
    let request_id = match requests::submit(&dir, args.nonce.clone()) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("quiesce freeze: {e}");
            return 2;
        }
    };
    if let Err(e) = signal_init(&dir, sig) {
        // Withdrawn, so that no later freeze answers a client that gave up.
        if let Err(w) = requests::withdraw(&dir, &request_id) {
            eprintln!("quiesce freeze: {w}");
        }
        eprintln!("quiesce freeze: {e}");
        return 2;
    }
    if !args.wait {
        if !args.json {
            eprintln!("quiesce freeze: requested ({request_id})");
        }
        return 0;
    }
    let until = Instant::now() + limit;
    while Instant::now() < until {
        match requests::read_result(&results, &request_id) {
            Ok(Some(st)) => {
                if args.json {
                    println!("{}", serde_json::to_string_pretty(&st).unwrap_or_default());
                } else {
                    println!(
                        "{} {} (freeze {}, {} killed, {} ms){}",
                        st.state,
                        st.nonce.as_deref().unwrap_or("-"),
                        st.id,
                        st.killed,
                        st.phases_ms.total,
                        st.reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default()
                    );
                }
                return if st.state == "quiescent" { 0 } else { 1 };
            }
            Ok(None) => {}
            Err(e) => {
                eprintln!("quiesce freeze: {e}");
                return 2;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!(
        "quiesce freeze: no final status within {:?}: is quiesce running here with a --sandbox-user?",
        limit
    );
    2
}

pub fn keygen(args: KeygenArgs) -> i32 {
    let run = || -> Result<(), String> {
        if !args.out.exists() {
            std::fs::create_dir_all(&args.out)
                .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
            std::fs::set_permissions(&args.out, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| format!("cannot chmod {}: {e}", args.out.display()))?;
        }
        let key = crate::marker::generate().map_err(|e| e.to_string())?;
        let priv_pem = crate::marker::private_pem(&key);
        let pub_pem = crate::marker::public_pem(&key.verifying_key());
        state::write_atomic(&args.out, "signing.key", priv_pem.as_bytes(), 0o600)
            .map_err(|e| format!("signing.key: {e}"))?;
        state::write_atomic(&args.out, "signing.pub", pub_pem.as_bytes(), 0o644)
            .map_err(|e| format!("signing.pub: {e}"))?;
        Ok(())
    };
    match run() {
        Ok(()) => {
            eprintln!("quiesce keygen: wrote {0}/signing.key and {0}/signing.pub", args.out.display());
            0
        }
        Err(e) => {
            eprintln!("quiesce keygen: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn only_a_missing_sandbox_file_means_nothing_was_published() {
        let d = std::env::temp_dir().join(format!("quiesce-published-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        let sd = StateDir::create(&d).unwrap();
        assert_eq!(published_in(&sd).map(|p| p.is_none()), Ok(true));
        let file = d.join(SANDBOX_FILE);
        fs::write(&file, r#"{"uids":[4242],"lineage":true,"pid":7,"start_time":9}"#).unwrap();
        fs::set_permissions(&file, fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(published_in(&sd).unwrap().map(|p| (p.pid, p.start_time)), Some((7, 9)));
        fs::set_permissions(&file, fs::Permissions::from_mode(0o666)).unwrap();
        let e = published_in(&sd).unwrap_err();
        assert!(e.contains(SANDBOX_FILE) && e.contains("writable by group or others"), "{e}");
        fs::write(&file, "{not json").unwrap();
        fs::set_permissions(&file, fs::Permissions::from_mode(0o644)).unwrap();
        let e = published_in(&sd).unwrap_err();
        assert!(e.contains(SANDBOX_FILE) && e.contains("remove it"), "{e}");
        fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", &file).unwrap();
        assert!(published_in(&sd).unwrap_err().contains("symlink"));
        fs::remove_dir_all(d).unwrap();
    }
}

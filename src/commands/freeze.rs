//! `quiesce freeze`: the client that asks the init for a freeze and waits for its result.

use crate::cli::args::FreezeArgs;
use crate::kernel::{pidfd, process, signal};
use crate::marker;
use crate::observe::procs::reader::Reader;
use crate::state::dir::{AttestationState, FreezeState, StateDir, Status};
use crate::state::requests;
use crate::state::{self, published::published_in, published::SANDBOX_FILE};
use std::time::{Duration, Instant};

/// Signal the init wherever it runs: PID 1, or the pid it published in sandbox.json when it is
/// not PID 1 (a pod's pause process or a wrapper shell is PID 1 there). sandbox.json is read
/// through the state dir the client opened once, never its path again: in a parent others may
/// write in, the path may lead to the sandbox user's directory by now. The published start time
/// must match, so a pid reused since is never signalled; a pidfd closes the gap between the check
/// and the signal. PID 1 is signalled only when nothing is published: a sandbox.json that cannot
/// be trusted is refused, not read as "the init is PID 1".
pub(super) fn signal_init(dir: &StateDir, sig: i32) -> Result<(), String> {
    let published = published_in(dir).map_err(|e| format!("{e} (no signal sent)"))?;
    let Some(p) = published.filter(|p| p.pid > 1) else {
        return signal::kill(1, sig)
            .map_err(|e| format!("cannot signal PID 1: {e} (run this as root inside the container)"));
    };
    let gone = || {
        format!(
            "the init that published {} (pid {}) is gone: is quiesce running with this --state-dir?",
            SANDBOX_FILE, p.pid
        )
    };
    let fd = pidfd::pidfd_open(p.pid).map_err(|_| gone())?;
    // An init's zombie (beside a PID 1 that never reaps) would never answer.
    match Reader::default().live_start_time(p.pid) {
        Ok(Some(t)) if t == p.start_time => {}
        _ => return Err(gone()),
    }
    // Every process of a root agent carries the lineage tag, and no init can: a sandbox.json
    // naming such a process was written by one. (Any other loginuid is no sign: an init started
    // from a login session carries that session's, and a kernel without audit shows none.)
    if carries_tag(p.pid) {
        return Err(format!(
            "the process {} names (pid {}) carries loginuid {}, the lineage tag, which no quiesce init does: \
             a root process of the container rewrote it; no signal sent: freeze with a bare signal from \
             outside (docker kill -s USR1)",
            SANDBOX_FILE,
            p.pid,
            crate::decide::taint::LINEAGE_TAG
        ));
    }
    pidfd::pidfd_send_signal(&fd, sig).map_err(|e| {
        format!("cannot signal the init (pid {}): {e} (run this as root inside the container)", p.pid)
    })
}

/// Does process `pid` carry the lineage tag (`--sandbox-lineage`'s loginuid)?
pub(super) fn carries_tag(pid: crate::kernel::process::Pid) -> bool {
    crate::observe::procs::reader::loginuid_of(pid).ok().flatten() == Some(crate::decide::taint::LINEAGE_TAG)
}

/// Signal the init until it has taken request `id`: the init takes a request only on its own
/// client's signal, and a standard signal sent while another of its kind is pending is lost.
/// Bounded by `within`; a request still there then is withdrawn.
pub(super) fn signal_until_taken(dir: &StateDir, id: &str, sig: i32, within: Duration) -> Result<(), String> {
    let until = Instant::now() + within;
    let mut pause = Duration::from_millis(1);
    let mut next_signal = Instant::now();
    loop {
        let now = Instant::now();
        if now >= next_signal {
            if let Err(e) = signal_init(dir, sig) {
                // Withdrawn, so that no later freeze answers a client that gave up.
                let withdrawn =
                    requests::withdraw(dir, id).err().map(|w| format!("; {w}")).unwrap_or_default();
                return Err(format!("{e}{withdrawn}"));
            }
            next_signal = now + Duration::from_millis(200);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
        if requests::taken(dir, id)? {
            return Ok(());
        }
        if Instant::now() >= until {
            let withdrawn = requests::withdraw(dir, id).err().map(|w| format!("; {w}")).unwrap_or_default();
            return Err(format!(
                "the init did not take request {id} within {within:?} (is quiesce running here with this \
                 --state-dir and a --sandbox-user?){withdrawn}"
            ));
        }
    }
}

/// The marker this freeze signed, read as verify reads it: from the state dir opened once (root
/// owned, no link), its signature checked with the state dir's `signing.pub`, and its `jti` this
/// freeze's id: a later freeze may have replaced the file since the answer was written.
fn own_marker(dir: &StateDir, st: &Status) -> Result<String, String> {
    let where_ = dir.file(state::dir::MARKER);
    let token = dir.read(state::dir::MARKER).map_err(|e| e.to_string())?;
    let token = String::from_utf8(token).map_err(|_| format!("{} is not text", where_.display()))?;
    let token = token.trim().to_string();
    let key = dir.read(state::dir::PUBKEY).map_err(|e| e.to_string())?;
    let key = marker::jws::parse_public(&key)
        .map_err(|e| format!("{}: {e}", dir.file(state::dir::PUBKEY).display()))?;
    let claims = marker::jws::verify(&token, &key)
        .map_err(|_| format!("{} does not verify with signing.pub", where_.display()))?;
    if claims.jti != st.id || claims.result != "quiescent" {
        return Err(format!(
            "{} is freeze {}'s, not {}'s (a later freeze replaced it)",
            where_.display(),
            claims.jti,
            st.id
        ));
    }
    Ok(token)
}

/// `--json`'s object: the status, and `marker` (the JWS text, or null when the freeze was not
/// quiescent or its marker could not be read as verify would read it).
fn json_with_marker(dir: &StateDir, st: &Status) -> String {
    let marker = if st.state == FreezeState::Quiescent {
        match own_marker(dir, st) {
            Ok(m) => Some(m),
            Err(e) => {
                eprintln!("quiesce freeze: marker not included: {e}");
                None
            }
        }
    } else {
        None
    };
    let mut v = serde_json::to_value(st).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("marker".into(), marker.map(serde_json::Value::String).unwrap_or_default());
    }
    serde_json::to_string_pretty(&v).unwrap_or_default()
}

pub fn freeze(args: FreezeArgs) -> i32 {
    let asked = match ask(&args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("quiesce freeze: {e}");
            return 2;
        }
    };
    if !args.wait {
        if !args.json {
            eprintln!("quiesce freeze: requested ({})", asked.request_id);
        }
        return 0;
    }
    match wait_for_result(&asked) {
        Ok(Some(st)) => {
            if args.json {
                println!("{}", json_with_marker(&asked.dir, &st));
            } else {
                println!("{}", status_line(&st));
            }
            if st.state == FreezeState::Quiescent {
                0
            } else {
                1
            }
        }
        Ok(None) => {
            eprintln!(
                "quiesce freeze: no final status within {:?}: is quiesce running here with a --sandbox-user?",
                asked.limit
            );
            2
        }
        Err(e) => {
            eprintln!("quiesce freeze: {e}");
            2
        }
    }
}

/// A freeze request the init has taken.
struct Asked {
    dir: StateDir,
    results: StateDir,
    request_id: String,
    limit: Duration,
}

/// Submit the request and signal the init until it takes it.
fn ask(args: &FreezeArgs) -> Result<Asked, String> {
    // The client is root and alive for exactly the length of every freeze: a root escapee must
    // not be able to ptrace it into forking a process the freeze cannot tell from the client's.
    process::set_not_dumpable().map_err(|e| format!("cannot mark this process non-dumpable: {e}"))?;
    let sig = crate::cli::args::freeze_signal(&args.freeze_signal)?;
    let dir = StateDir::open(&args.state.state_dir)?;
    let limit = crate::cli::args::seconds("--timeout", args.timeout)?;
    let results = dir.sub(requests::RESULTS)?;
    // Without its start time the client is not the init's own during the freeze: a freeze with
    // lineage off may then fail naming it, never pass another process for it.
    let me = Reader::default().start_time(process::getpid()).ok().flatten();
    let request_id = requests::submit(&dir, args.nonce.clone(), me, args.attest.clone())?;
    signal_until_taken(&dir, &request_id, sig, limit)?;
    Ok(Asked { dir, results, request_id, limit })
}

/// The request's final status, within its --timeout; None when none came.
fn wait_for_result(asked: &Asked) -> Result<Option<Status>, String> {
    let until = Instant::now() + asked.limit;
    while Instant::now() < until {
        match requests::read_result(&asked.results, &asked.request_id)? {
            // The init answers again when the attestation ends; its result is waited for within
            // the same bound, and never changes this command's exit status.
            Some(st)
                if st.attestation.as_ref().is_some_and(|a| a.state == AttestationState::Running)
                    && Instant::now() + Duration::from_millis(10) < until => {}
            Some(st) => return Ok(Some(st)),
            None => {}
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(None)
}

/// The line a request's result is shown as.
pub fn status_line(st: &Status) -> String {
    format!(
        "{} {} (freeze {}, {} killed, {} ms){}{}",
        st.state,
        st.nonce.as_deref().unwrap_or("-"),
        st.id,
        st.killed,
        st.phases_ms.total,
        st.reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default(),
        st.attestation
            .as_ref()
            .map(|a| format!(
                "; attestation {}{}",
                a.state,
                a.reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default()
            ))
            .unwrap_or_default()
    )
}

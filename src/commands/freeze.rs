//! `quiesce freeze`: the client that asks the init for a freeze and waits for its result.

use crate::cli::FreezeArgs;
use crate::procs::Reader;
use crate::requests;
use crate::state::{published_in, StateDir, SANDBOX_FILE};
use crate::sys;
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
    let request_id = match requests::submit(&dir, args.nonce.clone(), args.attest.clone()) {
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
            // The init answers again when the attestation ends; its result is waited for within
            // the same bound, and never changes this command's exit status.
            Ok(Some(st))
                if st.attestation.as_ref().is_some_and(|a| a.state == "running")
                    && Instant::now() + Duration::from_millis(10) < until => {}
            Ok(Some(st)) => {
                if args.json {
                    println!("{}", serde_json::to_string_pretty(&st).unwrap_or_default());
                } else {
                    println!(
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

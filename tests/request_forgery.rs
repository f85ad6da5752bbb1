//! The freeze client's identity against a root escapee (`--no-lineage`, a setuid launch), which
//! owns `requests/` as much as the client does: it rewrites the real client's request in place
//! to name a child of its own (y01, y02), or kills the client and puts a child on its pid within
//! the client's start tick (y03; the state dir on tmpfs, `TMPDIR=/dev/shm`, makes that likelier).
//! A request believed on its word, or a client known by pid and start time alone, would sign a
//! marker beside that child. The client is the init's own only as the kernel shows it now
//! (`src/freeze/client.rs`): entered from outside, this binary, untraced, its pidfd held.
mod common;
use common::adversary::{knob, report_forged, unfollowed_exec};
use common::*;
use std::time::{Duration, Instant};

/// The sandbox launched through a shell the orchestrator entered (`docker exec ctr sh -c
/// 'quiesce exec ...; ...'`): the real client, entered from outside, is not refused by itself,
/// so it stays alive and gets "quiescent" with its nonce.
#[test]
fn y01_escapee_rewrites_the_clients_request() {
    // ATK_CONTROL=1: the same run, the request left untouched (S must then be refused).
    let control = knob("ATK_CONTROL", 0) == 1;
    forge(4395, true, if control { "control" } else { "-" });
}

/// Launched straight from outside (as x01): the real client would be refused, so the escapee
/// kills it once the init took the forged request (x01's threat).
#[test]
fn y02_escapee_rewrites_the_request_and_kills_the_client() {
    forge(4396, false, "kill");
}

fn forge(uid: u32, via_shell: bool, mode: &str) {
    let rounds: usize = knob("ATK_ROUNDS", 3);
    let mut forged = 0;
    for round in 0..rounds {
        let c = sandbox_setuid(uid, &["--no-lineage"]);
        let suid = setuid_copy(&c);
        let file = c.path("forge");
        let st_dir = c.state.to_str().unwrap().to_string();
        let launch = unfollowed_exec(uid, &suid, &["forge-request", &st_dir, file.to_str().unwrap(), mode]);
        let shell: &[&str] = if via_shell { &["sh", "-c", "\"$@\"; echo launcher done", "sh"] } else { &[] };
        let args = [shell.iter().map(|a| a.to_string()).collect(), launch].concat();
        let _w = c.start_ready(c.exec_cmd(&args), "forge-request");
        std::thread::sleep(Duration::from_millis(300));
        let started = Instant::now();
        let out = c.freeze_cmd("n-y01", None).output().expect("run the client");
        let took = started.elapsed();
        // A request whose body names another pid than its name is refused before any freeze.
        // The client may be dead by then (y02): its answer is in results/ all the same.
        let refusal = || {
            std::fs::read_dir(c.state.join("results"))
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
                .find(|t| t.contains("request refused"))
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        };
        let mut st = serde_json::Value::Null;
        wait_for("the freeze to end, or the request's refusal", Duration::from_secs(60), || {
            st = refusal().unwrap_or_else(|| c.status_file());
            matches!(st["state"].as_str(), Some("quiescent" | "failed"))
        });
        let info = read(&file);
        let x: i32 = info.split_whitespace().next().and_then(|s| s.parse().ok()).unwrap_or(0);
        let alive = x > 0 && c.stat(x).is_some_and(|s| s.live());
        eprintln!(
            "round {round}: client exit {:?} in {took:?}; state {} reason {}; adversary '{}'; S alive {alive} uid {:?} ppid {:?}; marker {}",
            out.status.code(),
            st["state"],
            st["reason"],
            info.trim(),
            c.status_line(x, "Uid"),
            c.stat(x).map(|s| s.ppid),
            c.marker_exists()
        );
        eprintln!("round {round}: client stdout {}", String::from_utf8_lossy(&out.stdout).trim());
        if alive && st["state"] == "quiescent" {
            forged += 1;
            report_forged(&c, round, x);
        }
    }
    assert_eq!(forged, 0, "{forged} of {rounds} freezes signed a marker while the escapee's child lived");
}

/// Same-tick squat (no request tampering: an attack on knowing the client by pid and start time):
/// the escapee shrinks the namespace's pid_max (root's sysctl file; writable here), kills the
/// client the moment its request is in place and takes its pid within the client's start tick.
#[test]
fn y03_escapee_squats_the_client_within_its_start_tick() {
    let rounds: usize = knob("ATK_ROUNDS", 3);
    let uid = 4397;
    let pid_max: String = knob("ATK_PID_MAX", "310".into());
    let (mut forged, mut same_tick) = (0, 0);
    for round in 0..rounds {
        let c = sandbox_setuid(uid, &["--no-lineage"]);
        let suid = setuid_copy(&c);
        let file = c.path("tick");
        let st_dir = c.state.to_str().unwrap().to_string();
        let _w = c.launch_unfollowed(uid, &suid, &["tick-squat", &st_dir, file.to_str().unwrap(), &pid_max]);
        std::thread::sleep(Duration::from_millis(300));
        let _client = guard(c.freeze_cmd("n-y03", None));
        let mut st = serde_json::Value::Null;
        wait_for("the freeze to end", Duration::from_secs(60), || {
            st = c.status_file();
            matches!(st["state"].as_str(), Some("quiescent" | "failed"))
        });
        // A bare signal's second freeze may follow: let it end too.
        std::thread::sleep(Duration::from_millis(1500));
        let st = c.status_file();
        let info = read(&file);
        let f: Vec<&str> = info.split_whitespace().collect();
        let x: i32 = f.first().and_then(|s| s.parse().ok()).unwrap_or(0);
        let tick = f.len() > 2 && f[1] == f[2] && x > 0;
        same_tick += tick as usize;
        let alive = x > 0
            && c.stat(x).is_some_and(|s| s.live())
            && c.status_line(x, "Uid").is_some_and(|u| u[0] == "0");
        eprintln!(
            "round {round}: state {} reason {}; squat '{}' same tick {tick}; alive {alive}; marker {}",
            st["state"],
            st["reason"],
            info.trim(),
            c.marker_exists()
        );
        if alive && st["state"] == "quiescent" && c.marker_exists() {
            forged += 1;
            report_forged(&c, round, x);
        }
    }
    eprintln!("same tick {same_tick} of {rounds}");
    assert_eq!(forged, 0, "{forged} of {rounds} freezes signed a marker while the squatter lived");
}

/// The same configuration with nothing forged: a client entered from outside after an unfollowed
/// launch is not the init's own, with or without CAP_SYS_PTRACE. With it, a root escapee can
/// write the client's memory through /proc/PID/mem without tracing it, and so run code of its own
/// in a real `quiesce freeze --wait` that asks for a marker beside a root writer; without it,
/// the init may not read the undumpable client's executable, and nothing tells it from an
/// undumpable root process that runs anything. The freeze fails, naming the client and the way
/// round (a bare signal), which then signs.
#[test]
fn y04_a_client_after_an_unfollowed_launch_is_not_the_inits_own() {
    let uid = 4397;
    let u = uid.to_string();
    let no_ptrace = ["setpriv", "--bounding-set=-sys_ptrace", "--inh-caps=-sys_ptrace"];
    for prefix in [vec![], no_ptrace.to_vec()] {
        let mut c = Container::start_with(
            Opts {
                init_args: vec!["--sandbox-user", &u, "--no-lineage"],
                prefix: prefix.clone(),
                setuid: true,
                ..Default::default()
            },
            &["sleep", "1000000"],
        );
        c.wait_published();
        let _w = c.launch_unfollowed(uid, &adv(), &["sleepers", "2"]);
        let q = quiesce();
        let st = c.state.to_str().unwrap().to_string();
        let client =
            [&prefix[..], &[q.to_str().unwrap(), "freeze", "--state-dir", &st, "--wait", "--json"]].concat();
        let out = c.exec(&client);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        assert_eq!(v["state"], "failed", "{prefix:?}: {v}");
        let reason = v["reason"].as_str().unwrap_or_default();
        assert!(
            reason.contains("asked for this freeze and is not taken for the init's own")
                && reason.contains("/proc/PID/mem")
                && reason.contains("docker kill -s USR1"),
            "{v}"
        );
        assert!(!c.marker_exists());
        let (st, _) = c.freeze_by_signal(Duration::from_secs(30));
        assert_eq!(st["state"], "quiescent", "the bare signal's freeze: {st}");
        assert!(c.live_of_uid(uid).is_empty());
    }
}

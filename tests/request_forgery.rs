//! The freeze client's identity against a root escapee (`--no-lineage`, a setuid launch), which
//! owns `requests/` as much as the client does: it rewrites the real client's request in place
//! to name a child of its own (y01, y02), or kills the client and puts a child on its pid within
//! the client's start tick (y03; the state dir on tmpfs, `TMPDIR=/dev/shm`, makes that likelier).
//! A request believed on its word, or a client known by pid and start time alone, would sign a
//! marker beside that child. The client is the init's own only as the kernel shows it now
//! (`src/freeze/client.rs`): entered from outside, this binary, untraced, its pidfd held.
//! y05 and y06 meet the two checks that only such a request, or a client run from inside,
//! reaches: this binary run as another subcommand, and a client with a parent inside.
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

/// A container whose init logs at info level to `$D/init.log`, where the client it refuses is named.
fn logged(uid: u32) -> Container {
    let u = uid.to_string();
    let mut c = Container::start_with(
        Opts {
            init_args: vec!["-v", "--sandbox-user", &u],
            prefix: vec!["sh", "-c", "exec \"$@\" 2>>\"$D/init.log\"", "sh"],
            ..Default::default()
        },
        &["sleep", "1000000"],
    );
    c.wait_published();
    c
}

/// The init's refusals of the client process `pid`, as its log words them.
fn refusals_of(c: &Container, pid: i32) -> Vec<String> {
    let log = std::fs::read_to_string(c.path("init.log")).unwrap_or_default();
    let head = format!("freeze client {pid} is not taken for the init's own: ");
    log.lines().filter_map(|l| l.split_once(&head).map(|(_, why)| why.to_string())).collect()
}

/// A request a root process wrote, naming a process of this binary that is no client: a
/// `quiesce exec` entered from outside, which signals the init with the freeze signal to have
/// its launch recorded, and so claims the request. It runs this binary, from outside,
/// untraced, with the start time the request says: only the subcommand it runs as tells it from
/// a client, and the init must not take it for its own (where a client's identity decides, in
/// its freeze's starting tick, t27, it would be exempt from the newcomer rule). The launch is
/// answered before the freeze runs, and the exec may run its command before the client is
/// checked: that round's refusal says "does not run this binary"; a round may show either, and
/// one at least must show the subcommand.
#[test]
fn y05_a_forged_request_naming_this_binary_run_as_exec_gets_no_client() {
    let uid = 4398;
    let rounds: usize = knob("ATK_ROUNDS", 3);
    let mut by_subcommand = 0;
    for round in 0..rounds {
        let c = logged(uid);
        let launch = format!("kill -STOP $$; exec \"$Q\" exec --user {uid} -- sleep 1000000");
        let _w = guard(c.exec_cmd(&["sh", "-c", &launch, "forged-client"]));
        let mut x = 0;
        wait_for("the launcher to stop itself", Duration::from_secs(10), || {
            x = c
                .pids()
                .into_iter()
                .find(|&p| {
                    c.stat(p).is_some_and(|s| s.state == 'T' && s.ppid == 0)
                        && c.proc_read(p, "cmdline").is_some_and(|a| a.contains("forged-client"))
                })
                .unwrap_or(0);
            x > 0
        });
        let start = c.stat(x).expect("the launcher's stat").start_time;
        // Named a second earlier than now, so that it sorts before the launch record it rides on.
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
        let id = format!("{:016x}{:08x}0000f00d", nanos - 1_000_000_000, x as u32);
        let body = serde_json::json!({ "nonce": "forged", "request_id": id, "pid": x, "start_time": start });
        let requests = c.state.join("requests");
        std::fs::write(requests.join(".forging"), body.to_string()).expect("write the forged request");
        std::fs::rename(requests.join(".forging"), requests.join(&id)).expect("place it");
        let (host, _) = c.host_pid(x).expect("the launcher's host pid");
        assert_eq!(unsafe { libc::kill(host, libc::SIGCONT) }, 0, "cannot continue the launcher");
        let answer = c.state.join("results").join(format!("{id}.json"));
        let until = Instant::now() + Duration::from_secs(60);
        while !std::fs::read_to_string(&answer).is_ok_and(|t| t.contains("quiescent") || t.contains("failed"))
        {
            if Instant::now() > until {
                let log = std::fs::read_to_string(c.path("init.log")).unwrap_or_default();
                panic!("round {round}: the forged request's freeze did not end within 60 s; the init's log:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let why = refusals_of(&c, x);
        eprintln!("round {round}: process {x}: refused {why:?}; answer {}", read(&answer).trim());
        assert_eq!(
            why.len(),
            1,
            "round {round}: process {x}, this binary run as `exec`, taken for the init's own"
        );
        by_subcommand += why[0].contains("runs this binary as 'exec', not as 'freeze'") as usize;
        assert!(
            why[0].contains("runs this binary as 'exec'") || why[0].contains("does not run this binary"),
            "round {round}: {why:?}"
        );
    }
    assert!(by_subcommand > 0, "no round checked the launcher while it still ran this binary as `exec`");
}

/// A real client started by a shell inside the container (`docker exec ctr sh -c 'quiesce freeze
/// ...'`): it runs this binary as `freeze`, untraced, but has a parent in this namespace, which
/// may be anyone's (a sandbox process could have started it to vouch for what it starts next).
/// It is not the init's own; its freeze signs all the same (nothing was born during it).
#[test]
fn y06_a_client_with_a_parent_inside_is_not_the_inits_own() {
    let uid = 4399;
    let c = logged(uid);
    let st = c.state.to_str().unwrap().to_string();
    let q = quiesce();
    let script = "\"$@\"; echo shell done";
    let out = c.exec(&[
        "sh",
        "-c",
        script,
        "sh",
        q.to_str().unwrap(),
        "freeze",
        "--state-dir",
        &st,
        "--wait",
        "--json",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    // The shell's own line after the client's JSON shows the client ran under it.
    let json = text
        .strip_suffix("shell done\n")
        .unwrap_or_else(|| panic!("the shell did not outlive its client: {text}"));
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    assert_eq!(v["state"], "quiescent", "{json} {}", String::from_utf8_lossy(&out.stderr));
    let log = std::fs::read_to_string(c.path("init.log")).unwrap_or_default();
    let refused: Vec<&str> = log
        .lines()
        .filter(|l| {
            l.contains("is not taken for the init's own: ") && l.contains("has a parent in this namespace")
        })
        .collect();
    assert_eq!(refused.len(), 1, "the client with a parent inside was taken for the init's own:\n{log}");
}

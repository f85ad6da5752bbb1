//! Pids the init frees during a freeze, taken by the sandbox: a root escapee that kills one of
//! the init's own processes (the freeze client, the command) and puts a child of its own on the
//! freed pid (x01, x04: the init's own are known by pid and start time, so the squatter is not
//! taken for one of them), and the proof's reaping at a pids limit (x02: a root hopper whose hops
//! are the init's zombies; x03: zombies handed to the init as fast as the limit allows). Each
//! round asserts no marker while a sandbox-made process lives, and an end within the freeze's
//! budget.
mod common;
use common::adversary::{knob, knob_set, report_forged, unfollowed_exec};
use common::*;
use std::time::{Duration, Instant};

/// An unfollowed launch (`--no-lineage`, `--allow-setuid`) escapes to root under the init before
/// the freeze. When the orchestrator's `quiesce freeze` client appears, the escapee kills it
/// (root may: the client is a root process of the namespace), cycles the pid counter until a
/// child of its own gets the client's pid, and exits. Were the requesting client's pid counted as
/// the init's own by number only, that child would be neither a newcomer nor an unfollowed child,
/// and the marker would be signed while it lives: no freeze may sign one.
#[test]
fn x01_escapee_squats_the_freeze_clients_pid() {
    squat(4391, false, "client");
}

/// The same with the init not PID 1 (a subreaper, as under a shared PID namespace's pause
/// process), its command at a pid above the reserved ones: the escapee kills the command (a root
/// process) once the freeze has begun; the init reaps it inside the proof (after a kill round, or
/// at a pids limit); the escapee takes its pid. The command's pid is the init's own, the
/// squatter on it is not.
#[test]
fn x04_escapee_squats_the_commands_pid_once_the_proof_reaps_it() {
    squat(4394, true, "command");
}

fn squat(uid: u32, subreaper: bool, what: &str) {
    let rounds: usize = knob("ATK_ROUNDS", 3);
    let mut forged = 0;
    for round in 0..rounds {
        let u = uid.to_string();
        // ATK_CG_MAX: the container in a pids cgroup of that limit, held by a sandbox bomb, and
        // no decoys wanted (ATK_DECOY=0): the proof's reaping at the limit frees the pid.
        let cg: Option<PidsCgroup> =
            knob_set("ATK_CG_MAX").map(|m| PidsCgroup::new("squat", m).expect("a pids cgroup"));
        let enter = cg.as_ref().map(|g| g.enter()).unwrap_or_default();
        let prefix = if cg.is_some() { vec!["sh", "-c", enter.as_str(), "sh"] } else { vec![] };
        let burn = "i=0; while [ $i -lt 400 ]; do /bin/true; i=$((i+1)); done; exec \"$@\"";
        let c = if subreaper {
            let mut c = Container::start_with(
                Opts {
                    init_args: vec!["--sandbox-user", &u, "--no-lineage"],
                    shell_pid1: true,
                    prefix: prefix.clone(),
                    wrap: vec!["sh", "-c", burn, "sh"],
                    setuid: true,
                    ..Default::default()
                },
                &["sleep", "1000000"],
            );
            let until = Instant::now() + Duration::from_secs(10);
            while !c.state.join("sandbox.json").exists() {
                assert!(c.alive() && Instant::now() < until, "no sandbox.json");
                std::thread::sleep(Duration::from_millis(5));
            }
            c
        } else {
            sandbox_setuid(uid, &["--no-lineage"])
        };
        // The namespace's pid_max: the host's default here (32768) unless ATK_PID_MAX says
        // otherwise (a child namespace starts at 4194304 on Linux 6.14+).
        let pid_max: String = knob("ATK_PID_MAX", "32768".into());
        let out = c.exec(&[
            "sh",
            "-c",
            &format!("echo {pid_max} > /proc/sys/kernel/pid_max; cat /proc/sys/kernel/pid_max"),
        ]);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            pid_max,
            "cannot set the namespace's pid_max"
        );
        let suid = setuid_copy(&c);
        let file = c.path("squat");
        let decoy: String = knob("ATK_DECOY", uid.to_string());
        let mode: String = knob("ATK_MODE", "-".into());
        let status = c.state.join("status.json");
        let w = c.launch_unfollowed(
            uid,
            &suid,
            &["squat-client", file.to_str().unwrap(), &decoy, &mode, what, status.to_str().unwrap()],
        );
        let _bomb = cg.as_ref().map(|g| {
            let q = quiesce();
            let a = adv();
            let b = c.start_ready(
                c.exec_in(g, &[q.to_str().unwrap(), "exec", "--user", &u, "--", &a, "bomb", "100000"]),
                "a bomb in the cgroup",
            );
            let max: u32 = read(&g.0.join("pids.max")).trim().parse().unwrap();
            wait_for("the bomb to hold the limit", Duration::from_secs(30), || g.current() + 2 >= max);
            b
        });
        std::thread::sleep(Duration::from_millis(300));
        let e0 = w.pid;
        eprintln!(
            "round {round}: escapee {e0}: uid {:?} ppid {:?}",
            c.status_line(e0, "Uid"),
            c.stat(e0).map(|s| s.ppid)
        );
        let started = Instant::now();
        let _client = guard(c.freeze_cmd("n-x01", None));
        let mut st = serde_json::Value::Null;
        wait_for("the freeze to end", Duration::from_secs(60), || {
            st = c.status_file();
            matches!(st["state"].as_str(), Some("quiescent" | "failed"))
        });
        let took = started.elapsed();
        let squat = read(&file);
        let x: i32 = squat.split_whitespace().next().and_then(|s| s.parse().ok()).unwrap_or(0);
        let alive = x > 0
            && c.stat(x).is_some_and(|s| s.live())
            && c.proc_read(x, "comm").is_some_and(|n| n.trim() == "adversary-suid");
        eprintln!(
            "round {round}: state {} in {took:?}, reason {}, squat file '{}', squatter alive {alive}, marker {}",
            st["state"],
            st["reason"],
            squat.trim(),
            c.marker_exists()
        );
        if alive && st["state"] == "quiescent" {
            forged += 1;
            report_forged(&c, round, x);
        }
    }
    assert_eq!(forged, 0, "{forged} of {rounds} freezes signed a marker while the squatter lived");
}

/// A root hopper (`--no-lineage --allow-setuid`, a plain fork whose parent exits: every hop that
/// exits is a zombie child of the init) inside the container's pids cgroup. While the init
/// observes it does not reap, so the hops' zombies fill the limit within a pass: the hopper
/// stalls and the init's thread gets no pid. The proof then reaps, which frees pids to the
/// hopper, and observes again. Every freeze must fail while the hopper lives, and end within its
/// budget.
#[test]
fn x02_root_hopper_whose_hops_are_the_inits_zombies_at_a_pids_limit() {
    let rounds: usize = knob("ATK_ROUNDS", 4);
    let max: u32 = knob("ATK_PIDS_MAX", 60);
    let nap: String = knob("ATK_NAP_US", "0".into());
    let mut bad = Vec::new();
    for round in 0..rounds {
        let uid = 4392;
        let Some(cg) = PidsCgroup::new("hop", max) else {
            skip("x02", "no pids cgroup");
            return;
        };
        let c = sandbox_in_setuid(&cg, uid, &["--no-lineage", "--freeze-timeout", "5"]);
        let suid = setuid_copy(&c);
        let file = c.path("hops");
        let hopper = c.exec_in(&cg, &unfollowed_exec(uid, &suid, &["hopper", file.to_str().unwrap(), &nap]));
        let _h = c.start_ready(hopper, "a root hopper in the cgroup");
        let a0 = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
        wait_for("the hopper to hop", Duration::from_secs(10), || {
            std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0) > a0 + 40
        });
        let (st, took) = c.freeze_by_signal(Duration::from_secs(60));
        let b0 = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
        std::thread::sleep(Duration::from_millis(300));
        let alive = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0) > b0
            || c.pids().into_iter().any(|p| {
                c.stat(p).is_some_and(|s| s.live())
                    && c.proc_read(p, "comm").is_some_and(|n| n.trim() == "adversary-suid")
            });
        eprintln!(
            "round {round}: pids.current {} of {max}, state {} in {took:?}, hopper alive {alive}, marker {}: {}",
            cg.current(),
            st["state"],
            c.marker_exists(),
            st["reason"]
        );
        if (alive && st["state"] == "quiescent") || took > Duration::from_secs(20) {
            bad.push(round);
        }
        drop(c);
        drop(cg);
    }
    assert!(bad.is_empty(), "rounds {bad:?}: a marker beside a live hopper, or an unbounded freeze");
}

/// Sandbox processes reparented to the init that hand it zombies with CLONE_PARENT as fast as the
/// container's pids limit lets them (`zombie-storm`), so the init's thread finds no pid and the
/// proof reaps while more zombies keep coming until the kill. One signal: a bounded end, and no
/// marker unless nothing of the sandbox lives.
#[test]
fn x03_zombie_storm_at_a_pids_limit() {
    let rounds: usize = knob("ATK_ROUNDS", 3);
    let mut bad = Vec::new();
    for round in 0..rounds {
        let uid = 4393;
        let Some(cg) = PidsCgroup::new("storm", 120) else {
            skip("x03", "no pids cgroup");
            return;
        };
        let u = uid.to_string();
        let c = sandbox_in_setuid(&cg, uid, &["--no-lineage", "--freeze-timeout", "5"]);
        let q = quiesce();
        let a = adv();
        let storm = c.exec_in(
            &cg,
            &[q.to_str().unwrap(), "exec", "--user", &u, "--", &a, "zombie-storm", "16", "200", "30", "20"],
        );
        let _s = c.start_ready(storm, "a zombie storm in the cgroup");
        wait_for("the storm to reach the limit", Duration::from_secs(20), || cg.current() >= 110);
        let (st, took) = c.freeze_by_signal(Duration::from_secs(60));
        let left = c.live_of_uid(uid);
        eprintln!(
            "round {round}: state {} in {took:?}, killed {}, live sandbox {left:?}, marker {}: {}",
            st["state"],
            st["killed"],
            c.marker_exists(),
            st["reason"]
        );
        if (!left.is_empty() && st["state"] == "quiescent") || took > Duration::from_secs(20) {
            bad.push(round);
        }
        drop(c);
        drop(cg);
    }
    assert!(bad.is_empty(), "rounds {bad:?}");
}

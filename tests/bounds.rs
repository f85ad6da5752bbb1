//! PID 1 never falls and never stalls: what the sandbox controls (argv sizes, locks its reads
//! wait on, how many zombies it hands the init, capabilities the init lacks) must not grow the
//! init's memory, hold up a freeze past its budget, or keep it from handling a signal.
//! Each test uses its own sandbox UID so that per-UID process limits never mix.

mod common;
use common::*;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Run `cmd` inside the container and wait until it creates the ready file; returns the guard
/// and the pid (in the namespace) the workload wrote there.
fn launch_ready(c: &Container, tag: &str, mut cmd: std::process::Command) -> (Guard, i32) {
    let ready = c.path(&format!("ready-{tag}"));
    cmd.env("ADV_READY", &ready).stdin(Stdio::null()).stdout(Stdio::null());
    let child = guard(cmd);
    wait_for(&format!("workload {tag} to be ready"), Duration::from_secs(30), || ready.exists());
    let pid = read(&ready).trim().parse().expect("pid in the ready file");
    (child, pid)
}

/// The adversary as root inside the container (not a sandbox launch).
fn launch_root(c: &Container, tag: &str, args: &[&str]) -> (Guard, i32) {
    let a = adv();
    let mut full = vec![a.as_str()];
    full.extend_from_slice(args);
    launch_ready(c, tag, c.exec_cmd(&full))
}

/// The adversary as a sandbox launch (`quiesce exec --user UID`).
fn launch_as(c: &Container, uid: u32, tag: &str, args: &[&str]) -> (Guard, i32) {
    let (q, a, u) = (quiesce(), adv(), uid.to_string());
    let mut full = vec![q.to_str().unwrap(), "exec", "--user", &u, "--", &a];
    full.extend_from_slice(args);
    launch_ready(c, tag, c.exec_cmd(&full))
}

fn claims(c: &Container) -> serde_json::Value {
    use base64::Engine;
    let t = read(&c.state.join("quiescence.jws"));
    let payload = t.split('.').nth(1).expect("a marker");
    serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).unwrap())
        .unwrap()
}

/// A number field of /proc/PID/status (VmRSS and VmHWM in KiB, Threads).
fn status_kib(pid: i32, field: &str) -> u64 {
    read(std::path::Path::new(&format!("/proc/{pid}/status")))
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!("{field}:"))
                .map(|v| v.trim().trim_end_matches("kB").trim().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("{field} of pid {pid}"))
}

#[test]
fn huge_argvs_keep_pid_1_small() {
    // 30 shells, each with 15 arguments of 120 KiB of 0xFF: about 54 MB of command lines.
    let uid = 4501;
    let c = sandbox(uid, &[]);
    let _w = launch_as(&c, uid, "hog", &["argv-hog", "30", "15", "122880"]);
    let before = status_kib(c.init, "VmHWM");
    let (code, st) = c.freeze_within("n-1", Some(60));
    assert_eq!(code, 0, "{st}");
    let peak = status_kib(c.init, "VmHWM");
    eprintln!("huge argvs: PID 1 VmHWM {before} KiB before, {peak} KiB after; freeze {}", st["phases_ms"]);
    assert!(peak < 16 * 1024, "PID 1 peaked at {peak} KiB");
    let cl = claims(&c);
    let procs = cl["processes"].as_array().unwrap();
    let shells: Vec<&serde_json::Value> = procs.iter().filter(|p| p["comm"] == "sh").collect();
    assert_eq!(shells.len(), 30, "{}", cl["processes_omitted"]);
    for p in shells {
        assert_eq!(p["truncated"], true, "{p}");
        assert!(p["cmdline"].to_string().len() <= 4096, "{}", p["cmdline"].to_string().len());
        assert_eq!(p["cmdline"][0], "sh");
    }
    assert_eq!(cl["processes_omitted"], 0);
}

#[test]
fn ordinary_argvs_for_comparison() {
    // The same 30 shells with ordinary command lines: the figure the huge-argv freeze is
    // compared with (printed, not asserted).
    let uid = 4508;
    let c = sandbox(uid, &[]);
    let _w = launch_as(&c, uid, "plain", &["argv-hog", "30", "0", "0"]);
    let (code, st) = c.freeze_within("n-1", Some(60));
    assert_eq!(code, 0, "{st}");
    eprintln!("ordinary argvs: PID 1 VmHWM {} KiB; freeze {}", status_kib(c.init, "VmHWM"), st["phases_ms"]);
    let cl = claims(&c);
    let shells = cl["processes"].as_array().unwrap().iter().filter(|p| p["comm"] == "sh").count();
    assert_eq!(shells, 30);
}

#[test]
fn marker_evidence_is_capped_with_a_count_of_the_rest() {
    // 300 shells with an 8 KiB argument each: every entry is near the per-process cap, and
    // together they pass the whole-marker cap.
    let uid = 4502;
    let c = sandbox(uid, &[]);
    let _w = launch_as(&c, uid, "hog", &["argv-hog", "300", "1", "8192"]);
    let (code, st) = c.freeze_within("n-1", Some(60));
    assert_eq!(code, 0, "{st}");
    let cl = claims(&c);
    let kept = cl["processes"].as_array().unwrap().len() as u64;
    let omitted = cl["processes_omitted"].as_u64().expect("processes_omitted");
    assert!(omitted > 0, "nothing omitted of {kept}");
    // Every sandbox process is counted: 300 shells, 300 sleeps and the adversary.
    assert_eq!(kept + omitted, 601, "{st}");
    assert_eq!(st["killed"], 601, "{st}");
    let size = cl["processes"].to_string().len();
    assert!(size <= 1 << 20, "processes take {size} bytes");
    let peak = status_kib(c.init, "VmHWM");
    eprintln!("capped marker: {kept} entries kept ({size} bytes), {omitted} omitted; PID 1 VmHWM {peak} KiB");
    assert!(peak < 16 * 1024, "PID 1 peaked at {peak} KiB");
}

/// A FUSE daemon (as `daemon_uid`, or root) and a sandbox process that holds its own mmap lock
/// in a read from that file system while another of its threads waits for it in mbind(), which
/// SIGKILL does not interrupt: reading its cmdline now waits for as long as the daemon is silent.
fn fuse_lock_holder(c: &Container, uid: u32, daemon_uid: Option<u32>) -> (Guard, Guard, i32) {
    fuse_lock_holder_at(c, "fuse", uid, daemon_uid)
}

/// The same, with its own FUSE mount at `name` in the container's directory.
fn fuse_lock_holder_at(c: &Container, name: &str, uid: u32, daemon_uid: Option<u32>) -> (Guard, Guard, i32) {
    let mnt = c.path(name);
    std::fs::create_dir(&mnt).unwrap();
    let m = mnt.to_str().unwrap().to_string();
    let du = daemon_uid.map(|u| u.to_string());
    let mut args = vec!["fuse-serve", m.as_str()];
    args.extend(du.as_deref());
    let (d, _) = launch_root(c, &format!("daemon-{name}"), &args);
    let file = mnt.join("x");
    let (v, pid) =
        launch_as(c, uid, &format!("victim-{name}"), &["fuse-mmap-victim", file.to_str().unwrap(), "mbind"]);
    (d, v, pid)
}

#[test]
fn a_read_that_waits_on_the_sandbox_cannot_stall_the_freeze() {
    // The sandbox runs the FUSE daemon: killing it releases the victim, so the freeze can
    // succeed, and it must, within its budget, with that process's evidence marked unreadable.
    let uid = 4503;
    if !std::path::Path::new("/dev/fuse").exists() {
        eprintln!("skipped: no /dev/fuse on this machine");
        return;
    }
    let c = sandbox(uid, &["--freeze-timeout", "5"]);
    let (_d, _v, victim) = fuse_lock_holder(&c, uid, Some(uid));
    let t = Instant::now();
    let (code, st) = c.freeze_within("n-1", Some(30));
    eprintln!("fuse lock holder: freeze ended after {:?}: {}", t.elapsed(), st["state"]);
    assert_eq!(code, 0, "{st}");
    let cl = claims(&c);
    let unreadable: Vec<&serde_json::Value> =
        cl["processes"].as_array().unwrap().iter().filter(|p| p["unreadable"] == true).collect();
    assert_eq!(unreadable.len(), 1, "{}", cl["processes"]);
    assert_eq!(unreadable[0]["pid"], victim, "{}", unreadable[0]);
    assert!(unreadable[0]["cmdline"].is_null(), "{}", unreadable[0]);
    let daemon =
        cl["processes"].as_array().unwrap().iter().find(|p| p["pid"] != victim && p["unreadable"] == false);
    assert!(daemon.is_some_and(|p| p["cmdline"].is_array()), "{}", cl["processes"]);
}

#[test]
fn a_read_that_waits_on_an_unkillable_process_is_a_bounded_failure() {
    // A root daemon never answers: the victim stays in D state after SIGKILL, and so does the
    // init's reader of its cmdline. The freeze must fail within its budget naming it, and the
    // init must answer the next request the same way, without stranding a second reader on it.
    let uid = 4504;
    if !std::path::Path::new("/dev/fuse").exists() {
        eprintln!("skipped: no /dev/fuse on this machine");
        return;
    }
    let c = sandbox(uid, &["--freeze-timeout", "3"]);
    let (_d, _v, victim) = fuse_lock_holder(&c, uid, None);
    let mut threads = vec![status_kib(c.init, "Threads")];
    for round in ["n-1", "n-2"] {
        let t = Instant::now();
        let (code, st) = c.freeze_within(round, Some(30));
        eprintln!("unkillable lock holder: freeze {round} ended after {:?}: {}", t.elapsed(), st["state"]);
        assert_eq!(code, 1, "{st}");
        assert_eq!(st["state"], "failed", "{st}");
        let survivors = st["survivors"].as_array().unwrap();
        assert_eq!(survivors.len(), 1, "{st}");
        assert_eq!(survivors[0]["pid"], victim, "{st}");
        assert_eq!(survivors[0]["state"], "D", "{st}");
        assert!(!c.marker_exists());
        threads.push(status_kib(c.init, "Threads"));
        assert_eq!(init_threads_in_d(c.init), 1, "the init's reader of the victim is not the one stuck");
    }
    // The reader started with the init is stuck on the victim after the first freeze; the second
    // freeze does not start another for it.
    eprintln!("unkillable lock holder: init threads {threads:?}");
    assert_eq!(threads[1], threads[2], "threads of the init: {threads:?}");
}

#[test]
fn readers_stuck_on_many_unkillable_processes_stay_within_their_bound() {
    // Six processes stay in D state after SIGKILL, each holding its mmap lock, among a hundred
    // sleepers: a walk large enough for two readers. Each freeze may strand readers on them, but
    // never more than four at once, however many freezes ask, and whichever reader would start.
    let uid = 4510;
    if !std::path::Path::new("/dev/fuse").exists() {
        eprintln!("skipped: no /dev/fuse on this machine");
        return;
    }
    let c = sandbox(uid, &["--freeze-timeout", "8"]);
    let holders: Vec<(Guard, Guard, i32)> =
        (0..6).map(|i| fuse_lock_holder_at(&c, &format!("fuse{i}"), uid, None)).collect();
    let mut victims: Vec<i64> = holders.iter().map(|h| h.2 as i64).collect();
    victims.sort_unstable();
    let _s = launch_as(&c, uid, "sleepers", &["sleepers", "100"]);
    let mut stuck = Vec::new();
    for round in ["n-1", "n-2", "n-3"] {
        let t = Instant::now();
        let (code, st) = c.freeze_within(round, Some(60));
        eprintln!(
            "six unkillable lock holders: freeze {round} ended after {:?}: {}",
            t.elapsed(),
            st["state"]
        );
        assert_eq!(code, 1, "{st}");
        assert_eq!(st["state"], "failed", "{st}");
        let mut named: Vec<i64> =
            st["survivors"].as_array().unwrap().iter().filter_map(|s| s["pid"].as_i64()).collect();
        named.sort_unstable();
        assert_eq!(named, victims, "{st}");
        assert!(!c.marker_exists());
        stuck.push(init_threads_in_d(c.init));
    }
    eprintln!("six unkillable lock holders: init threads in D after each freeze {stuck:?}");
    assert!(stuck.iter().all(|&n| n <= 4), "init threads stuck in the kernel: {stuck:?}");
    assert!(stuck[0] >= 1, "no reader was stuck: the test did not reach the bound: {stuck:?}");
}

/// Threads of `pid` in uninterruptible (or killable) sleep.
fn init_threads_in_d(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter(|t| {
            let st = read(&t.path().join("stat"));
            st.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('D'))
        })
        .count()
}

/// Latency from `send` to `done()`, polled every millisecond up to `bound`.
fn latency(bound: Duration, send: impl FnOnce(), mut done: impl FnMut() -> bool) -> Option<Duration> {
    let t = Instant::now();
    send();
    while t.elapsed() < bound {
        if done() {
            return Some(t.elapsed());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

#[test]
fn a_zombie_storm_does_not_hold_back_a_freeze_request() {
    let uid = 4505;
    let c = sandbox(uid, &[]);
    // Eight processes reparented to PID 1 hand it zombies for 20 s, behind 2,000 orphans that
    // make each of its waitpid() calls slow; 3,000 tasks at most.
    let _w = launch_as(&c, uid, "storm", &["zombie-storm", "8", "3000", "20", "2000"]);
    std::thread::sleep(Duration::from_millis(500));
    assert!(!c.state.join("status.json").exists());
    // Bound for "handled at all", not a speed requirement: the storm alone lasts 20 s.
    let handled =
        latency(Duration::from_secs(5), || c.signal(libc::SIGUSR1), || c.state.join("status.json").exists());
    eprintln!("zombie storm: freeze request handled after {handled:?}");
    assert!(handled.is_some(), "the freeze request was not handled within 5 s");
    wait_for("the freeze to end", Duration::from_secs(30), || {
        matches!(c.status_file()["state"].as_str(), Some("quiescent" | "failed"))
    });
    assert_eq!(c.status_file()["state"], "quiescent", "{}", c.status_file());
}

#[test]
fn a_zombie_storm_does_not_hold_back_sigterm() {
    let uid = 4506;
    let u = uid.to_string();
    let a = adv();
    let mut c = Container::start_with(
        Opts {
            init_args: vec!["--sandbox-user", &u, "--grace", "1"],
            stdout: Stdio::piped(),
            ..Default::default()
        },
        &[&a, "signals"],
    );
    let lines = c.stdout_lines();
    let _w = launch_as(&c, uid, "storm", &["zombie-storm", "8", "3000", "20", "2000"]);
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    c.signal(libc::SIGTERM);
    let got = lines.next_within(Duration::from_secs(5));
    let took = t.elapsed();
    eprintln!("zombie storm: SIGTERM reached the command after {took:?}");
    assert_eq!(got, "got 15", "SIGTERM was not forwarded within 5 s");
    // The command ended, so the init ends the rest (the storm included) and exits.
    assert_eq!(c.wait_code(Duration::from_secs(15)), 0);
}

#[test]
fn exe_is_read_without_cap_sys_ptrace() {
    // Docker's default capabilities lack CAP_SYS_PTRACE: root may not read the exe link of
    // another user's process, so the init reads it with that user's filesystem credentials.
    let uid = 4507;
    let u = uid.to_string();
    let c = Container::start_with(
        Opts {
            init_args: vec!["--sandbox-user", &u],
            wrap: vec!["setpriv", "--inh-caps=-all", "--bounding-set=-sys_ptrace", "--"],
            ..Default::default()
        },
        &["sleep", "1000000"],
    );
    let caps = read(std::path::Path::new(&format!("/proc/{}/status", c.init)));
    let eff = caps.lines().find_map(|l| l.strip_prefix("CapEff:")).unwrap().trim().to_string();
    let eff = u64::from_str_radix(&eff, 16).unwrap();
    assert_eq!(eff & (1 << 19), 0, "the init still has CAP_SYS_PTRACE");
    let _w = launch_as(&c, uid, "sleepers", &["sleepers", "3"]);
    let (code, st) = c.freeze_within("n-1", Some(30));
    assert_eq!(code, 0, "{st}");
    let cl = claims(&c);
    let procs = cl["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 4, "{}", cl["processes"]);
    for p in procs {
        assert!(p["exe"].as_str().is_some_and(|e| e.ends_with("/adversary")), "{p}");
    }
}

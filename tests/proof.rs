//! The proof holds against a sandbox that has read the source: pid hoppers, inherited loginuids,
//! SIGCONT rings, a /proc that hides processes or belongs to another namespace, processes that
//! change credentials after the init first saw them, and attacks on the credential switch.
//! Each test uses its own sandbox UID so that per-UID process limits never mix.

mod common;
use common::*;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// (state, uids) of a host pid, or None once it is gone.
fn host_proc(pid: i32) -> Option<(char, Vec<u32>)> {
    let st = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let state = st.lines().find(|l| l.starts_with("State:"))?.split_whitespace().nth(1)?.chars().next()?;
    let uids = st
        .lines()
        .find(|l| l.starts_with("Uid:"))?
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    Some((state, uids))
}

/// Live (not zombie) processes of the namespace with any UID in `uids`, from the host's /proc:
/// what the init may believe is irrelevant here.
fn host_live_with_uid(c: &Container, uid: u32) -> Vec<i32> {
    let ns = std::fs::read_link(format!("/proc/{}/ns/pid", c.init)).unwrap();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        if std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok() != Some(ns.clone()) {
            continue;
        }
        if let Some((state, uids)) = host_proc(pid) {
            if !matches!(state, 'Z' | 'X') && uids.contains(&uid) {
                out.push(pid);
            }
        }
    }
    out
}

fn claims(c: &Container) -> serde_json::Value {
    use base64::Engine;
    let jws = read(&c.state.join("quiescence.jws"));
    let payload = jws.split('.').nth(1).expect("a marker");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

fn size(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

/// The hopper appends a line per hop: wait until it provably keeps going.
fn hopping(file: &Path) {
    let a = size(file);
    wait_for("the hopper to hop", Duration::from_secs(10), || size(file) > a + 20);
}

/// After a quiescent freeze, the hopper's file must not change any more.
fn hopper_is_dead(c: &Container, file: &Path, st: &serde_json::Value) {
    assert_eq!(st["state"], "quiescent", "{st}");
    let a = size(file);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(size(file), a, "the hopper still writes after a quiescent marker: {st}");
    assert!(c.marker_exists());
}

/// Rounds of: a fresh setuid-root hopper (napping `nap` µs per hop) beside `sleepers` sandbox
/// sleepers, then a freeze that must kill it before it certifies.
fn hopper_rounds(uid: u32, nap: &str, sleepers: &str, rounds: usize, pid_max: Option<u32>) {
    let c = sandbox_setuid(uid, &[]);
    if let Some(max) = pid_max {
        // Pids of this namespace wrap around often: a new hop may get any free pid, not the
        // highest, as on any long-running container.
        let out = c.exec(&["sh", "-c", &format!("echo {max} > /proc/sys/kernel/pid_max")]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let suid = setuid_copy(&c);
    for round in 0..rounds {
        let _s = c.launch(uid, &["sleepers", sleepers]);
        let file = c.path(&format!("hops-{round}"));
        let _w = c.launch_bin(uid, &["--allow-setuid"], &suid, &["hopper", file.to_str().unwrap(), nap]);
        hopping(&file);
        let (code, st) = c.freeze(&format!("n-{round}"));
        assert_eq!(code, 0, "round {round}: {st}");
        hopper_is_dead(&c, &file, &st);
        assert!(host_live_with_uid(&c, uid).is_empty(), "round {round}: {st}");
    }
}

#[test]
fn p01_pid_hopping_root_escapee_is_killed_before_the_marker() {
    hopper_rounds(4601, "200", "0", 3, None);
}

#[test]
fn p02_pid_hopper_without_a_pause_among_a_thousand_sleepers() {
    // The observation takes long here, each hop lives for microseconds and may take any free
    // pid: a table that is not consistent misses the hopper most of the time.
    hopper_rounds(4602, "0", "1000", 4, Some(2048));
}

#[test]
fn p03_hopper_in_a_new_group_per_hop_is_killed_or_fails_and_the_marker_names_late_hops() {
    // No process group holds it: only the consistent proof can see each new hop.
    let uid = 4603;
    let c = sandbox_setuid(uid, &[]);
    let suid = setuid_copy(&c);
    let file = c.path("hops");
    let _w =
        c.launch_bin(uid, &["--allow-setuid"], &suid, &["hopper", file.to_str().unwrap(), "200", "newgroup"]);
    hopping(&file);
    let (code, st) = c.freeze("n-1");
    if code == 0 {
        hopper_is_dead(&c, &file, &st);
        // Whichever hop the freeze saw alive and killed — at the walk or, for a hop created
        // after it, in a later round — the marker names it: a root process tagged by lineage.
        let processes = claims(&c)["processes"].as_array().unwrap().clone();
        let hops = processes
            .iter()
            .filter(|p| {
                p["uids"] == serde_json::json!([0])
                    && p["reason"].as_array().is_some_and(|r| r.contains(&serde_json::json!("lineage")))
            })
            .count();
        assert!(hops >= 1, "no hop in the marker: {processes:?}");
        assert_eq!(st["killed"].as_u64().unwrap() as usize, processes.len());
    } else {
        assert_eq!(code, 1, "{st}");
        assert_eq!(st["state"], "failed");
        assert!(!c.marker_exists());
        let reason = st["reason"].as_str().unwrap();
        assert!(reason.contains("kept appearing") || reason.contains("still alive"), "{st}");
    }
}

#[test]
fn p04_root_service_spawning_all_the_time_is_never_touched_and_never_fails_the_freeze() {
    let uid = 4604;
    let c = sandbox(uid, &[]);
    let _s = c.launch(uid, &["sleepers", "200"]);
    let churn = {
        let mut cmd = c.exec_cmd(&["sh", "-c", "echo $$ > $D/churn; while :; do /bin/true; done"]);
        cmd.stdout(Stdio::null());
        guard(cmd)
    };
    wait_for("the churner", Duration::from_secs(10), || !read(&c.path("churn")).trim().is_empty());
    // Prove it churns: the namespace hands out pids all the time. (Bounded generously: at nice 0
    // on a machine loaded from outside, one shell's forks come slowly.)
    let counter = c.proc_dir().join("sys/kernel/ns_last_pid");
    let last = || read(&counter).trim().parse::<i64>().unwrap();
    let a = last();
    wait_for("pids to be handed out", Duration::from_secs(30), || last() > a + 20);
    for round in 0..3 {
        let (code, st) = c.freeze(&format!("n-{round}"));
        assert_eq!(code, 0, "round {round}: {st}");
        assert_eq!(st["state"], "quiescent");
        if round == 0 {
            assert!(st["killed"].as_u64().unwrap() >= 201, "{st}");
        }
    }
    assert!(host_live_with_uid(&c, uid).is_empty());
    // The churning shell, root, is alive, not stopped, and still churning.
    let sh: i32 = read(&c.path("churn")).trim().parse().unwrap();
    let ps = c.processes();
    let me = ps.iter().find(|p| p.0 == sh).expect("the churner is alive");
    assert_eq!(me.1, 0);
    assert!(!matches!(me.2, 'T' | 't' | 'Z' | 'X'), "{me:?}");
    let a = last();
    wait_for("the churner to go on", Duration::from_secs(30), || last() > a + 20);
    drop(churn);
}

#[test]
fn p05_inherited_loginuid_turns_lineage_off_and_root_stays_untouched() {
    let uid = 4605;
    let u = uid.to_string();
    // The init starts from a "login session" whose loginuid is the sandbox UID.
    let wrap = format!("echo {uid} > /proc/self/loginuid && exec \"$@\"");
    let c = Container::start_with(
        Opts {
            init_args: vec!["--sandbox-user", &u],
            prefix: vec!["sh", "-c", &wrap, "sh"],
            ..Default::default()
        },
        &["sleep", "1000000"],
    );
    assert_eq!(read(Path::new(&format!("/proc/{}/loginuid", c.init))).trim(), u);
    let a = adv();
    let svc = {
        let mut cmd = c.exec_cmd(&[&a, "sleepers", "2"]);
        cmd.env("ADV_READY", c.path("svc-ready")).stdout(Stdio::null());
        guard(cmd)
    };
    wait_for("root service", Duration::from_secs(10), || c.path("svc-ready").exists());
    let _w = c.launch(uid, &["sleepers", "20"]);
    let root_before: Vec<i32> =
        c.processes().iter().filter(|p| p.1 == 0 && p.2 != 'Z' && p.0 != 1).map(|p| p.0).collect();
    assert!(root_before.len() >= 4, "{root_before:?}");
    let (code, st) = c.freeze("n-1");
    assert_eq!(code, 0, "{st}");
    assert_eq!(st["killed"].as_u64(), Some(21), "{st}");
    let root_after: Vec<i32> =
        c.processes().iter().filter(|p| p.1 == 0 && p.2 != 'Z' && p.0 != 1).map(|p| p.0).collect();
    for pid in &root_before {
        // Short-lived helpers of the harness (ps itself) come and go; the root ones we knew stay.
        if host_proc(*pid).is_some() || root_after.contains(pid) {
            continue;
        }
        panic!("root process {pid} was killed: {st}");
    }
    assert!(c.processes().iter().any(|p| p.0 == 2 || p.3 == "sleep"), "the root command lives");
    drop(svc);
}

/// A root process whose loginuid is the sandbox UID, as an escapee of a sandbox launch has.
fn tagged_root(c: &Container, uid: u32) -> (Guard, i32) {
    let a = adv();
    let script = format!("echo {uid} > /proc/self/loginuid && exec \"$0\" pause");
    let mut cmd = c.exec_cmd(&["sh", "-c", &script, &a]);
    let ready = c.path(&format!("tagged-{uid}"));
    cmd.env("ADV_READY", &ready).stdout(Stdio::null());
    let g = guard(cmd);
    wait_for("tagged root process", Duration::from_secs(10), || ready.exists());
    let pid: i32 = read(&ready).trim().parse().unwrap();
    (g, pid)
}

#[test]
fn p06_no_lineage_switches_lineage_off_in_classification() {
    let uid = 4606;
    // With lineage: the tagged root process is a sandbox process and dies.
    let c = sandbox_setuid(uid, &[]);
    let (_g, pid) = tagged_root(&c, uid);
    let (code, st) = c.freeze("n-1");
    assert_eq!(code, 0, "{st}");
    assert_eq!(st["killed"].as_u64(), Some(1), "{st}");
    assert!(!c.processes().iter().any(|p| p.0 == pid && p.2 != 'Z'));
    // With --no-lineage: nothing marks it, and nothing touches it.
    let c = sandbox_setuid(uid, &["--no-lineage"]);
    let (_g, pid) = tagged_root(&c, uid);
    let (code, st) = c.freeze("n-1");
    assert_eq!(code, 0, "{st}");
    assert_eq!(st["killed"].as_u64(), Some(0), "{st}");
    assert!(c.processes().iter().any(|p| p.0 == pid && p.2 != 'Z'), "{st}");
}

#[test]
fn p07_sigcont_ring_ends_stopped() {
    let uid = 4607;
    let c = sandbox(uid, &[]);
    let _w = c.launch(uid, &["cont-ring", "20"]);
    for round in 0..3 {
        let _w = if round > 0 { Some(c.launch(uid, &["cont-ring", "20"])) } else { None };
        let (code, st) = c.freeze(&format!("n-{round}"));
        assert_eq!(code, 0, "{st}");
        assert_eq!(st["unstopped"], 0, "round {round}: the stop did not converge: {st}");
        assert!(st["killed"].as_u64().unwrap() >= 21, "{st}");
    }
}

#[test]
fn p08_hidepid_without_cap_sys_ptrace_fails_and_with_it_works() {
    let uid = 4608;
    let u = uid.to_string();
    for (prefix, ok) in
        [(vec!["setpriv", "--bounding-set=-sys_ptrace", "--inh-caps=-sys_ptrace"], false), (vec![], true)]
    {
        let c = Container::start_with(
            Opts {
                init_args: vec!["--sandbox-user", &u, "--freeze-timeout", "3"],
                prefix,
                ..Default::default()
            },
            &["sleep", "1000000"],
        );
        let _w = c.launch(uid, &["sleepers", "5"]);
        let out = c.exec(&["mount", "-o", "remount,hidepid=invisible", "/proc"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let (code, st) = c.freeze("n-1");
        if ok {
            assert_eq!(code, 0, "{st}");
            assert!(host_live_with_uid(&c, uid).is_empty());
        } else {
            assert_eq!(code, 1, "{st}");
            assert!(st["reason"].as_str().unwrap().contains("hidepid"), "{st}");
            assert!(!c.marker_exists());
            assert_eq!(host_live_with_uid(&c, uid).len(), 6, "{st}");
        }
    }
}

#[test]
fn p09_proc_of_another_pid_namespace_fails() {
    let uid = 4609;
    let c = sandbox(uid, &["--freeze-timeout", "3"]);
    let _w = c.launch(uid, &["sleepers", "5"]);
    // A procfs of a nested PID namespace over the container's /proc: it has a pid 1 too.
    let out = c.exec(&["unshare", "--pid", "--fork", "sh", "-c", "mount -t proc proc /proc && sleep 0.1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (code, st) = c.freeze("n-1");
    assert_eq!(code, 1, "{st}");
    assert!(st["reason"].as_str().unwrap().contains("another PID namespace"), "{st}");
    assert!(!c.marker_exists());
    assert_eq!(host_live_with_uid(&c, uid).len(), 6);
}

#[test]
fn p10_root_process_that_was_the_sandbox_user_for_a_while_stays_tracked() {
    let uid = 4610;
    let c = sandbox(uid, &["--track-interval", "0.1"]);
    let ready = c.path("late-ready");
    let a = adv();
    let mut cmd = c.exec_cmd(&[&a, "late-drop", &uid.to_string(), "700"]);
    cmd.env("ADV_READY", &ready).stdout(Stdio::null());
    let _g = guard(cmd);
    wait_for("late-drop", Duration::from_secs(15), || ready.exists());
    let pid: i32 = read(&ready).trim().parse().unwrap();
    // Root again now, untagged: only the init's history knows what it was.
    let host: i32 = {
        let st = read(Path::new(&format!("/proc/{}/status", c.init)));
        assert!(st.contains("NSpid"));
        // The host pid of the adversary: the exec child's pid inside is `pid`.
        let ns = std::fs::read_link(format!("/proc/{}/ns/pid", c.init)).unwrap();
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()))
            .find(|p| {
                std::fs::read_link(format!("/proc/{p}/ns/pid")).ok() == Some(ns.clone())
                    && read(Path::new(&format!("/proc/{p}/status")))
                        .lines()
                        .find(|l| l.starts_with("NSpid:"))
                        .and_then(|l| l.split_whitespace().last().map(|x| x == pid.to_string()))
                        .unwrap_or(false)
            })
            .expect("adversary on the host")
    };
    assert_eq!(host_proc(host).unwrap().1, vec![0, 0, 0, 0]);
    assert_eq!(read(Path::new(&format!("/proc/{host}/loginuid"))).trim(), "4294967295");
    let (code, st) = c.freeze("n-1");
    assert_eq!(code, 0, "{st}");
    let wait = Instant::now();
    while host_proc(host).is_some_and(|p| p.0 != 'Z') && wait.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(host_proc(host).is_none_or(|p| p.0 == 'Z'), "the former sandbox process survived: {st}");
    let listed = claims(&c)["processes"].as_array().unwrap().iter().any(|p| p["pid"] == pid);
    assert!(listed, "{st}");
}

#[test]
fn p11_credential_switch_hammered_with_tgkill_when_not_pid_1() {
    let uid = 4611;
    let u = uid.to_string();
    let mut c = Container::start_with(
        Opts {
            init_args: vec!["--sandbox-user", &u, "--freeze-timeout", "5"],
            shell_pid1: true,
            ..Default::default()
        },
        &["sleep", "1000000"],
    );
    // The init's pid inside the namespace: the shell (pid 1) started it.
    let ns_init: i32 = read(Path::new(&format!("/proc/{}/status", c.init)))
        .lines()
        .find(|l| l.starts_with("NSpid:"))
        .and_then(|l| l.split_whitespace().last().and_then(|x| x.parse().ok()))
        .unwrap();
    assert_ne!(ns_init, 1);
    let mut results = Vec::new();
    for round in 0..8 {
        let _s = c.launch(uid, &["sleepers", "800"]);
        // Last created, so the switched context signals it last and it has the longest window.
        let _h = c.launch(uid, &["hammer", &ns_init.to_string()]);
        let before = c.status_file()["id"].clone();
        c.signal(libc::SIGUSR1);
        wait_for("a final status", Duration::from_secs(20), || {
            let st = c.status_file();
            st["id"] != before && st["state"] != "freezing"
        });
        assert!(c.alive(), "round {round}: the init died");
        let st = c.status_file();
        let stat = read(Path::new(&format!("/proc/{}/stat", c.init)));
        assert!(!stat.contains(") T "), "round {round}: the init is stopped");
        if st["state"] == "quiescent" {
            assert!(host_live_with_uid(&c, uid).is_empty(), "round {round}: {st}");
        } else {
            assert!(!c.marker_exists(), "{st}");
            assert!(st["reason"].as_str().unwrap().contains("credential helper"), "{st}");
        }
        results.push(st["state"].as_str().unwrap().to_string());
        // Whatever the freeze left, end it before the next round.
        for pid in host_live_with_uid(&c, uid) {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    eprintln!("credential hammer rounds: {results:?}");
}

/// How the self-restarting process of p12 comes in and makes its root child.
#[derive(Clone, Copy, Debug)]
enum Escape {
    /// Entered from outside through `quiesce exec`; a plain fork, so the child goes to PID 1.
    Fork,
    /// Started by a live root shell; clone(CLONE_PARENT) makes the child the shell's.
    ParentUnderLauncher,
    /// Entered from outside; clone(CLONE_PARENT) makes the child's parent the outside (ppid 0).
    ParentFromOutside,
}

/// A root process born during the freeze that nothing marks: a sandbox process restarts itself
/// after the stop with a SIGCONT timer, becomes root for good through a setuid helper, makes a
/// child in a session of its own and exits. Without lineage nothing marks the child, and its
/// parent (PID 1, a launcher, the outside) predates the freeze; the proof must refuse (a failed
/// freeze naming it), never sign while it lives. The escape needs the process restarted within
/// the walk, before the first kill: not every freeze gives it that, so up to 12 fresh
/// namespaces; every freeze that ends quiescent must leave no such child, and the first one with
/// an escape must refuse.
fn escape_is_refused(name: &str, uid: u32, how: Escape) {
    for attempt in 1..=12 {
        // Refreshed every 50 ms: the check knows a launcher or the outside as the sandbox's only
        // from an observation that saw the process there (an escape that completes between the
        // last refresh and the freeze's first observation is the gap docs/threat-model.md names).
        let c = sandbox_setuid(uid, &["--no-lineage", "--track-interval", "0.05"]);
        let suid = setuid_copy(&c);
        let _s = c.launch(uid, &["sleepers", "1000"]);
        let _w = start_escape(&c, uid, &suid, how, "");
        std::thread::sleep(Duration::from_millis(200));
        let (code, st) = c.freeze_bare();
        // The child, if the escape happened: root for good, alive, wherever its parent is.
        let escaped = escaped(&c);
        if escaped.is_empty() {
            assert_eq!(code, 0, "{how:?} attempt {attempt}: {st}");
            continue;
        }
        assert_eq!(code, 1, "{how:?}: a marker was signed while {escaped:?} lives: {st}");
        assert_eq!(st["state"], "failed");
        assert!(!c.marker_exists());
        let reason = st["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("appeared during the freeze"), "{st}");
        let named: Vec<i64> =
            st["survivors"].as_array().unwrap().iter().filter_map(|s| s["pid"].as_i64()).collect();
        for p in &escaped {
            assert!(named.contains(&(*p as i64)), "{how:?}: {p} not named: {st}");
        }
        return;
    }
    skip(name, "the self-restarting process never escaped in 12 freezes here: the refusal was not exercised");
}

#[test]
fn p12_root_child_born_after_the_stop_by_a_self_restarting_process() {
    escape_is_refused("p12_root_child_born_after_the_stop_by_a_self_restarting_process", 4362, Escape::Fork);
}

#[test]
fn p12b_root_child_handed_to_a_live_root_launcher_with_clone_parent() {
    escape_is_refused(
        "p12b_root_child_handed_to_a_live_root_launcher_with_clone_parent",
        4363,
        Escape::ParentUnderLauncher,
    );
}

#[test]
fn p12c_root_child_handed_to_the_outside_with_clone_parent() {
    escape_is_refused(
        "p12c_root_child_handed_to_the_outside_with_clone_parent",
        4364,
        Escape::ParentFromOutside,
    );
}

/// The live processes named `adversary-suid` (the setuid copy's children keep its name).
fn escaped(c: &Container) -> Vec<i32> {
    c.pids()
        .into_iter()
        .filter(|&p| {
            c.stat(p).is_some_and(|s| s.live())
                && c.proc_read(p, "comm").is_some_and(|n| n.trim() == "adversary-suid")
        })
        .collect()
}

/// A quiescent freeze is right about an escapee only if it killed it: a refresh that saw the
/// child under its sandbox parent before the parent exited makes it the sandbox's (ancestry), and
/// the freeze kills it, root or not. Then it must be gone and the marker's; any other quiescent
/// freeze is a marker signed beside it. Returns whether the freeze was quiescent (and right).
fn killed_by_the_freeze(c: &Container, child: i32, code: i32, st: &serde_json::Value, what: &str) -> bool {
    if code != 0 {
        assert_eq!(code, 1, "{what}: {st}");
        return false;
    }
    let gone = (0..50).any(|_| {
        let alive = escaped(c).contains(&child);
        if alive {
            std::thread::sleep(Duration::from_millis(20));
        }
        !alive
    });
    assert!(gone, "{what}: a marker was signed while {child} lives: {st}");
    let killed = st["killed"].as_u64().unwrap_or(0);
    assert!(killed >= 1, "{what}: quiescent with {child} gone but nothing killed: {st}");
    eprintln!("{what}: the escapee's child {child} was seen as the sandbox's and killed: {st}");
    true
}

/// Wait (10 s at most) until `pid` is alive and root in every UID: a child still on its way there
/// is a sandbox process, which the freeze kills (rightly), and the escape was not tested.
fn wait_escaped(c: &Container, pid: i32, what: &str) {
    wait_for(what, Duration::from_secs(10), || {
        escaped(c).contains(&pid) && c.status_line(pid, "Uid").is_some_and(|u| u.iter().all(|x| x == "0"))
    });
}

/// Start cont-escape the way `how` says; `extra`: more cont-escape arguments (`now`).
fn start_escape(c: &Container, uid: u32, suid: &str, how: Escape, extra: &str) -> Workload {
    let status = c.state.join("status.json");
    let status = status.to_str().unwrap();
    let mode = if matches!(how, Escape::Fork) { "fork" } else { "parent" };
    match how {
        Escape::ParentUnderLauncher => {
            // The shell stops itself afterwards rather than forking again: a launcher that
            // starts something during a freeze fails it (its child is a newcomer it cannot
            // vouch for), which is not what these tests look at.
            let q = quiesce();
            let script = format!(
                "'{}' exec --user {uid} --allow-setuid --no-lineage -- '{suid}' cont-escape '{status}' {mode} {extra}; kill -STOP $$",
                q.display()
            );
            c.start_ready(c.exec_cmd(&["sh", "-c", &script]), "cont-escape under a root shell")
        }
        _ => c.launch_bin(
            uid,
            &["--allow-setuid", "--no-lineage"],
            suid,
            &["cont-escape", status, mode, extra],
        ),
    }
}

/// The same escape as p12's, made at once, before any observation can see the process: a root
/// child under the launcher, under the init, or outside, born before the freeze, that nothing
/// observed as the sandbox's. Only the launch record tells the init who started it. Every
/// freeze must refuse, naming the child: deterministic, no attempt left to luck.
#[test]
fn p16_an_escape_before_any_observation_is_refused() {
    for (uid, how) in
        [(4371, Escape::Fork), (4372, Escape::ParentUnderLauncher), (4373, Escape::ParentFromOutside)]
    {
        let c = sandbox_setuid(uid, &["--no-lineage", "--track-interval", "0.05"]);
        let suid = setuid_copy(&c);
        let w = start_escape(&c, uid, &suid, how, "now");
        let child = w.pid;
        std::thread::sleep(Duration::from_millis(200));
        wait_escaped(&c, child, "the escapee's child to be root");
        let (code, st) = c.freeze_bare();
        if killed_by_the_freeze(&c, child, code, &st, &format!("{how:?}")) {
            continue;
        }
        assert!(!c.marker_exists());
        let reason = st["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("born since a launch that lineage does not follow"), "{how:?}: {st}");
        let named: Vec<i64> =
            st["survivors"].as_array().unwrap().iter().filter_map(|s| s["pid"].as_i64()).collect();
        assert!(named.contains(&(child as i64)), "{how:?}: {child} not named: {st}");
        assert!(escaped(&c).contains(&child), "{how:?}: the child was alive throughout");
    }
}

/// A launcher that returns at once (`sh -c 'quiesce exec … &'`) under a root subreaper: the
/// launch is handed to the subreaper before the init takes its record, and escapes at once with a
/// plain fork whose child then goes to the subreaper too. The record names the launcher, which is
/// gone; the init notes the chain above the launch as it is when it takes the record. The init is
/// held (stopped from outside) for 600 ms so that the launcher is surely gone by then; every freeze
/// must refuse, naming the child.
#[test]
fn p17_a_launcher_that_exits_before_the_init_takes_its_record_under_a_subreaper() {
    for (uid, hold) in [(4375, true), (4376, false)] {
        let c = sandbox_setuid(uid, &["--no-lineage", "--track-interval", "0.05"]);
        let suid = setuid_copy(&c);
        let status = c.state.join("status.json");
        let script = format!(
            "'{}' exec --user {uid} --allow-setuid --no-lineage -- '{suid}' cont-escape '{}' fork now & sleep 0.005",
            quiesce().display(),
            status.display()
        );
        if hold {
            unsafe { libc::kill(c.init, libc::SIGSTOP) };
            let init = c.init;
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(600));
                unsafe { libc::kill(init, libc::SIGCONT) };
            });
        }
        let a = adversary();
        let w = c.start_ready(
            c.exec_cmd(&[a.to_str().unwrap(), "subreaper", "sh", "-c", &script]),
            "a launcher under a subreaper",
        );
        std::thread::sleep(Duration::from_millis(700));
        wait_escaped(&c, w.pid, "the escapee's child to be root");
        let (code, st) = c.freeze_bare();
        if killed_by_the_freeze(&c, w.pid, code, &st, &format!("hold {hold}")) {
            continue;
        }
        assert!(!c.marker_exists());
        let named: Vec<i64> =
            st["survivors"].as_array().unwrap().iter().filter_map(|s| s["pid"].as_i64()).collect();
        assert!(named.contains(&(w.pid as i64)), "hold {hold}: {} not named: {st}", w.pid);
    }
}

/// p12b with the load made by the sandbox user itself (a busy loop per core, two writers that
/// fsync without pause on the state dir's file system), which once let the escape happen between
/// the freeze's announcement and its start point. Every attempt that escapes must be refused;
/// the launcher is known from its launch record, so it vouches for nothing whatever was observed.
#[test]
fn p12d_escape_under_a_launcher_while_the_sandbox_loads_the_machine() {
    use std::os::unix::fs::PermissionsExt;
    let uid = 4374;
    let mut escapes = 0;
    for attempt in 1..=6 {
        let c = sandbox_setuid(uid, &["--no-lineage", "--track-interval", "0.05"]);
        let suid = setuid_copy(&c);
        let scratch = c.path("scratch");
        std::fs::create_dir(&scratch).unwrap();
        std::fs::set_permissions(&scratch, std::fs::Permissions::from_mode(0o777)).unwrap();
        let _load = c.launch(uid, &["load", scratch.to_str().unwrap(), "2"]);
        let _s = c.launch(uid, &["sleepers", "1000"]);
        let _w = start_escape(&c, uid, &suid, Escape::ParentUnderLauncher, "");
        std::thread::sleep(Duration::from_millis(200));
        let (code, st) = c.freeze_bare();
        let alive = escaped(&c);
        if alive.is_empty() {
            assert_eq!(code, 0, "attempt {attempt}: {st}");
            continue;
        }
        escapes += 1;
        assert_eq!(code, 1, "attempt {attempt}: a marker was signed while {alive:?} lives: {st}");
        assert!(!c.marker_exists());
    }
    eprintln!("p12d: {escapes} of 6 attempts escaped, every one refused");
}

/// A root launcher that starts something when its sandbox process dies (`sh -c 'quiesce exec …;
/// next'`) does it during the freeze. Without lineage its new child cannot be told from a
/// CLONE_PARENT escape under it: the freeze fails, naming the child. With lineage the sandbox
/// process's own children carry its loginuid, so the launcher's new child is its own.
#[test]
fn p13_a_launcher_that_forks_during_the_freeze() {
    for (uid, lineage) in [(4365, false), (4366, true)] {
        let opts: &[&str] = if lineage { &[] } else { &["--no-lineage"] };
        let c = sandbox_setuid(uid, &[opts, &["--track-interval", "0.05"]].concat());
        let q = quiesce();
        let no = if lineage { "" } else { "--no-lineage" };
        // `sleep` is forked (a command follows it), as a launcher's next step would be; the
        // thousand sleepers make the kill take long enough for it to be alive at the proof.
        let script = format!(
            "'{}' exec --user {uid} {no} -- '{}' sleepers 1000; sleep 30; :",
            q.display(),
            adversary().display()
        );
        let _l = c.start_ready(c.exec_cmd(&["sh", "-c", &script]), "a launcher");
        std::thread::sleep(Duration::from_millis(200));
        let (code, st) = c.freeze_bare();
        if lineage {
            assert_eq!(code, 0, "with lineage: {st}");
            assert_eq!(st["state"], "quiescent");
        } else {
            assert_eq!(code, 1, "without lineage: {st}");
            assert!(!c.marker_exists());
            let reason = st["reason"].as_str().unwrap_or_default();
            assert!(reason.contains("appeared during the freeze") && reason.contains("sleep"), "{st}");
        }
    }
}

/// A root escapee can ptrace a root process of the container into forking for it
/// (docs/threat-model.md, "A sandbox process that is root"). The freeze client, root and alive
/// for the whole freeze, must not be such a process: it makes itself non-dumpable. Root without
/// CAP_SYS_PTRACE, as under Docker's default capabilities, may trace the container's own root
/// command (the control) but not the client.
#[test]
fn p14_the_freeze_client_cannot_be_traced() {
    let uid = 4614;
    let u = uid.to_string();
    let no_ptrace = ["setpriv", "--bounding-set=-sys_ptrace", "--inh-caps=-sys_ptrace"];
    let c = Container::start_with(
        Opts { init_args: vec!["--sandbox-user", &u], prefix: no_ptrace.to_vec(), ..Default::default() },
        &["sleep", "1000000"],
    );
    wait_for("sandbox.json", Duration::from_secs(10), || c.state.join("sandbox.json").exists());
    // The init, stopped from outside, cannot answer: the client waits, as during a long freeze.
    c.signal(libc::SIGSTOP);
    let q = quiesce();
    let st = c.state.to_str().unwrap().to_string();
    let client =
        [&no_ptrace[..], &[q.to_str().unwrap(), "freeze", "--state-dir", &st, "--wait", "--timeout", "20"]]
            .concat();
    let mut cmd = c.exec_cmd(&client);
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    let _client = guard(cmd);
    let find = |name: &str, arg: &str| {
        c.processes().into_iter().find(|p| {
            p.0 != 1
                && p.3 == name
                && c.proc_read(p.0, "cmdline").is_some_and(|l| l.split('\0').any(|a| a == arg))
        })
    };
    wait_for("the freeze client", Duration::from_secs(10), || find("quiesce", "freeze").is_some());
    // The init publishes its sandbox before its command has surely exec'd: under load the
    // command can still be the init's fork here.
    wait_for("the init's command", Duration::from_secs(10), || find("sleep", "1000000").is_some());
    let client_pid = find("quiesce", "freeze").unwrap().0;
    let command_pid = find("sleep", "1000000").expect("the init's command").0;
    let a = adv();
    let seize = |pid: i32| c.exec(&[&no_ptrace[..], &[a.as_str(), "seize", &pid.to_string()]].concat());
    let control = seize(command_pid);
    let out = seize(client_pid);
    c.signal(libc::SIGCONT);
    if !control.status.success() {
        skip(
            "p14_the_freeze_client_cannot_be_traced",
            &format!(
                "root cannot trace the container's own root command here ({}): the client's refusal is not what stops it",
                String::from_utf8_lossy(&control.stderr).trim()
            ),
        );
        return;
    }
    assert_eq!(
        out.status.code(),
        Some(3),
        "the freeze client was traced: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// fs.suid_dumpable set for one test and put back when it ends, panics included.
struct SuidDumpable(String);

impl SuidDumpable {
    fn set(v: &str) -> SuidDumpable {
        let f = "/proc/sys/fs/suid_dumpable";
        let old = std::fs::read_to_string(f).expect("fs.suid_dumpable");
        std::fs::write(f, v).expect("cannot set fs.suid_dumpable");
        SuidDumpable(old.trim().to_string())
    }
}

impl Drop for SuidDumpable {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write("/proc/sys/fs/suid_dumpable", &self.0) {
            eprintln!("cannot put fs.suid_dumpable back to {}: {e}; set it by hand", self.0);
        }
    }
}

/// Every switch to a sandbox UID (the command's privilege drop, which shares the init's memory
/// until its exec, and the init's switch to the UID for its kill) resets the dumpable flag of the
/// init's memory to the host's fs.suid_dumpable; with 1, root without CAP_SYS_PTRACE (and the
/// sandbox UID, for as long as a switch lasts) could trace the init and read its signing key. The
/// init sets the flag back at once. Only fs.suid_dumpable = 1 tells the two apart from outside,
/// so the test sets it for its own length and puts it back.
#[test]
fn p15_the_init_stays_non_dumpable_after_switching_to_a_sandbox_uid() {
    let uid = 4615;
    let u = uid.to_string();
    let no_ptrace = ["setpriv", "--bounding-set=-sys_ptrace", "--inh-caps=-sys_ptrace"];
    let _host = SuidDumpable::set("1");
    let c = Container::start_with(
        Opts {
            init_args: vec!["--sandbox-user", &u, "--run-as", &u],
            prefix: no_ptrace.to_vec(),
            ..Default::default()
        },
        &["sleep", "1000000"],
    );
    wait_for("sandbox.json", Duration::from_secs(10), || c.state.join("sandbox.json").exists());
    let a = adv();
    let seize = |pid: i32| c.exec(&[&no_ptrace[..], &[a.as_str(), "seize", &pid.to_string()]].concat());
    // The control: a dumpable root process of the container with the init's capabilities.
    let mut root = c.exec_cmd(&[&no_ptrace[..], &["sleep", "1000"]].concat());
    root.stdout(Stdio::null());
    let _root = guard(root);
    let root_sleep = || c.processes().into_iter().find(|p| p.1 == 0 && p.3 == "sleep").map(|p| p.0);
    wait_for("a root sleep", Duration::from_secs(10), || root_sleep().is_some());
    let control = seize(root_sleep().unwrap());
    assert!(
        control.status.success(),
        "root could not trace a root process: {}",
        String::from_utf8_lossy(&control.stderr)
    );
    let after_start = seize(1);
    assert_eq!(
        after_start.status.code(),
        Some(3),
        "the init was traceable after its command's privilege drop"
    );
    let _w = c.launch(uid, &["sleepers", "3"]);
    let (code, st) = c.freeze("n-1");
    assert_eq!(code, 0, "{st}");
    let after_freeze = seize(1);
    assert_eq!(
        after_freeze.status.code(),
        Some(3),
        "the init was traceable after a freeze's switches to the sandbox UID"
    );
}

/// The freeze starts from the last tracking refresh, and a freeze leaves it so: a second freeze
/// within the interval starts from the same view, which still shows the sandbox processes the
/// first one killed under their root parent. That parent vouches for nothing in either freeze
/// (without lineage its new children cannot be told from a CLONE_PARENT escape under it). Were
/// the tracking view replaced by the first freeze's last table, the parent would vouch again in
/// the second one and a marker would be signed beside its newcomers.
#[test]
fn p18_a_second_freeze_within_the_interval_starts_from_the_same_tracking_view() {
    let uid = 4781;
    let c = sandbox_setuid(uid, &["--no-lineage", "--track-interval", "60"]);
    // A root parent that forks all the time, with a sandbox process under it: not a recorded
    // launch, so only an observation says it is above it. One process with no children: its
    // death hands the init nothing, so no refresh follows the first freeze.
    let script = format!(
        "setpriv --reuid {uid} --regid {uid} --clear-groups \"$ADV\" sleepers 0 & \
         while :; do sleep 0.3 & sleep 0.01; done"
    );
    let _r = c.start_ready(c.exec_cmd(&["sh", "-c", &script]), "a root parent of sandbox processes");
    // A refresh now, long before the next periodic one: a child handed to the init exits.
    let out = c.exec(&["sh", "-c", "sleep 0.2 & exit 0"]);
    assert!(out.status.success(), "{out:?}");
    std::thread::sleep(Duration::from_millis(600));
    // Before each freeze, 300 sandbox processes under another root parent that does not fork,
    // so that the freeze lasts long enough for the forking parent to make newcomers. Each is that
    // parent's own child, which it reaps: nothing is handed to the init.
    let group = format!(
        "for i in $(seq 300); do setpriv --reuid {uid} --regid {uid} --clear-groups sleep 1000 & done; \
         setpriv --reuid {uid} --regid {uid} --clear-groups \"$ADV\" sleepers 0 & wait"
    );
    for nonce in ["n-1", "n-2"] {
        let _g = c.start_ready(c.exec_cmd(&["sh", "-c", &group]), "300 sandbox processes");
        // The first freeze also has the forking parent's own sandbox process.
        let n = if nonce == "n-1" { 302 } else { 301 };
        wait_for("every sandbox process", Duration::from_secs(30), || c.live_of_uid(uid).len() >= n);
        let (code, st) = c.freeze(nonce);
        assert_eq!(code, 1, "freeze {nonce}: {st}");
        assert!(!c.marker_exists(), "freeze {nonce}: {st}");
        let reason = st["reason"].as_str().unwrap_or_default();
        assert!(
            reason.contains("no parent that can vouch") && reason.contains("sleep"),
            "freeze {nonce}: {st}"
        );
        assert!(c.live_of_uid(uid).is_empty(), "freeze {nonce} left a sandbox process: {st}");
    }
}

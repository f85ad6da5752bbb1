//! Sandbox processes that would escape the init's OOM raise (`src/init/oom.rs`) were it to
//! infer a child's score from its parent's ("a child born after its parent's raise inherited
//! it"): a child whose parent is not its forker (CLONE_PARENT; an orphan handed to a
//! subreaper), and one whose fork copied the score before the raise but stamped its start time
//! after it (a long copy of memory). Each test enters examples/oom_escape as the sandbox user, as
//! `docker exec -u` does (no `quiesce exec`), and fails when a live sandbox process still holds
//! oom_score_adj 0 several refreshes later. With the inference, each one failed; the init now
//! reads each process's own score.

mod common;
use common::*;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn container(uid: u32) -> Container {
    let u = uid.to_string();
    let wrap = "mkdir -p \"$D/state\" && mount -t tmpfs -o size=2048k,mode=755 quiesce-state \"$D/state\" \
                && exec \"$@\" 2>>\"$D/init.log\"";
    let c = Container::start_with(
        Opts {
            init_args: vec!["-v", "--sandbox-user", &u],
            wrap: vec!["sh", "-c", wrap, "sh"],
            ..Default::default()
        },
        &["sleep", "1000000"],
    );
    wait_for("the init to publish its sandbox", Duration::from_secs(10), || {
        std::fs::metadata(format!("/proc/{}/root{}", c.init, c.state.join("sandbox.json").display())).is_ok()
    });
    c
}

fn log(c: &Container) -> String {
    std::fs::read_to_string(c.dir.join("init.log")).unwrap_or_default()
}

fn escape_bin() -> String {
    quiesce().parent().unwrap().join("examples").join("oom_escape").to_str().unwrap().to_string()
}

/// Enter `mode` as `uid` (up to `tries` times, each a fresh entry: a try whose D is raised
/// before its race runs is lost); once a D is raised and 5 s (5 refreshes) more have passed,
/// the processes it reported that are alive, of `uid`, and still at oom_score_adj 0.
fn escapees(mode: &str, uid: u32, extra: &[&str], tries: usize) -> Vec<String> {
    let mut c = container(uid);
    let mut escaped = Vec::new();
    let mut _held = Vec::new();
    for t in 0..tries {
        let out: PathBuf = c.dir.join(format!("escape-{mode}-{t}"));
        let (bin, o) = (escape_bin(), out.to_str().unwrap().to_string());
        let mut args = vec![bin.as_str(), mode, o.as_str()];
        args.extend_from_slice(extra);
        let w = c.start_ready(c.exec_as_cmd(uid, &args), mode);
        let until = Instant::now() + Duration::from_secs(20);
        while c.proc_read(w.pid, "oom_score_adj").map(|s| s.trim().to_string()).as_deref() != Some("1000") {
            assert!(Instant::now() < until, "D {} never raised\n{}", w.pid, log(&c));
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_secs(5));
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        eprintln!("{mode} try {t}: D {} reported:\n{text}", w.pid);
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            let pid: i32 = l.split_whitespace().next().unwrap().parse().unwrap();
            let now = c.proc_read(pid, "oom_score_adj").map(|s| s.trim().to_string());
            let st = c.stat(pid);
            let live = c.live_of_uid(uid).contains(&pid);
            eprintln!("  {pid}: oom_score_adj now {now:?}, live as {uid}: {live}, stat {st:?}");
            if live && now.as_deref() == Some("0") {
                escaped.push(format!("{l} -> still 0"));
            }
        }
        _held.push(w);
        if !escaped.is_empty() {
            break;
        }
    }
    // Tracking still raises: a fresh process entered now is raised within a few refreshes.
    let probe = c.start_ready(c.exec_as_cmd(uid, &[adv().as_str(), "sleepers", "0"]), "probe");
    let until = Instant::now() + Duration::from_secs(10);
    while c.proc_read(probe.pid, "oom_score_adj").map(|s| s.trim().to_string()).as_deref() != Some("1000") {
        assert!(Instant::now() < until, "the probe was never raised: tracking stopped\n{}", log(&c));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(c.alive(), "the init died\n{}", log(&c));
    let text = log(&c);
    let oom: Vec<&str> = text.lines().filter(|l| l.contains("oom")).collect();
    eprintln!("init log (oom lines): {}", oom.join("\n"));
    escaped
}

#[test]
fn attack_oom_clone_parent_child_escapes_the_raise() {
    let e = escapees("clone-parent", 4291, &[], 3);
    assert!(e.is_empty(), "sandbox processes left at oom_score_adj 0: {e:?}");
}

#[test]
fn attack_oom_orphan_reparented_to_a_raised_subreaper_escapes_the_raise() {
    let e = escapees("subreaper", 4292, &[], 3);
    assert!(e.is_empty(), "sandbox processes left at oom_score_adj 0: {e:?}");
}

#[test]
fn attack_oom_fork_spanning_the_parents_raise_escapes_it() {
    let e = escapees("bigfork", 4293, &["256"], 3);
    assert!(e.is_empty(), "sandbox processes left at oom_score_adj 0: {e:?}");
}

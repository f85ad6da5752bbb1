//! Who counts as a sandbox process, how sandbox processes are launched, and `quiesce ps`.

mod common;
use common::*;
use std::process::Command;

fn ps_json(c: &Container, uid: u32) -> Vec<serde_json::Value> {
    let q = quiesce();
    let out = c.exec(&[q.to_str().unwrap(), "ps", "--json", "--sandbox-user", &uid.to_string()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["processes"].as_array().unwrap().clone()
}

fn reasons_of(
    rows: &[serde_json::Value],
    pred: impl Fn(&serde_json::Value) -> bool,
) -> Vec<serde_json::Value> {
    rows.iter().filter(|r| pred(r)).map(|r| r["reasons"].clone()).collect()
}

#[test]
fn taint_reasons_for_each_kind_of_process() {
    let uid = 4501;
    let u = uid.to_string();
    let c = Container::start_with(
        Opts { init_args: vec!["--sandbox-user", &u], setuid: true, ..Default::default() },
        &["sleep", "1000000"],
    );
    // A root process with one thread switched to the sandbox UID.
    let a = adversary();
    let _t = c.launch_root(&["thread-uid", &u]);
    // A setuid-root helper (ruid sandbox, euid 0).
    let suid = setuid_copy(&c);
    let _h = c.launch_bin(uid, &["--allow-setuid"], &suid, &["pause"]);
    // Injected from outside the tree: its parent is outside the namespace (ppid 0).
    let inject = ["setpriv", "--reuid", &u, "--regid", &u, "--clear-groups", a.to_str().unwrap(), "pause"];
    let _i = c.start_ready(c.exec_cmd(&inject), "injected");
    // A root process that is no descendant of anything sandboxed.
    let _r = c.launch_root(&["pause"]);

    let rows = ps_json(&c, uid);
    let by_comm = |comm: &str, uids: serde_json::Value| {
        reasons_of(&rows, |r| r["comm"] == comm && r["uids"] == uids && r["state"] != "Z")
    };
    // thread-uid: the leader is root; the process counts through its thread.
    let thread = reasons_of(&rows, |r| r["comm"] == "adversary" && r["uids"] == serde_json::json!([0, uid]));
    assert_eq!(thread, vec![serde_json::json!(["uid"])], "{rows:#?}");
    let helper = by_comm("adversary-suid", serde_json::json!([0, uid]));
    assert_eq!(helper, vec![serde_json::json!(["uid", "lineage"])], "{rows:#?}");
    let injected = reasons_of(&rows, |r| r["ppid"] == 0 && r["uids"] == serde_json::json!([uid]));
    assert_eq!(injected, vec![serde_json::json!(["uid"])], "{rows:#?}");
    let root = reasons_of(&rows, |r| r["comm"] == "adversary" && r["uids"] == serde_json::json!([0]));
    assert_eq!(root, vec![serde_json::json!([])], "{rows:#?}");
    // PID 1, the root service, is never tainted.
    assert_eq!(rows.iter().find(|r| r["pid"] == 1).unwrap()["sandbox"], false);
}

#[test]
fn ancestry_taints_root_descendants_of_a_sandbox_process() {
    let uid = 4502;
    let u = uid.to_string();
    let c = Container::start_with(
        Opts { init_args: vec!["--sandbox-user", &u], setuid: true, ..Default::default() },
        &["sleep", "1000000"],
    );
    let suid = setuid_copy(&c);
    // The setuid helper's children: a sleeper tree whose members are all ruid sandbox, euid 0.
    let _h = c.launch_bin(uid, &["--allow-setuid", "--no-lineage"], &suid, &["sleepers", "3"]);
    let rows = ps_json(&c, uid);
    let parent = rows.iter().find(|r| r["comm"] == "adversary-suid" && r["ppid"] == 0).expect("helper");
    let kids: Vec<_> = rows.iter().filter(|r| r["ppid"] == parent["pid"]).collect();
    assert_eq!(kids.len(), 3, "{rows:#?}");
    for k in kids {
        assert_eq!(k["reasons"], serde_json::json!(["uid", "ancestry"]));
    }
}

#[test]
fn ps_human_output_is_aligned_and_names_reasons() {
    let uid = 4503;
    let u = uid.to_string();
    let mut c = Container::start(&["--sandbox-user", &u], &["sleep", "1000000"]);
    c.wait_published();
    let _w = c.launch(uid, &["sleepers", "2"]);
    let q = quiesce();
    let st = c.state.to_str().unwrap().to_string();
    // With no --sandbox-user, ps uses the UIDs the running init published.
    let out = c.exec(&[q.to_str().unwrap(), "ps", "--state-dir", &st]);
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("    PID    PPID USER"), "{text}");
    let col = lines[0].find("COMMAND").unwrap();
    let sandboxed: Vec<&&str> = lines.iter().filter(|l| l.contains("uid,lineage")).collect();
    assert_eq!(sandboxed.len(), 1, "{text}");
    assert!(lines.iter().filter(|l| l.contains("ancestry")).count() == 2, "{text}");
    assert!(lines[1..].iter().all(|l| l.len() > col), "{text}");
}

#[test]
fn sandbox_user_refusals_happen_before_anything_runs() {
    let d = scratch("refuse");
    for (spec, needle) in
        [("root", "UID 0"), ("0", "UID 0"), ("no-such-user", "not in /etc/passwd"), ("a:b", "malformed")]
    {
        let ran = d.join("ran");
        let out = output(
            Command::new(quiesce())
                .args(["--sandbox-user", spec, "--state-dir"])
                .arg(d.join("state"))
                .args(["--", "touch"])
                .arg(&ran),
        );
        assert_eq!(out.status.code(), Some(2), "{spec}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(&format!("'{spec}'")) && err.contains(needle), "{err}");
        assert!(!ran.exists(), "{spec}: the command ran");
    }
}

#[test]
fn run_as_drops_privileges_sets_no_new_privs_and_tags_lineage() {
    let out = output(
        Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "--kill-child"])
            .arg(quiesce())
            .args(["--run-as", "4504", "--", "sh", "-c"])
            .arg("grep -E '^(Uid|Gid|Groups|NoNewPrivs):' /proc/self/status; cat /proc/self/loginuid; echo"),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Uid:\t4504\t4504\t4504\t4504"), "{text}");
    assert!(text.contains("Gid:\t4504\t4504\t4504\t4504"), "{text}");
    assert!(text.contains("NoNewPrivs:\t1"), "{text}");
    assert!(text.lines().any(|l| l.trim() == "4504"), "loginuid: {text}");
}

#[test]
fn exec_runs_in_place_with_the_commands_status() {
    let c = Container::start(&[], &["sleep", "1000000"]);
    let q = quiesce();
    let out = c.exec(&[q.to_str().unwrap(), "exec", "--user", "4505", "--", "sh", "-c", "id -u; exit 7"]);
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "4505");
    let out = c.exec(&[q.to_str().unwrap(), "exec", "--user", "4505", "--", "no-such-thing"]);
    assert_eq!(out.status.code(), Some(127));
    let out = c.exec(&[q.to_str().unwrap(), "exec", "--user", "root!", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_process_that_execs_from_a_thread_is_never_read_as_dead() {
    // Each exec from a thread that is not the leader swaps that thread into the leader's pid while
    // the old leader is a zombie. A read of /proc/PID that straddles the swap goes through the old
    // leader: Z, with a count of 0 once the kernel released it, or with its other threads gone by
    // the time the task directory is read. A live process read as dead gets no kill of its own and
    // passes the proof, so every read must count it alive. 11,500 groups make each status read
    // long enough for the swap to land inside it (about 5 in 3,000 reads did, when it could).
    let uid = 4509;
    let c = Container::start(&["--sandbox-user", &uid.to_string()], &["sleep", "1000000"]);
    let hop = c.launch_root(&["exec-hop", "11500"]);
    let q = quiesce();
    let script =
        format!("for i in $(seq 3000); do '{}' ps --json --sandbox-user {uid} || exit 1; done", q.display());
    let out = c.exec(&["sh", "-c", &script]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (mut read, mut absent) = (0, 0);
    for doc in serde_json::Deserializer::from_slice(&out.stdout).into_iter::<serde_json::Value>() {
        let doc = doc.expect("quiesce ps printed something that is not JSON");
        match doc["processes"].as_array().unwrap().iter().find(|p| p["pid"] == hop.pid) {
            Some(p) => {
                read += 1;
                assert_eq!(p["alive"], true, "read {read}: the hopping process read as dead: {p}");
            }
            None => absent += 1,
        }
    }
    eprintln!("exec hop: {read} reads alive, {absent} without it");
    assert!(read >= 2900, "{read} reads found the process, {absent} did not");
}

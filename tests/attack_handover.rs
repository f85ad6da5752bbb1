//! Attacks on `verify --hand-over`, as the agent (UID 4661) who read the source, each found by a
//! review and fixed. Each test asserts the safe outcome: a failing one is an attack that works
//! again (its message says how).

mod common;
use common::services::*;
use common::*;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const AGENT: u32 = 4661;
const SERVICE: u32 = 65520;
const SVC: &str = "65520";

/// A python service written by the agent into `dir`: listens on `port`, and as the service user
/// runs `hostile` (python source, indented by 4) in a thread.
fn py_service(c: &Container, dir: &Path, name: &str, port: u16, hostile: &str) -> Guard {
    common::services::hostile_py(c, (AGENT, SERVICE), dir, name, port, "", hostile)
}

fn workspace(c: &Container) -> (PathBuf, PathBuf) {
    common::services::workspace(c, AGENT)
}

fn agent_service(c: &Container, dir: &Path, args: &[&str], port: u16) -> Guard {
    common::services::agent_service(c, &[], &["--user", &AGENT.to_string()], dir, args, port)
}

fn vcmd(c: &Container, opts: &[&str], cmd: &[&str]) -> Command {
    let st = c.state.to_str().unwrap().to_string();
    let q = quiesce();
    let mut full = vec![q.to_str().unwrap().to_string(), "verify".into(), "--state-dir".into(), st];
    full.extend(opts.iter().map(|s| s.to_string()));
    full.push("--".into());
    full.extend(cmd.iter().map(|s| s.to_string()));
    c.exec_cmd(&full)
}

fn as_agent(c: &Container, sh: &str) {
    let o = c.exec_as(AGENT, &["sh", "-c", sh]);
    assert!(o.status.success(), "agent setup `{sh}`: {}", said(&o));
}

/// A1. A protected file the service user can write through a hard link outside the protected
/// tree: access(2) on the protected path says "no" only because a parent is not searchable.
#[test]
fn x01_hardlink_to_a_protected_file_behind_an_unsearchable_dir() {
    let _serial = serial();
    let c = sandbox(AGENT, &[]);
    let (work, reward) = workspace(&c);
    let port = free_port();
    let alias = c.dir.join("alias");
    let hostile = common::services::indent(&format!(
        "while True:\n    try: open('{}','w').write('1337\\n')\n    except OSError as e: pass\n    time.sleep(0.01)",
        alias.display()
    ));
    let _svc = py_service(&c, &work, "serve.py", port, &hostile);
    // The agent hides its answer in a directory of its own that only it may search.
    let w = work.display();
    as_agent(
        &c,
        &format!(
            "mkdir {w}/priv && echo 42 > {w}/priv/answer.txt && chmod 666 {w}/priv/answer.txt \
             && ln {w}/priv/answer.txt {a} && chmod 700 {w}/priv",
            a = alias.display()
        ),
    );
    let (code, st) = c.freeze("x01");
    assert_eq!(code, 0, "freeze: {st}");
    std::fs::write(work.join("priv/answer.txt"), "42\n").unwrap();
    let (ws, rs) = (work.to_str().unwrap(), reward.to_str().unwrap());
    let check =
        format!("sleep 1; cat {ws}/priv/answer.txt; [ \"$(cat {ws}/priv/answer.txt)\" = 42 ] && echo intact");
    let out = output(&mut vcmd(
        &c,
        &["--hand-over", "--service-user", SVC, "--protect", ws, "--protect", rs],
        &["sh", "-c", &check],
    ));
    let now = std::fs::read_to_string(work.join("priv/answer.txt")).unwrap();
    assert!(
        out.status.code() == Some(20) || (now == "42\n" && said(&out).contains("intact")),
        "ATTACK WORKED: verify exit {:?}, protected {ws}/priv/answer.txt now {now:?}: {}",
        out.status.code(),
        said(&out)
    );
}

/// A2. A symbolic link inside the protected tree to a directory outside it: the walk does not
/// follow it, and the files behind it are the service user's to write.
#[test]
fn x02_symlinked_directory_inside_the_protected_tree_is_not_walked() {
    let _serial = serial();
    let c = sandbox(AGENT, &[]);
    let (work, reward) = workspace(&c);
    let port = free_port();
    let out_dir = c.dir.join("outside");
    let hostile = common::services::indent(&format!(
        "while True:\n    try: open('{}/answer.txt','w').write('1337\\n')\n    except OSError: pass\n    time.sleep(0.01)",
        out_dir.display()
    ));
    let _svc = py_service(&c, &work, "serve.py", port, &hostile);
    let w = work.display();
    as_agent(
        &c,
        &format!(
            "mkdir -m 755 {o} && echo 42 > {o}/answer.txt && chmod 666 {o}/answer.txt && ln -s {o} {w}/sub",
            o = out_dir.display()
        ),
    );
    let (code, st) = c.freeze("x02");
    assert_eq!(code, 0, "freeze: {st}");
    std::fs::write(out_dir.join("answer.txt"), "42\n").unwrap();
    let (ws, rs) = (work.to_str().unwrap(), reward.to_str().unwrap());
    let check = format!("sleep 1; [ \"$(cat {ws}/sub/answer.txt)\" = 42 ] && echo intact");
    let out = output(&mut vcmd(
        &c,
        &["--hand-over", "--service-user", SVC, "--protect", ws, "--protect", rs],
        &["sh", "-c", &check],
    ));
    assert!(
        out.status.code() == Some(20) || said(&out).contains("intact"),
        "ATTACK WORKED: verify exit {:?}, {ws}/sub/answer.txt now {:?}: {}",
        out.status.code(),
        std::fs::read_to_string(work.join("sub/answer.txt")),
        said(&out)
    );
}

/// A3. The services inherit verify's descriptors: its stdout, here a log file in the protected
/// reward dir (as `verify ... > /logs/verifier/test-stdout.txt`), is the service's to rewrite.
#[test]
fn x03_service_rewrites_verifys_stdout_file_in_the_protected_dir() {
    let _serial = serial();
    let c = sandbox(AGENT, &[]);
    let (work, reward) = workspace(&c);
    let port = free_port();
    let hostile = common::services::indent(
        "while True:\n    try:\n        os.ftruncate(1,0); os.lseek(1,0,0); os.write(1,b'== 12 passed in 0.1s (forged) ==\\n')\n    except OSError: pass\n    time.sleep(0.01)",
    );
    let _svc = py_service(&c, &work, "serve.py", port, &hostile);
    let (code, st) = c.freeze("x03");
    assert_eq!(code, 0, "freeze: {st}");
    let (ws, rs) = (work.to_str().unwrap(), reward.to_str().unwrap());
    let st = c.state.to_str().unwrap().to_string();
    let q = quiesce();
    let sh = format!(
        "exec {q} verify --state-dir {st} --hand-over --protect {ws} --protect {rs} -- \
         sh -c 'echo 3 failed; sleep 1' > {rs}/test-stdout.txt 2>&1",
        q = q.display()
    );
    let out = output(&mut c.exec_cmd(&["sh", "-c", &sh]));
    let log = std::fs::read_to_string(reward.join("test-stdout.txt")).unwrap_or_default();
    assert!(
        !log.contains("forged"),
        "ATTACK WORKED: verify exit {:?}; {rs}/test-stdout.txt (root's 0644, protected) is now {log:?}",
        out.status.code()
    );
}

/// A4. The services inherit verify's stdin: a test script fed on stdin (`verify -- sh -s <
/// test.sh`) is read by the service first; the shell then sees EOF and exits 0.
#[test]
fn x04_service_steals_the_test_script_from_stdin() {
    let _serial = serial();
    let c = sandbox(AGENT, &[]);
    let (work, reward) = workspace(&c);
    let port = free_port();
    let hostile = common::services::indent("while True:\n    if not os.read(0, 65536): break");
    let _svc = py_service(&c, &work, "serve.py", port, &hostile);
    let (code, st) = c.freeze("x04");
    assert_eq!(code, 0, "freeze: {st}");
    let (ws, rs) = (work.to_str().unwrap(), reward.to_str().unwrap());
    let script = b"echo running the tests; exit 7\n";
    let run = |opts: &[&str]| {
        let mut cmd = vcmd(&c, opts, &["sh", "-s"]);
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut ch = cmd.spawn().unwrap();
        let mut i = ch.stdin.take().unwrap();
        i.write_all(script).unwrap();
        drop(i);
        ch.wait_with_output().unwrap()
    };
    let plain = run(&[]);
    assert_eq!(plain.status.code(), Some(7), "{}", said(&plain));
    let handed = run(&["--hand-over", "--service-user", SVC, "--protect", ws, "--protect", rs]);
    assert_eq!(
        handed.status.code(),
        Some(7),
        "ATTACK WORKED: the failing test script, fed on stdin, exited {:?} with the hand-over: {}",
        handed.status.code(),
        said(&handed)
    );
}

/// A5. verify killed while the command runs (a harness's timeout: SIGTERM): nothing stops the
/// services, which run on as the service user past verify.
#[test]
fn x05_services_outlive_a_verify_that_is_terminated() {
    let _serial = serial();
    let c = sandbox(AGENT, &[]);
    let (work, reward) = workspace(&c);
    let port = free_port();
    let _svc = py_service(&c, &work, "serve.py", port, "    pass\n");
    let (code, st) = c.freeze("x05");
    assert_eq!(code, 0, "freeze: {st}");
    let (ws, rs) = (work.to_str().unwrap(), reward.to_str().unwrap());
    let st = c.state.to_str().unwrap().to_string();
    let q = quiesce();
    let sh = format!(
        "timeout -s TERM 4 {q} verify --state-dir {st} --hand-over --protect {ws} --protect {rs} -- sleep 30 >/dev/null 2>&1 </dev/null; echo rc=$?",
        q = q.display()
    );
    let out = output(&mut c.exec_cmd(&["sh", "-c", &sh]));
    std::thread::sleep(Duration::from_secs(1));
    let left = c.live_of_uid(SERVICE);
    let rec = std::fs::read_to_string(c.state.join("handover.json")).unwrap_or_default();
    assert!(
        left.is_empty() && !listening(port),
        "ATTACK WORKED: after verify was terminated ({}), service-user processes {left:?} live on, port {port} \
         listening={}; handover.json state: {}",
        said(&out).trim(),
        listening(port),
        rec.lines().find(|l| l.contains("\"state\"")).unwrap_or("?").trim()
    );
}

/// A6. A service started first SIGSTOPs the next service's vfork child between its setresuid
/// and its exec: verify waits in vfork for ever.
#[test]
fn x06_vfork_child_stopped_by_an_earlier_service_hangs_verify() {
    let _serial = serial();
    let c = sandbox(AGENT, &[]);
    let (work, reward) = workspace(&c);
    let (pa, pb) = (free_port(), free_port());
    let flag = c.dir.join("stopped");
    let stopper = work.join("stopper");
    // Built here from its source (g++, which scripts/test installs, brings the C compiler).
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/attack_bin/stopper.c");
    match std::process::Command::new("cc").args(["-O2", "-static", "-o"]).arg(&stopper).arg(src).status() {
        Ok(s) if s.success() => {}
        other => {
            skip("x06", &format!("cannot build the stopper with cc ({other:?}): install gcc"));
            return;
        }
    }
    std::os::unix::fs::chown(&stopper, Some(AGENT), Some(AGENT)).unwrap();
    let pas = pa.to_string();
    let _a = agent_service(&c, &work, &[stopper.to_str().unwrap(), &pas, "next", flag.to_str().unwrap()], pa);
    // B's executable: python, made slow to digest (sparse tail): A is up before B is spawned.
    let bin = work.join("pyb");
    as_agent(&c, &format!("cp {PY} {b} && truncate -s 3G {b}", b = bin.display()));
    let bscript = work.join("b.py");
    std::fs::write(
        &bscript,
        format!(
            "import socket,time\ns=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
             s.bind(('127.0.0.1',{pb})); s.listen(4)\nwhile True: time.sleep(1)\n"
        ),
    )
    .unwrap();
    // B runs in a deep directory: its chdir, after the drop and before the exec, is slow.
    let deep = work.join("a/".repeat(450));
    std::fs::create_dir_all(&deep).unwrap();
    let _b = agent_service(&c, &deep, &[bin.to_str().unwrap(), bscript.to_str().unwrap()], pb);
    let (code, st) = c.freeze("x06");
    assert_eq!(code, 0, "freeze: {st}");
    let (ws, rs) = (work.to_str().unwrap(), reward.to_str().unwrap());
    let mut cmd = vcmd(
        &c,
        &["--hand-over", "--service-user", SVC, "--protect", ws, "--protect", rs, "--service-wait", "30"],
        &["true"],
    );
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    let mut ch = cmd.spawn().unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = ch.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() >= until {
            let _ = ch.kill();
            let _ = ch.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let hit = std::fs::read_to_string(&flag).ok();
    let states: Vec<_> =
        c.processes().into_iter().filter(|p| p.1 == SERVICE || p.3.contains("quiesce")).collect();
    assert!(
        status.is_some(),
        "ATTACK WORKED: verify still running after 60 s (service-wait 30); A stopped pid {hit:?}; {states:?}"
    );
    eprintln!(
        "x06: verify ended {status:?}; A's SIGSTOP hit {hit:?}; record {}",
        std::fs::read_to_string(c.state.join("handover.json")).unwrap_or_default()
    );
}

/// A7. While verify kills the services it is, on its main thread, the service user (real and
/// effective UID 65530): a service can SIGSTOP verify in that window.
#[test]
fn x07_services_stop_verify_while_it_is_the_service_user() {
    let _serial = serial();
    let c = sandbox(AGENT, &[]);
    let (work, reward) = workspace(&c);
    let port = free_port();
    let flag = c.dir.join("hit");
    // 100 spinning processes (RLIMIT_NPROC is 256), each trying SIGSTOP on verify (the parent).
    let stopper = work.join("stopper");
    // Built here from its source (g++, which scripts/test installs, brings the C compiler).
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/attack_bin/stopper.c");
    match std::process::Command::new("cc").args(["-O2", "-static", "-o"]).arg(&stopper).arg(src).status() {
        Ok(s) if s.success() => {}
        other => {
            skip("x06", &format!("cannot build the stopper with cc ({other:?}): install gcc"));
            return;
        }
    }
    std::os::unix::fs::chown(&stopper, Some(AGENT), Some(AGENT)).unwrap();
    let ps = port.to_string();
    let _svc =
        agent_service(&c, &work, &[stopper.to_str().unwrap(), &ps, "parent", flag.to_str().unwrap()], port);
    let (code, st) = c.freeze("x07");
    assert_eq!(code, 0, "freeze: {st}");
    let (ws, rs) = (work.to_str().unwrap(), reward.to_str().unwrap());
    let mut cmd =
        vcmd(&c, &["--hand-over", "--service-user", SVC, "--protect", ws, "--protect", rs], &["sleep", "2"]);
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    let mut ch = cmd.spawn().unwrap();
    let until = Instant::now() + Duration::from_secs(40);
    let status = loop {
        if let Some(s) = ch.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() >= until {
            let _ = ch.kill();
            let _ = ch.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let hit = std::fs::read_to_string(&flag).ok();
    assert!(
        status.is_some() && hit.is_none(),
        "ATTACK WORKED: verify {status:?} (None: hung 40 s); SIGSTOP on verify succeeded: {hit:?}"
    );
}

/// A8. A declared service (`--service PORT=COMMAND`, the task's own start) gets the agent's
/// recorded environment: the agent's PATH picks what "python3" is.
#[test]
fn x08_declared_service_runs_the_agents_binary_through_its_recorded_path() {
    let _serial = serial();
    let c = sandbox(AGENT, &[]);
    let (work, reward) = workspace(&c);
    let port = free_port();
    let pwned = c.dir.join("pwned");
    let bin = work.join("bin");
    as_agent(
        &c,
        &format!(
            "mkdir {b} && printf '#!/bin/sh\\necho agent code ran as $(id -u) > {p}\\nexec {PY} \"$@\"\\n' > {b}/python3 && chmod 755 {b}/python3",
            b = bin.display(),
            p = pwned.display()
        ),
    );
    let path = format!("PATH={}:/usr/bin:/bin", bin.display());
    let ps = port.to_string();
    let _svc =
        agent_service(&c, &work, &["env", &path, PY, "-m", "http.server", &ps, "--bind", "127.0.0.1"], port);
    let _ = std::fs::remove_file(&pwned);
    let (code, st) = c.freeze("x08");
    assert_eq!(code, 0, "freeze: {st}");
    let (ws, rs) = (work.to_str().unwrap(), reward.to_str().unwrap());
    let decl = format!("{port}=exec python3 -m http.server {port} --bind 127.0.0.1");
    let out = output(&mut vcmd(
        &c,
        &["--hand-over", "--service-user", SVC, "--protect", ws, "--protect", rs, "--service", &decl],
        &["true"],
    ));
    let ran = std::fs::read_to_string(&pwned).ok();
    assert!(
        ran.is_none(),
        "ATTACK WORKED: verify exit {:?}; the task's declared start ran the agent's bin/python3: {ran:?}",
        out.status.code()
    );
}

/// A9. A service binds ports it never recorded (ones the tests use): handover.json says nothing.
#[test]
fn x09_a_service_listens_on_ports_it_was_not_recorded_with() {
    let _serial = serial();
    let c = sandbox(AGENT, &[]);
    let (work, reward) = workspace(&c);
    let (port, squat) = (free_port(), free_port());
    let hostile = common::services::indent(&format!(
        "t=socket.socket(); t.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1); t.bind(('0.0.0.0',{squat})); t.listen(4)\n\
         while True: time.sleep(1)"
    ));
    let _svc = py_service(&c, &work, "serve.py", port, &hostile);
    let (code, st) = c.freeze("x09");
    assert_eq!(code, 0, "freeze: {st}");
    let (ws, rs) = (work.to_str().unwrap(), reward.to_str().unwrap());
    // The tests' own reference server on `squat`.
    let tests = format!("sleep 0.5; {PY} -c \"import socket; socket.socket().bind(('127.0.0.1',{squat}))\" && echo tests-server-up");
    let out = output(&mut vcmd(
        &c,
        &["--hand-over", "--service-user", SVC, "--protect", ws, "--protect", rs],
        &["sh", "-c", &tests],
    ));
    let rec = std::fs::read_to_string(c.state.join("handover.json")).unwrap_or_default();
    // Safe: the tests got their port, or verify refused their verdict, naming the port taken.
    let refused = out.status.code() == Some(20) && said(&out).contains(&format!("[{squat}]"));
    assert!(
        said(&out).contains("tests-server-up") || refused,
        "ATTACK WORKED: verify exit {:?}; the tests could not bind their port {squat} (taken by the service \
         user); handover.json records ports: {:?}",
        out.status.code(),
        rec.lines()
            .filter(|l| l.trim().chars().all(|ch| ch.is_ascii_digit() || ch == ',' || ch.is_whitespace()))
            .map(str::trim)
            .collect::<Vec<_>>()
    );
}

/// A10. A socket table of ~19,000 listening sockets (and their fds) at the freeze: the new
/// evidence reads (/proc/net/tcp at 8 MiB, /proc/PID/fd of every target) must stay bounded.
#[test]
fn x10_a_large_socket_table_at_the_freeze() {
    let _serial = serial();
    let c = sandbox(AGENT, &[]);
    let (work, _reward) = workspace(&c);
    let port = free_port();
    let script = format!(
        "import socket,time,os\nkeep=[]\n\
         for i in range(19000):\n\
         \x20   s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(1); keep.append(s)\n\
         m=socket.socket(); m.bind(('127.0.0.1',{port})); m.listen(4)\n\
         while True: time.sleep(1)\n"
    );
    std::fs::write(work.join("many.py"), script).unwrap();
    let _svc = agent_service(&c, &work, &[PY, "many.py"], port);
    let t = Instant::now();
    let (code, st) = c.freeze("x10");
    let took = t.elapsed();
    let m = c.marker_claims();
    eprintln!(
        "x10: freeze exit {code} in {took:?}; services recorded {}; endpoints of the first {}",
        m["services"].as_array().map_or(0, |a| a.len()),
        m["services"][0]["listen"].as_array().map_or(0, |a| a.len())
    );
    assert_eq!(code, 0, "freeze: {st}");
    assert!(took < Duration::from_secs(10), "freeze took {took:?}");
}

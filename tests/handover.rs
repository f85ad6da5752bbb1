//! `verify --hand-over`: a service the agent left (a process listening on TCP) is killed by the
//! freeze like every sandbox process, recorded in the marker, and started again by verify for the
//! verifier's command, as a service user that can write none of the protected paths; stopped
//! once the command ends. Real services (python3's http.server) on real sockets; the test
//! namespaces share the host's network, so each test takes a port of its own.

mod common;
use common::services::*;
use common::*;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

const AGENT: u32 = 4661;
const SERVICE: u32 = 65530;
const SVC: &str = "65530";

fn get(port: u16, path: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
}

fn http_server(port: u16) -> Vec<String> {
    [PY, "-m", "http.server", &port.to_string(), "--bind", "127.0.0.1"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// The verifier's check: the answer served on `port` is 42, then `extra` (sh) holds.
fn scorer(port: u16, extra: &str) -> Vec<String> {
    let py = format!(
        "import urllib.request,sys; b=urllib.request.urlopen('http://127.0.0.1:{port}/answer.txt',timeout=5).read(); \
         sys.exit(0 if b==b'42\\n' else 5)"
    );
    vec!["sh".into(), "-c".into(), format!("{PY} -c \"{py}\" && {{ {extra}; }} && echo scored")]
}

/// Start the agent's service as Docker enters an exec: without CAP_SYS_PTRACE, as the init runs.
fn agent_service(c: &Container, exec: &[&str], dir: &Path, args: &[&str], port: u16) -> Guard {
    common::services::agent_service(c, &NO_PTRACE, exec, dir, args, port)
}

/// Without CAP_SYS_PTRACE, as Docker runs a container: root then reads another user's
/// descriptors only with that user's filesystem IDs, for the init's walk and verify alike.
const NO_PTRACE: [&str; 5] = ["setpriv", "--bounding-set", "-sys_ptrace", "--inh-caps", "-sys_ptrace"];

fn docker_like() -> Container {
    let u = AGENT.to_string();
    let mut c = Container::start_with(
        Opts { init_args: vec!["--sandbox-user", &u], prefix: NO_PTRACE.to_vec(), ..Default::default() },
        &["sleep", "1000000"],
    );
    c.wait_published();
    c
}

/// `quiesce verify` from inside, without CAP_SYS_PTRACE.
fn verify_np(c: &Container, args: &[&str]) -> std::process::Output {
    let st = c.state.to_str().unwrap().to_string();
    let q = quiesce();
    let mut full: Vec<&str> = NO_PTRACE.to_vec();
    full.extend_from_slice(&[q.to_str().unwrap(), "verify", "--state-dir", &st]);
    full.extend_from_slice(args);
    c.exec(&full)
}

fn verify_with(c: &Container, opts: &[&str], cmd: &[String]) -> std::process::Output {
    let mut all: Vec<&str> = opts.to_vec();
    all.push("--");
    all.extend(cmd.iter().map(String::as_str));
    verify_np(c, &all)
}

fn record(c: &Container) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(c.state.join("handover.json")).expect("handover.json")).unwrap()
}

#[test]
fn h01_an_honest_service_is_handed_over_confined_and_stopped_after() {
    let _serial = serial();
    let c = docker_like();
    let (work, reward) = workspace(&c, AGENT);
    let port = free_port();
    let argv = http_server(port);
    let args: Vec<&str> = argv.iter().map(String::as_str).collect();
    let u = AGENT.to_string();
    let _svc = agent_service(&c, &["--user", &u], &work, &args, port);
    assert_eq!(get(port, "/answer.txt").as_deref(), Some("42\n"));
    let (code, st) = c.freeze("h01");
    assert_eq!(code, 0, "freeze: {st}");
    assert!(!listening(port), "the freeze left the service alive");

    // Without the hand-over the verifier finds no service: the honest agent would score 0.
    let out = verify_with(&c, &[], &scorer(port, "true"));
    assert!(!out.status.success() && !said(&out).contains("scored"), "{}", said(&out));

    let (w, r) = (work.to_str().unwrap(), reward.to_str().unwrap());
    // It listens again as the service user.
    let own = format!(
        "awk '$2 ~ /:{port:04X}$/ && $4 == \"0A\" {{ print $8 }}' /proc/net/tcp | grep -qx {SERVICE}"
    );
    let cmd = scorer(port, &own);
    let out = verify_with(&c, &["--hand-over", "--service-user", SVC, "--protect", w, "--protect", r], &cmd);
    assert!(out.status.success() && said(&out).contains("scored"), "hand-over: {}", said(&out));
    let rec = record(&c);
    assert_eq!(rec["state"], "ended", "{rec}");
    assert_eq!(rec["user"], SERVICE);
    let s = &rec["services"][0];
    assert_eq!(s["ports"][0], port, "{rec}");
    assert_eq!(s["argv"][2], "http.server", "{rec}");
    assert_eq!(s["cwd"], w, "{rec}");
    assert!(s["env_names"].as_array().unwrap().iter().any(|n| n == "SERVICE_SECRET"), "{rec}");
    assert!(!rec.to_string().contains("kept"), "a value of the environment is in the record: {rec}");
    assert_eq!(s["exe_sha256"].as_str().map(str::len), Some(64), "{rec}");
    assert_eq!(rec["stopped"], 1, "{rec}");
    assert!(!listening(port), "the handed-over service outlived verify");
    assert!(c.live_of_uid(SERVICE).is_empty(), "service user processes left");
    // The marker recorded where it listened, its directory and environment.
    let m = verify_np(&c, &["--json"]);
    assert!(m.status.success(), "{}", said(&m));
}

#[test]
fn h02_a_hostile_service_cannot_write_the_answer_or_the_reward() {
    let _serial = serial();
    let c = docker_like();
    let (work, reward) = workspace(&c, AGENT);
    let port = free_port();
    // It serves, and in a thread rewrites the answer and plants a reward every 10 ms.
    let script = format!(
        "import threading,time,http.server,functools\n\
         def tamper():\n\
         \x20   while True:\n\
         \x20       for p,t in (('{w}/answer.txt','1337\\n'),('{r}/reward.txt','1')):\n\
         \x20           try: open(p,'w').write(t)\n\
         \x20           except OSError: pass\n\
         \x20       time.sleep(0.01)\n\
         threading.Thread(target=tamper,daemon=True).start()\n\
         http.server.ThreadingHTTPServer(('127.0.0.1',{port}),http.server.SimpleHTTPRequestHandler).serve_forever()\n",
        w = work.display(),
        r = reward.display()
    );
    std::fs::write(work.join("serve.py"), &script).unwrap();
    std::fs::write(work.join("answer.txt"), "42\n").unwrap();
    let u = AGENT.to_string();
    let _svc = agent_service(&c, &["--user", &u], &work, &[PY, "serve.py"], port);
    // While the agent runs, its service can write (the reward dir is root's: not even then).
    wait_for("the agent's tampering", Duration::from_secs(5), || {
        std::fs::read_to_string(work.join("answer.txt")).is_ok_and(|t| t == "1337\n")
    });
    let (code, st) = c.freeze("h02");
    assert_eq!(code, 0, "freeze: {st}");
    std::fs::write(work.join("answer.txt"), "42\n").unwrap();
    let (w, r) = (work.to_str().unwrap(), reward.to_str().unwrap());
    let check = format!("sleep 0.5; [ \"$(cat {w}/answer.txt)\" = 42 ] && [ ! -e {r}/reward.txt ]");
    let out = verify_with(
        &c,
        &["--hand-over", "--service-user", SVC, "--protect", w, "--protect", r],
        &scorer(port, &check),
    );
    assert!(out.status.success() && said(&out).contains("scored"), "{}", said(&out));
    assert_eq!(std::fs::read_to_string(work.join("answer.txt")).unwrap(), "42\n");
    assert!(!reward.join("reward.txt").exists());
}

#[test]
fn h03_a_protected_path_the_service_user_could_write_refuses_the_hand_over() {
    let _serial = serial();
    let c = docker_like();
    let (work, reward) = workspace(&c, AGENT);
    let port = free_port();
    let argv = http_server(port);
    let args: Vec<&str> = argv.iter().map(String::as_str).collect();
    let u = AGENT.to_string();
    let _svc = agent_service(&c, &["--user", &u], &work, &args, port);
    // The agent leaves its answer writable by anyone, before the freeze.
    let chmod = c.exec_as(AGENT, &["chmod", "666", work.join("answer.txt").to_str().unwrap()]);
    assert!(chmod.status.success());
    let (code, st) = c.freeze("h03");
    assert_eq!(code, 0, "freeze: {st}");
    let (w, r) = (work.to_str().unwrap(), reward.to_str().unwrap());
    let ran = c.dir.join("ran");
    let touch = format!("touch {}", ran.display());
    let out = verify_with(
        &c,
        &["--hand-over", "--service-user", SVC, "--protect", w, "--protect", r],
        &scorer(port, &touch),
    );
    assert_eq!(out.status.code(), Some(20), "{}", said(&out));
    assert!(said(&out).contains("answer.txt"), "{}", said(&out));
    assert!(!ran.exists(), "the command ran after a refused hand-over");
    assert!(!listening(port));
    assert_eq!(record(&c)["state"], "failed");

    // A parent directory the service user may write (not sticky) is refused the same way.
    std::fs::set_permissions(work.join("answer.txt"), std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(&work, std::fs::Permissions::from_mode(0o777)).unwrap();
    let sub = work.join("sub");
    std::fs::create_dir(&sub).unwrap();
    let out = verify_with(
        &c,
        &["--hand-over", "--service-user", SVC, "--protect", sub.to_str().unwrap()],
        &scorer(port, "true"),
    );
    assert_eq!(out.status.code(), Some(20), "{}", said(&out));
    assert!(said(&out).contains("on the way to"), "{}", said(&out));
    // Fixed: the hand-over runs.
    std::fs::set_permissions(&work, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = verify_with(
        &c,
        &["--hand-over", "--service-user", SVC, "--protect", w, "--protect", r],
        &scorer(port, "true"),
    );
    assert!(out.status.success(), "{}", said(&out));
}

#[test]
fn h04_a_service_that_cannot_run_again_fails_loudly_and_a_declared_start_serves() {
    let _serial = serial();
    let c = docker_like();
    let (work, reward) = workspace(&c, AGENT);
    let port = free_port();
    // It serves only as the agent: as anyone else it exits 3 (a service that needs its user's files).
    let script = format!(
        "import os,sys,http.server\n\
         if os.getuid() != {AGENT}: sys.exit(3)\n\
         http.server.HTTPServer(('127.0.0.1',{port}),http.server.SimpleHTTPRequestHandler).serve_forever()\n"
    );
    std::fs::write(work.join("serve.py"), &script).unwrap();
    let u = AGENT.to_string();
    let _svc = agent_service(&c, &["--user", &u], &work, &[PY, "serve.py"], port);
    let (code, st) = c.freeze("h04");
    assert_eq!(code, 0, "freeze: {st}");
    let (w, r) = (work.to_str().unwrap(), reward.to_str().unwrap());
    let out = verify_with(
        &c,
        &["--hand-over", "--service-user", SVC, "--protect", w, "--protect", r],
        &scorer(port, "true"),
    );
    assert_eq!(out.status.code(), Some(20), "{}", said(&out));
    assert!(said(&out).contains("exited with status 3"), "{}", said(&out));
    assert_eq!(record(&c)["state"], "failed");
    // The task declares how its service starts: that runs instead, from its own command.
    let decl = format!("{port}=cd {w} && exec {PY} -m http.server {port} --bind 127.0.0.1");
    let out = verify_with(
        &c,
        &["--hand-over", "--service-user", SVC, "--protect", r, "--service", &decl],
        &scorer(port, "true"),
    );
    assert!(out.status.success() && said(&out).contains("scored"), "{}", said(&out));
    assert_eq!(record(&c)["services"][0]["declared"], true);
    // A service that never listens fails within its wait, naming the port.
    let never = format!("{}=sleep 100", free_port());
    let opts = [
        "--hand-over",
        "--service-user",
        SVC,
        "--service",
        &decl,
        "--service",
        &never,
        "--service-wait",
        "1",
    ];
    let out = verify_with(&c, &opts, &scorer(port, "true"));
    assert_eq!(out.status.code(), Some(20), "{}", said(&out));
    assert!(said(&out).contains("not listened on"), "{}", said(&out));
    assert!(c.live_of_uid(SERVICE).is_empty(), "the failed hand-over left its service");
}

#[test]
fn h05_the_service_user_must_be_the_hand_overs_own() {
    let _serial = serial();
    let c = docker_like();
    let (code, st) = c.freeze("h05");
    assert_eq!(code, 0, "freeze: {st}");
    let other = c.exec_as_cmd(SERVICE, &["sleep", "100"]);
    let _g = guard(other);
    wait_for("a process of the service user", Duration::from_secs(5), || !c.live_of_uid(SERVICE).is_empty());
    let out = verify_np(&c, &["--hand-over", "--service-user", SVC, "--", "true"]);
    assert_eq!(out.status.code(), Some(20), "{}", said(&out));
    assert!(said(&out).contains("alive already"), "{}", said(&out));
    let a = AGENT.to_string();
    for bad in ["0", a.as_str()] {
        let out = verify_np(&c, &["--hand-over", "--service-user", bad, "--", "true"]);
        assert_eq!(out.status.code(), Some(20), "{bad}: {}", said(&out));
        assert!(said(&out).contains("root or a sandbox user"), "{}", said(&out));
    }
}

#[test]
fn h06_a_root_agents_service_is_handed_over_in_a_lineage_sandbox() {
    let _serial = serial();
    let mut c = Container::start_with(
        Opts {
            init_args: vec!["-v", "--sandbox-lineage"],
            prefix: vec![
                "setpriv",
                "--bounding-set",
                "-audit_control,-sys_ptrace",
                "--inh-caps",
                "-audit_control,-sys_ptrace",
            ],
            ..Default::default()
        },
        &["sleep", "1000000"],
    );
    c.wait_published();
    let key = c.path("kept.pub");
    std::fs::copy(c.state.join("signing.pub"), &key).unwrap();
    let (work, reward) = workspace(&c, 0);
    let port = free_port();
    let argv = http_server(port);
    let args: Vec<&str> = argv.iter().map(String::as_str).collect();
    let _svc = agent_service(&c, &["--sandbox-lineage", "--user", "root"], &work, &args, port);
    let (code, st) = c.freeze_bare();
    assert_eq!(code, 0, "freeze: {st}");
    assert!(!listening(port));
    let (w, r, k) = (work.to_str().unwrap(), reward.to_str().unwrap(), key.to_str().unwrap());
    let opts = [
        "--accept-root-agent",
        "--public-key",
        k,
        "--hand-over",
        "--service-user",
        SVC,
        "--protect",
        w,
        "--protect",
        r,
    ];
    let out = verify_with(&c, &opts, &scorer(port, "true"));
    assert!(out.status.success() && said(&out).contains("scored"), "{}", said(&out));
    assert!(c.live_of_uid(SERVICE).is_empty());
}

//! The Landlock domain the handed-over services run in (`commands::handover::confine`), tried as the agent
//! (UID 4661) would on the real kernel: each service is hostile as the service user only, and
//! says in its output (services.log) what the kernel answered, so each test shows the attempt
//! was made. Each asserts the SAFE outcome: a failing test is an attack that works.

mod common;
use common::services::*;
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const AGENT: u32 = 4661;
const SERVICE: u32 = 65520;
const SVC: &str = "65520";

fn py_service(c: &Container, dir: &Path, port: u16, hostile: &str) -> Guard {
    common::services::hostile_py(c, (AGENT, SERVICE), dir, "serve.py", port, "", hostile)
}

fn hand_over(c: &Container, work: &Path, reward: &Path, extra: &[&str], cmd: &str) -> std::process::Output {
    hand_over_with(c, work, reward, (extra, &[]), cmd)
}

/// With `before` ahead of the binary (a wrapper) and `opts` among verify's options.
fn hand_over_with(
    c: &Container,
    work: &Path,
    reward: &Path,
    (before, opts): (&[&str], &[&str]),
    cmd: &str,
) -> std::process::Output {
    let (st, q) = (c.state.to_str().unwrap().to_string(), quiesce());
    let mut full: Vec<&str> = before.to_vec();
    full.extend_from_slice(&[q.to_str().unwrap(), "verify", "--state-dir", &st, "--hand-over"]);
    full.extend_from_slice(opts);
    full.extend_from_slice(&["--service-user", SVC, "--protect", work.to_str().unwrap()]);
    full.extend_from_slice(&["--protect", reward.to_str().unwrap(), "--", "sh", "-c", cmd]);
    output(&mut c.exec_cmd(&full))
}

/// What the services wrote while the tests ran.
fn services_log(c: &Container) -> String {
    std::fs::read_to_string(c.state.join("services.log")).unwrap_or_default()
}

fn record(c: &Container) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(c.state.join("handover.json")).expect("handover.json")).unwrap()
}

/// The agent's python service on `port`, running `hostile` (python, indented by 4) as the
/// service user; then the freeze.
fn frozen(tag: &str, hostile: &str) -> (Container, PathBuf, PathBuf, u16, Guard) {
    let c = sandbox(AGENT, &[]);
    let (work, reward) = workspace(&c, AGENT);
    let port = free_port();
    let svc = py_service(&c, &work, port, hostile);
    let (code, st) = c.freeze(tag);
    assert_eq!(code, 0, "freeze: {st}");
    (c, work, reward, port, svc)
}

/// The hijack: the service binds the tests' own port WITHOUT listen() (no listening
/// socket for any look to find); the tests' reference server would get EADDRINUSE.
/// The hand-over's output shows the guard `held` (the tests' own word); otherwise the `attack`
/// worked, said with verify's exit, its output and the services' log.
fn assert_held(out: &std::process::Output, log: &str, held: &str, attack: &str) {
    assert!(
        said(out).contains(held),
        "ATTACK WORKED: verify exit {:?}; {attack}: {}; services: {log}",
        out.status.code(),
        said(out)
    );
}

#[test]
fn d01_the_tests_port_bound_without_listen() {
    let _serial = serial();
    let tests_port = free_port();
    let hostile = indent(&format!(
        "t=socket.socket()\n\
         try:\n    t.bind(('0.0.0.0',{tests_port})); print('bound-the-tests-port', flush=True)\n\
         except OSError as e: print('bind-refused', e.errno, flush=True)\n\
         global keep; keep=t"
    ));
    let (c, work, reward, port, _svc) = frozen("d01", &hostile);
    let tests = format!(
        "sleep 0.5; {PY} -c \"import socket; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1); \
         s.bind(('127.0.0.1',{tests_port})); s.listen(4)\" && echo tests-server-up"
    );
    let out = hand_over(&c, &work, &reward, &[], &tests);
    let log = services_log(&c);
    assert!(
        out.status.success() && said(&out).contains("tests-server-up"),
        "ATTACK WORKED: verify exit {:?}; the tests could not bind their port {tests_port}: {}; services: {log}",
        out.status.code(),
        said(&out)
    );
    assert!(log.contains(&format!("bind-refused {}", libc::EACCES)), "the service never tried: {log}");
    let d = &record(&c)["domain"];
    assert_eq!(d["bind_tcp"], serde_json::json!([[port]]), "{d}");
    assert_eq!(d["connect_tcp"], serde_json::json!([port]), "{d}");
    assert!(d["abi"].as_u64().unwrap_or(0) >= 6, "{d}");
    assert_eq!(d["scopes"], serde_json::json!(["signal", "abstract_unix_socket"]), "{d}");
    assert!(d["fs_write"].as_array().unwrap().iter().any(|p| p == "/tmp"), "{d}");
}

/// The same hijack through an MPTCP socket: its first subflow is a TCP socket bound to the port,
/// and Landlock's port rules look at TCP sockets only; the services' seccomp filter refuses the
/// socket itself.
#[test]
fn d08_the_tests_port_bound_through_an_mptcp_socket() {
    let _serial = serial();
    let tests_port = free_port();
    let hostile = indent(&format!(
        "try:\n    t=socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262); t.bind(('0.0.0.0',{tests_port})); t.listen(4)\n\
         \x20   print('bound-the-tests-port', flush=True)\n\
         except OSError as e: print('mptcp-refused', e.errno, flush=True)\n\
         global keep; keep=locals().get('t')"
    ));
    let (c, work, reward, _port, _svc) = frozen("d08", &hostile);
    let tests = format!(
        "sleep 0.5; {PY} -c \"import socket; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1); \
         s.bind(('127.0.0.1',{tests_port})); s.listen(4)\" && echo tests-server-up"
    );
    let out = hand_over(&c, &work, &reward, &[], &tests);
    let log = services_log(&c);
    assert!(
        out.status.success() && said(&out).contains("tests-server-up"),
        "ATTACK WORKED: verify exit {:?}; the tests could not bind their port {tests_port}: {}; services: {log}",
        out.status.code(),
        said(&out)
    );
    assert!(
        log.contains(&format!("mptcp-refused {}", libc::EPROTONOSUPPORT)),
        "the service never tried: {log}"
    );
    let refuses = &record(&c)["domain"]["seccomp_refuses"];
    assert!(refuses[0].as_str().unwrap_or("").starts_with("socket(AF_INET/AF_INET6) but TCP"), "{refuses}");
}

/// The filter allows, not refuses: a protocol of the inet families this kernel has and no
/// deny-list named (UDP-Lite, checked here without the filter first) is refused as well, so is
/// protocol 0 of a SOCK_SEQPACKET (SCTP's, where loaded), and a family not named; plain UDP
/// still works.
#[test]
fn d09_an_inet_protocol_no_deny_list_named() {
    let _serial = serial();
    let udplite = libc::IPPROTO_UDPLITE;
    // SAFETY: a plain socket call; the descriptor is closed at once.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, udplite) };
    assert!(fd >= 0, "this kernel has no UDP-Lite: the test shows nothing here");
    // SAFETY: our own descriptor.
    unsafe { libc::close(fd) };
    let hostile = indent(&format!(
        "tries=[('udplite', (socket.AF_INET, socket.SOCK_DGRAM, {udplite})),\n\
         \x20      ('seqpacket', (socket.AF_INET, socket.SOCK_SEQPACKET, 0)),\n\
         \x20      ('vsock', (40, socket.SOCK_STREAM, 0)), ('udp', (socket.AF_INET, socket.SOCK_DGRAM, 0))]\n\
         for name, args in tries:\n\
         \x20   try: socket.socket(*args).close(); print(name, 'made', flush=True)\n\
         \x20   except OSError as e: print(name, 'refused', e.errno, flush=True)"
    ));
    let (c, work, reward, _port, _svc) = frozen("d09", &hostile);
    let out = hand_over(&c, &work, &reward, &[], "sleep 0.5; echo tests-ran");
    let log = services_log(&c);
    assert!(out.status.success() && said(&out).contains("tests-ran"), "verify: {}", said(&out));
    assert!(log.contains("udp made"), "the service never tried: {log}");
    assert!(
        log.contains(&format!("udplite refused {}", libc::EPROTONOSUPPORT))
            && log.contains(&format!("seqpacket refused {}", libc::EPROTONOSUPPORT))
            && log.contains(&format!("vsock refused {}", libc::EAFNOSUPPORT)),
        "ATTACK WORKED: a socket past the allow-list: {log}"
    );
}

/// The task declares a service of its own (`--service B=COMMAND`, its reference, slow to
/// start as a database is) beside the agent's recorded one on A. The agent's service binds B
/// first, and where the kernel refuses that, takes B as an ephemeral port by listen() without
/// bind, which no bind rule sees; a hand-over that counts B as up when any service listens on it
/// starts the tests, whose queries to B reach the agent's code.
#[test]
fn d10_the_agents_service_takes_the_declared_services_port() {
    let _serial = serial();
    let b = free_port();
    let hostile = indent(&format!(
        "m=socket.socket(); m.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
         try: m.bind(('127.0.0.1',{b})); print('bound-the-declared-port', flush=True)\n\
         except OSError as e: print('bind-refused', e.errno, flush=True); m.close(); m=None\n\
         for i in range(400000):\n\
         \x20   if m is not None: break\n\
         \x20   t=socket.socket(); t.listen(8)\n\
         \x20   if t.getsockname()[1]=={b}: m=t; print('listened-on-the-declared-port', i, flush=True); break\n\
         \x20   t.close()\n\
         if m is None: print('never-got-it', flush=True); return\n\
         m.listen(8)\n\
         while True:\n\
         \x20   a,_=m.accept(); a.sendall(b'AGENT\\n'); a.close()"
    ));
    let (c, work, reward, _port, _svc) = frozen("d10", &hostile);
    let task = c.dir.join("task_service.py");
    let serve = format!(
        "import socket\ns=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
         s.bind(('127.0.0.1',{b})); s.listen(8)\nwhile True:\n    a,_=s.accept(); a.sendall(b'TASK\\n'); a.close()\n"
    );
    std::fs::write(&task, serve).unwrap();
    std::fs::set_permissions(&task, std::fs::Permissions::from_mode(0o644)).unwrap();
    let decl = format!("{b}=sleep 4; exec {PY} {}", task.display());
    let tests = format!(
        "{PY} -c \"import socket; c=socket.create_connection(('127.0.0.1',{b}),timeout=2); print('tests-read', c.recv(64))\""
    );
    let out = hand_over_with(&c, &work, &reward, (&[], &["--service", &decl]), &tests);
    let log = services_log(&c);
    assert!(log.contains(&format!("bind-refused {}", libc::EACCES)), "the bind rule: {log}");
    assert!(log.contains("listened-on-the-declared-port"), "the service never took the port: {log}");
    assert!(
        !said(&out).contains("AGENT"),
        "ATTACK WORKED: verify exit {:?}; the tests reached the agent's code on the declared port {b}: {}; services: {log}",
        out.status.code(),
        said(&out)
    );
    eprintln!("d10: verify {:?}: {}; services: {log}", out.status.code(), said(&out));
    let d = &record(&c)["domain"];
    assert_eq!(d["bind_tcp"].as_array().map(Vec::len), Some(2), "{d}");
    assert!(d["bind_tcp"][1] == serde_json::json!([b]), "the declared service binds its port alone: {d}");
}

/// d05 through a second name: the agent hard-links the reward the harness left world-writable
/// (outside every place the services may write, on /tmp's filesystem) into /tmp before the
/// freeze, as fs.protected_hardlinks lets it; Landlock allows writes by path, and that path is
/// beneath /tmp. The hand-over is refused, naming the link, and the reward stays as it was.
#[test]
fn d11_a_hard_link_in_tmp_to_a_reward_left_writable() {
    let _serial = serial();
    let logs = PathBuf::from(format!("/var/lib/quiesce-test-d11-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir(&logs).unwrap();
    std::fs::set_permissions(&logs, std::fs::Permissions::from_mode(0o755)).unwrap();
    let r = logs.join("reward.txt");
    std::fs::write(&r, "0\n").unwrap();
    std::fs::set_permissions(&r, std::fs::Permissions::from_mode(0o666)).unwrap();
    let link = format!("/tmp/quiesce-d11-link-{}", std::process::id());
    let _ = std::fs::remove_file(&link);
    let always = format!("if os.getuid() == {AGENT}:\n    os.link('{r}', '{link}')", r = r.display());
    let hostile = indent(&format!(
        "for i in range(100):\n\
         \x20   try: open('{link}','r+').write('1\\n'); print('wrote-through-link', flush=True)\n\
         \x20   except OSError as e: print('link-write-refused', e.errno, flush=True); break\n\
         \x20   time.sleep(0.02)"
    ));
    let c = sandbox(AGENT, &[]);
    let (work, reward) = workspace(&c, AGENT);
    let port = free_port();
    let _svc = hostile_py(&c, (AGENT, SERVICE), &work, "serve.py", port, &always, &hostile);
    let (code, st) = c.freeze("d11");
    assert_eq!(code, 0, "freeze: {st}");
    let tests = format!("echo 0 > {r}; sleep 1.5; cat {r}", r = r.display());
    let out = hand_over(&c, &work, &reward, &[], &tests);
    let log = services_log(&c);
    let now = std::fs::read_to_string(&r).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&logs);
    let _ = std::fs::remove_file(&link);
    assert!(
        now == "0\n" && !log.contains("wrote-through-link"),
        "ATTACK WORKED: verify exit {:?}; the service wrote the reward through {link}: {now:?}; {}; services: {log}",
        out.status.code(),
        said(&out)
    );
    assert_eq!(out.status.code(), Some(20), "{}", said(&out));
    assert!(said(&out).contains(&format!("{link} has 2 names")), "{}", said(&out));
}

/// A port no service names, listened on for a few milliseconds at a time, between any two looks
/// a sampler could take: the kernel refuses the bind itself.
#[test]
fn d02_a_port_no_service_names_listened_on_for_an_instant() {
    let _serial = serial();
    let other = free_port();
    let hostile = indent(&format!(
        "for i in range(60):\n\
         \x20   t=socket.socket(); t.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
         \x20   try:\n\
         \x20       t.bind(('127.0.0.1',{other})); t.listen(1); print('listened', flush=True); time.sleep(0.005)\n\
         \x20   except OSError as e: print('bind-refused', e.errno, flush=True)\n\
         \x20   t.close(); time.sleep(0.03)"
    ));
    let (c, work, reward, _port, _svc) = frozen("d02", &hostile);
    let out = hand_over(&c, &work, &reward, &[], "sleep 2.5; echo tests-done");
    let log = services_log(&c);
    assert!(out.status.success() && said(&out).contains("tests-done"), "{}", said(&out));
    assert!(
        !log.contains("listened"),
        "ATTACK WORKED: the service listened on port {other}, which no service names: {log}"
    );
    assert!(log.contains(&format!("bind-refused {}", libc::EACCES)), "the service never tried: {log}");
}

/// A process of the tests' that runs as the service user (DAC lets that user signal it): the
/// service kills it by the pid the tests wrote down.
#[test]
fn d03_the_service_signals_a_process_of_the_tests() {
    let _serial = serial();
    let c = sandbox(AGENT, &[]);
    let (work, reward) = workspace(&c, AGENT);
    let port = free_port();
    let pidfile = c.dir.join("tests.pid");
    let hostile = indent(&format!(
        "for i in range(200):\n\
         \x20   try: pid=int(open('{p}').read())\n\
         \x20   except (OSError, ValueError): time.sleep(0.02); continue\n\
         \x20   try: os.kill(pid, signal.SIGKILL); print('signalled', flush=True)\n\
         \x20   except OSError as e: print('signal-refused', e.errno, flush=True)\n\
         \x20   break",
        p = pidfile.display()
    ));
    let _svc = py_service(&c, &work, port, &hostile);
    let (code, st) = c.freeze("d03");
    assert_eq!(code, 0, "freeze: {st}");
    let p = pidfile.display();
    let tests = format!(
        "setpriv --reuid={SVC} --regid={SVC} --clear-groups sleep 20 & s=$!; echo $s > {p}.new; chmod 644 {p}.new; \
         mv {p}.new {p}; sleep 1.5; kill -0 $s && echo tests-process-alive; kill $s; wait $s; true"
    );
    let out = hand_over(&c, &work, &reward, &[], &tests);
    let log = services_log(&c);
    assert_held(&out, &log, "tests-process-alive", "the tests' process was killed by the service");
    assert!(log.contains(&format!("signal-refused {}", libc::EPERM)), "the service never tried: {log}");
}

/// An abstract Unix socket the tests made (no file, so no permission guards it): the service
/// connects to it.
#[test]
fn d04_the_service_connects_to_the_tests_abstract_socket() {
    let _serial = serial();
    let name = format!("quiesce-d04-{}", std::process::id());
    let hostile = indent(&format!(
        "for i in range(100):\n\
         \x20   u=socket.socket(socket.AF_UNIX)\n\
         \x20   try: u.connect('\\0{name}'); print('reached-the-tests', flush=True); break\n\
         \x20   except ConnectionRefusedError: time.sleep(0.02)\n\
         \x20   except OSError as e: print('connect-refused', e.errno, flush=True); break"
    ));
    let (c, work, reward, _port, _svc) = frozen("d04", &hostile);
    let server = format!(
        "import socket; s=socket.socket(socket.AF_UNIX); s.bind('\\0{name}'); s.listen(4); s.settimeout(2.5)\n\
         try: s.accept(); print('tests-socket-reached')\n\
         except socket.timeout: print('tests-socket-alone')"
    );
    let out = hand_over(&c, &work, &reward, &[], &format!("{PY} -c \"{server}\""));
    let log = services_log(&c);
    assert_held(&out, &log, "tests-socket-alone", "the service reached the tests' abstract socket");
    assert!(log.contains(&format!("connect-refused {}", libc::EPERM)), "the service never tried: {log}");
}

/// The reward file the harness made world-writable outside every protected path (and outside
/// /tmp): the service writes 1 into it while the tests run.
#[test]
fn d05_the_service_writes_a_reward_left_writable() {
    let _serial = serial();
    let logs = PathBuf::from(format!("/run/quiesce-test-d05-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir(&logs).unwrap();
    std::fs::set_permissions(&logs, std::fs::Permissions::from_mode(0o755)).unwrap();
    let r = logs.join("reward.txt");
    std::fs::write(&r, "0\n").unwrap();
    std::fs::set_permissions(&r, std::fs::Permissions::from_mode(0o666)).unwrap();
    let hostile = indent(&format!(
        "for i in range(100):\n\
         \x20   try: open('{r}','w').write('1\\n'); print('wrote-the-reward', flush=True)\n\
         \x20   except OSError as e: print('write-refused', e.errno, flush=True); break\n\
         \x20   time.sleep(0.02)",
        r = r.display()
    ));
    let (c, work, reward, _port, _svc) = frozen("d05", &hostile);
    let tests =
        format!("echo 0 > {r}; sleep 1.5; [ \"$(cat {r})\" = 0 ] && echo reward-intact", r = r.display());
    let out = hand_over(&c, &work, &reward, &[], &tests);
    let log = services_log(&c);
    let _ = std::fs::remove_dir_all(&logs);
    assert_held(&out, &log, "reward-intact", "the service rewrote the reward");
    assert!(log.contains(&format!("write-refused {}", libc::EACCES)), "the service never tried: {log}");
}

/// A kernel without Landlock, or a seccomp profile that refuses it: the hand-over is refused
/// (exit 20) with the line that names it, and no service starts.
#[test]
fn d06_no_landlock_refuses_the_hand_over() {
    let _serial = serial();
    let (c, work, reward, port, _svc) = frozen("d06", "    pass\n");
    let bin = c.dir.join("nolandlock");
    let src = format!("{}/tests/attack_bin/nolandlock.c", env!("CARGO_MANIFEST_DIR"));
    if !matches!(Command::new("cc").args(["-O2", "-static", "-o"]).arg(&bin).arg(src).status(), Ok(s) if s.success())
    {
        skip("d06", "cannot build nolandlock.c with cc");
        return;
    }
    for (errno, says) in [("ENOSYS", "has no Landlock"), ("EPERM", "seccomp")] {
        let check = format!(
            "{PY} -c \"import socket; socket.create_connection(('127.0.0.1',{port}))\" && echo served"
        );
        let out = hand_over(&c, &work, &reward, &[bin.to_str().unwrap(), errno], &check);
        assert_eq!(out.status.code(), Some(20), "{errno}: {}", said(&out));
        assert!(said(&out).contains(says), "{errno}: {}", said(&out));
        assert!(!said(&out).contains("served"), "{errno}: the command ran: {}", said(&out));
        assert!(c.live_of_uid(SERVICE).is_empty(), "{errno}: a service started");
        assert_eq!(record(&c)["state"], "failed");
    }
}

/// Not a test: what the domain adds to a hand-over, measured side by side. From verify's start
/// to the tests' first instruction (a `date` the command runs), `QUIESCE_D07_RUNS` runs of this
/// binary and of `QUIESCE_WITHOUT_DOMAIN` (a build without `.confined`), alternated; prints the
/// medians. `QUIESCE_WITHOUT_DOMAIN=... cargo test --release --test handover_domain d07 -- --ignored --nocapture`
#[test]
#[ignore]
fn d07_measure_what_the_domain_adds() {
    let _serial = serial();
    let Some(other) = std::env::var_os("QUIESCE_WITHOUT_DOMAIN") else {
        skip("d07", "QUIESCE_WITHOUT_DOMAIN names no binary");
        return;
    };
    let runs = common::adversary::knob("QUIESCE_D07_RUNS", 10);
    let (c, work, reward, _port, _svc) = frozen("d07", "    pass\n");
    let ours = quiesce();
    let mut times: [Vec<u128>; 2] = [Vec::new(), Vec::new()];
    for i in 0..runs * 2 {
        let bin = if i % 2 == 0 { ours.as_os_str() } else { other.as_os_str() };
        let st = c.state.to_str().unwrap().to_string();
        let (w, r) = (work.to_str().unwrap(), reward.to_str().unwrap());
        let full =
            [bin.to_str().unwrap(), "verify", "--state-dir", &st, "--hand-over", "--service-user", SVC];
        let mut full: Vec<&str> = full.to_vec();
        full.extend_from_slice(&["--protect", w, "--protect", r, "--", "date", "+%s%N"]);
        let t0 = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let out = output(&mut c.exec_cmd(&full));
        assert!(out.status.success(), "{}", said(&out));
        let t1: u128 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        times[i % 2].push((t1 - t0) / 1000);
    }
    for t in times.iter_mut() {
        t.sort_unstable();
    }
    let med = |t: &Vec<u128>| t[t.len() / 2];
    eprintln!(
        "d07: verify's start to the tests' start, µs (median of {runs}): with the domain {}, without {}; all with {:?}, without {:?}",
        med(&times[0]),
        med(&times[1]),
        times[0],
        times[1]
    );
}

//! What the hand-over's tests share (tests/handover.rs and the attack files): ports on the
//! host's network, which the test namespaces share, the agent's workspace, its service started
//! through `quiesce exec`, and the hand-overs of one binary taken one at a time.

use super::{guard, quiesce, wait_for, Container, Guard};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

pub const PY: &str = "/usr/bin/python3";

/// The hand-overs of this test binary one at a time: the test namespaces share the host's
/// network, and a socket the service user made counts as the services' whoever holds it.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().unwrap().port()
}

pub fn listening(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// The agent's workspace (`owner`'s, 0755) with the answer in it, and the verifier's reward
/// directory (root's, 0755).
pub fn workspace(c: &Container, owner: u32) -> (PathBuf, PathBuf) {
    let work = c.dir.join("work");
    let reward = c.dir.join("reward");
    for d in [&work, &reward] {
        std::fs::create_dir(d).unwrap();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::write(work.join("answer.txt"), "42\n").unwrap();
    std::os::unix::fs::chown(&work, Some(owner), Some(owner)).unwrap();
    std::os::unix::fs::chown(work.join("answer.txt"), Some(owner), Some(owner)).unwrap();
    (work, reward)
}

/// Start `args` through `prefix` (a capability drop) and `quiesce exec EXEC...` in `dir`, and wait
/// until `port` listens. Its environment holds SERVICE_SECRET=kept (never to appear in a record).
pub fn agent_service(
    c: &Container,
    prefix: &[&str],
    exec: &[&str],
    dir: &Path,
    args: &[&str],
    port: u16,
) -> Guard {
    // Entering the mount namespace moves to its root: the directory is entered after.
    let q = quiesce();
    let cd = format!("cd '{}' && exec \"$@\"", dir.display());
    let mut full: Vec<&str> = prefix.to_vec();
    full.extend_from_slice(&[q.to_str().unwrap(), "exec"]);
    full.extend_from_slice(exec);
    full.extend_from_slice(&["--", "sh", "-c", &cd, "sh"]);
    full.extend_from_slice(args);
    let mut cmd = c.exec_cmd(&full);
    cmd.env("SERVICE_SECRET", "kept").stdin(Stdio::null()).stdout(Stdio::null());
    let g = guard(cmd);
    wait_for("the agent's service to listen", Duration::from_secs(20), || listening(port));
    g
}

/// A python service written by the agent (`agent`) into `dir` and started through `quiesce
/// exec`: it runs `always` at module level (as the agent, and again as the service user),
/// listens on `port`, and as `service` runs `hostile` (python, indented by 4) in a thread.
pub fn hostile_py(
    c: &Container,
    (agent, service): (u32, u32),
    dir: &Path,
    name: &str,
    port: u16,
    always: &str,
    hostile: &str,
) -> Guard {
    let script = format!(
        "import os,sys,time,signal,socket,threading\n\
         {always}\n\
         s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
         s.bind(('127.0.0.1',{port})); s.listen(16)\n\
         def hostile():\n\
         \x20   if os.getuid() != {service}: return\n\
         {hostile}\n\
         threading.Thread(target=hostile,daemon=True).start()\n\
         while True:\n\
         \x20   try:\n\
         \x20       a,_=s.accept(); a.close()\n\
         \x20   except OSError: time.sleep(0.01)\n"
    );
    let p = dir.join(name);
    std::fs::write(&p, script).unwrap();
    std::os::unix::fs::chown(&p, Some(agent), Some(agent)).unwrap();
    agent_service(c, &[], &["--user", &agent.to_string()], dir, &[PY, name], port)
}

/// Python source indented by 4, for a function body.
pub fn indent(s: &str) -> String {
    s.lines().map(|l| format!("    {l}\n")).collect()
}

/// stdout and stderr of a command, for a failing assertion's message.
pub fn said(o: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

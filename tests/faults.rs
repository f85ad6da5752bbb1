//! Faults a host throws at the init, the real binary as PID 1: its state dir's file system full
//! or remounted read-only, the init stopped and continued from outside mid-freeze, /proc
//! replaced under it, its memory cgroup's limit reached mid-freeze, its wall clock moved. For each: the init lives, no marker vouches for a freeze that did not
//! prove its sandbox empty, the failure is bounded and named, and the next freeze works once
//! the fault is gone.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The sandbox user of a container of this file; each test its own.
fn container(uid: u32, size_kb: u32) -> Container {
    container_with(uid, size_kb, false)
}

/// `shell_pid1`: the init is not PID 1 (a shell is), as a sidecar or a subreaper runs.
fn container_with(uid: u32, size_kb: u32, shell_pid1: bool) -> Container {
    container_opts(uid, size_kb, "", Opts { shell_pid1, ..Default::default() })
}

/// `o` with the init's arguments, its state dir and its log set as every test here has them;
/// `first`: shell commands run inside the namespace before any of that.
fn container_opts(uid: u32, size_kb: u32, first: &str, o: Opts) -> Container {
    let u = uid.to_string();
    // Inside the container's own mount namespace: the state dir on a small tmpfs of its own, the
    // init's log in the scratch dir (the host's file system), where a test reads what it said.
    let wrap = format!(
"{first}mkdir -p \"$D/state\" && mount -t tmpfs -o size={size_kb}k,mode=755 quiesce-state \"$D/state\" \
         && exec \"$@\" 2>>\"$D/init.log\""
    );
    let mut c = Container::start_with(
        Opts { init_args: vec!["-v", "--sandbox-user", &u], wrap: vec!["sh", "-c", &wrap, "sh"], ..o },
        &["sleep", "1000000"],
    );
    wait_for("the init to publish its sandbox", Duration::from_secs(10), || {
        state_file(&c, "sandbox.json").is_some()
    });
    assert!(c.alive(), "the init ended at start: {}", log(&c));
    c
}

/// The state dir as the init sees it (its mount namespace), read from the host.
fn state_path(c: &Container, name: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{}/root{}", c.init, c.state.join(name).display()))
}

fn state_file(c: &Container, name: &str) -> Option<Vec<u8>> {
    std::fs::read(state_path(c, name)).ok()
}

fn log(c: &Container) -> String {
    std::fs::read_to_string(c.dir.join("init.log")).unwrap_or_default()
}

/// Wait until the init's log says `what`; the log from then on.
fn wait_log(c: &Container, what: &str, within: Duration) -> String {
    let until = std::time::Instant::now() + within;
    while !log(c).contains(what) {
        assert!(
            std::time::Instant::now() < until,
            "the init did not log '{what}' within {within:?}: {}",
            log(c)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    log(c)
}

fn quiescent(c: &Container, uid: u32, nonce: &str) {
    let (code, st) = c.freeze(nonce);
    assert_eq!(code, 0, "freeze {nonce}: {st}\n{}", log(c));
    assert_eq!(st["state"], "quiescent", "{st}");
    assert!(c.live_of_uid(uid).is_empty(), "a sandbox process outlived a quiescent freeze");
    assert_scored(&c.verify(&["--nonce", nonce, "--", "echo", "scored"]), nonce);
}

/// In the container's mount namespace, as root.
fn sh(c: &Container, script: &str) {
    let out = c.exec(&["sh", "-c", script]);
    assert!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_full_state_dir_fails_the_freeze_unsigned_and_the_next_one_works() {
    let uid = 4611;
    let mut c = container(uid, 512);
    let _w = c.launch(uid, &["sleepers", "5"]);
    quiescent(&c, uid, "f-1");
    // More processes than the first freeze killed: this marker's evidence needs more room than
    // removing the first one frees.
    let _w = c.launch(uid, &["sleepers", "300"]);
    // Full to the last page; `dd` ends at ENOSPC, which is what this wants.
    let _ = c.exec(&["sh", "-c", "dd if=/dev/zero of=\"$D/state/filler\" bs=4k 2>/dev/null"]);
    // Asked for as `docker kill -s USR1` does: nothing needs writing before it runs.
    c.signal(libc::SIGUSR1);
    let said = wait_log(&c, "cannot write the marker", Duration::from_secs(60));
    assert!(said.contains("No space left on device"), "{said}");
    assert!(c.live_of_uid(uid).is_empty(), "the freeze killed nothing");
    // The first freeze's marker went before any signal; the second's could not be written.
    assert!(state_file(&c, "quiescence.jws").is_none(), "a marker is readable after a failed freeze");
    // Nor is a status that could not be written left to say an earlier state (this freeze's
    // "freezing", or the first one's "quiescent"): it says "failed", or there is none. Which
    // of the two depends on the room the failed marker's write gave back.
    let st: Option<serde_json::Value> =
        state_file(&c, "status.json").and_then(|b| serde_json::from_slice(&b).ok());
    assert!(st.as_ref().is_none_or(|s| s["state"] == "failed"), "a stale status: {st:?}");
    assert_eq!(verify_code(&c), 10, "verify with no marker: {}", log(&c));
    assert!(c.alive(), "the init died of a full state dir");
    sh(&c, "rm \"$D/state/filler\"");
    let _w = c.launch(uid, &["sleepers", "5"]);
    quiescent(&c, uid, "f-3");
}

#[test]
fn a_read_only_state_dir_fails_the_freeze_before_a_signal_and_the_next_one_works() {
    let uid = 4612;
    let mut c = container(uid, 2048);
    let _w = c.launch(uid, &["sleepers", "5"]);
    quiescent(&c, uid, "r-1");
    let w = c.launch(uid, &["sleepers", "5"]);
    sh(&c, "mount -o remount,ro \"$D/state\"");
    c.signal(libc::SIGUSR1);
    let said = wait_log(&c, "cannot remove the old marker", Duration::from_secs(30));
    assert!(said.contains("Read-only file system"), "{said}");
    // The freeze stopped before it sent a signal: the sandbox lives, and the old marker, which
    // a read-only file system keeps, does not let the verifier through.
    assert!(c.live_of_uid(uid).contains(&w.pid), "the sandbox was killed by a freeze that could not sign");
    let out = c.verify(&["--", "echo", "scored"]);
    assert_eq!(
        out.status.code(),
        Some(16),
        "verify beside a live sandbox: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(c.alive(), "the init died of a read-only state dir");
    sh(&c, "mount -o remount,rw \"$D/state\"");
    quiescent(&c, uid, "r-2");
}

#[test]
fn an_init_stopped_and_continued_mid_freeze_ends_the_freeze_truthfully() {
    let uid = 4613;
    let mut c = container(uid, 4096);
    let _w = c.launch(uid, &["sleepers", "500"]);
    c.signal(libc::SIGUSR1);
    // Stopped while it stops, walks or kills, for longer than any of its steps takes here.
    std::thread::sleep(Duration::from_millis(20));
    c.signal(libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(3));
    c.signal(libc::SIGCONT);
    wait_for("the freeze to end", Duration::from_secs(120), || {
        let st: serde_json::Value =
            state_file(&c, "status.json").and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
        matches!(st["state"].as_str(), Some("quiescent" | "failed"))
    });
    let st: serde_json::Value = serde_json::from_slice(&state_file(&c, "status.json").unwrap()).unwrap();
    if st["state"] == "quiescent" {
        assert!(c.live_of_uid(uid).is_empty(), "quiescent beside a live sandbox: {st}");
    } else {
        assert!(state_file(&c, "quiescence.jws").is_none(), "a marker beside a failed freeze: {st}");
    }
    assert!(c.alive(), "the init died of a stop");
    let _w = c.launch(uid, &["sleepers", "5"]);
    quiescent(&c, uid, "s-2");
}

#[test]
fn proc_replaced_under_the_init_does_not_hide_the_sandbox() {
    let uid = 4614;
    let mut c = container(uid, 2048);
    let _w = c.launch(uid, &["sleepers", "5"]);
    // An empty /proc over the real one, in the init's mount namespace: had the init looked
    // through the path, it would see no process and could sign. The sandbox is checked from
    // the host's /proc.
    sh(&c, "mount -t tmpfs -o size=64k fake /proc");
    c.signal(libc::SIGUSR1);
    wait_for("the freeze to end", Duration::from_secs(60), || {
        log(&c).contains("quiescent,") || log(&c).contains("failed")
    });
    let host_alive = host_live_of_uid(&c, uid);
    if log(&c).contains("quiescent,") {
        assert!(host_alive.is_empty(), "quiescent beside {host_alive:?}: {}", log(&c));
    } else {
        assert!(state_file(&c, "quiescence.jws").is_none(), "a marker beside a failed freeze: {}", log(&c));
    }
    assert!(c.alive(), "the init died with /proc replaced");
    sh(&c, "umount /proc");
    let _w = c.launch(uid, &["sleepers", "5"]);
    quiescent(&c, uid, "p-2");
}

/// Live processes of the container's PID namespace with real UID `uid`, from the host's /proc.
fn host_live_of_uid(c: &Container, uid: u32) -> Vec<i32> {
    let ns = std::fs::read_link(format!("/proc/{}/ns/pid", c.init)).expect("the init's pid namespace");
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(h) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        if std::fs::read_link(format!("/proc/{h}/ns/pid")).ok().as_ref() != Some(&ns) {
            continue;
        }
        let Ok(s) = std::fs::read_to_string(format!("/proc/{h}/status")) else { continue };
        let field =
            |k: &str| s.lines().find_map(|l| l.strip_prefix(k)?.strip_prefix(':')?.split_whitespace().next());
        if !matches!(field("State"), None | Some("Z" | "X")) && field("Uid") == Some(uid.to_string().as_str())
        {
            v.push(h);
        }
    }
    v
}

fn verify_code(c: &Container) -> i32 {
    c.verify(&["--", "echo", "scored"]).status.code().unwrap_or(-1)
}

#[test]
fn a_credential_helper_killed_or_stopped_fails_one_freeze_at_most_and_the_next_works() {
    let uid = 4615;
    // Not PID 1: the init signals as the sandbox UID through a helper process, which anything
    // of the host's (or a sandbox process, in its switched instant) can kill or stop.
    let mut c = container_with(uid, 2048, true);
    for (sig, name) in [(libc::SIGKILL, "killed"), (libc::SIGSTOP, "stopped")] {
        let helper = credential_helper(&c);
        assert_eq!(unsafe { libc::kill(helper, sig) }, 0, "signal the credential helper {helper}");
        let _w = c.launch(uid, &["sleepers", "5"]);
        let (code, st) = c.freeze_within(&format!("h-{name}"), Some(60));
        if sig == libc::SIGKILL {
            // Known gone at the freeze's start: replaced before it is asked.
            assert_eq!(code, 0, "helper {name}: {st}\n{}", log(&c));
            assert!(c.live_of_uid(uid).is_empty(), "helper {name}: quiescent beside a live sandbox: {st}");
        } else {
            // Stopped, it is asked and does not answer: this freeze fails, within its bound.
            let why = st["reason"].as_str().unwrap_or_default();
            assert!(why.contains("credential helper"), "helper {name}: {st}\n{}", log(&c));
            assert!(state_file(&c, "quiescence.jws").is_none(), "helper {name}: a marker beside {st}");
        }
        assert!(c.alive(), "the init died of its helper {name}");
        assert_ne!(credential_helper(&c), helper, "the {name} helper is still the one in use");
        let _w = c.launch(uid, &["sleepers", "5"]);
        quiescent(&c, uid, &format!("h-{name}-after"));
    }
}

/// A credential helper that does not answer (stopped, as a sandbox process can stop it in the
/// instant it holds the sandbox UID) holds the freeze's first stop back for its 2 s bound. The old
/// marker goes before that stop, by a bare unlink: it is not readable meanwhile, once the client
/// that asked (without --wait) has returned. Before, it stayed readable until the bound ran out.
#[test]
fn the_old_marker_is_gone_while_a_stopped_credential_helper_holds_the_first_stop_back() {
    let uid = 4616;
    let mut c = container_with(uid, 2048, true);
    let _w = c.launch(uid, &["sleepers", "5"]);
    quiescent(&c, uid, "m-1");
    assert!(state_file(&c, "quiescence.jws").is_some(), "the first freeze left no marker");
    let helper = credential_helper(&c);
    assert_eq!(unsafe { libc::kill(helper, libc::SIGSTOP) }, 0, "stop the credential helper {helper}");
    let _w = c.launch(uid, &["sleepers", "5"]);
    let st = c.state.to_str().unwrap().to_string();
    let q = quiesce();
    let out = output(&mut c.exec_cmd(&[q.to_str().unwrap(), "freeze", "--state-dir", &st, "--nonce", "m-2"]));
    assert_eq!(out.status.code(), Some(0), "the request: {}", String::from_utf8_lossy(&out.stderr));
    // The init takes the request (the client's return) and unlinks the marker in one turn of its
    // loop; the helper's bound is 2 s. Looked for until 1 s has passed.
    let asked = Instant::now();
    while state_file(&c, "quiescence.jws").is_some() && asked.elapsed() < Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(
        state_file(&c, "quiescence.jws").is_none(),
        "the old marker was still readable {:?} after the request was taken, while the first stop waited \
         for the stopped helper\n{}",
        asked.elapsed(),
        log(&c)
    );
    let said = wait_log(&c, "credential helper", Duration::from_secs(30));
    assert!(said.contains("did not answer"), "{said}");
    assert!(c.alive(), "the init died of its stopped helper");
    let _w = c.launch(uid, &["sleepers", "5"]);
    quiescent(&c, uid, "m-3");
}

/// The host pid of the init's credential helper: its child that runs the init's own binary.
fn credential_helper(c: &Container) -> i32 {
    let kids = std::fs::read_dir(format!("/proc/{}/task", c.init))
        .expect("the init's threads")
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|k| k.split_whitespace().filter_map(|p| p.parse::<i32>().ok()).collect::<Vec<_>>());
    let helpers: Vec<i32> = kids
        .filter(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|n| n.trim() == "quiesce"))
        .collect();
    assert_eq!(helpers.len(), 1, "one credential helper: {helpers:?}");
    helpers[0]
}

/// A memory cgroup of the test's own, under this process's (cgroup v1's memory hierarchy) or at
/// the root of v2's, removed when dropped once the namespace inside it has ended.
struct MemCgroup {
    dir: PathBuf,
    v1: bool,
}

impl MemCgroup {
    fn new(tag: &str) -> Result<MemCgroup, String> {
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let (base, is_v1) = if v1.join("cgroup.procs").exists() {
            // Under our own: whatever bounds this run's memory bounds the container's too.
            let own = read(Path::new("/proc/self/cgroup"))
                .lines()
                .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.trim_start_matches('/').to_string()))
                .unwrap_or_default();
            (v1.join(own), true)
        } else if read(Path::new("/sys/fs/cgroup/cgroup.subtree_control"))
            .split_whitespace()
            .any(|c| c == "memory")
        {
            // The limits, the peak and the OOM count are read from v2's files too, but the
            // limit was chosen and the test shown to fail on v1 only: not counted as passed.
            return Err("cgroup v2: this test was measured and shown to fail on cgroup v1's memory \
                 controller only"
                .into());
        } else {
            return Err(
                "no memory controller (cgroup v1 memory, or v2 with memory enabled at its root)".into()
            );
        };
        let dir = base.join(format!("quiesce-test-{tag}-{}", std::process::id()));
        std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        Ok(MemCgroup { dir, v1: is_v1 })
    }

    fn file(&self, v1: &str, v2: &str) -> PathBuf {
        self.dir.join(if self.v1 { v1 } else { v2 })
    }

    fn bytes(&self, v1: &str, v2: &str) -> u64 {
        read(&self.file(v1, v2)).trim().parse().unwrap_or(0)
    }

    /// Bytes charged now, and the most ever charged.
    fn usage(&self) -> (u64, u64) {
        (
            self.bytes("memory.usage_in_bytes", "memory.current"),
            self.bytes("memory.max_usage_in_bytes", "memory.peak"),
        )
    }

    /// The limit on memory, and on memory and swap together (no swap to spill to: the limit is
    /// the limit), or none (`None`). v1 keeps memory+swap at or above memory: raised first when
    /// the limit goes up, lowered after it when it goes down.
    fn set_limit(&self, bytes: Option<u64>) {
        let (mem, both) = if self.v1 {
            ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")
        } else {
            ("memory.max", "memory.swap.max")
        };
        let value = bytes.map_or(if self.v1 { "-1".into() } else { "max".into() }, |b| b.to_string());
        let swap = if self.v1 { value.clone() } else { "0".into() };
        // Not every kernel accounts swap: that file may be missing or refuse.
        let _ = std::fs::write(self.dir.join(both), &swap);
        std::fs::write(self.dir.join(mem), &value)
            .unwrap_or_else(|e| panic!("cannot set {} to {value}: {e}", self.dir.join(mem).display()));
        let _ = std::fs::write(self.dir.join(both), &swap);
    }

    /// Processes the OOM killer took in this cgroup so far.
    fn oom_kills(&self) -> u64 {
        read(&self.file("memory.oom_control", "memory.events"))
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
            .unwrap_or(0)
    }

    /// A shell prefix (`sh -c THIS sh CMD...`) that moves itself into the cgroup, then execs CMD.
    fn enter(&self) -> String {
        format!("echo 0 > {} && exec \"$@\"", self.dir.join("cgroup.procs").display())
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        // Its last tasks are released a little after the namespace's PID 1 is reaped.
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while std::fs::remove_dir(&self.dir).is_err() && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        if self.dir.exists() {
            eprintln!("harness: cannot remove the memory cgroup {}", self.dir.display());
        }
    }
}

/// A kB field of the init's /proc/PID/status (VmHWM: its peak resident set; VmRSS: now).
fn init_kb(c: &Container, field: &str) -> u64 {
    let s = read(Path::new(&format!("/proc/{}/status", c.init)));
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':')?.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// `quiesce freeze --wait --json` entered into the memory cgroup, as `docker exec` puts a
/// client into the container's: (exit code, status).
fn freeze_in(c: &Container, mc: &MemCgroup, nonce: &str) -> (i32, serde_json::Value) {
    let (enter, st, q) = (mc.enter(), c.state.display().to_string(), quiesce().display().to_string());
    let args =
        ["sh", "-c", &enter, "sh", &q, "freeze", "--state-dir", &st, "--wait", "--json", "--nonce", nonce];
    let out = c.exec(&args);
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(
        |_| serde_json::json!({ "client_stderr": String::from_utf8_lossy(&out.stderr).to_string() }),
    );
    (out.status.code().unwrap_or(-1), v)
}

/// A workload launched as `uid` by `quiesce exec` inside the memory cgroup.
fn launch_in(c: &Container, mc: &MemCgroup, uid: u32, args: &[&str]) -> Workload {
    let (enter, u, q, a) = (mc.enter(), uid.to_string(), quiesce().display().to_string(), adv());
    let mut full = vec!["sh", "-c", &enter, "sh", &q, "exec", "--user", &u, "--", &a];
    full.extend_from_slice(args);
    c.start_ready(c.exec_cmd(&full), &format!("{args:?} as {uid} in the memory cgroup"))
}

/// `args` entered as `uid` inside the memory cgroup as `docker exec -u` enters it: no `quiesce
/// exec`, so nothing raised its oom_score_adj at its start.
fn enter_in_cmd(c: &Container, mc: &MemCgroup, uid: u32, args: &[&str]) -> std::process::Command {
    let (enter, u, a) = (mc.enter(), uid.to_string(), adv());
    let mut full =
        vec!["sh", "-c", &enter, "sh", "setpriv", "--reuid", &u, "--regid", &u, "--clear-groups", &a];
    full.extend_from_slice(args);
    c.exec_cmd(&full)
}

/// `enter_in_cmd`'s workload, once it says it is ready.
/// One more 1 MiB hog entered at the memory limit; the OOM kills it caused since `before`, and
/// its guard (it holds its memory until the namespace ends: what is awaited is the kill).
fn one_more_at_the_limit(c: &mut Container, mc: &MemCgroup, uid: u32, before: u64) -> (u64, Guard) {
    let mut more = enter_in_cmd(c, mc, uid, &["hog", "1", "1"]);
    more.env("ADV_READY", c.path("ready-one-more"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null());
    let more = guard(more);
    let until = Instant::now() + Duration::from_secs(20);
    while mc.oom_kills() == before && Instant::now() < until && c.alive() {
        std::thread::sleep(Duration::from_millis(20));
    }
    (mc.oom_kills() - before, more)
}

fn enter_in(c: &Container, mc: &MemCgroup, uid: u32, args: &[&str]) -> Workload {
    c.start_ready(enter_in_cmd(c, mc, uid, args), &format!("{args:?} entered as {uid} in the memory cgroup"))
}

/// The oom_score_adj of each live process of `uid` in the container.
fn oom_scores(c: &Container, uid: u32) -> Vec<(i32, String)> {
    let live = c.live_of_uid(uid);
    live.into_iter()
        .map(|p| (p, c.proc_read(p, "oom_score_adj").unwrap_or_default().trim().to_string()))
        .collect()
}

/// Wait until every live process of `uid` holds oom_score_adj 1000 (bounded: a tracking
/// refresh comes every second).
fn wait_raised(c: &Container, uid: u32) {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = oom_scores(c, uid);
        if !seen.is_empty() && seen.iter().all(|(_, s)| s == "1000") {
            return;
        }
        assert!(
            Instant::now() < until,
            "not every process of {uid} was raised within 10 s: {seen:?}\n{}",
            log(c)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A freeze asked for from outside, as `docker kill -s USR1` asks: its final status, read in the
/// init's mount namespace, and how long it took.
fn bare_freeze(c: &Container) -> (serde_json::Value, Duration) {
    bare_freeze_then(c, || {})
}

/// `bare_freeze`, `then` run as soon as the freeze is asked for.
fn bare_freeze_then(c: &Container, then: impl FnOnce()) -> (serde_json::Value, Duration) {
    let status = || -> serde_json::Value {
        state_file(c, "status.json").and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default()
    };
    let before = status()["id"].clone();
    let t = std::time::Instant::now();
    c.signal(libc::SIGUSR1);
    then();
    let mut st = serde_json::Value::Null;
    wait_for("the freeze to end", Duration::from_secs(60), || {
        st = status();
        assert!(Path::new(&format!("/proc/{}", c.init)).exists(), "the init died in the freeze: {}", log(c));
        st["id"] != before && matches!(st["state"].as_str(), Some("quiescent" | "failed"))
    });
    (st, t.elapsed())
}

/// Room left under the limit once the sandbox holds its memory: less than a freeze of 300
/// processes needs, so the init's own charges meet the limit in the freeze.
const ROOM: u64 = 64 << 10;

/// The memory tests one at a time: each sets a limit a few pages above what its container
/// holds, and the machine's reclaim under several at once made the init's charges miss it.
static MEMORY: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn memory_serial() -> std::sync::MutexGuard<'static, ()> {
    MEMORY.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn a_memory_limit_reached_mid_freeze_takes_the_hog_not_the_init() {
    let _m = memory_serial();
    let name = "a_memory_limit_reached_mid_freeze_takes_the_hog_not_the_init";
    let mc = match MemCgroup::new("mem") {
        Ok(m) => m,
        Err(e) => return skip(name, &e),
    };
    let uid = 4260;
    // Entered inside the namespace, as a runtime puts a container's processes in its cgroup:
    // what starts the namespace from outside is not the container's.
    let first = format!("echo 0 > {} && ", mc.dir.join("cgroup.procs").display());
    let mut c = container_opts(uid, 2048, &first, Opts::default());
    let _w = launch_in(&c, &mc, uid, &["sleepers", "300"]);
    let (st, _) = bare_freeze(&c);
    assert_eq!(st["state"], "quiescent", "the freeze before any limit: {st}\n{}", log(&c));
    eprintln!(
        "memory: the init's VmHWM {} kB after a freeze of 300; the cgroup's peak {} B",
        init_kb(&c, "VmHWM"),
        mc.usage().1
    );
    for round in 1..=3 {
        mc.set_limit(None);
        let _w = launch_in(&c, &mc, uid, &["sleepers", "300"]);
        // Three hogs of 8 MiB: the largest processes of the container, far above the init.
        let _hogs = launch_in(&c, &mc, uid, &["hog", "3", "8"]);
        // Asked for from outside (`docker kill -s USR1`): nothing but the init charges the
        // cgroup from here, and the limit is just above what the container holds.
        let (now, _) = mc.usage();
        mc.set_limit(Some(now + ROOM));
        let kills = mc.oom_kills();
        let (st, took) = bare_freeze(&c);
        let kills = mc.oom_kills() - kills;
        eprintln!(
            "memory: round {round}: limit {} B ({now} B held + {ROOM}); freeze {} in {took:?} ({} ms by its \
             phases, {} killed): {kills} OOM kill(s) during it; the init's \
             VmHWM {} kB",
            now + ROOM,
            st["state"],
            st["phases_ms"]["total"],
            st["killed"],
            init_kb(&c, "VmHWM")
        );
        assert!(c.alive(), "the init died under its memory limit: {}", log(&c));
        // Only the init charges the cgroup during the freeze: an OOM kill then is its charge
        // meeting the limit (v1's failcnt does not count a charge that an OOM kill let through).
        assert!(kills > 0, "the limit was not met during the freeze: the test tested nothing");
        if st["state"] == "quiescent" {
            assert!(c.live_of_uid(uid).is_empty(), "quiescent beside a live sandbox: {st}");
            assert_scored(&c.verify(&["--", "echo", "scored"]), &format!("round {round}"));
        } else {
            let why = st["reason"].as_str().unwrap_or_default();
            assert!(!why.is_empty(), "a freeze failed unnamed: {st}\n{}", log(&c));
            assert!(state_file(&c, "quiescence.jws").is_none(), "a marker beside a failed freeze: {st}");
        }
        // The fault gone: no hog left (a failed freeze may have left them; they go from
        // outside).
        wait_for("the hogs to be gone", Duration::from_secs(30), || {
            for p in host_live_of_uid(&c, uid) {
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
            host_live_of_uid(&c, uid).is_empty()
        });
    }
    mc.set_limit(None);
    let _w = launch_in(&c, &mc, uid, &["sleepers", "20"]);
    let (code, st) = freeze_in(&c, &mc, "m-after");
    assert_eq!(code, 0, "the freeze after the hogs: {st}\n{}", log(&c));
    assert!(c.live_of_uid(uid).is_empty(), "quiescent beside a live sandbox after the hogs");
    assert_scored(&c.verify(&["--nonce", "m-after", "--", "echo", "scored"]), "m-after");
    assert!(c.alive(), "the init died after its memory limit");
    eprintln!("memory: {} OOM kills in all; the init's VmHWM {} kB", mc.oom_kills(), init_kb(&c, "VmHWM"));
}

#[test]
fn a_request_written_before_the_wall_clock_moved_waits_for_its_client() {
    let uid = 4616;
    let c = container(uid, 2048);
    let _w = c.launch(uid, &["sleepers", "5"]);
    // A client (root, in the container) that wrote its request an hour ago by the wall clock
    // as it is now (the clock set forward since) and has not signalled yet: it does once told.
    let script = r#"
        id=$(printf '%016x%08x00000001' $(( ($(date +%s) - 3600) * 1000000000 )) $$)
        r="$QUIESCE_STATE_DIR/requests"
        printf '{"nonce":"late","request_id":"%s","pid":%d}' "$id" $$ > "$r/.$id.tmp" && mv "$r/.$id.tmp" "$r/$id"
        echo "$id" > "$D/late-id.tmp" && mv "$D/late-id.tmp" "$D/late-id"
        i=0; while [ ! -e "$D/go" ] && [ $i -lt 6000 ]; do sleep 0.01; i=$((i+1)); done
        i=0; while [ -e "$r/$id" ] && [ $i -lt 500 ]; do kill -USR1 1; sleep 0.02; i=$((i+1)); done
        a="$QUIESCE_STATE_DIR/results/$id.json"
        i=0; while [ ! -e "$a" ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done
        cat "$a""#;
    let mut late = c.exec_cmd(&["sh", "-c", script]);
    late.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::null());
    let mut late = Guard(late.spawn().expect("start the late client"));
    wait_for("the late client's request", Duration::from_secs(30), || c.dir.join("late-id").exists());
    let id = read(&c.dir.join("late-id")).trim().to_string();
    // Another client's freeze: the init lists the waiting request and must leave it.
    quiescent(&c, uid, "c-1");
    assert!(
        state_file(&c, &format!("requests/{id}")).is_some(),
        "a waiting request was removed because its name says an hour ago: {}",
        log(&c)
    );
    let _w = c.launch(uid, &["sleepers", "5"]);
    std::fs::write(c.dir.join("go"), b"").unwrap();
    let out = {
        let mut s = String::new();
        let mut o = late.0.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = std::io::Read::read_to_string(&mut o, &mut s);
            let _ = tx.send(s);
        });
        rx.recv_timeout(Duration::from_secs(90)).expect("the late client's answer")
    };
    let st: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
    assert_eq!(
        st["request_id"],
        id.as_str(),
        "the late client got no answer of its own: '{out}'\n{}",
        log(&c)
    );
    assert_eq!(st["state"], "quiescent", "{st}");
    assert_eq!(st["nonce"], "late", "{st}");
    assert_scored(&c.verify(&["--nonce", "late", "--", "echo", "scored"]), "late");
}

/// The init's wall clock, as libfaketime moves it: a dynamically linked build (the shipped one
/// is static, which no preloaded library reaches), its clock read from `$D/clock` at every call.
fn faked_clock() -> Result<(PathBuf, PathBuf), String> {
    let bin =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("target/dynamic/x86_64-unknown-linux-gnu/release/quiesce");
    let lib = Path::new("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1");
    if !bin.exists() {
        return Err(format!(
            "no dynamic build at {}: RUSTFLAGS='-C target-feature=-crt-static' cargo build --release \
             --target x86_64-unknown-linux-gnu --target-dir target/dynamic --bin quiesce",
            bin.display()
        ));
    }
    if !lib.exists() {
        return Err(format!("no {}: apt-get install faketime", lib.display()));
    }
    Ok((bin, lib.to_path_buf()))
}

/// The marker's `iat` minus the wall clock's now, in seconds.
fn iat_offset(c: &Container) -> i64 {
    use base64::Engine;
    let m = String::from_utf8(state_file(c, "quiescence.jws").expect("a marker")).unwrap();
    let claims: serde_json::Value = m
        .split('.')
        .nth(1)
        .and_then(|p| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(p.trim()).ok())
        .and_then(|b| serde_json::from_slice(&b).ok())
        .expect("the marker's claims");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    claims["iat"].as_i64().expect("iat") - now
}

#[test]
fn the_wall_clock_moved_an_hour_mid_freeze_leaves_proof_and_verify_truthful() {
    let name = "the_wall_clock_moved_an_hour_mid_freeze_leaves_proof_and_verify_truthful";
    let (bin, lib) = match faked_clock() {
        Ok(f) => f,
        Err(e) => return skip(name, &e),
    };
    let uid = 4617;
    // Only the wall clock moves, as when the host's is set: the monotonic one stays.
    let first = format!(
        "echo +0 > \"$D/clock\" && export LD_PRELOAD={} FAKETIME_TIMESTAMP_FILE=\"$D/clock\" \
         FAKETIME_NO_CACHE=1 FAKETIME_DONT_FAKE_MONOTONIC=1 && ",
        lib.display()
    );
    let mut c = container_opts(uid, 4096, &first, Opts { init_bin: Some(bin), ..Default::default() });
    let clock = |offset: &str| {
        let tmp = c.dir.join("clock.tmp");
        std::fs::write(&tmp, format!("{offset}\n")).unwrap();
        std::fs::rename(&tmp, c.dir.join("clock")).unwrap();
    };
    let verify = |args: &[&str]| {
        let mut full = args.to_vec();
        full.extend_from_slice(&["--", "echo", "scored"]);
        let out = c.verify(&full);
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).to_string())
    };
    for (offset, refused) in [("+3600", "in the future"), ("-3600", "older than --max-age")] {
        let _w = c.launch(uid, &["sleepers", "300"]);
        // Moved while the freeze stops, walks and kills 300 processes.
        let (st, took) = bare_freeze_then(&c, || clock(offset));
        let skew = iat_offset(&c);
        eprintln!(
            "clock {offset}: freeze {} in {took:?} ({} ms by its phases, {} killed); the marker's iat {skew:+} s from now",
            st["state"],
            st["phases_ms"]["total"],
            st["killed"]
        );
        assert_eq!(st["state"], "quiescent", "clock {offset}: {st}\n{}", log(&c));
        assert!(c.live_of_uid(uid).is_empty(), "clock {offset}: quiescent beside a live sandbox");
        // The marker says when the init's clock said it was signed; verify, by the real clock,
        // refuses it, naming why.
        let hour = if offset.starts_with('+') { 3600 } else { -3600 };
        assert!((skew - hour).abs() < 60, "clock {offset}: iat {skew:+} s from now");
        let (code, said) = verify(&["--max-age", "600"]);
        assert_eq!(code, 14, "clock {offset}: verify: {said}");
        assert!(said.contains(refused), "clock {offset}: verify: {said}");
        // The clock left moved: the next freeze works, and so does the one after it is set right.
        let _w = c.launch(uid, &["sleepers", "5"]);
        let (code, st) = c.freeze(&format!("moved{offset}"));
        assert_eq!(code, 0, "clock {offset}, left moved: {st}\n{}", log(&c));
        clock("+0");
        let _w = c.launch(uid, &["sleepers", "5"]);
        quiescent(&c, uid, &format!("back{offset}"));
        assert!(iat_offset(&c).abs() < 60, "clock set right: iat {:+} s from now", iat_offset(&c));
    }
    assert!(c.alive(), "the init died of a moved clock");
}

#[test]
fn a_memory_limit_met_by_sandbox_processes_all_smaller_than_the_init_takes_them_not_the_init() {
    let _m = memory_serial();
    // Forty hogs of 1 MiB, each smaller than the init (about 2 MB): by size alone the OOM killer
    // would take the command and then the init, ending the container. Launched through `quiesce
    // exec`, they carry oom_score_adj 1000 and go first.
    let name = "a_memory_limit_met_by_sandbox_processes_all_smaller_than_the_init_takes_them_not_the_init";
    let mc = match MemCgroup::new("mem-small") {
        Ok(m) => m,
        Err(e) => return skip(name, &e),
    };
    let uid = 4261;
    let first = format!("echo 0 > {} && ", mc.dir.join("cgroup.procs").display());
    let mut c = container_opts(uid, 2048, &first, Opts::default());
    let _w = launch_in(&c, &mc, uid, &["sleepers", "300"]);
    let _hogs = launch_in(&c, &mc, uid, &["hog", "40", "1"]);
    let (now, _) = mc.usage();
    mc.set_limit(Some(now + ROOM));
    let kills = mc.oom_kills();
    // One more process meets the limit: the freeze's own charges no longer do, once a tracking
    // refresh has read the whole sandbox into the init's heap before the request.
    let (kills, _more) = one_more_at_the_limit(&mut c, &mc, uid, kills);
    eprintln!("memory, small hogs: one more process at the limit; {kills} OOM kill(s)");
    assert!(c.alive(), "the init died under its memory limit: {}", log(&c));
    assert!(kills > 0, "the limit was not met: the test tested nothing");
    let (st, took) = bare_freeze(&c);
    eprintln!("memory, small hogs: then a freeze {} in {took:?}", st["state"]);
    assert!(c.alive(), "the init died in the freeze under its memory limit: {}", log(&c));
    if st["state"] == "quiescent" {
        assert!(c.live_of_uid(uid).is_empty(), "quiescent beside a live sandbox: {st}");
    } else {
        assert!(state_file(&c, "quiescence.jws").is_none(), "a marker beside a failed freeze: {st}");
    }
    mc.set_limit(None);
}

#[test]
fn processes_entered_as_the_sandbox_user_are_made_the_oom_killers_first_choice() {
    // `docker exec -u` with no `quiesce exec`: a tracking refresh raises each sandbox process,
    // children forked before it included; a root process entered from outside is not touched.
    let uid = 4262;
    let mut c = container(uid, 2048);
    let u = uid.to_string();
    let root = c.launch_root(&["sleepers", "1"]);
    let entered = ["setpriv", "--reuid", &u, "--regid", &u, "--clear-groups", &adv(), "sleepers", "5"];
    let _w = c.start_ready(c.exec_cmd(&entered), "sleepers entered as the sandbox user");
    assert_eq!(c.live_of_uid(uid).len(), 6, "{:?}", oom_scores(&c, uid));
    wait_raised(&c, uid);
    let root_score = c.proc_read(root.pid, "oom_score_adj").unwrap_or_default();
    assert_eq!(root_score.trim(), "0", "a root process entered from outside was raised");
    assert!(c.alive());
}

#[test]
fn a_memory_limit_met_by_small_processes_entered_without_quiesce_exec_takes_them_not_the_init() {
    // Forty hogs of 1 MiB entered as `docker exec -u` enters them, each smaller than the init:
    // once a tracking refresh raised them, one more process entered at the limit meets it, and
    // the OOM killer takes sandbox processes, not the init (with the raise removed, it took the
    // init). Then a freeze, which must not lie about what the kills left.
    let _m = memory_serial();
    let name = "a_memory_limit_met_by_small_processes_entered_without_quiesce_exec_takes_them_not_the_init";
    let mc = match MemCgroup::new("mem-entered") {
        Ok(m) => m,
        Err(e) => return skip(name, &e),
    };
    let uid = 4263;
    let first = format!("echo 0 > {} && ", mc.dir.join("cgroup.procs").display());
    let mut c = container_opts(uid, 2048, &first, Opts::default());
    let _w = enter_in(&c, &mc, uid, &["sleepers", "300"]);
    let _hogs = enter_in(&c, &mc, uid, &["hog", "40", "1"]);
    wait_raised(&c, uid);
    let (now, _) = mc.usage();
    mc.set_limit(Some(now + ROOM));
    let kills = mc.oom_kills();
    let (kills, _more) = one_more_at_the_limit(&mut c, &mc, uid, kills);
    eprintln!("memory, small hogs entered: one more process entered at the limit; {kills} OOM kill(s)");
    assert!(c.alive(), "the init died under its memory limit: {}", log(&c));
    assert!(kills > 0, "the limit was not met: the test tested nothing");
    let (st, took) = bare_freeze(&c);
    eprintln!("memory, small hogs entered: then a freeze {} in {took:?}", st["state"]);
    assert!(c.alive(), "the init died in the freeze under its memory limit: {}", log(&c));
    if st["state"] == "quiescent" {
        assert!(c.live_of_uid(uid).is_empty(), "quiescent beside a live sandbox: {st}");
    } else {
        assert!(state_file(&c, "quiescence.jws").is_none(), "a marker beside a failed freeze: {st}");
    }
    mc.set_limit(None);
}

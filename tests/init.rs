//! The init's job, tested on the real binary as PID 1 of a real PID namespace.

mod common;
use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(20);

/// Shell that waits (up to 10 s) until no process but PID 1 and itself is left in the namespace,
/// dead or alive, then writes how many are left to $D/left and lists them in $D/left-ps.
const COUNT_LEFT: &str = r#"i=0; while :; do n=0; : > $D/left-ps
    for f in /proc/[0-9]*/stat; do read -r l < $f 2>/dev/null || continue; p=${l%% *}
        [ "$p" = 1 ] || [ "$p" = $$ ] && continue; n=$((n+1)); echo "$l" >> $D/left-ps; done
    [ $n = 0 ] || [ $i -ge 200 ] && break; i=$((i+1)); sleep 0.05; done; echo $n > $D/left"#;

/// `unshare --pid --fork --mount-proc --kill-child ARGS`, bounded: whatever it leaves behind
/// ends with its PID namespace.
fn in_namespace(args: &[&std::ffi::OsStr]) -> std::process::Output {
    let mut c = Command::new("unshare");
    c.args(["--pid", "--fork", "--mount-proc", "--kill-child"]).args(args);
    output_within(&mut c, Duration::from_secs(30))
}

fn run(args: &[&str], cmd: &[&str]) -> i32 {
    Container::start(args, cmd).wait_code(T)
}

#[test]
fn exit_codes_pass_through() {
    for code in [0, 1, 2, 127, 254, 255] {
        assert_eq!(run(&[], &["sh", "-c", &format!("exit {code}")]), code, "exit {code}");
    }
}

#[test]
fn killed_by_signal_is_128_plus_n() {
    for (name, n) in [("TERM", 15), ("HUP", 1), ("KILL", 9)] {
        assert_eq!(run(&[], &["sh", "-c", &format!("kill -{name} $$")]), 128 + n, "{name}");
    }
}

#[test]
fn exec_failures_are_127_and_126_with_one_line() {
    let q = quiesce();
    let out = in_namespace(&[q.as_ref(), "--".as_ref(), "no-such-command-here".as_ref()]);
    assert_eq!(out.status.code(), Some(127));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("'no-such-command-here'") && err.contains("not found"), "{err}");

    let d = scratch("noexec");
    let f = d.join("script");
    std::fs::write(&f, "#!/bin/sh\nexit 0\n").unwrap();
    let out = in_namespace(&[q.as_ref(), "--".as_ref(), f.as_ref()]);
    assert_eq!(out.status.code(), Some(126));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("permission denied"), "{err}");
}

/// A step before the exec that fails (here the privilege drop of an init without CAP_SETGID) is
/// named whole in one line, and the status is 126: the child reports it through the memory it
/// shares with the init until the exec.
#[test]
fn a_failed_privilege_drop_is_126_with_the_step_named() {
    let q = quiesce();
    let out = in_namespace(&[
        "setpriv".as_ref(),
        "--reuid=1000".as_ref(),
        "--regid=1000".as_ref(),
        "--clear-groups".as_ref(),
        q.as_ref(),
        "--run-as".as_ref(),
        "4243".as_ref(),
        "--".as_ref(),
        "true".as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(126));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("cannot run 'true': setgroups failed"), "{err}");
}

/// The command's child shares the init's memory until its exec, the C library's thread list
/// included: its drop to the sandbox user must change that child alone, never the init's threads
/// (which a sandbox user runs beside).
#[test]
fn the_privilege_drop_leaves_every_thread_of_the_init_root() {
    let q = quiesce();
    let d = scratch("drop-threads");
    let state = d.join("state");
    let script = "for t in /proc/1/task/*; do grep -H '^Uid:' $t/status; done; id -u";
    let out = in_namespace(&[
        q.as_ref(),
        "--sandbox-user".as_ref(),
        "4242".as_ref(),
        "--run-as".as_ref(),
        "4242".as_ref(),
        "--state-dir".as_ref(),
        state.as_ref(),
        "--".as_ref(),
        "sh".as_ref(),
        "-c".as_ref(),
        script.as_ref(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text} {}", String::from_utf8_lossy(&out.stderr));
    let uids: Vec<&str> = text.lines().filter(|l| l.contains("Uid:")).collect();
    assert!(uids.len() >= 2, "the init runs threads with a sandbox user: {text}");
    for l in &uids {
        assert!(l.ends_with("Uid:\t0\t0\t0\t0"), "{l}");
    }
    assert_eq!(text.lines().last(), Some("4242"), "{text}");
}

/// A `--run-as` command is the sandbox's: the OOM killer takes it (and what it starts) before
/// the init, as it takes a `quiesce exec` launch (tests/faults.rs, the small hogs).
#[test]
fn a_run_as_command_goes_first_at_a_memory_limit() {
    let q = quiesce();
    let d = scratch("run-as-oom");
    let state = d.join("state");
    let out = in_namespace(&[
        q.as_ref(),
        "--sandbox-user".as_ref(),
        "4242".as_ref(),
        "--run-as".as_ref(),
        "4242".as_ref(),
        "--state-dir".as_ref(),
        state.as_ref(),
        "--".as_ref(),
        "sh".as_ref(),
        "-c".as_ref(),
        "cat /proc/self/oom_score_adj /proc/1/oom_score_adj".as_ref(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text} {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(text.split_whitespace().collect::<Vec<_>>(), ["1000", "0"], "command, then the init");
}

/// A `quiesce exec` launch runs at SCHED_IDLE, and so does what it starts, with no way back
/// (RLIMIT_NICE 0): under a fork bomb of it the init and a freeze client get the CPU first.
/// `--no-idle` leaves the normal policy. The policy is read from the kernel (chrt -p), and the
/// way back is tried as the launch itself.
#[test]
fn a_quiesce_exec_launch_runs_idle_and_cannot_leave_it() {
    let q = quiesce();
    let d = scratch("exec-idle");
    let state = d.join("state");
    let qs = q.to_str().unwrap();
    let probe = "chrt -p $$; sh -c 'chrt -p $$'; if chrt -o -p 0 $$ 2>/dev/null; then echo left; else echo stayed; fi";
    let script = format!(
        "{qs} exec --user 4242 -- sh -c \"$P\"; echo ---; {qs} exec --user 4242 --no-idle -- sh -c \"$P\""
    );
    // Started with an RLIMIT_NICE that would let a thread leave SCHED_IDLE, the launch must lower
    // it. Raising it needs CAP_SYS_RESOURCE: where root lacks that, the hard limit is what the
    // machine gives (0 on most), and only the policy is shown.
    let raised = Command::new("prlimit").args(["--nice=20:20", "true"]).status().is_ok_and(|s| s.success());
    if !raised {
        eprintln!(
            "RLIMIT_NICE cannot be raised here (no CAP_SYS_RESOURCE): the launch's own limit is not shown"
        );
    }
    let mut c = Command::new(if raised { "prlimit" } else { "env" });
    c.args(raised.then_some("--nice=20:20"))
        .args(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"])
        .args([
            qs,
            "--sandbox-user",
            "4242",
            "--state-dir",
            state.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &script,
        ])
        .env("P", probe);
    let out = output_within(&mut c, Duration::from_secs(30));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text} {}", String::from_utf8_lossy(&out.stderr));
    let (idle, normal) = text.split_once("---").unwrap_or_else(|| panic!("{text}"));
    let policies = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| l.contains("policy:"))
            .map(|l| l.rsplit(' ').next().unwrap_or("").to_string())
            .collect()
    };
    assert_eq!(policies(idle), ["SCHED_IDLE", "SCHED_IDLE"], "the launch, then its child: {text}");
    assert_eq!(idle.lines().last(), Some("stayed"), "the launch left SCHED_IDLE: {text}");
    assert_eq!(policies(normal), ["SCHED_OTHER", "SCHED_OTHER"], "--no-idle: {text}");
}

#[test]
fn a_child_exiting_127_is_not_an_exec_failure() {
    // catatonit#5: a command that itself exits 127 is reported as its status, silently.
    let q = quiesce();
    let out = in_namespace(&[q.as_ref(), "--".as_ref(), "sh".as_ref(), "-c".as_ref(), "exit 127".as_ref()]);
    assert_eq!(out.status.code(), Some(127));
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn remap_exit_code() {
    assert_eq!(run(&["-e", "3"], &["sh", "-c", "exit 3"]), 0);
    assert_eq!(run(&["-e", "3"], &["sh", "-c", "exit 4"]), 4);
}

#[test]
fn every_catchable_signal_is_forwarded() {
    let adv = adversary();
    let mut c = Container::start_with(
        Opts { stdout: Stdio::piped(), ready: true, ..Default::default() },
        &[adv.to_str().unwrap(), "signals"],
    );
    let lines = c.stdout_lines();
    let mut sigs: Vec<i32> = (1..=31).filter(|&s| ![9, 19, 17, 15].contains(&s)).collect();
    sigs.push(libc::SIGRTMIN() + 2);
    sigs.push(15);
    for s in sigs {
        c.signal(s);
        assert_eq!(lines.next_within(Duration::from_secs(10)), format!("got {s}"), "signal {s}");
    }
    assert_eq!(c.wait_code(T), 0);
}

#[test]
fn pgroup_mode_signals_the_whole_pipeline() {
    // The sleeps ignore TERM, so only the forwarded USR2 can end them before the grace (60 s,
    // past the 10 s bound below). Each stage says when it has set its trap.
    let pipeline = "(trap '' TERM; touch $D/a; exec sleep 100) | (trap '' TERM; touch $D/b; exec sleep 100)";
    let started = |c: &Container| {
        wait_for("the pipeline", Duration::from_secs(10), || c.path("a").exists() && c.path("b").exists());
        let sh = c.children_of(1);
        assert_eq!(sh.len(), 1, "{sh:?}");
        let stages = c.children_of(sh[0]);
        assert_eq!(stages.len(), 2, "{stages:?}");
        (sh[0], stages)
    };
    let mut with = Container::start(&["-g", "--grace", "60"], &["sh", "-c", pipeline]);
    started(&with);
    with.signal(libc::SIGUSR2);
    assert_eq!(with.wait_code(Duration::from_secs(10)), 128 + libc::SIGUSR2);

    let mut without = Container::start(&["--grace", "60"], &["sh", "-c", pipeline]);
    let (sh, stages) = started(&without);
    without.signal(libc::SIGUSR2);
    // The shell dies of it and is reaped; the stages were never signalled and live on.
    wait_for("the shell to end", Duration::from_secs(10), || without.stat(sh).is_none());
    for p in stages {
        assert!(
            without.stat(p).is_some_and(|s| s.live()),
            "without -g stage {p} should have outlived the signal"
        );
    }
    assert!(without.alive());
}

/// Run `prelude` as the command, then wait until nothing else is left in the namespace: no
/// live process and no zombie. Returns how many were left (after 10 s at most), and which.
fn left_after(prelude: &str) -> (String, String) {
    let script = format!("{prelude}; {COUNT_LEFT}");
    let mut c = Container::start(&[], &["sh", "-c", &script]);
    assert_eq!(c.wait_code(T), 0);
    (read(&c.path("left")).trim().to_string(), read(&c.path("left-ps")))
}

#[test]
fn thousand_orphans_are_reaped() {
    let (n, ps) = left_after("$ADV orphans 1000 > /dev/null");
    assert_eq!(n, "0", "{ps}");
}

#[test]
fn grandchild_orphan_is_reaped() {
    let (n, ps) = left_after("(sh -c 'exit 0' &)");
    assert_eq!(n, "0", "{ps}");
}

#[test]
fn instantly_failing_children_never_hang_the_init() {
    // dumb-init#102: thousands of children that fail at once, orphaned to the init.
    let mut c = Container::start(
        &[],
        &["sh", "-c", "i=0; while [ $i -lt 2000 ]; do false & i=$((i+1)); done; exit 0"],
    );
    assert_eq!(c.wait_code(Duration::from_secs(30)), 0);
}

#[test]
fn child_killing_itself_while_a_sibling_exits() {
    // catatonit#4: the command's own status wins, whatever else is reaped at the same moment.
    let mut c = Container::start(&[], &["sh", "-c", "(sleep 0.05; exit 3) & sleep 0.05; kill -9 $$"]);
    assert_eq!(c.wait_code(T), 137);
}

#[test]
fn shutdown_terms_then_kills_after_grace_and_waits() {
    let script = "(trap '' TERM; touch $D/trapped; exec sleep 100) & \
                  while [ ! -e $D/trapped ]; do sleep 0.01; done; exit 7";
    let mut c = Container::start(&["--grace", "1"], &["sh", "-c", script]);
    let t = Instant::now();
    assert_eq!(c.wait_code(T), 7);
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(900), "exited after {took:?}, before the grace");
}

#[test]
fn subreaper_when_not_pid_1() {
    // quiesce as a child of a shell that is PID 1 of a namespace of its own: not PID 1, so a
    // subreaper, and nothing it leaves behind can reach the host. The subshell orphans a sleep,
    // which must reparent to quiesce; when the command ends quiesce TERMs it and waits, well
    // within a 60 s grace the 30 s bound cuts short. The outer shell then records whether the
    // sleep outlived quiesce.
    let d = scratch("subreaper");
    let inner = "echo $PPID > $D/qpid; (sleep 30 & echo $! > $D/pid); read -r l < /proc/$(cat $D/pid)/stat; \
                 set -- ${l##*) }; echo $2 > $D/ppid; exit 5";
    let outer = r#""$Q" -vv --grace 60 -- sh -c "$INNER"; echo $? > $D/code
        if read -r l 2>/dev/null < /proc/$(cat $D/pid)/stat; then set -- ${l##*) }; echo $1 > $D/after
        else echo gone > $D/after; fi"#;
    let mut c = Command::new("unshare");
    c.args(["--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c", outer])
        .env("Q", quiesce())
        .env("D", &d)
        .env("INNER", inner);
    let out = output_within(&mut c, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(read(&d.join("code")).trim(), "5", "{err}");
    assert_eq!(read(&d.join("ppid")).trim(), read(&d.join("qpid")).trim(), "the orphan reparents to quiesce");
    let after = read(&d.join("after"));
    assert!(matches!(after.trim(), "gone" | "Z"), "the orphan outlived quiesce (state {after})");
    assert!(err.contains("subreaper"), "{err}");
}

#[test]
fn command_starts_with_a_clean_signal_state() {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc", "--kill-child"]).arg(quiesce()).args([
        "--",
        "cat",
        "/proc/self/status",
    ]);
    // The init itself inherits SIGINT and SIGQUIT ignored, as under nohup-like launchers.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            libc::signal(libc::SIGQUIT, libc::SIG_IGN);
            Ok(())
        });
    }
    let out = output(&mut cmd);
    let status = String::from_utf8_lossy(&out.stdout);
    for field in ["SigBlk:", "SigIgn:"] {
        let line = status.lines().find(|l| l.starts_with(field)).unwrap();
        assert_eq!(line.split_whitespace().nth(1), Some("0000000000000000"), "{line}");
    }
}

#[test]
fn idle_init_never_wakes() {
    let mut c = Container::start(&[], &["sleep", "100"]);
    wait_for("the command to run", Duration::from_secs(10), || {
        c.children_of(1).first().and_then(|&k| c.proc_read(k, "comm")).is_some_and(|n| n.trim() == "sleep")
    });
    // Context switches of every thread of the init; fails (never reads 0) when the init is gone.
    let init = c.init;
    let switches = || {
        let tasks = std::fs::read_dir(format!("/proc/{init}/task")).expect("the init is gone");
        tasks
            .flatten()
            .map(|t| {
                let s = std::fs::read_to_string(t.path().join("status")).expect("init thread status");
                let n: Vec<u64> = s
                    .lines()
                    .filter(|l| l.contains("ctxt_switches"))
                    .map(|l| l.split_whitespace().last().unwrap().parse().unwrap())
                    .collect();
                assert_eq!(n.len(), 2, "{s}");
                n.iter().sum::<u64>()
            })
            .sum::<u64>()
    };
    wait_for("the init to sleep", Duration::from_secs(10), || c.stat(1).is_some_and(|s| s.state == 'S'));
    let before = switches();
    // An observation window: nothing happens in it, so the init must not run.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(switches(), before, "the idle init woke up");
    assert!(c.alive(), "the init died");
    // The count does move when there is something to do: a signal to forward.
    c.signal(libc::SIGWINCH);
    wait_for("the init to wake for a signal", Duration::from_secs(10), || switches() > before);
}

#[test]
fn ctrl_c_on_a_tty_ends_a_shell_loop_with_130() {
    let driver = r#"
import os, pty, sys, time, select
pid, fd = pty.fork()
if pid == 0:
    os.execvp("unshare", ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.argv[1], "--",
                          "sh", "-c", "echo started; while true; do sleep 1; done"])
buf = b""
deadline = time.time() + 10
while b"started" not in buf and time.time() < deadline:
    r, _, _ = select.select([fd], [], [], 0.1)
    if r:
        try: buf += os.read(fd, 1024)
        except OSError: break
os.write(fd, b"\x03")
deadline = time.time() + 10
while time.time() < deadline:
    p, st = os.waitpid(pid, os.WNOHANG)
    if p:
        print(os.waitstatus_to_exitcode(st)); sys.exit(0)
    try:
        select.select([fd], [], [], 0.05); os.read(fd, 1024)
    except OSError: pass
os.kill(pid, 9); print("timeout")
"#;
    let out =
        output_within(Command::new("python3").arg("-c").arg(driver).arg(quiesce()), Duration::from_secs(60));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "130",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn binary_is_static() {
    let bin = std::fs::read(quiesce()).unwrap();
    assert_eq!(&bin[..4], b"\x7fELF");
    let u16_at = |o: usize| u16::from_le_bytes([bin[o], bin[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(bin[0x20..0x28].try_into().unwrap()) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    for i in 0..phnum {
        let p_type = u32::from_le_bytes(bin[phoff + i * phentsize..][..4].try_into().unwrap());
        assert_ne!(p_type, 3, "PT_INTERP present: the binary is dynamically linked");
    }
}

#[test]
fn no_command_and_bad_options_are_refused() {
    let out = output(&mut Command::new(quiesce()));
    assert_eq!(out.status.code(), Some(2));
    let out = output(Command::new(quiesce()).args(["--grace", "-1", "--", "true"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--grace"));
}

/// The harness signals only the init it saw, through a pidfd: for an init that has ended (or
/// that it never saw) it fails the test, where `kill(0, sig)` would have hit the test runner's
/// own process group.
#[test]
#[should_panic(expected = "cannot signal the init")]
fn harness_refuses_to_signal_an_ended_init() {
    let mut c = Container::start(&[], &["true"]);
    assert_eq!(c.wait_code(T), 0);
    c.signal(libc::SIGTERM);
}

/// A terminal's hangup: the kernel sends SIGHUP to the session leader that holds the terminal,
/// here the init (`setsid -c`), with no sender (SI_KERNEL). With a sandbox user the init drops
/// the signals a sandbox process may have sent it, and a file owner's SIGIO or SIGURG is the only
/// kernel signal such a process can aim at PID 1; a hangup stays the command's, and is forwarded.
#[test]
fn a_terminal_hangup_reaches_the_command_with_a_sandbox_user() {
    let dir = scratch("hangup");
    let d = dir.to_str().unwrap();
    let q = quiesce();
    let inner = format!(
        "unshare --pid --fork --mount-proc --kill-child setsid -c {} --state-dir {d}/state --sandbox-user 4338 -- \
         sh -c 'trap \"echo HUP > {d}/hup; exit 0\" HUP; echo $$ > {d}/ready; while :; do sleep 0.1; done'",
        q.display()
    );
    let mut script = Command::new("script")
        .args(["-qfec", &inner, "/dev/null"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("script (util-linux) runs the init on a terminal of its own");
    let ready = dir.join("ready");
    wait_for("the command under a terminal", Duration::from_secs(10), || ready.exists());
    // Everything below script, found before script goes: killed at the end, which ends the
    // namespace if the test fails (the shell script runs may stand between it and unshare).
    let below = descendants(script.id() as i32);
    unsafe { libc::kill(script.id() as i32, libc::SIGKILL) };
    let _ = script.wait();
    let hup = dir.join("hup");
    let until = Instant::now() + Duration::from_secs(5);
    while !hup.exists() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    for p in &below {
        unsafe { libc::kill(*p, libc::SIGKILL) };
    }
    assert!(hup.exists(), "the terminal's hangup did not reach the command");
}

/// The processes below `pid` (children of each thread, depth first), bounded to 64.
fn descendants(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        let tasks = std::fs::read_dir(format!("/proc/{p}/task")).map(|d| d.flatten().collect::<Vec<_>>());
        for t in tasks.unwrap_or_default() {
            let kids = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            for k in kids.split_whitespace().filter_map(|k| k.parse::<i32>().ok()) {
                if out.len() < 64 {
                    out.push(k);
                    todo.push(k);
                }
            }
        }
    }
    out
}

//! The init's job, tested on the real binary as PID 1 of a real PID namespace.

mod common;
use common::*;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(20);

/// Shell that writes the number of zombies in the namespace to $D/zombies.
const COUNT_ZOMBIES: &str = r#"n=0; for f in /proc/[0-9]*/stat; do read -r l < $f 2>/dev/null || continue;
    case "$l" in *") Z "*) n=$((n+1));; esac; done; echo $n > $D/zombies"#;

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
    let out = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(quiesce())
        .args(["--", "no-such-command-here"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("'no-such-command-here'") && err.contains("not found"), "{err}");

    let d = scratch("noexec");
    let f = d.join("script");
    std::fs::write(&f, "#!/bin/sh\nexit 0\n").unwrap();
    let out = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(quiesce())
        .arg("--")
        .arg(&f)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(126));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("permission denied"), "{err}");
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn a_child_exiting_127_is_not_an_exec_failure() {
    // catatonit#5: a command that itself exits 127 is reported as its status, silently.
    let out = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(quiesce())
        .args(["--", "sh", "-c", "exit 127"])
        .output()
        .unwrap();
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
        Opts { stdout: Stdio::piped(), ..Default::default() },
        &[adv.to_str().unwrap(), "signals"],
    );
    let mut lines = BufReader::new(c.take_stdout().unwrap()).lines();
    std::thread::sleep(Duration::from_millis(300));
    let mut sigs: Vec<i32> = (1..=31).filter(|&s| ![9, 19, 17, 15].contains(&s)).collect();
    sigs.push(libc::SIGRTMIN() + 2);
    sigs.push(15);
    for s in sigs {
        c.signal(s);
        let line = lines.next().expect("child output").unwrap();
        assert_eq!(line, format!("got {s}"), "signal {s}");
    }
    assert_eq!(c.wait_code(T), 0);
}

#[test]
fn pgroup_mode_signals_the_whole_pipeline() {
    // The sleeps ignore TERM, so only the forwarded USR2 can end them quickly.
    let pipeline = "(trap '' TERM; sleep 100) | (trap '' TERM; sleep 100)";
    let mut with = Container::start(&["-g", "--grace", "30"], &["sh", "-c", pipeline]);
    std::thread::sleep(Duration::from_millis(300));
    with.signal(libc::SIGUSR2);
    assert_eq!(with.wait_code(Duration::from_secs(10)), 128 + libc::SIGUSR2);

    let mut without = Container::start(&["--grace", "30"], &["sh", "-c", pipeline]);
    std::thread::sleep(Duration::from_millis(300));
    without.signal(libc::SIGUSR2);
    std::thread::sleep(Duration::from_secs(2));
    assert!(without.alive(), "without -g the pipeline should have outlived the signal");
}

/// Run `prelude` as the command, then count the zombies left in the namespace.
fn zombies_after(prelude: &str) -> String {
    let script = format!("{prelude}; {COUNT_ZOMBIES}");
    let mut c = Container::start(&[], &["sh", "-c", &script]);
    assert_eq!(c.wait_code(T), 0);
    read(&c.path("zombies")).trim().to_string()
}

#[test]
fn thousand_orphans_are_reaped_within_a_second() {
    assert_eq!(zombies_after("$ADV orphans 1000; sleep 1"), "0");
}

#[test]
fn grandchild_orphan_is_reaped() {
    assert_eq!(zombies_after("(sh -c 'exit 0' &) ; sleep 0.5"), "0");
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
    let script = "(trap '' TERM; exec sleep 100) & echo $! > $D/bg; sleep 0.2; exit 7";
    let mut c = Container::start(&["--grace", "1"], &["sh", "-c", script]);
    let t = Instant::now();
    assert_eq!(c.wait_code(T), 7);
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(900), "exited after {took:?}, before the grace");
}

#[test]
fn subreaper_when_not_pid_1() {
    let d = scratch("subreaper");
    let script = "(sleep 30 & echo $! > $D/pid); sleep 0.3; read -r l < /proc/$(cat $D/pid)/stat; \
                  set -- ${l##*) }; echo $2 > $D/ppid; exit 5";
    let child = Command::new(quiesce())
        .args(["-vv", "--grace", "5", "--", "sh", "-c", script])
        .env("D", &d)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let t = Instant::now();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(5));
    assert_eq!(read(&d.join("ppid")).trim(), pid.to_string(), "the orphan reparents to quiesce");
    assert!(t.elapsed() < Duration::from_secs(4), "the orphan should have died of SIGTERM");
    assert!(String::from_utf8_lossy(&out.stderr).contains("subreaper"));
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn command_starts_with_a_clean_signal_state() {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc"]).arg(quiesce()).args(["--", "cat", "/proc/self/status"]);
    // The init itself inherits SIGINT and SIGQUIT ignored, as under nohup-like launchers.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            libc::signal(libc::SIGQUIT, libc::SIG_IGN);
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let status = String::from_utf8_lossy(&out.stdout);
    for field in ["SigBlk:", "SigIgn:"] {
        let line = status.lines().find(|l| l.starts_with(field)).unwrap();
        assert_eq!(line.split_whitespace().nth(1), Some("0000000000000000"), "{line}");
    }
}

#[test]
fn idle_init_never_wakes() {
    let c = Container::start(&[], &["sleep", "100"]);
    std::thread::sleep(Duration::from_millis(300));
    let switches = || {
        let s = read(std::path::Path::new(&format!("/proc/{}/status", c.init)));
        s.lines()
            .filter(|l| l.contains("ctxt_switches"))
            .map(|l| l.split_whitespace().last().unwrap().parse::<u64>().unwrap())
            .sum::<u64>()
    };
    let before = switches();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(switches(), before, "the idle init woke up");
}

#[test]
fn ctrl_c_on_a_tty_ends_a_shell_loop_with_130() {
    let driver = r#"
import os, pty, sys, time, select
pid, fd = pty.fork()
if pid == 0:
    os.execvp("unshare", ["unshare", "--pid", "--fork", "--mount-proc", sys.argv[1], "--",
                          "sh", "-c", "echo started; while true; do sleep 1; done"])
buf = b""
deadline = time.time() + 10
while b"started" not in buf and time.time() < deadline:
    r, _, _ = select.select([fd], [], [], 0.1)
    if r:
        try: buf += os.read(fd, 1024)
        except OSError: break
time.sleep(0.3)
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
    let out = Command::new("python3").arg("-c").arg(driver).arg(quiesce()).output().unwrap();
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
    let out = Command::new(quiesce()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(quiesce()).args(["--grace", "-1", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--grace"));
}

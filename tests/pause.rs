//! The proof's consistent observation held between two of its steps, and a pid freed and handed
//! to a sandbox process right there. A window of the observation (`observe::consistency`) reads
//! the namespace's pid counter, takes the task that holds that pid as its holder, reads /proc,
//! and reads the counter again: unmoved and still held means no pid was handed out meanwhile.
//! What keeps that true when pids are reused (the holder's check, and the entries read again once
//! a window saw pids handed out) matters only when a pid is freed and handed out again between two
//! steps of one observation. The pid-reuse tests (pidspace, reuse) reuse pids, but only by chance
//! at that moment: nothing outside the init says when a window opens or closes. Here the test
//! traces the init's main thread (ptrace, from the host: no hook in the binary) and holds it at
//! the closing reading of the counter in the proof's first window, after its last listing. While it
//! is held, the holder exits (its parent, outside the namespace, reaps it), the pid space fills,
//! and a sandbox process takes the one pid left, the holder's: the counter reads what it read when
//! the window opened, and the table's entry for that pid is the holder's. The freeze must find
//! that process, or fail: never sign a marker while it lives.

mod common;
use common::pidmax::{own_pid_max_of, pid_max_per_namespace};
use common::trace::{Call, Tracer};
use common::*;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// The namespace's pid_max: small, so that the pause fills the pid space with a hundred
/// processes.
const PID_MAX: u32 = 400;
/// Pids from here to pid_max are the ones handed out again once the counter has gone past them.
const RESERVED: u32 = 300;

/// Pids from RESERVED to pid_max that name no task of the namespace (threads included).
fn free_pids(c: &Container) -> Vec<u32> {
    (RESERVED..PID_MAX).filter(|n| !c.proc_dir().join(n.to_string()).exists()).collect()
}

/// SIGKILL the namespace's process `pid`, the one that started at `start`, from the host.
fn kill_ns(c: &Container, pid: i32, start: u64) {
    let (host, host_start) = c.host_pid(pid).unwrap_or_else(|| panic!("no host pid for {pid}"));
    assert_eq!(host_start, start, "pid {pid} is another process by now");
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, host, 0) };
    assert!(fd >= 0, "pidfd_open({host}): {}", std::io::Error::last_os_error());
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // The pidfd names the process that was read only if it still has that start time.
    assert!(!host_dead(host, start), "pid {pid} ended meanwhile");
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    assert_eq!(r, 0, "kill {pid}: {}", std::io::Error::last_os_error());
}

/// What the traced thread has done since its last reading of the pid counter.
#[derive(Default)]
struct Steps {
    /// The call whose exit comes next.
    pending: Option<i64>,
    /// The fd of the counter's file while it is open, and the buffer of a read of it.
    opening: bool,
    counter_fd: Option<i64>,
    read_buf: Option<u64>,
    /// The value of the last reading; since then, a pidfd of the task holding it (a window's
    /// holder), and a listing of /proc.
    last: Option<i32>,
    probed: bool,
    listed: bool,
    /// The last reading was a window's first check (it named the holder, and came after the
    /// holder's pidfd and a listing): the next one, after the window's last listing, closes it.
    checked: bool,
    /// The readings, for the failure message.
    log: Vec<String>,
}

/// Where the trace stopped the thread.
enum Held {
    /// At the entry of the closing reading of a window held by the task the test named.
    Closing,
    /// No such window came (why).
    Never(String),
}

/// The path an open or openat call opens (musl opens files with `open` where the architecture
/// has that call).
fn opened_path(t: &Tracer, nr: i64, args: &[u64; 6]) -> std::io::Result<Option<String>> {
    #[cfg(target_arch = "x86_64")]
    if nr == libc::SYS_open {
        return t.read_str(args[0]).map(Some);
    }
    if nr == libc::SYS_openat {
        return t.read_str(args[1]).map(Some);
    }
    Ok(None)
}

/// Run the traced init up to the opening of the counter's file that closes a window held by
/// the task at `holder`. A window's readings: the one that opens it names `holder`, then a pidfd
/// of the holder is taken and /proc listed (the window's table, the holder in it); the next
/// reading finds the counter unmoved; then the entries that may name another process by now are
/// read again and /proc listed once more; and the last reading, with the holder's check, closes
/// it. Held there, everything the window reads is behind it.
fn run_to_closing(t: &mut Tracer, holder: i32, s: &mut Steps, until: Instant) -> std::io::Result<Held> {
    loop {
        if Instant::now() >= until {
            return Ok(Held::Never("no such window within the time allowed".into()));
        }
        let Some(call) = t.next()? else { return Ok(Held::Never("the init ended".into())) };
        match call {
            Call::Entry { nr, args } => {
                s.pending = Some(nr);
                if let Some(path) = opened_path(t, nr, &args)? {
                    if path.ends_with("sys/kernel/ns_last_pid") {
                        if s.checked && s.last == Some(holder) && s.listed {
                            s.log.push("closing reading: held".into());
                            return Ok(Held::Closing);
                        }
                        s.opening = true;
                    }
                } else if nr == libc::SYS_read {
                    s.read_buf = (Some(args[0] as i64) == s.counter_fd).then_some(args[1]);
                } else if nr == libc::SYS_close && Some(args[0] as i64) == s.counter_fd {
                    s.counter_fd = None;
                } else if nr == libc::SYS_pidfd_open && s.last == Some(args[0] as i32) {
                    s.probed = true;
                } else if nr == libc::SYS_getdents64 {
                    s.listed = true;
                }
            }
            Call::Exit { rval } => match s.pending.take() {
                Some(_) if s.opening => {
                    s.opening = false;
                    s.counter_fd = (rval >= 0).then_some(rval);
                }
                Some(nr) if nr == libc::SYS_read => {
                    // The first read that returns something; the one that finds the end does not.
                    if let Some(buf) = s.read_buf.take().filter(|_| rval > 0) {
                        let text = t.read_mem(buf, rval as usize)?;
                        let v = String::from_utf8_lossy(&text).trim().parse().ok();
                        s.log.push(format!("reading: {v:?}"));
                        s.checked = v.is_some() && v == Some(holder) && s.probed && s.listed;
                        s.last = v;
                        s.probed = false;
                        s.listed = false;
                    }
                }
                _ => {}
            },
        }
    }
}

/// The init held at the closing reading of the proof's first window, whose holder is a root
/// process read alive by that window's listing. Meanwhile the holder exits, the pid space fills
/// (here, not before the freeze: until the pause the init needs free pids for its own threads)
/// and a sandbox process takes the holder's pid, the one left. The counter then reads what it
/// read when the window opened, and the table's entry for that pid is the holder's: only the
/// holder's check sees that the window is not quiet (`Window::held`), and only the entries read
/// again in the next window find the sandbox process (`Reads::volatile`; the holder's parent is
/// not the init). Found, it is killed; the freeze then fails on the processes that filled the
/// pid space (born during it, with nothing inside the namespace to vouch for them once a
/// sandbox process came from outside). Without either check the table hides it, and the marker
/// is signed while it lives.
#[test]
fn w01_a_holder_that_exits_inside_a_window_and_its_pid_handed_to_a_sandbox_process_get_no_marker() {
    let name =
        "w01_a_holder_that_exits_inside_a_window_and_its_pid_handed_to_a_sandbox_process_get_no_marker";
    if !pid_max_per_namespace() {
        skip(name, "pid_max is not kept per PID namespace before Linux 6.14: the pid space cannot be filled without the host's");
        return;
    }
    let uid = 4450;
    let c = sandbox(uid, &["--freeze-timeout", "10"]);
    own_pid_max_of(&c, PID_MAX);
    // Past the reserved pids: a pid below them is never handed out again once the counter has
    // gone past them.
    let burn = c.exec(&["sh", "-c", "i=0; while [ $i -lt 320 ]; do /bin/true; i=$((i+1)); done"]);
    assert!(burn.status.success());
    // The holder: a root process entered from outside (its parent, outside the namespace, reaps
    // it), the last process made before the freeze, so the one whose pid the counter names.
    let holder = c.launch_root(&["pause"]);
    let h = holder.pid;
    assert!(h as u32 >= RESERVED, "the holder got pid {h}, below the reserved ones");
    let h_start = c.stat(h).unwrap().start_time;
    // A holder counts only if it started in an earlier tick than the window's clock reading.
    std::thread::sleep(Duration::from_millis(30));
    let mut t = match Tracer::seize(c.init) {
        Ok(t) => t,
        Err(e) => {
            skip(name, &format!("cannot trace the init from here: {e}"));
            return;
        }
    };
    // Bounds every wait of the trace: a killed init ends the trace.
    let _bound = c.kill_after(Duration::from_secs(120));
    let before = c.status_file()["id"].clone();
    c.signal(libc::SIGUSR1);
    let mut steps = Steps::default();
    let held = run_to_closing(&mut t, h, &mut steps, Instant::now() + Duration::from_secs(60)).unwrap();
    if let Held::Never(why) = held {
        drop(t);
        panic!("{why}: readings {:?}", steps.log);
    }
    // Held at the window's closing reading: the holder was read alive, and is.
    assert!(
        c.stat(h).is_some_and(|s| s.live() && s.start_time == h_start),
        "holder {h} gone before the pause"
    );
    // Full, the holder's pid the only one a process can get once the holder has been reaped.
    let fill_out = c.path("fill");
    let _fill = c.launch_root(&["pidfill", fill_out.to_str().unwrap(), "0", "0"]);
    assert_eq!(free_pids(&c), Vec::<u32>::new(), "the pid space is not full: {}", read(&fill_out));
    kill_ns(&c, h, h_start);
    wait_for("the holder's pid to be free", Duration::from_secs(10), || c.stat(h).is_none());
    let newcomer = c.start_ready(c.exec_as_cmd(uid, &[&adv(), "pause"]), "a sandbox process");
    assert_eq!(newcomer.pid, h, "the sandbox process did not get the holder's pid");
    let n_start = c.stat(h).unwrap().start_time;
    // Started in an earlier tick than any later reading of the clock: it holds the pid for the
    // next window.
    std::thread::sleep(Duration::from_millis(30));
    t.detach().unwrap();
    eprintln!("held at the closing reading; readings {:?}; pid {h} now of uid {uid}", steps.log);
    let mut st = serde_json::Value::Null;
    wait_for("the freeze to end", Duration::from_secs(60), || {
        st = c.status_file();
        st["id"] != before && matches!(st["state"].as_str(), Some("quiescent" | "failed"))
    });
    let alive = c.stat(h).is_some_and(|s| s.live() && s.start_time == n_start);
    eprintln!(
        "state {}, sandbox process {h} alive {alive}, marker {}: {}",
        st["state"],
        c.marker_exists(),
        st["reason"]
    );
    if alive {
        assert_eq!(st["state"], "failed", "a marker was signed while sandbox process {h} lives: {st}");
        assert!(!c.marker_exists(), "{st}");
    }
}

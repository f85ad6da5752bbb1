//! Test workloads that behave like a hostile sandbox user. Used by the acceptance tests and
//! the benchmark; never shipped. `adversary MODE [ARGS]`; with ADV_READY=PATH it creates
//! PATH once the workload is in place.

use std::ffi::CString;
use std::time::Duration;

fn ready() {
    ready_as(std::process::id());
}

/// The ready file names `pid`, the process the test is to look at.
fn ready_as(pid: u32) {
    if let Ok(p) = std::env::var("ADV_READY") {
        let tmp = format!("{p}.tmp.{}", std::process::id());
        std::fs::write(&tmp, pid.to_string()).expect("write ready file");
        std::fs::rename(&tmp, &p).expect("rename ready file");
    }
}

/// An adversary that cannot reach the state its test is about exits non-zero, never ready.
fn fail(what: &str) -> ! {
    eprintln!("adversary: {what}: {}", std::io::Error::last_os_error());
    std::process::exit(1);
}

/// fork, or fail.
fn fork_checked() -> i32 {
    match fork() {
        p if p < 0 => fail("fork"),
        p => p,
    }
}

fn pipe_checked() -> (i32, i32) {
    let mut fds = [0; 2];
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        fail("pipe");
    }
    (fds[0], fds[1])
}

/// Tell the parent over the pipe that this process is in place, and let go of the write end.
fn report(wr: i32) {
    if unsafe { libc::write(wr, b"x".as_ptr() as *const libc::c_void, 1) } != 1 {
        fail("report over the pipe");
    }
    unsafe { libc::close(wr) };
}

/// Read `n` reports; EOF first means a child failed (every write end is gone).
fn await_reports(rd: i32, wr: i32, n: usize) {
    unsafe { libc::close(wr) };
    let mut got = 0;
    while got < n {
        let mut b = [0u8; 16];
        match unsafe { libc::read(rd, b.as_mut_ptr() as *mut libc::c_void, b.len()) } {
            r if r > 0 => got += r as usize,
            r if r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) => {}
            _ => fail(&format!("only {got} of {n} children reported in place")),
        }
    }
    unsafe { libc::close(rd) };
}

/// Wait for child `c` to exit without reaping it; fail unless it exited with status 0.
fn exited_ok_unreaped(c: i32) {
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    if unsafe { libc::waitid(libc::P_PID, c as libc::id_t, &mut info, libc::WEXITED | libc::WNOWAIT) } != 0 {
        fail("waitid");
    }
    let status = unsafe { info.si_status() };
    if info.si_code != libc::CLD_EXITED || status != 0 {
        eprintln!("adversary: child {c} ended with code {} status {status}", info.si_code);
        std::process::exit(1);
    }
}

/// Is `pid` suspended in vfork: in the vfork syscall, waiting (D) for its child to exec or exit?
fn in_vfork(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let waiting = stat.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('D'));
    let syscall = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
    waiting && syscall.split_whitespace().next() == Some(&libc::SYS_vfork.to_string())
}

/// Mount a FUSE file system served through a new /dev/fuse descriptor at MNT (as root).
fn mount_fuse(mnt: &str) -> i32 {
    let fd = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    assert!(fd >= 0, "open /dev/fuse: {}", std::io::Error::last_os_error());
    let opts = CString::new(format!("fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other")).unwrap();
    let target = CString::new(mnt).unwrap();
    let r = unsafe {
        libc::mount(
            c"quiesce-test".as_ptr(),
            target.as_ptr(),
            c"fuse".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            opts.as_ptr() as *const libc::c_void,
        )
    };
    assert_eq!(r, 0, "mount fuse: {}", std::io::Error::last_os_error());
    fd
}

fn forever() -> ! {
    loop {
        unsafe { libc::pause() };
    }
}

fn fork() -> i32 {
    unsafe { libc::fork() }
}

/// cont-escape's escape: root for good, then a child in a session of its own, made the child of
/// this process's parent (`parent` as argument 3: CLONE_PARENT, a live launcher) or its own (it
/// goes to a subreaper once this process exits). Returns 0 in the child, as fork does.
fn escape(timer: libc::timer_t) -> i32 {
    if raw_setresuid(0, 0, 0) != 0 {
        fail("setresuid to root");
    }
    let child = if std::env::args().nth(3).as_deref() == Some("parent") {
        unsafe { libc::syscall(libc::SYS_clone, libc::CLONE_PARENT | libc::SIGCHLD, 0, 0, 0, 0) as i32 }
    } else {
        fork()
    };
    if child < 0 {
        fail("clone");
    }
    if child == 0 {
        unsafe { libc::setsid() };
        unsafe { libc::timer_delete(timer) };
    }
    child
}

/// The events of one inotify read of `n` bytes: each one's mask and name.
fn inotify_events(buf: &[u8], n: isize) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    let mut off = 0usize;
    while n > 0 && off + 16 <= n as usize {
        let ev = unsafe { &*(buf.as_ptr().add(off) as *const libc::inotify_event) };
        let len = ev.len as usize;
        let raw = &buf[off + 16..off + 16 + len];
        off += 16 + len;
        out.push((ev.mask, String::from_utf8_lossy(raw.split(|&b| b == 0).next().unwrap_or(&[])).into()));
    }
    out
}

/// A FUSE reply: the out header (length, error, unique), then the body.
fn fuse_reply(fd: i32, unique: u64, error: i32, body: &[u8]) {
    let mut out = Vec::with_capacity(16 + body.len());
    out.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
    out.extend_from_slice(&error.to_ne_bytes());
    out.extend_from_slice(&unique.to_ne_bytes());
    out.extend_from_slice(body);
    unsafe { libc::write(fd, out.as_ptr() as *const libc::c_void, out.len()) };
}

/// fuse_init_out: major, minor, max_readahead, flags (no async read), max_background,
/// congestion_threshold, max_write, time_gran, then zeros to 64 bytes.
fn fuse_init_out() -> Vec<u8> {
    let mut body = Vec::with_capacity(64);
    for v in [7u32, 31, 65536, 0] {
        body.extend_from_slice(&v.to_ne_bytes());
    }
    body.extend_from_slice(&0u16.to_ne_bytes());
    body.extend_from_slice(&0u16.to_ne_bytes());
    body.extend_from_slice(&4096u32.to_ne_bytes());
    body.extend_from_slice(&1u32.to_ne_bytes());
    body.resize(64, 0);
    body
}

/// A process's start time (clock ticks after boot, field 22 of its stat); None once it is gone.
fn start_of(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ").and_then(|(_, r)| r.split(' ').nth(19)).and_then(|t| t.parse().ok())
}

fn unix_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// execve with an empty environment; returns only if it failed.
fn execve_bare(argv: &[CString]) {
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let env: [*const libc::c_char; 1] = [std::ptr::null()];
    unsafe { libc::execve(ptrs[0], ptrs.as_ptr(), env.as_ptr()) };
}

/// Root for good through a setuid-root copy, or the named mode fails.
fn become_root(mode: &str) {
    if raw_setresuid(0, 0, 0) != 0 {
        fail(&format!("setresuid: {mode} needs a setuid-root copy"));
    }
}

/// Root for good, then escaped under the init: this process stays (the launch waits on it), and
/// a grandchild goes on once its parent exited and it was reparented.
fn escape_as_root(mode: &str) {
    become_root(mode);
    match fork() {
        0 => {}
        p if p < 0 => fail("fork"),
        _ => forever(),
    }
    let mid = std::process::id() as i32;
    match fork() {
        0 => {}
        p if p < 0 => fail("fork"),
        _ => unsafe { libc::_exit(0) },
    }
    while unsafe { libc::getppid() } == mid {
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn arg(i: usize, default: u64) -> u64 {
    std::env::args().nth(i).and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn nproc_cap(n: u64) {
    let r = libc::rlimit { rlim_cur: n, rlim_max: n };
    unsafe { libc::setrlimit(libc::RLIMIT_NPROC, &r) };
}

fn spawn_sleepers(n: u64) {
    for _ in 0..n {
        match fork() {
            0 => forever(),
            p if p < 0 => fail("fork"),
            _ => {}
        }
    }
}

fn raw_setresuid(r: u32, e: u32, s: u32) -> i64 {
    unsafe { libc::syscall(libc::SYS_setresuid, r, e, s) }
}

/// Is any process with real UID `uid` alive (not a zombie)?
fn any_alive(uid: u32) -> bool {
    let Ok(rd) = std::fs::read_dir("/proc") else { return true };
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().filter(|n| n.bytes().all(|b| b.is_ascii_digit())) else { continue };
        let Ok(st) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { continue };
        let mine = st
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some(&uid.to_string()));
        let zombie = st.lines().any(|l| l.starts_with("State:") && l.contains('Z'));
        if mine && !zombie {
            return true;
        }
    }
    false
}

/// Did this error say the process (or thread) is gone, as opposed to unreadable?
fn gone(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ESRCH))
}

/// UID's processes and the stat paths of all their threads, from one listing of /proc; None
/// when something could not be read (a process that exited meanwhile is left out).
fn tasks_of(uid: u32) -> Option<(Vec<String>, Vec<String>)> {
    use std::os::unix::fs::MetadataExt;
    let (mut pids, mut stats) = (Vec::new(), Vec::new());
    for e in std::fs::read_dir("/proc").ok()? {
        let name = e.ok()?.file_name();
        let Some(pid) = name.to_str().filter(|n| n.bytes().all(|b| b.is_ascii_digit())) else { continue };
        match std::fs::metadata(format!("/proc/{pid}")) {
            Ok(m) if m.uid() == uid => {}
            Ok(_) => continue,
            Err(e) if gone(&e) => continue,
            Err(_) => return None,
        }
        let tasks = match std::fs::read_dir(format!("/proc/{pid}/task")) {
            Ok(t) => t,
            Err(e) if gone(&e) => continue,
            Err(_) => return None,
        };
        for t in tasks {
            stats.push(format!("/proc/{pid}/task/{}/stat", t.ok()?.file_name().to_string_lossy()));
        }
        pids.push(pid.to_string());
    }
    Some((pids, stats))
}

/// Does the stat file at PATH read stopped or dead, or is the thread gone? An unreadable line is
/// not stopped: the caller keeps reading until its deadline.
fn stopped(path: &str, buf: &mut Vec<u8>) -> bool {
    use std::io::Read;
    buf.clear();
    let read = std::fs::File::open(path).and_then(|mut f| f.read_to_end(buf));
    match read {
        Ok(_) => {}
        Err(e) => return gone(&e),
    }
    let Some(close) = buf.iter().rposition(|&b| b == b')') else { return false };
    matches!(buf.get(close + 2), Some(b'T' | b'Z' | b'X' | b't'))
}

fn path_c(p: &str) -> CString {
    CString::new(p).expect("path without NUL")
}

/// Append this process's pid and a newline to the file, with syscalls only.
fn append_pid(path: &CString) {
    let line = format!("{}\n", std::process::id());
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT, 0o666);
        if fd >= 0 {
            libc::write(fd, line.as_ptr() as *const libc::c_void, line.len());
            libc::close(fd);
        }
    }
}

/// Wait (at most 10 s) until the file exists and is not empty.
fn wait_for_file_growth(path: &str) {
    for _ in 0..1000 {
        if std::fs::metadata(path).is_ok_and(|m| m.len() > 0) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("{path} never grew");
}

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_default();
    match mode.as_str() {
        // N children that sleep forever, and the parent.
        "sleepers" => {
            spawn_sleepers(arg(2, 10));
            ready();
            forever();
        }
        // N children that each take MB MiB, touched so that it is charged, and hold it; ready
        // once every one holds all of it. What fills a memory cgroup to a limit the test sets
        // just above it.
        "hog" => {
            let (n, mb) = (arg(2, 3) as usize, arg(3, 8) as usize);
            let (rd, wr) = pipe_checked();
            for _ in 0..n {
                if fork_checked() == 0 {
                    unsafe { libc::close(rd) };
                    std::mem::forget(vec![0x5au8; mb << 20]);
                    report(wr);
                    forever();
                }
            }
            await_reports(rd, wr, n);
            ready();
            forever();
        }
        // N sleepers whose parent exited: a middle process forks them and exits, so they are
        // children of the init. Ready once the middle process is reaped (they are reparented).
        "orphaned" => {
            let n = arg(2, 10);
            let middle = fork_checked();
            if middle == 0 {
                spawn_sleepers(n);
                unsafe { libc::_exit(0) };
            }
            let mut st = 0;
            if unsafe { libc::waitpid(middle, &mut st, 0) } != middle
                || !libc::WIFEXITED(st)
                || libc::WEXITSTATUS(st) != 0
            {
                fail("the process that forked the sleepers");
            }
            ready();
            std::process::exit(0);
        }
        // N processes of T threads each (this one included), all asleep.
        "thread-procs" => {
            let n = arg(2, 10).max(1);
            let t = arg(3, 10).max(1);
            let start_threads = || {
                for _ in 1..t {
                    let spawned = std::thread::Builder::new().stack_size(64 * 1024).spawn(|| forever());
                    if spawned.is_err() {
                        fail("thread");
                    }
                }
            };
            let (rd, wr) = pipe_checked();
            for _ in 1..n {
                if fork_checked() == 0 {
                    unsafe { libc::close(rd) };
                    start_threads();
                    report(wr);
                    forever();
                }
            }
            await_reports(rd, wr, n as usize - 1);
            start_threads();
            ready();
            forever();
        }
        // Every process forks without pause, capped by RLIMIT_NPROC; only the first one writes
        // the ready file, once a fork of its failed (the cap is reached).
        "bomb-flat" => {
            nproc_cap(arg(2, 500));
            let mut first = true;
            loop {
                match fork() {
                    0 => first = false,
                    p if p < 0 && first => {
                        ready();
                        first = false;
                    }
                    _ => {}
                }
            }
        }
        // Every process forks as fast as it can, capped by RLIMIT_NPROC.
        "bomb" => {
            nproc_cap(arg(2, 500));
            // Ready before the first fork, from this process alone: forkers writing ready files
            // queue on the directory's lock, each waiting for a CPU among thousands, and that
            // convoy held the test's own lookups in that directory for minutes. The test waits
            // for the count it needs itself.
            ready();
            loop {
                if fork() == 0 {
                    continue;
                }
                // Reap our dead so the bomb keeps churning pids.
                unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) };
            }
        }
        // A double-forked daemon (reparented to PID 1), a setsid and a setpgid escapee.
        // Ready once each is in place: the daemon reparented, the others leaders of their own.
        "daemon" => {
            let (rd, wr) = pipe_checked();
            let middle = fork_checked();
            if middle == 0 {
                if unsafe { libc::setsid() } < 0 {
                    fail("setsid");
                }
                if fork_checked() == 0 {
                    report(wr);
                    forever();
                }
                std::process::exit(0);
            }
            if fork_checked() == 0 {
                if unsafe { libc::setsid() } < 0 {
                    fail("setsid");
                }
                report(wr);
                forever();
            }
            if fork_checked() == 0 {
                if unsafe { libc::setpgid(0, 0) } != 0 {
                    fail("setpgid");
                }
                report(wr);
                forever();
            }
            // Reaping the middle process means its child was already handed to PID 1.
            let mut st = 0;
            if unsafe { libc::waitpid(middle, &mut st, 0) } != middle
                || !libc::WIFEXITED(st)
                || libc::WEXITSTATUS(st) != 0
            {
                fail("the middle of the double fork");
            }
            await_reports(rd, wr, 3);
            ready();
            forever();
        }
        // Ignores every catchable signal and blocks them too.
        "ignore" => {
            for s in 1..=64 {
                unsafe { libc::signal(s, libc::SIG_IGN) };
            }
            unsafe {
                let mut all: libc::sigset_t = std::mem::zeroed();
                libc::sigfillset(&mut all);
                libc::sigprocmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
            }
            ready();
            forever();
        }
        // N spinning threads plus a thread that keeps cloning short-lived threads.
        "threads" => {
            for _ in 0..arg(2, 50) {
                std::thread::spawn(|| loop {
                    std::hint::spin_loop();
                });
            }
            std::thread::spawn(|| loop {
                let _ = std::thread::spawn(|| std::thread::sleep(Duration::from_millis(1))).join();
            });
            ready();
            forever();
        }
        // Run as root: one thread switches to UID U with the raw syscall; the leader stays root.
        "thread-uid" => {
            let uid = arg(2, 4242) as u32;
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let r = raw_setresuid(uid, uid, uid);
                let _ = tx.send(r);
                forever();
            });
            if rx.recv() != Ok(0) {
                fail("setresuid in the thread");
            }
            ready();
            forever();
        }
        // Double fork, then after a delay the grandchild becomes root for good (setuid binary).
        "escape" => {
            let delay = arg(2, 0);
            if fork() == 0 {
                if fork() == 0 {
                    std::thread::sleep(Duration::from_millis(delay));
                    assert_eq!(raw_setresuid(0, 0, 0), 0, "escape needs a setuid-root copy");
                    ready();
                    forever();
                }
                std::process::exit(0);
            }
            forever();
        }
        "pause" => {
            ready();
            forever();
        }
        // Run as a setuid-root copy: a SIGCONT timer restarts this process after every stop;
        // once STATUS says a freeze runs and a stop has just ended (a gap in its own clock), it
        // becomes root for good, forks a child into a session of its own and exits: the child is
        // created during the freeze, after the stop, and nothing observed it as the sandbox's.
        "cont-escape" => {
            let status = std::env::args().nth(2).unwrap_or_default();
            // Real and saved the sandbox UID, effective root: kill(-1) as the UID reaches it and
            // it reads as an ordinary sandbox process, not one that may be missed.
            let r = unsafe { libc::getuid() };
            if raw_setresuid(r, 0, r) != 0 {
                fail("setresuid: cont-escape needs a setuid-root copy");
            }
            // A handler, not the default: the kernel parks a timer whose signal is ignored.
            extern "C" fn on_cont(_: libc::c_int) {}
            unsafe { libc::signal(libc::SIGCONT, on_cont as *const () as libc::sighandler_t) };
            let mut ev: libc::sigevent = unsafe { std::mem::zeroed() };
            ev.sigev_notify = libc::SIGEV_SIGNAL;
            ev.sigev_signo = libc::SIGCONT;
            let mut timer: libc::timer_t = std::ptr::null_mut();
            if unsafe { libc::timer_create(libc::CLOCK_MONOTONIC, &mut ev, &mut timer) } != 0 {
                fail("timer_create");
            }
            let every = libc::timespec { tv_sec: 0, tv_nsec: 3_000_000 };
            let spec = libc::itimerspec { it_interval: every, it_value: every };
            if unsafe { libc::timer_settime(timer, 0, &spec, std::ptr::null_mut()) } != 0 {
                fail("timer_settime");
            }
            // `now`: escape at once, before any observation can see this process: its record of
            // the launch is all the init has.
            if std::env::args().nth(4).as_deref() == Some("now") {
                if escape(timer) == 0 {
                    ready();
                    forever();
                }
                // The test waits for the child's ready file; this process is gone by then.
                let file = std::env::var("ADV_READY").unwrap_or_default();
                let until = std::time::Instant::now() + Duration::from_secs(5);
                while !std::path::Path::new(&file).exists() && std::time::Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(1));
                }
                std::process::exit(0);
            }
            ready();
            let mut last = std::time::Instant::now();
            loop {
                std::thread::sleep(Duration::from_micros(200));
                let now = std::time::Instant::now();
                let gap = now - last;
                last = now;
                if gap < Duration::from_micros(800) {
                    continue;
                }
                if !std::fs::read(&status).is_ok_and(|b| b.windows(8).any(|w| w == b"freezing")) {
                    last = std::time::Instant::now();
                    continue;
                }
                if escape(timer) == 0 {
                    forever();
                }
                std::process::exit(0);
            }
        }
        // A root supervisor (a `tini -s`, s6, a harness): a child subreaper that runs CMD... and
        // reaps whatever it is handed, forever.
        "subreaper" => {
            if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
                fail("PR_SET_CHILD_SUBREAPER");
            }
            let args: Vec<String> = std::env::args().skip(2).collect();
            if args.is_empty() {
                fail("subreaper needs a command");
            }
            if fork() == 0 {
                let err = std::os::unix::process::CommandExt::exec(
                    std::process::Command::new(&args[0]).args(&args[1..]),
                );
                eprintln!("adversary: subreaper cannot run {}: {err}", args[0]);
                std::process::exit(127);
            }
            loop {
                if unsafe { libc::waitpid(-1, std::ptr::null_mut(), 0) } < 0 {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        // The sandbox's own load on the machine: a busy loop per core and WRITERS processes that
        // write and fsync a file in DIR (the state dir's file system) without pause.
        "load" => {
            let dir = std::env::args().nth(2).unwrap_or_else(|| ".".into());
            let writers = arg(3, 2);
            let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
            for _ in 0..cores {
                if fork() == 0 {
                    let mut x = 0u64;
                    loop {
                        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                    }
                }
            }
            for i in 0..writers {
                if fork() == 0 {
                    let path = format!("{dir}/.load-{}-{i}", std::process::id());
                    let Ok(mut f) = std::fs::File::create(&path) else { fail("create a load file") };
                    let block = [7u8; 4096];
                    loop {
                        use std::io::{Seek, Write};
                        if f.write_all(&block).is_err() || f.sync_all().is_err() || f.rewind().is_err() {
                            fail("write the load file");
                        }
                    }
                }
            }
            ready();
            forever();
        }
        // Two processes that restart each other.
        "restart" => {
            ready();
            loop {
                let c = fork();
                if c == 0 {
                    // The child restarts its parent's role when orphaned.
                    let parent = unsafe { libc::getppid() };
                    loop {
                        std::thread::sleep(Duration::from_millis(5));
                        if unsafe { libc::getppid() } != parent {
                            break;
                        }
                    }
                    continue;
                }
                unsafe { libc::waitpid(c, std::ptr::null_mut(), 0) };
            }
        }
        // Continue every stopped process of our UID, in a loop.
        "sigcont" => {
            ready();
            loop {
                unsafe { libc::kill(-1, libc::SIGCONT) };
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        // Stopped, and stops itself again whenever it is continued.
        "stopped" => {
            ready();
            loop {
                if unsafe { libc::raise(libc::SIGSTOP) } != 0 {
                    fail("raise SIGSTOP");
                }
            }
        }
        // Attach to PID as a tracer and let go: exit 0 when the kernel allowed it, 3 otherwise.
        // PID 1 signalled so that the kernel does not name the sender: a queued signal whose
        // si_pid says 0 (from outside), SIGIO from a pipe PID 1 owns, or a poll signal of the
        // agent's choosing (F_SETSIG). SIG: the signal's number.
        "signal-init" => {
            let kind = std::env::args().nth(2).unwrap_or_default();
            let sig = arg(3, libc::SIGTERM as u64) as i32;
            unsafe {
                match kind.as_str() {
                    "queue" => {
                        let mut si: libc::siginfo_t = std::mem::zeroed();
                        // si_signo, si_errno, si_code, then (at 16 on x86_64) si_pid, si_uid.
                        let raw = &mut si as *mut libc::siginfo_t as *mut i32;
                        *raw = sig;
                        *raw.add(2) = libc::SI_QUEUE;
                        *raw.add(4) = 0;
                        if libc::syscall(libc::SYS_rt_sigqueueinfo, 1, sig, &si) != 0 {
                            fail("rt_sigqueueinfo");
                        }
                    }
                    "sigio" | "setsig" => {
                        let (rd, wr) = pipe_checked();
                        if libc::fcntl(rd, libc::F_SETOWN, 1) != 0 {
                            fail("F_SETOWN");
                        }
                        // F_SETSIG (10): not in every libc crate.
                        if kind == "setsig" && libc::fcntl(rd, 10, sig) != 0 {
                            fail("F_SETSIG");
                        }
                        if libc::fcntl(rd, libc::F_SETFL, libc::O_ASYNC | libc::O_NONBLOCK) != 0 {
                            fail("F_SETFL");
                        }
                        if libc::write(wr, b"x".as_ptr() as *const libc::c_void, 1) != 1 {
                            fail("write");
                        }
                    }
                    _ => fail("signal-init queue|sigio|setsig SIG"),
                }
            }
            std::process::exit(0);
        }
        "seize" => {
            let pid = arg(2, 0) as i32;
            if pid <= 0 {
                fail("seize needs a pid");
            }
            if unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid, 0, 0) } != 0 {
                eprintln!("adversary: PTRACE_SEIZE {pid}: {}", std::io::Error::last_os_error());
                std::process::exit(3);
            }
            unsafe { libc::ptrace(libc::PTRACE_DETACH, pid, 0, 0) };
            std::process::exit(0);
        }
        // A tracer attached to its own child, continuing it forever.
        "ptrace" => {
            let c = fork_checked();
            if c == 0 {
                forever();
            }
            if unsafe { libc::ptrace(libc::PTRACE_SEIZE, c, 0, 0) } != 0 {
                fail("PTRACE_SEIZE");
            }
            ready();
            loop {
                let mut st = 0;
                if unsafe { libc::waitpid(c, &mut st, libc::__WALL) } < 0 {
                    forever();
                }
                unsafe { libc::ptrace(libc::PTRACE_CONT, c, 0, 0) };
            }
        }
        // A vfork child that never execs: the parent stays suspended in vfork. Neither can say
        // so itself, so a watcher forked first writes the ready file (naming the parent) once it
        // sees the parent in vfork, or exits non-zero after 10 s.
        "vfork" => {
            let parent = std::process::id();
            if fork_checked() == 0 {
                for _ in 0..2000 {
                    if in_vfork(parent) {
                        ready_as(parent);
                        forever();
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                eprintln!("adversary: never saw {parent} suspended in vfork");
                std::process::exit(1);
            }
            #[allow(deprecated)]
            let c = unsafe { libc::vfork() };
            if c == 0 {
                loop {
                    unsafe { libc::pause() };
                }
            }
            if c < 0 {
                fail("vfork");
            }
            forever();
        }
        // Appends to a file through a descriptor held open, as fast as it can.
        "writer" => {
            use std::io::Write;
            let path = std::env::args().nth(2).expect("writer PATH");
            let mut f = std::fs::OpenOptions::new().append(true).create(true).open(path).expect("open");
            ready();
            let mut i = 0u64;
            loop {
                let _ = writeln!(f, "{i}");
                i += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        // A root escapee (a setuid-root copy) that takes over the orchestrator's own freeze
        // client without tracing it: it waits for the client's temp request in requests/ (the
        // client's pid is in its name), then writes code into the client through /proc/PID/mem:
        // at its exit the client forks `sh -c CMD` as root and exits as it would have. The client
        // still runs this binary, as `freeze`, untraced and childless at every check. x86_64.
        // `mem-inject STATE QUIESCE CMD`
        "mem-inject" => {
            use std::io::Write;
            use std::os::unix::fs::FileExt;
            let a = |i: usize| std::env::args().nth(i).expect("mem-inject STATE QUIESCE CMD");
            let (state, q, cmd) = (a(2), a(3), a(4));
            become_root("mem-inject");
            let elf = std::fs::read(&q).unwrap_or_else(|_| fail("read the quiesce binary"));
            let u64at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap());
            let u16at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap()) as usize;
            let entry = u64at(0x18);
            let (phoff, phentsize, phnum) = (u64at(0x20) as usize, u16at(0x36), u16at(0x38));
            let mut exit_at = None;
            let mut bss_end = 0u64;
            for i in 0..phnum {
                let ph = phoff + i * phentsize;
                let p_type = u32::from_le_bytes(elf[ph..ph + 4].try_into().unwrap());
                let p_flags = u32::from_le_bytes(elf[ph + 4..ph + 8].try_into().unwrap());
                if p_type != 1 {
                    continue;
                }
                let (off, vaddr, filesz, memsz) =
                    (u64at(ph + 8), u64at(ph + 16), u64at(ph + 32), u64at(ph + 40));
                if p_flags & 1 != 0 {
                    let seg = &elf[off as usize..(off + filesz) as usize];
                    let pat = [0xb8u8, 0xe7, 0, 0, 0, 0x0f, 0x05];
                    exit_at = seg.windows(pat.len()).position(|w| w == pat).map(|x| vaddr + x as u64);
                }
                bss_end = bss_end.max(vaddr + memsz);
            }
            let exit_at = exit_at.unwrap_or_else(|| fail("no exit_group in the quiesce binary"));
            let data = (bss_end + 15) & !15;
            let mut d = Vec::new();
            d.extend_from_slice(b"/bin/sh\0-c\0\0\0\0\0\0");
            d.extend_from_slice(cmd.as_bytes());
            d.push(0);
            while d.len() % 8 != 0 {
                d.push(0);
            }
            let argv = data + d.len() as u64;
            for p in [data, data + 8, data + 16, 0] {
                d.extend_from_slice(&p.to_le_bytes());
            }
            if (data + d.len() as u64) > ((bss_end + 0xfff) & !0xfff) {
                fail("CMD does not fit in the last bss page");
            }
            // fork; child: execve("/bin/sh", argv, NULL); parent: exit_group(rdi)
            let mut code = vec![0xb8, 57, 0, 0, 0, 0x0f, 0x05, 0x85, 0xc0, 0x75, 29, 0x48, 0xbf];
            code.extend_from_slice(&data.to_le_bytes());
            code.extend_from_slice(&[0x48, 0xbe]);
            code.extend_from_slice(&argv.to_le_bytes());
            code.extend_from_slice(&[0x31, 0xd2, 0xb8, 59, 0, 0, 0, 0x0f, 0x05]);
            code.extend_from_slice(&[0xb8, 0xe7, 0, 0, 0, 0x0f, 0x05]);
            let rel = (entry as i64 - (exit_at as i64 + 5)) as i32;
            let mut jmp = vec![0xe9];
            jmp.extend_from_slice(&rel.to_le_bytes());
            jmp.extend_from_slice(&[0x90, 0x90]);
            let dir = CString::new(format!("{state}/requests")).unwrap();
            let ino = unsafe { libc::inotify_init1(0) };
            if ino < 0 || unsafe { libc::inotify_add_watch(ino, dir.as_ptr(), libc::IN_CREATE) } < 0 {
                fail("inotify on requests/");
            }
            let mut log = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(format!("{}/mem-inject.log", std::env::var("D").unwrap_or("/tmp".into())))
                .unwrap_or_else(|_| fail("log"));
            ready();
            let mut buf = vec![0u8; 4096];
            loop {
                let n = unsafe { libc::read(ino, buf.as_mut_ptr().cast(), buf.len()) };
                if n <= 0 {
                    fail("inotify read");
                }
                let mut i = 0usize;
                while i + 16 <= n as usize {
                    let len = u32::from_le_bytes(buf[i + 12..i + 16].try_into().unwrap()) as usize;
                    let name: Vec<u8> =
                        buf[i + 16..i + 16 + len].iter().copied().take_while(|&b| b != 0).collect();
                    i += 16 + len;
                    if name.len() < 25 || name[0] != b'.' {
                        continue;
                    }
                    let Some(pid) =
                        std::str::from_utf8(&name[17..25]).ok().and_then(|h| i32::from_str_radix(h, 16).ok())
                    else {
                        continue;
                    };
                    let args = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                    if args.split(|&b| b == 0).nth(1) != Some(b"freeze") {
                        continue;
                    }
                    let mem = match std::fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .open(format!("/proc/{pid}/mem"))
                    {
                        Ok(m) => m,
                        Err(e) => {
                            let _ = writeln!(log, "open /proc/{pid}/mem: {e}");
                            continue;
                        }
                    };
                    let r = mem
                        .write_all_at(&d, data)
                        .and_then(|_| mem.write_all_at(&code, entry))
                        .and_then(|_| mem.write_all_at(&jmp, exit_at));
                    let _ = writeln!(log, "injected into {pid}: {r:?}");
                }
            }
        }
        // The escape a plain `docker exec -u agent` gets from a setuid-root binary in the image:
        // root for good, a child whose parent is this process's (CLONE_PARENT: the outside, ppid
        // 0, like any root `docker exec`) that keeps appending to FILE, and this process exits.
        // Where no setuid binary works (no_new_privs) it stays the sandbox user's, and says so in
        // FILE's first line. `root-writer FILE`
        "root-writer" => {
            use std::io::Write;
            let path = std::env::args().nth(2).expect("root-writer FILE");
            let root = raw_setresuid(0, 0, 0) == 0;
            let mut f = std::fs::OpenOptions::new().append(true).create(true).open(path).expect("open");
            let _ = writeln!(f, "{}", if root { "escaped" } else { "no-escape" });
            let child = unsafe {
                libc::syscall(libc::SYS_clone, libc::CLONE_PARENT | libc::SIGCHLD, 0, 0, 0, 0) as i32
            };
            if child < 0 {
                fail("clone");
            }
            if child == 0 {
                unsafe { libc::setsid() };
                let mut i = 0u64;
                loop {
                    let _ = writeln!(f, "{i}");
                    i += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            ready_as(child as u32);
            unsafe { libc::_exit(0) };
        }
        // A root escapee's forged freeze client (a setuid-root copy): a CLONE_PARENT child C
        // whose parent is the outside (ppid 0) keeps a writer child W appending to FILE, then
        // execs the init's own binary, so that the kernel shows C running it, entered from
        // outside, untraced. `bare`: C plants a request naming itself in STATE/requests and runs
        // as a plain init, for the orchestrator's bare signal to take. `client`: C runs a real
        // `quiesce freeze --wait` of its own. `plant-client STATE QUIESCE FILE bare|client`
        "plant-client" => {
            use std::io::Write;
            let state = std::env::args().nth(2).expect("plant-client STATE QUIESCE FILE MODE");
            let q = std::env::args().nth(3).expect("plant-client STATE QUIESCE FILE MODE");
            let out = std::env::args().nth(4).expect("plant-client STATE QUIESCE FILE MODE");
            let mode = std::env::args().nth(5).expect("plant-client STATE QUIESCE FILE MODE");
            become_root("plant-client");
            let c = unsafe {
                libc::syscall(libc::SYS_clone, libc::CLONE_PARENT | libc::SIGCHLD, 0, 0, 0, 0) as i32
            };
            if c < 0 {
                fail("clone");
            }
            if c > 0 {
                ready_as(c as u32);
                std::thread::sleep(Duration::from_millis(300));
                unsafe { libc::_exit(0) };
            }
            let me = std::process::id();
            if fork() == 0 {
                let mut f = std::fs::OpenOptions::new().append(true).create(true).open(&out).expect("open");
                let mut i = 0u64;
                loop {
                    let _ = writeln!(f, "{i}");
                    i += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            let argv: Vec<CString> = if mode == "bare" {
                let start = start_of(me as i32).unwrap_or_else(|| fail("own start time"));
                let nanos = unix_nanos();
                let id = format!("{nanos:016x}{me:08x}00c0ffee");
                let body = format!(
                    r#"{{"nonce":"planted","request_id":"{id}","pid":{me},"start_time":{start},"attest":["/"]}}"#
                );
                let tmp = format!("{state}/requests/.plant.{me}");
                std::fs::write(&tmp, body).unwrap_or_else(|_| fail("write the planted request"));
                std::fs::rename(&tmp, format!("{state}/requests/{id}")).unwrap_or_else(|_| fail("rename"));
                [q.as_str(), "--", "sleep", "1000000"].iter().map(|a| CString::new(*a).unwrap()).collect()
            } else {
                [q.as_str(), "freeze", "--state-dir", state.as_str(), "--nonce", "planted", "--wait"]
                    .iter()
                    .map(|a| CString::new(*a).unwrap())
                    .collect()
            };
            execve_bare(&argv);
            fail("execve the init's binary");
        }
        // A root escapee (a setuid-root copy) makes a `quiesce exec` process its freeze client:
        // a CLONE_PARENT child P (ppid 0) held on a pipe; a freeze request planted in P's name
        // with NONCE, and 16 empty ones sorted before P's own launch record, so that P's signal
        // for its launch takes the planted freeze first and the record only after it; then P
        // runs `quiesce exec --user 0` of a root writer appending to FILE, which it becomes once
        // its record is taken. `exec-client STATE QUIESCE FILE NONCE`
        "exec-client" => {
            let a = |i: usize| std::env::args().nth(i).expect("exec-client STATE QUIESCE FILE NONCE");
            let (state, q, out, nonce) = (a(2), a(3), a(4), a(5));
            let me_exe = std::fs::read_link("/proc/self/exe").unwrap_or_else(|_| fail("read own exe"));
            become_root("exec-client");
            let (rd, wr) = pipe_checked();
            let p = unsafe {
                libc::syscall(libc::SYS_clone, libc::CLONE_PARENT | libc::SIGCHLD, 0, 0, 0, 0) as i32
            };
            if p < 0 {
                fail("clone");
            }
            if p == 0 {
                unsafe { libc::close(wr) };
                let mut b = [0u8; 1];
                if unsafe { libc::read(rd, b.as_mut_ptr().cast(), 1) } != 1 {
                    unsafe { libc::_exit(3) };
                }
                let me = me_exe.to_str().unwrap_or_default().to_string();
                let argv: Vec<CString> = [
                    q.as_str(),
                    "exec",
                    "--user",
                    "0",
                    "--no-lineage",
                    "--state-dir",
                    state.as_str(),
                    "--",
                    me.as_str(),
                    "writer",
                    out.as_str(),
                ]
                .iter()
                .map(|x| CString::new(*x).unwrap())
                .collect();
                execve_bare(&argv);
                unsafe { libc::_exit(4) };
            }
            unsafe { libc::close(rd) };
            let start = start_of(p).unwrap_or_else(|| fail("start time of P"));
            let base = unix_nanos() - 1_000_000;
            let put = |i: u64, body: String| {
                let id = format!("{:016x}{:08x}{:08x}", base + i, p as u32, i as u32);
                let body = body.replace("@ID@", &id);
                let tmp = format!("{state}/requests/.plant.{i}");
                std::fs::write(&tmp, body).unwrap_or_else(|_| fail("write a planted request"));
                std::fs::rename(&tmp, format!("{state}/requests/{id}")).unwrap_or_else(|_| fail("rename"));
            };
            put(0, format!(r#"{{"nonce":"{nonce}","request_id":"@ID@","pid":{p},"start_time":{start}}}"#));
            for i in 1..=16 {
                put(i, "{}".to_string());
            }
            ready_as(p as u32);
            report(wr);
            forever();
        }
        // Calls itself "quiesce" and re-execs with argv[0] "sshd".
        "spoof" => {
            let name = CString::new("quiesce").unwrap();
            unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr(), 0, 0, 0) };
            if std::env::args().nth(2).as_deref() != Some("again") {
                use std::os::unix::process::CommandExt;
                let e =
                    std::process::Command::new("/proc/self/exe").arg0("sshd").args(["spoof", "again"]).exec();
                panic!("re-exec: {e}");
            }
            unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr(), 0, 0, 0) };
            ready();
            forever();
        }
        // Attacks PID 1 in a loop: SIGSTOP, SIGKILL and SIGTERM to it and to each of its threads
        // (one that switches to our UID for a moment is in reach), and SIGCONT to every process
        // of ours, which undoes a freeze's stop. Ready after the first full round.
        // Races a freeze's switched instant: N sleepers first (the stop's kill(-1) reaches them
        // before the racers, which widens the instant), then R racers that probe PID 1 with
        // kill(1, 0) and, each time it is let through, try everything at once: a burst of
        // real-time signals, SIGTERM, the freeze signal, SIGHUP, SIGTSTP, a thread-directed
        // SIGINT, and every call that asks for the same owner (nice, policy, affinity, I/O
        // priority, limits). Each call the kernel lets through is appended to FILE as a line.
        // The racers SIGCONT every process of ours after each round. Ready once all run.
        "race-init" => {
            let n = arg(2, 100);
            let racers = arg(3, 2);
            let file = std::env::args().nth(4).unwrap_or_else(|| fail("race-init N R FILE"));
            spawn_sleepers(n);
            for _ in 0..racers {
                if fork_checked() == 0 {
                    let log = |what: &str| {
                        use std::io::Write;
                        if let Ok(mut f) = std::fs::OpenOptions::new().append(true).create(true).open(&file) {
                            let _ = writeln!(f, "{} {what}", std::process::id());
                        }
                    };
                    let rt = libc::SIGRTMIN();
                    loop {
                        if unsafe { libc::kill(1, 0) } == 0 {
                            let mut sent = 0;
                            for k in 0..256 {
                                if unsafe { libc::kill(1, rt + 1 + (k % 20)) } == 0 {
                                    sent += 1;
                                }
                            }
                            for sig in
                                [libc::SIGTERM, libc::SIGUSR1, libc::SIGHUP, libc::SIGTSTP, libc::SIGQUIT]
                            {
                                if unsafe { libc::kill(1, sig) } == 0 {
                                    sent += 1;
                                }
                            }
                            if unsafe { libc::syscall(libc::SYS_tgkill, 1, 1, libc::SIGINT) } == 0 {
                                sent += 1;
                            }
                            unsafe {
                                if libc::setpriority(libc::PRIO_PROCESS, 1, 19) == 0 {
                                    log("setpriority");
                                }
                                let sp: libc::sched_param = std::mem::zeroed();
                                if libc::sched_setscheduler(1, libc::SCHED_IDLE, &sp) == 0 {
                                    log("sched_setscheduler");
                                }
                                let mut set: libc::cpu_set_t = std::mem::zeroed();
                                libc::CPU_SET(0, &mut set);
                                if libc::sched_setaffinity(1, std::mem::size_of_val(&set), &set) == 0 {
                                    log("sched_setaffinity");
                                }
                                if libc::syscall(libc::SYS_ioprio_set, 1, 1, 3 << 13) == 0 {
                                    log("ioprio_set");
                                }
                                let rl = libc::rlimit { rlim_cur: 8, rlim_max: 8 };
                                if libc::prlimit(1, libc::RLIMIT_NOFILE, &rl, std::ptr::null_mut()) == 0 {
                                    log("prlimit");
                                }
                            }
                            log(&format!("hit sent={sent}"));
                        }
                        unsafe { libc::kill(-1, libc::SIGCONT) };
                    }
                }
            }
            ready();
            forever();
        }
        "attack-init" => {
            let mut first = true;
            loop {
                for sig in [libc::SIGSTOP, libc::SIGKILL, libc::SIGTERM] {
                    unsafe { libc::kill(1, sig) };
                }
                let tids: Vec<i64> = std::fs::read_dir("/proc/1/task")
                    .map(|rd| rd.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect())
                    .unwrap_or_default();
                for tid in tids {
                    for sig in [libc::SIGSTOP, libc::SIGKILL, libc::SIGTERM] {
                        unsafe { libc::syscall(libc::SYS_tgkill, 1, tid, sig) };
                    }
                }
                unsafe { libc::kill(-1, libc::SIGCONT) };
                if first {
                    ready();
                    first = false;
                }
                std::thread::sleep(Duration::from_micros(500));
            }
        }
        // Run as root: a child drops to UID U and exits; the root parent never reaps it.
        "zombie-root" => {
            let uid = arg(2, 4242) as u32;
            let c = fork_checked();
            if c == 0 {
                let r = unsafe { libc::setresuid(uid, uid, uid) };
                unsafe { libc::_exit(if r == 0 { 0 } else { 1 }) };
            }
            exited_ok_unreaped(c);
            ready();
            forever();
        }
        // A child of ours that exits; we never reap it.
        "zombie" => {
            let c = fork_checked();
            if c == 0 {
                unsafe { libc::_exit(0) };
            }
            exited_ok_unreaped(c);
            ready();
            forever();
        }
        // A nested user + PID namespace with a sleeper inside.
        "userns" => {
            let r = unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWPID) };
            if r != 0 {
                eprintln!("unshare: {}", std::io::Error::last_os_error());
                std::process::exit(3);
            }
            let (rd, wr) = pipe_checked();
            if fork_checked() == 0 {
                spawn_sleepers(3);
                report(wr);
                forever();
            }
            await_reports(rd, wr, 1);
            ready();
            forever();
        }
        // The leader thread exits while another thread runs: the leader shows Z.
        "leader-exit" => {
            let pid = std::process::id();
            std::thread::spawn(move || {
                // Ready only once the leader really is a zombie; never, if it does not become one.
                for _ in 0..1000 {
                    let st =
                        std::fs::read_to_string(format!("/proc/self/task/{pid}/stat")).unwrap_or_default();
                    if st.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')) {
                        ready();
                        forever();
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                eprintln!("adversary: the leader never showed Z");
                unsafe { libc::_exit(1) };
            });
            // The raw exit ends this thread only, without unwinding through the runtime.
            unsafe { libc::syscall(libc::SYS_exit, 0) };
            unreachable!();
        }
        // Exec from a thread that is not the leader, over and over: each exec swaps the execing
        // thread into the leader's pid (de_thread) while the old leader is a zombie. With G > 0
        // (as root) it first takes G supplementary groups, which makes each status read of it
        // long enough for the swap to land inside it. Ready once, on the first run.
        "exec-hop" => {
            let groups = arg(2, 0) as usize;
            if std::env::args().nth(3).as_deref() != Some("again") {
                if groups > 0 {
                    let g: Vec<libc::gid_t> = (1..=groups as libc::gid_t).collect();
                    if unsafe { libc::setgroups(g.len(), g.as_ptr()) } != 0 {
                        fail("setgroups");
                    }
                }
                ready();
            }
            // Named now: once the leader has exited, /proc/self/exe no longer resolves.
            let exe = std::env::current_exe().unwrap_or_else(|_| fail("current_exe"));
            let exe = CString::new(exe.as_os_str().as_encoded_bytes()).unwrap_or_default();
            std::thread::spawn(move || {
                let args: Vec<CString> = ["adversary", "exec-hop", &groups.to_string(), "again"]
                    .iter()
                    .map(|a| CString::new(*a).unwrap_or_default())
                    .collect();
                let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
                argv.push(std::ptr::null());
                unsafe { libc::execv(exe.as_ptr(), argv.as_ptr()) };
                fail("execv");
            });
            // The leader ends at once, so the exec always comes from a non-leader thread.
            unsafe { libc::syscall(libc::SYS_exit, 0) };
            unreachable!();
        }
        // N children block on a pipe; the parent exits, orphaning them; they all exit at once
        // when the last write end closes.
        "orphans" => {
            let n = arg(2, 1000);
            let mut fds = [0; 2];
            unsafe { libc::pipe(fds.as_mut_ptr()) };
            for _ in 0..n {
                if fork() == 0 {
                    unsafe { libc::close(fds[1]) };
                    let mut b = [0u8; 1];
                    unsafe { libc::read(fds[0], b.as_mut_ptr() as *mut libc::c_void, 1) };
                    unsafe { libc::_exit(0) };
                }
            }
            // For the benchmark: when the orphans were released (they exit as we do).
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
            println!("{}", now.as_nanos());
            std::process::exit(0);
        }
        // The benchmark's kernel floor, run as root: one kill(-1, SIGKILL) from a thread switched
        // to UID, then poll /proc until no live process of that UID is left. Prints milliseconds.
        "floor" => {
            let uid = arg(2, 4242) as u32;
            let t = std::time::Instant::now();
            std::thread::spawn(move || {
                assert_eq!(raw_setresuid(uid, uid, 0), 0);
                unsafe { libc::kill(-1, libc::SIGKILL) };
                assert_eq!(raw_setresuid(0, 0, 0), 0);
            })
            .join()
            .unwrap();
            let deadline = t + Duration::from_secs(10);
            while any_alive(uid) {
                if std::time::Instant::now() > deadline {
                    println!("timeout");
                    return;
                }
            }
            println!("{:.3}", t.elapsed().as_secs_f64() * 1000.0);
        }
        // The freeze's own steps done bare, as the benchmark's second reference: SIGSTOP to the
        // UID, poll every thread's stat until all are stopped, read each process's command line
        // and executable, SIGKILL to the UID, poll until none is alive. No safety, no proof
        // beyond the last poll, no marker. Prints total, stop, walk and kill ms.
        "protocol-floor" => {
            let uid = arg(2, 4242) as u32;
            let as_uid = move |sig: i32| {
                std::thread::spawn(move || {
                    assert_eq!(raw_setresuid(uid, uid, 0), 0);
                    let r = unsafe { libc::kill(-1, sig) };
                    // ESRCH: nothing of the UID left to signal.
                    let ok = r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
                    assert_eq!(raw_setresuid(0, 0, 0), 0);
                    ok
                })
                .join()
                .unwrap()
            };
            let t = std::time::Instant::now();
            let deadline = t + Duration::from_secs(10);
            if !as_uid(libc::SIGSTOP) {
                println!("error: kill(-1, SIGSTOP) as {uid} failed");
                return;
            }
            // Each thread is read until it reads stopped, and not again: the fewest reads that
            // see every thread stopped.
            let Some((pids, mut pending)) = tasks_of(uid) else {
                println!("error: /proc unreadable");
                return;
            };
            let mut buf = Vec::with_capacity(1024);
            while !pending.is_empty() {
                if std::time::Instant::now() > deadline {
                    println!("timeout");
                    return;
                }
                pending.retain(|p| !stopped(p, &mut buf));
            }
            let stopped = t.elapsed();
            // The reads are what is timed; what they return (or that the process is gone)
            // does not matter to the reference.
            for pid in &pids {
                let _ = std::fs::read(format!("/proc/{pid}/cmdline"));
                let _ = std::fs::read_link(format!("/proc/{pid}/exe"));
            }
            let walked = t.elapsed();
            if !as_uid(libc::SIGKILL) {
                println!("error: kill(-1, SIGKILL) as {uid} failed");
                return;
            }
            while any_alive(uid) {
                if std::time::Instant::now() > deadline {
                    println!("timeout");
                    return;
                }
            }
            let ms = |d: Duration| d.as_secs_f64() * 1000.0;
            let total = t.elapsed();
            println!(
                "{:.3} {:.3} {:.3} {:.3}",
                ms(total),
                ms(stopped),
                ms(walked - stopped),
                ms(total - walked)
            );
        }
        // Run as root: a FUSE file system at MNT that answers INIT and nothing else, so a
        // process that touches it blocks in the kernel for good (uninterruptible once read).
        "fuse-daemon" => {
            let mnt = std::env::args().nth(2).expect("fuse-daemon MNT");
            let fd = mount_fuse(&mnt);
            ready();
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = unsafe { libc::read(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
                if n < 40 {
                    continue;
                }
                let opcode = u32::from_ne_bytes(buf[4..8].try_into().unwrap());
                let unique = u64::from_ne_bytes(buf[8..16].try_into().unwrap());
                if opcode != 26 {
                    continue; // FUSE_INIT only; every other request stays unanswered.
                }
                fuse_reply(fd, unique, 0, &fuse_init_out());
            }
        }
        // Touch PATH (on the silent FUSE mount): blocks in the kernel.
        "fuse-victim" => {
            ready();
            let p = std::env::args().nth(2).expect("fuse-victim PATH");
            let _ = std::fs::metadata(p);
            forever();
        }
        // Print each signal received (blocked + sigwaitinfo); exit on SIGTERM.
        "signals" => {
            use std::io::Write;
            unsafe {
                let mut all: libc::sigset_t = std::mem::zeroed();
                libc::sigfillset(&mut all);
                libc::sigprocmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
                ready();
                loop {
                    let s = libc::sigwaitinfo(&all, std::ptr::null_mut());
                    if s > 0 {
                        println!("got {s}");
                        let _ = std::io::stdout().flush();
                        if s == libc::SIGTERM {
                            std::process::exit(0);
                        }
                    }
                }
            }
        }
        // Run from a setuid-root copy: becomes root for good, leaves its parent, then never keeps
        // a pid: each hop forks, the parent exits, the child appends its pid to FILE and naps.
        // `hopper FILE [NAP_US] [newgroup]`: each hop naps NAP_US (default 200) microseconds;
        // with "newgroup" each hop also takes a process group of its own.
        // Root for good through a setuid copy, escaped under the init (its parent exits), then:
        // wait for a `quiesce freeze` client, kill it (its parent outside reaps it, so its pid is
        // free at once), and fork and reap until a child gets the client's pid; that child stays
        // (writes its pid to FILE), this process exits. `squat-client FILE [DECOY_UID] [MODE] [WHAT] [STATUS]`
        "squat-client" => {
            let out = std::env::args().nth(2).expect("squat-client FILE");
            escape_as_root("squat-client");
            // A container that has run a while: the counter is past the reserved pids.
            for _ in 0..400 {
                match fork() {
                    0 => unsafe { libc::_exit(0) },
                    p if p > 0 => unsafe {
                        libc::waitpid(p, std::ptr::null_mut(), 0);
                    },
                    _ => {}
                }
            }
            ready();
            // Find the client: a `quiesce freeze` process.
            let until = std::time::Instant::now() + Duration::from_secs(60);
            let target = loop {
                if std::time::Instant::now() > until {
                    std::process::exit(3);
                }
                let mut found = None;
                for e in std::fs::read_dir("/proc").unwrap().flatten() {
                    let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
                    let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
                    let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
                    if args.len() > 2 && args[0].ends_with(b"quiesce") && args[1] == b"freeze" {
                        found = Some(pid);
                    }
                }
                if let Some(p) = found {
                    break p;
                }
                std::thread::sleep(Duration::from_micros(500));
            };
            // Let the request reach the init first: with STATUS (argument 6), until the init
            // says it is freezing (a loaded machine may take longer than any fixed nap to carry
            // the client's signal); then a nap.
            if let Some(status) = std::env::args().nth(6) {
                let until = std::time::Instant::now() + Duration::from_secs(30);
                while !std::fs::read_to_string(&status).is_ok_and(|s| s.contains("\"freezing\""))
                    && std::time::Instant::now() < until
                {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            std::thread::sleep(Duration::from_millis(50));
            // "control" (argument 4): everything the same, but the child kept is the one that gets
            // the pid after the client's (not the init's own).
            let control = std::env::args().nth(4).as_deref() == Some("control");
            // "command" (argument 5): the pid to take is the init's command's (the init's child
            // named sleep), killed now; its pid is free once the init reaps it, during the freeze.
            let on_command = std::env::args().nth(5).as_deref() == Some("command");
            let client = if on_command {
                let comm =
                    |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                let mut cmd = None;
                for e in std::fs::read_dir("/proc").unwrap().flatten() {
                    let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
                    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
                    let Some(rest) = stat.rsplit_once(") ").map(|x| x.1) else { continue };
                    let ppid: i32 = rest.split(' ').nth(1).and_then(|x| x.parse().ok()).unwrap_or(0);
                    if comm(ppid).trim() == "quiesce" && stat.contains("(sleep)") {
                        cmd = Some(pid);
                    }
                }
                cmd.unwrap_or_else(|| fail("no command under the init"))
            } else {
                target
            };
            unsafe { libc::kill(client, libc::SIGKILL) };
            let target = if control { client + 1 } else { client };
            let end = std::time::Instant::now() + Duration::from_secs(8);
            let mut forks = 0u64;
            // DECOY_UID: keep a few processes of the sandbox UID alive meanwhile, so that every
            // observation has one to kill (a kill round, not the newcomer check's grace).
            let decoy_uid: u32 = std::env::args().nth(3).and_then(|s| s.parse().ok()).unwrap_or(0);
            let mut decoys: Vec<i32> = Vec::new();
            while std::time::Instant::now() < end {
                if decoy_uid > 0 {
                    decoys.retain(|&d| unsafe { libc::waitpid(d, std::ptr::null_mut(), libc::WNOHANG) } == 0);
                    while decoys.len() < 3 {
                        match fork() {
                            0 => {
                                raw_setresuid(decoy_uid, decoy_uid, decoy_uid);
                                forever();
                            }
                            p if p == target => unsafe { libc::_exit(0) },
                            p if p > 0 => decoys.push(p),
                            _ => break,
                        }
                    }
                }
                // Not reaped yet (the init reaps only inside the proof now): wait, decoys kept.
                if std::path::Path::new(&format!("/proc/{client}")).exists() {
                    std::thread::sleep(Duration::from_micros(200));
                    continue;
                }
                // Far from the target: burn pids with threads (cheaper than processes).
                let last: i32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
                    .ok()
                    .and_then(|t| t.trim().parse().ok())
                    .unwrap_or(0);
                let ahead = if last < target { target - last } else { i32::MAX };
                if ahead > 64 && last != target {
                    let ts: Vec<_> = (0..32)
                        .filter_map(|_| std::thread::Builder::new().stack_size(16 * 1024).spawn(|| {}).ok())
                        .collect();
                    for t in ts {
                        let _ = t.join();
                    }
                    forks += 32;
                    continue;
                }
                match fork() {
                    0 => {
                        if unsafe { libc::getpid() } == target {
                            let _ = std::fs::write(&out, format!("{target} {forks}\n"));
                            forever();
                        }
                        unsafe { libc::_exit(0) };
                    }
                    p if p == target => {
                        for d in &decoys {
                            unsafe { libc::kill(*d, libc::SIGKILL) };
                        }
                        unsafe { libc::_exit(0) }
                    }
                    p if p > 0 => {
                        forks += 1;
                        let mut st = 0;
                        unsafe { libc::waitpid(p, &mut st, 0) };
                    }
                    _ => {}
                }
            }
            let last = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid").unwrap_or_default();
            let _ = std::fs::write(&out, format!("miss target {target} forks {forks} last {}", last.trim()));
            std::process::exit(4);
        }
        // Root for good through a setuid copy, escaped under the init, then: a child S kept
        // (FILE gets "S START"), and every freeze request a client writes in STATE/requests
        // rewritten in place (root owns that directory) to name S by pid and start time as the
        // client, before the init reads it. `forge-request STATE FILE`
        "forge-request" => {
            let state = std::env::args().nth(2).expect("forge-request STATE FILE");
            let out = std::env::args().nth(3).expect("forge-request STATE FILE");
            escape_as_root("forge-request");
            let s = match fork() {
                0 => forever(),
                p if p < 0 => fail("fork"),
                p => p,
            };
            let start = start_of(s).unwrap_or_else(|| fail("start time of S"));
            let _ = std::fs::write(&out, format!("{s} {start} waiting\n"));
            let dir = format!("{state}/requests");
            let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
            if fd < 0 {
                fail("inotify_init1");
            }
            let dc = path_c(&dir);
            let mask = libc::IN_CREATE | libc::IN_MODIFY | libc::IN_MOVED_TO | libc::IN_CLOSE_WRITE;
            if unsafe { libc::inotify_add_watch(fd, dc.as_ptr(), mask) } < 0 {
                fail("inotify_add_watch");
            }
            ready();
            let until = std::time::Instant::now() + Duration::from_secs(60);
            let mut buf = vec![0u8; 64 * 1024];
            let mut done: Vec<String> = Vec::new();
            while std::time::Instant::now() < until {
                let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
                if unsafe { libc::poll(&mut pfd, 1, 200) } <= 0 {
                    continue;
                }
                let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
                if n <= 0 {
                    continue;
                }
                for (mask, name) in inotify_events(&buf, n) {
                    if name.starts_with(".taken.") || mask & libc::IN_CREATE != 0 {
                        continue;
                    }
                    let path = format!("{dir}/{name}");
                    let Ok(body) = std::fs::read(&path) else { continue };
                    let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(&body) else { continue };
                    let id = v["request_id"].as_str().unwrap_or("").to_string();
                    if v.get("launch").is_some() || id.is_empty() || done.contains(&id) {
                        continue;
                    }
                    let client = format!("{} {}", v["pid"], v["start_time"]);
                    let v_client_pid = v["pid"].as_i64().map(|p| p as i32);
                    v["pid"] = serde_json::json!(s);
                    v["start_time"] = serde_json::json!(start);
                    let mut forged = serde_json::to_vec(&v).unwrap();
                    // "control" (argument 4): everything the same, the request left as written.
                    if std::env::args().nth(4).as_deref() == Some("control") {
                        forged = body.clone();
                    }
                    while forged.len() < body.len() {
                        forged.push(b' ');
                    }
                    let f = std::fs::OpenOptions::new().write(true).open(&path);
                    let wrote = f.and_then(|f| {
                        use std::os::unix::fs::FileExt;
                        f.write_all_at(&forged, 0)
                    });
                    if wrote.is_ok() {
                        done.push(id.clone());
                        // "kill" (argument 4): the real client is then not the init's own, and
                        // may be refused itself (its parent is the outside): once the init took
                        // the request, it is killed (root may).
                        if std::env::args().nth(4).as_deref() == Some("kill") {
                            let end = std::time::Instant::now() + Duration::from_secs(5);
                            // Taken: the request was seen under its name, and is no longer.
                            let at = format!("{dir}/{id}");
                            let mut seen = false;
                            while std::time::Instant::now() < end {
                                let here = std::path::Path::new(&at).exists();
                                if seen && !here {
                                    break;
                                }
                                seen |= here;
                                std::thread::sleep(Duration::from_micros(100));
                            }
                            if let Some(c) = v_client_pid {
                                unsafe { libc::kill(c, libc::SIGKILL) };
                            }
                        }
                        let _ = std::fs::write(&out, format!("{s} {start} forged {id} client {client}\n"));
                        // Gone before the proof looks: S, under the init now, is all that stays.
                        unsafe { libc::_exit(0) };
                    }
                }
            }
            let _ = std::fs::write(&out, format!("{s} {start} no request seen\n"));
            unsafe { libc::kill(s, libc::SIGKILL) };
            std::process::exit(4);
        }
        // Root for good through a setuid copy, escaped under the init; shrinks the namespace's
        // pid_max to a few pids past the reserved ones (root's file: no CAP_SYS_ADMIN needed),
        // then kills the freeze client as soon as its request is in place and forks until a
        // child gets its pid, within the client's start tick if it can. FILE gets
        // "PID START CLIENT_START forks". `tick-squat STATE FILE [PID_MAX]`
        "tick-squat" => {
            let state = std::env::args().nth(2).expect("tick-squat STATE FILE");
            let out = std::env::args().nth(3).expect("tick-squat STATE FILE");
            let pid_max: i32 = std::env::args().nth(4).and_then(|s| s.parse().ok()).unwrap_or(310);
            escape_as_root("tick-squat");
            let last = || -> i32 {
                std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
                    .ok()
                    .and_then(|t| t.trim().parse().ok())
                    .unwrap_or(0)
            };
            while last() < 300 {
                match fork() {
                    0 => unsafe { libc::_exit(0) },
                    p if p > 0 => unsafe {
                        libc::waitpid(p, std::ptr::null_mut(), 0);
                    },
                    _ => fail("fork"),
                }
            }
            if let Err(e) = std::fs::write("/proc/sys/kernel/pid_max", pid_max.to_string()) {
                let _ = std::fs::write(&out, format!("0 0 0 pid_max not written: {e}\n"));
                std::process::exit(5);
            }
            let dir = format!("{state}/requests");
            let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
            let dc = path_c(&dir);
            if fd < 0 || unsafe { libc::inotify_add_watch(fd, dc.as_ptr(), libc::IN_MOVED_TO) } < 0 {
                fail("inotify");
            }
            ready();
            let until = std::time::Instant::now() + Duration::from_secs(60);
            let mut buf = vec![0u8; 64 * 1024];
            while std::time::Instant::now() < until {
                let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
                if unsafe { libc::poll(&mut pfd, 1, 200) } <= 0 {
                    continue;
                }
                let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
                for (_, name) in inotify_events(&buf, n) {
                    if name.starts_with('.') {
                        continue;
                    }
                    let Ok(body) = std::fs::read(format!("{dir}/{name}")) else { continue };
                    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) else { continue };
                    if v.get("launch").is_some() {
                        continue;
                    }
                    let (Some(c), Some(t)) = (v["pid"].as_i64(), v["start_time"].as_u64()) else { continue };
                    let c = c as i32;
                    unsafe { libc::kill(c, libc::SIGKILL) };
                    let end = std::time::Instant::now() + Duration::from_secs(2);
                    while std::path::Path::new(&format!("/proc/{c}")).exists()
                        && std::time::Instant::now() < end
                    {
                        std::hint::spin_loop();
                    }
                    let mut forks = 0;
                    while std::time::Instant::now() < end {
                        match fork() {
                            0 => {
                                if unsafe { libc::getpid() } == c {
                                    let me = start_of(c).unwrap_or(0);
                                    let _ = std::fs::write(&out, format!("{c} {me} {t} {forks}\n"));
                                    forever();
                                }
                                unsafe { libc::_exit(0) };
                            }
                            p if p == c => {
                                // The request untaken yet (the client died before it signalled):
                                // signal for it.
                                if std::path::Path::new(&format!("{dir}/{name}")).exists() {
                                    unsafe { libc::kill(1, libc::SIGUSR1) };
                                }
                                unsafe { libc::_exit(0) }
                            }
                            p if p > 0 => {
                                forks += 1;
                                unsafe { libc::waitpid(p, std::ptr::null_mut(), 0) };
                            }
                            _ => {}
                        }
                    }
                    let _ = std::fs::write(&out, format!("0 0 {t} miss {c} forks {forks}\n"));
                    std::process::exit(4);
                }
            }
            std::process::exit(4);
        }
        "hopper" => {
            let path = std::env::args().nth(2).expect("hopper FILE");
            let nap = arg(3, 200) as u32;
            let newgroup = std::env::args().any(|a| a == "newgroup");
            assert_eq!(raw_setresuid(0, 0, 0), 0, "hopper needs a setuid-root copy");
            let c = path_c(&path);
            match fork() {
                0 => {}
                p if p < 0 => panic!("fork: {}", std::io::Error::last_os_error()),
                _ => {
                    // The first hop says it is running; then this parent leaves.
                    wait_for_file_growth(&path);
                    ready();
                    unsafe { libc::_exit(0) };
                }
            }
            assert!(unsafe { libc::setsid() } > 0, "setsid: {}", std::io::Error::last_os_error());
            loop {
                match fork() {
                    0 => {}
                    // Fork refused (a limit): try again; never exit without a successor.
                    p if p < 0 => continue,
                    _ => unsafe { libc::_exit(0) },
                }
                if newgroup {
                    unsafe { libc::setpgid(0, 0) };
                }
                append_pid(&c);
                if nap > 0 {
                    unsafe { libc::usleep(nap) };
                }
            }
        }
        // Run as root: fill the PID namespace's pid space with children that sleep, until the
        // kernel refuses a fork for want of a pid (at most 70,000), then let the last FREE of them
        // go (killed and reaped), so that exactly FREE pids are left to hand out. With CYCLES > 0,
        // then create and reap that many children and write to OUT what the pid counter read
        // before and after and how many pids they got. `pidfill OUT FREE CYCLES`
        "pidfill" => {
            let out = std::env::args().nth(2).expect("pidfill OUT");
            let free = arg(3, 1) as usize;
            let cycles = arg(4, 0);
            let last_pid = || -> i64 {
                std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or_else(|| fail("read ns_last_pid"))
            };
            let mut holders = Vec::new();
            loop {
                if holders.len() >= 70_000 {
                    fail("the pid space did not run out within 70,000 processes");
                }
                match fork() {
                    0 => forever(),
                    p if p > 0 => holders.push(p),
                    _ if std::io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN) => break,
                    _ => fail("fork"),
                }
            }
            if holders.len() < free {
                fail("fewer holders than pids to free");
            }
            for p in holders.split_off(holders.len() - free) {
                unsafe { libc::kill(p, libc::SIGKILL) };
                if unsafe { libc::waitpid(p, std::ptr::null_mut(), 0) } != p {
                    fail("reap a holder");
                }
            }
            let before = last_pid();
            let mut got = std::collections::BTreeSet::new();
            for _ in 0..cycles {
                match fork() {
                    0 => unsafe { libc::_exit(0) },
                    p if p > 0 => {
                        got.insert(p);
                        if unsafe { libc::waitpid(p, std::ptr::null_mut(), 0) } != p {
                            fail("reap a cycle's child");
                        }
                    }
                    _ => fail("fork in a cycle"),
                }
            }
            let after = last_pid();
            let pids: Vec<String> = got.iter().take(8).map(|p| p.to_string()).collect();
            let line = format!(
                "holders {} before {before} after {after} distinct {} pids {}\n",
                holders.len(),
                got.len(),
                pids.join(",")
            );
            std::fs::write(&out, line).unwrap_or_else(|_| fail("write OUT"));
            ready();
            forever();
        }
        // Run as root, as a launcher that reaps whatever dies under it (a shell, a supervisor):
        // runs ARGS as its child, then reaps every child, forever, pausing DELAY_US microseconds
        // after each one (a busy supervisor). `reaper DELAY_US ARGS...`
        "reaper" => {
            let delay = arg(2, 0) as u32;
            let argv: Vec<CString> =
                std::env::args().skip(3).map(|a| CString::new(a).expect("argument without NUL")).collect();
            if argv.is_empty() {
                fail("reaper needs a command");
            }
            let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
            ptrs.push(std::ptr::null());
            match fork() {
                0 => {
                    unsafe { libc::execv(ptrs[0], ptrs.as_ptr()) };
                    unsafe { libc::_exit(127) };
                }
                p if p < 0 => fail("fork"),
                _ => {}
            }
            loop {
                if unsafe { libc::waitpid(-1, std::ptr::null_mut(), 0) } < 0 {
                    if std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD) {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                } else if delay > 0 {
                    unsafe { libc::usleep(delay) };
                }
            }
        }
        // Run as a setuid-root copy under a root launcher that reaps (`reaper`): stays the
        // sandbox's (real UID the sandbox user, effective root) and alive, so that the init sees
        // the launcher above a sandbox process; makes a root child of the launcher
        // (CLONE_PARENT) that never keeps a pid: each hop clones the next one as the launcher's
        // child and exits, and the launcher reaps it, so the hops need no more than one free pid.
        // Each hop appends its pid to FILE and naps NAP_US. `parent-hopper FILE [NAP_US] [newsession]`
        // A root child whose parent dies while the init reads: run as a setuid-root copy (real UID
        // the sandbox user, effective root), no lineage. P (this process) pushes the pid counter near pid_max, then makes S, a root
        // process that ends up a child of the init (its parent M exits); S lets the counter wrap
        // and makes R (root, low pid) and R makes H (root, THREADS threads, slow to read, pid between
        // R and S). Once P is dead (the freeze's kill), S waits DELAY_US and exits: a table that
        // read R (ppid S) before S's exit and S after it holds R with a parent that is a dead
        // non-launcher. `stale-parent THREADS DELAY_US [nowrap]`
        "stale-parent" => {
            let threads = arg(2, 3000) as usize;
            let delay = arg(3, 5000) as u32;
            let r = unsafe { libc::getuid() };
            if raw_setresuid(r, 0, r) != 0 {
                fail("setresuid: stale-parent needs a setuid-root copy");
            }
            let num = |f: &str| -> i64 {
                std::fs::read_to_string(f).ok().and_then(|s| s.trim().parse().ok()).unwrap_or_else(|| fail(f))
            };
            let pid_max = num("/proc/sys/kernel/pid_max");
            let churn = |until: &dyn Fn() -> bool| {
                let mut n = 0u64;
                while !until() {
                    n += 1;
                    if n > 200_000 {
                        fail("counter did not get there");
                    }
                    match fork() {
                        0 => unsafe { libc::_exit(0) },
                        c if c > 0 => {
                            unsafe { libc::waitpid(c, std::ptr::null_mut(), 0) };
                        }
                        _ => {}
                    }
                }
            };
            eprintln!(
                "stale-parent: P {} pid_max {pid_max} last {}",
                unsafe { libc::getpid() },
                num("/proc/sys/kernel/ns_last_pid")
            );
            churn(&|| num("/proc/sys/kernel/ns_last_pid") >= pid_max - 30);
            eprintln!("stale-parent: P churned to {}", num("/proc/sys/kernel/ns_last_pid"));
            let (rd, wr) = pipe_checked();
            let p = unsafe { libc::getpid() };
            match fork() {
                0 => {
                    if raw_setresuid(0, 0, 0) != 0 {
                        unsafe { libc::_exit(1) };
                    }
                    match fork() {
                        0 => {
                            // S
                            unsafe { libc::close(rd) };
                            let t0 = std::time::Instant::now();
                            while unsafe { libc::getppid() } != 1 && t0.elapsed() < Duration::from_secs(2) {
                                std::thread::sleep(Duration::from_millis(1));
                            }
                            let me = unsafe { libc::getpid() } as i64;
                            eprintln!("stale-parent: S {me} ppid {}", unsafe { libc::getppid() });
                            if std::env::args().nth(4).as_deref() != Some("nowrap") {
                                churn(&|| num("/proc/sys/kernel/ns_last_pid") < me - 100);
                            }
                            match fork() {
                                0 => {
                                    // R
                                    match fork() {
                                        0 => {
                                            // H
                                            for _ in 0..threads {
                                                if std::thread::Builder::new()
                                                    .stack_size(16 * 1024)
                                                    .spawn(|| forever())
                                                    .is_err()
                                                {
                                                    fail("thread");
                                                }
                                            }
                                            eprintln!("stale-parent: H {} threads {threads}", unsafe {
                                                libc::getpid()
                                            });
                                            report(wr);
                                            forever();
                                        }
                                        h if h < 0 => fail("fork H"),
                                        _ => {}
                                    }
                                    unsafe { libc::close(wr) };
                                    forever();
                                }
                                c if c < 0 => fail("fork R"),
                                _ => {}
                            }
                            unsafe { libc::close(wr) };
                            // Armed once P is gone or a zombie.
                            let stat = format!("/proc/{p}/stat");
                            loop {
                                let s = std::fs::read_to_string(&stat).unwrap_or_default();
                                let st = s.rsplit(')').next().and_then(|r| r.trim_start().chars().next());
                                if s.is_empty() || st == Some('Z') || st == Some('X') {
                                    break;
                                }
                                unsafe { libc::usleep(100) };
                            }
                            unsafe { libc::usleep(delay) };
                            unsafe { libc::_exit(0) };
                        }
                        c if c < 0 => unsafe { libc::_exit(1) },
                        _ => unsafe { libc::_exit(0) },
                    }
                }
                m if m < 0 => fail("fork M"),
                m => {
                    unsafe { libc::waitpid(m, std::ptr::null_mut(), 0) };
                }
            }
            await_reports(rd, wr, 1);
            ready();
            forever();
        }
        "parent-hopper" => {
            let path = std::env::args().nth(2).expect("parent-hopper FILE");
            let nap = arg(3, 0) as u32;
            let r = unsafe { libc::getuid() };
            if raw_setresuid(r, 0, r) != 0 {
                fail("setresuid: parent-hopper needs a setuid-root copy");
            }
            let c = path_c(&path);
            let clone_parent =
                || unsafe { libc::syscall(libc::SYS_clone, libc::CLONE_PARENT | libc::SIGCHLD, 0, 0, 0, 0) };
            match clone_parent() {
                0 => {
                    if raw_setresuid(0, 0, 0) != 0 {
                        unsafe { libc::_exit(1) };
                    }
                    // With "newsession" the first hop leads a session of its own, whose id keeps
                    // its pid handed out after it exits: one pid fewer to hop through.
                    if std::env::args().any(|a| a == "newsession") {
                        unsafe { libc::setsid() };
                    }
                    loop {
                        append_pid(&c);
                        if nap > 0 {
                            unsafe { libc::usleep(nap) };
                        }
                        // Refused (no pid free right now): try again; never exit without a
                        // successor.
                        loop {
                            match clone_parent() {
                                0 => break,
                                p if p > 0 => unsafe { libc::_exit(0) },
                                _ => {}
                            }
                        }
                    }
                }
                p if p < 0 => fail("clone"),
                _ => {}
            }
            wait_for_file_growth(&path);
            ready();
            forever();
        }
        // N processes that each SIGCONT every process of their UID, as fast as they can.
        "cont-ring" => {
            let n = arg(2, 20);
            for _ in 0..n {
                match fork() {
                    0 => loop {
                        unsafe { libc::kill(-1, libc::SIGCONT) };
                    },
                    p if p < 0 => panic!("fork: {}", std::io::Error::last_os_error()),
                    _ => {}
                }
            }
            ready();
            loop {
                unsafe { libc::kill(-1, libc::SIGCONT) };
            }
        }
        // Run as root: first seen as root, then real and effective UID become U for HOLD ms
        // (saved UID stays 0, as in a setuid-root program or a launcher before its final setuid),
        // then root again for good, with no lineage tag.
        "late-drop" => {
            let uid = arg(2, 4242) as u32;
            let hold = arg(3, 600);
            std::thread::sleep(Duration::from_millis(300));
            // One thread: the raw syscall changes the whole (single-threaded) process.
            assert_eq!(raw_setresuid(uid, uid, 0), 0, "setresuid to {uid}");
            std::thread::sleep(Duration::from_millis(hold));
            assert_eq!(raw_setresuid(0, 0, 0), 0, "back to root");
            ready();
            forever();
        }
        // Sends SIGKILL and SIGSTOP to every thread of process PID, in a loop, for as long as it
        // lives: whatever it is allowed to hit, it hits.
        "hammer" => {
            let target = arg(2, 1) as i32;
            ready();
            loop {
                let Ok(rd) = std::fs::read_dir(format!("/proc/{target}/task")) else { forever() };
                for e in rd.flatten() {
                    if let Some(tid) = e.file_name().to_str().and_then(|t| t.parse::<i32>().ok()) {
                        for sig in [libc::SIGKILL, libc::SIGSTOP] {
                            unsafe { libc::syscall(libc::SYS_tgkill, target, tid, sig) };
                        }
                    }
                }
            }
        }
        // Stop the terminal's output, as a command that owns it can (`docker run -t`), and stay.
        "tcooff" => {
            if unsafe { libc::tcflow(1, libc::TCOOFF) } != 0 {
                eprintln!("tcflow: {}", std::io::Error::last_os_error());
                std::process::exit(1);
            }
            ready();
            forever();
        }
        // Run as root: a FUSE file system at MNT that serves one 1 MiB file under every name
        // (INIT, LOOKUP, GETATTR, OPEN are answered) and never answers a READ, so whoever
        // faults a page of that file waits in the kernel until the daemon dies. With UID it
        // drops to that UID after mounting (the sandbox user runs its own FUSE daemon).
        "fuse-serve" => {
            fn attr(out: &mut Vec<u8>, ino: u64, mode: u32, size: u64) {
                // fuse_attr: ino, size, blocks, atime, mtime, ctime, three nsec, mode, nlink,
                // uid, gid, rdev, blksize, flags.
                for v in [ino, size, size / 512, 0, 0, 0] {
                    out.extend_from_slice(&v.to_ne_bytes());
                }
                for v in [0u32, 0, 0, mode, 1, 0, 0, 0, 4096, 0] {
                    out.extend_from_slice(&v.to_ne_bytes());
                }
            }
            let mnt = std::env::args().nth(2).expect("fuse-serve MNT [UID]");
            let drop_to = std::env::args().nth(3).and_then(|s| s.parse::<u32>().ok());
            let fd = mount_fuse(&mnt);
            if let Some(uid) = drop_to {
                unsafe {
                    assert_eq!(libc::setgroups(0, std::ptr::null()), 0);
                    assert_eq!(libc::setresgid(uid, uid, uid), 0);
                    assert_eq!(libc::setresuid(uid, uid, uid), 0);
                }
            }
            ready();
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = unsafe { libc::read(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
                if n < 40 {
                    if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENODEV) {
                        std::process::exit(0); // unmounted
                    }
                    continue;
                }
                let opcode = u32::from_ne_bytes(buf[4..8].try_into().unwrap());
                let unique = u64::from_ne_bytes(buf[8..16].try_into().unwrap());
                let nodeid = u64::from_ne_bytes(buf[16..24].try_into().unwrap());
                let mut body = Vec::with_capacity(128);
                match opcode {
                    26 => fuse_reply(fd, unique, 0, &fuse_init_out()),
                    // LOOKUP: every name is the file, inode 2; valid for an hour.
                    1 => {
                        for v in [2u64, 0, 3600, 3600] {
                            body.extend_from_slice(&v.to_ne_bytes());
                        }
                        body.extend_from_slice(&[0u8; 8]);
                        attr(&mut body, 2, 0o100644, 1 << 20);
                        fuse_reply(fd, unique, 0, &body);
                    }
                    // GETATTR
                    3 => {
                        body.extend_from_slice(&3600u64.to_ne_bytes());
                        body.extend_from_slice(&[0u8; 8]);
                        if nodeid == 1 {
                            attr(&mut body, 1, 0o40755, 0);
                        } else {
                            attr(&mut body, 2, 0o100644, 1 << 20);
                        }
                        fuse_reply(fd, unique, 0, &body);
                    }
                    // OPEN, OPENDIR: file handle 1.
                    14 | 27 => {
                        body.extend_from_slice(&1u64.to_ne_bytes());
                        body.extend_from_slice(&[0u8; 8]);
                        fuse_reply(fd, unique, 0, &body);
                    }
                    // READ and INTERRUPT stay unanswered; FORGET and BATCH_FORGET take no answer.
                    15 | 36 | 2 | 42 => {}
                    _ => fuse_reply(fd, unique, -libc::ENOSYS, &[]),
                }
            }
        }
        // Map PATH (a file of `fuse-serve`) and read its first page through /proc/self/mem,
        // which faults it in while holding this process's mmap lock: the read never completes.
        // A second thread then calls mmap() and waits for that lock, and from then on anyone
        // who reads this process's cmdline, environ or maps waits too. The main thread is the
        // one stuck in the read, so after SIGKILL the process stays alive in D state.
        "fuse-mmap-victim" => {
            use std::ffi::CStr;
            use std::os::fd::AsRawFd;
            use std::sync::atomic::{AtomicI32, Ordering};
            // Once the lock is held no thread may allocate: a new malloc arena is an mmap() that
            // would wait for the lock too. Everything the helpers need is prepared first.
            fn state_of(stat: &CStr) -> u8 {
                let mut b = [0u8; 512];
                let fd = unsafe { libc::open(stat.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
                if fd < 0 {
                    return b'?';
                }
                let n = unsafe { libc::read(fd, b.as_mut_ptr() as *mut libc::c_void, b.len()) };
                unsafe { libc::close(fd) };
                let b = &b[..n.max(0) as usize];
                match b.iter().rposition(|&c| c == b')') {
                    Some(i) if i + 2 < b.len() => b[i + 2],
                    _ => b'?',
                }
            }
            static WRITER: AtomicI32 = AtomicI32::new(0);
            static PREPARED: AtomicI32 = AtomicI32::new(0);
            let path = std::env::args().nth(2).expect("fuse-mmap-victim PATH [mbind]");
            // mbind() waits for the lock without a way out for SIGKILL; mmap() can be killed.
            let unkillable = std::env::args().nth(3).as_deref() == Some("mbind");
            let anon_page = || unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    4096,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            let anon = anon_page() as usize;
            let f = std::fs::File::open(&path).expect("open the FUSE file");
            let addr = unsafe {
                libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ, libc::MAP_PRIVATE, f.as_raw_fd(), 0)
            };
            assert_ne!(addr, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
            let mem = std::fs::File::open("/proc/self/mem").expect("open /proc/self/mem");
            let leader_stat = CString::new(format!("/proc/self/task/{}/stat", std::process::id())).unwrap();
            std::thread::spawn(move || {
                WRITER.store(unsafe { libc::gettid() }, Ordering::SeqCst);
                // Wait until the leader sleeps in the fault, then ask for the lock for writing.
                while !matches!(state_of(&leader_stat), b'S' | b'D') {
                    unsafe { libc::usleep(5000) };
                }
                unsafe { libc::usleep(100_000) };
                if unkillable {
                    let node0: u64 = 1;
                    let r = unsafe {
                        libc::syscall(libc::SYS_mbind, anon, 4096usize, 2usize, &node0, 64usize, 0usize)
                    };
                    eprintln!("fuse-mmap-victim: mbind returned {r}: the lock was free");
                } else {
                    let p = anon_page();
                    eprintln!("fuse-mmap-victim: mmap returned {p:?}: the lock was free");
                }
                forever();
            });
            while WRITER.load(Ordering::SeqCst) == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            let writer_stat =
                CString::new(format!("/proc/self/task/{}/stat", WRITER.load(Ordering::SeqCst))).unwrap();
            let ready_paths = std::env::var("ADV_READY").ok().map(|p| {
                let tmp = CString::new(format!("{p}.tmp.{}", std::process::id())).unwrap();
                (tmp, CString::new(p).unwrap(), std::process::id().to_string().into_bytes())
            });
            std::thread::spawn(move || {
                PREPARED.store(1, Ordering::SeqCst);
                while state_of(&writer_stat) != b'D' {
                    unsafe { libc::usleep(5000) };
                }
                if let Some((tmp, path, pid)) = &ready_paths {
                    unsafe {
                        let fd =
                            libc::open(tmp.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC, 0o644);
                        assert!(fd >= 0);
                        libc::write(fd, pid.as_ptr() as *const libc::c_void, pid.len());
                        libc::close(fd);
                        assert_eq!(libc::rename(tmp.as_ptr(), path.as_ptr()), 0);
                    }
                }
                forever();
            });
            while PREPARED.load(Ordering::SeqCst) == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            let mut b = [0u8; 1];
            let n =
                unsafe { libc::pread(mem.as_raw_fd(), b.as_mut_ptr() as *mut libc::c_void, 1, addr as i64) };
            eprintln!("fuse-mmap-victim: the read returned {n}: the daemon answered or went away");
            forever();
        }
        // A storm of zombies for PID 1: CREATORS processes, reparented to PID 1 by a double
        // fork, each creating children with clone(CLONE_PARENT) (children of PID 1) that exit
        // at once, as fast as RLIMIT_NPROC (LIMIT) lets them, for SECS seconds. ORPHANS sleepers
        // reparented to PID 1 first sit ahead of the zombies in its list of children, which
        // every waitpid() walks: each reap costs the init more than each zombie costs the storm.
        "zombie-storm" => {
            let creators = arg(2, 16);
            nproc_cap(arg(3, 200));
            let secs = arg(4, 20);
            let orphans = arg(5, 0);
            if fork() == 0 {
                spawn_sleepers(orphans);
                for _ in 0..creators {
                    if fork() == 0 {
                        // Wait to be reparented to PID 1 before cloning siblings of ours.
                        while unsafe { libc::getppid() } != 1 {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        let until = std::time::Instant::now() + Duration::from_secs(secs);
                        while std::time::Instant::now() < until {
                            let flags = (libc::CLONE_PARENT | libc::SIGCHLD) as libc::c_ulong;
                            let r = unsafe {
                                libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize)
                            };
                            if r == 0 {
                                unsafe { libc::syscall(libc::SYS_exit_group, 0) };
                            }
                        }
                        std::process::exit(0);
                    }
                }
                std::process::exit(0);
            }
            std::thread::sleep(Duration::from_millis(300));
            ready();
            forever();
        }
        // N children that each run `sh -c 'sleep 1000; :'` with K more arguments of SIZE bytes
        // of 0xFF (K = 0: an ordinary command line), then the parent waits.
        "argv-hog" => {
            let n = arg(2, 30);
            let k = arg(3, 15) as usize;
            let size = arg(4, 120 * 1024) as usize;
            let junk = CString::new(vec![0xFFu8; size.max(1)]).unwrap();
            let mut argv: Vec<CString> = vec![
                CString::new("sh").unwrap(),
                CString::new("-c").unwrap(),
                CString::new("sleep 1000; :").unwrap(),
            ];
            argv.extend(std::iter::repeat_n(junk, k));
            let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
            ptrs.push(std::ptr::null());
            let mut kids = Vec::new();
            for _ in 0..n {
                match fork() {
                    0 => {
                        unsafe { libc::execv(c"/bin/sh".as_ptr(), ptrs.as_ptr()) };
                        unsafe { libc::_exit(127) };
                    }
                    p if p < 0 => panic!("fork: {}", std::io::Error::last_os_error()),
                    p => kids.push(p),
                }
            }
            // Ready once every child runs sh and has started its sleep.
            for p in kids {
                loop {
                    let kids_of =
                        std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap_or_default();
                    if !kids_of.trim().is_empty() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            ready();
            forever();
        }
        other => {
            eprintln!("adversary: unknown mode '{other}'");
            std::process::exit(2);
        }
    }
}

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

fn forever() -> ! {
    loop {
        unsafe { libc::pause() };
    }
}

fn fork() -> i32 {
    unsafe { libc::fork() }
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

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_default();
    match mode.as_str() {
        // N children that sleep forever, and the parent.
        "sleepers" => {
            spawn_sleepers(arg(2, 10));
            ready();
            forever();
        }
        // Every process forks as fast as it can, capped by RLIMIT_NPROC.
        "bomb" => {
            nproc_cap(arg(2, 500));
            let mut forked = 0u64;
            loop {
                if fork() == 0 {
                    continue;
                }
                forked += 1;
                if forked == 50 {
                    ready();
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
        // Run as root: a FUSE file system at MNT that answers INIT and nothing else, so a
        // process that touches it blocks in the kernel for good (uninterruptible once read).
        "fuse-daemon" => {
            let mnt = std::env::args().nth(2).expect("fuse-daemon MNT");
            let fd = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
            assert!(fd >= 0, "open /dev/fuse: {}", std::io::Error::last_os_error());
            let opts =
                CString::new(format!("fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other")).unwrap();
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
                let mut out = Vec::with_capacity(80);
                out.extend_from_slice(&80u32.to_ne_bytes());
                out.extend_from_slice(&0i32.to_ne_bytes());
                out.extend_from_slice(&unique.to_ne_bytes());
                // fuse_init_out: major, minor, max_readahead, flags, max_background,
                // congestion_threshold, max_write, time_gran, then zeros to 64 bytes.
                for v in [7u32, 31, 65536, 0] {
                    out.extend_from_slice(&v.to_ne_bytes());
                }
                out.extend_from_slice(&0u16.to_ne_bytes());
                out.extend_from_slice(&0u16.to_ne_bytes());
                out.extend_from_slice(&4096u32.to_ne_bytes());
                out.extend_from_slice(&1u32.to_ne_bytes());
                out.resize(80, 0);
                unsafe { libc::write(fd, out.as_ptr() as *const libc::c_void, out.len()) };
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
        other => {
            eprintln!("adversary: unknown mode '{other}'");
            std::process::exit(2);
        }
    }
}

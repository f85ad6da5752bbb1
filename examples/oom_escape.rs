//! Processes that would escape the init's OOM raise were it to infer a child's score from its
//! parent's (tests/attack_oom.rs). `oom_escape MODE OUT [ARGS]`, run as the sandbox user, entered like `docker exec -u` (no
//! `quiesce exec`: it starts at oom_score_adj 0). Every process that may have escaped the raise
//! appends "pid own_score_at_birth" to OUT, then sleeps; the test looks at it later.
//!
//! clone-parent [FILLERS]: D forks FILLERS sleepers, then short-lived U's; a U that sees D raised and itself not, 20 ms later
//!   clones C with CLONE_PARENT: C's ppid is D (held since D's write), its start later, its
//!   score U's 0.
//! subreaper [FILLERS]: the same, D a child subreaper; the U forks C plainly and exits: C is reparented
//!   to D.
//! vmshare N: see `vmshare`.
//! bigfork MB: D holds MB MiB of touched anonymous memory (no THP) in many VMAs and forks
//!   back to back: the child's oom_score_adj is copied (copy_signal) before copy_mm, its start
//!   time is taken after; a raise of D that lands during copy_mm leaves a child at 0 whose start
//!   is after D's raise tick.

use std::io::Write;
use std::time::{Duration, Instant};

fn score(fd: i32) -> i32 {
    let mut b = [0u8; 16];
    let n = unsafe { libc::pread(fd, b.as_mut_ptr().cast(), b.len(), 0) };
    if n <= 0 {
        return -99999;
    }
    std::str::from_utf8(&b[..n as usize]).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(-99999)
}

fn open_score(pid: u32) -> i32 {
    let p = std::ffi::CString::new(format!("/proc/{pid}/oom_score_adj")).unwrap();
    let fd = unsafe { libc::open(p.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    assert!(fd >= 0, "open {p:?}");
    fd
}

fn ready() {
    if let Ok(p) = std::env::var("ADV_READY") {
        let tmp = format!("{p}.tmp.{}", std::process::id());
        std::fs::write(&tmp, std::process::id().to_string()).unwrap();
        std::fs::rename(&tmp, &p).unwrap();
    }
}

fn note(out: &str, line: &str) {
    let mut f = std::fs::OpenOptions::new().append(true).create(true).open(out).unwrap();
    f.write_all(format!("{line}\n").as_bytes()).unwrap();
}

/// The escapee: say who it is and what it inherited, then stay.
fn escapee(out: &str, how: &str) -> ! {
    let me = std::process::id();
    let s = score(open_score(me));
    note(out, &format!("{me} {s} {how} ppid={}", unsafe { libc::getppid() }));
    if !how.ends_with("grandchild") {
        // Its own children, later: born after its start, they count as inheriting its "raise".
        std::thread::sleep(Duration::from_millis(50));
        for _ in 0..2 {
            if unsafe { libc::fork() } == 0 {
                escapee(out, &format!("{how}-grandchild"));
            }
        }
    }
    std::thread::sleep(Duration::from_secs(120));
    unsafe { libc::_exit(0) }
}

fn reap() {
    while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
}

fn cap_nproc(n: u64) {
    let r = libc::rlimit { rlim_cur: n, rlim_max: n };
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NPROC, &r) }, 0);
}

fn racers(out: &str, subreaper: bool, fillers: usize) {
    let d = std::process::id();
    if subreaper {
        assert_eq!(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) }, 0);
    }
    let dfd = open_score(d);
    ready();
    let until = Instant::now() + Duration::from_secs(8);
    let mut raised_at = None;
    let mut forks = 0;
    while Instant::now() < until {
        if raised_at.is_none() && score(dfd) == 1000 {
            raised_at = Some(Instant::now());
            note(out, &format!("# D {d} raised after {forks} forks"));
        }
        if raised_at.is_some_and(|t| t.elapsed() > Duration::from_millis(300)) {
            break;
        }
        // Fillers, forked from the start of the loop (a raise before the loop is a lost try):
        // every refresh reads them between its listing of /proc and D's write, which is how
        // long a U born after the listing stays out of the table while D is raised.
        if forks < fillers && raised_at.is_none() && unsafe { libc::fork() } == 0 {
            std::thread::sleep(Duration::from_secs(120));
            unsafe { libc::_exit(0) };
        }
        forks += 1;
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let me = std::process::id();
            let own = open_score(me);
            let t = Instant::now();
            while t.elapsed() < Duration::from_millis(60) {
                if score(dfd) == 1000 {
                    // Past the tick the init read after D's write.
                    std::thread::sleep(Duration::from_millis(25));
                    if score(own) != 0 {
                        unsafe { libc::_exit(0) };
                    }
                    if subreaper {
                        if unsafe { libc::fork() } == 0 {
                            // Until U has exited and C is D's.
                            while unsafe { libc::getppid() } as u32 != d {
                                std::thread::sleep(Duration::from_millis(1));
                            }
                            escapee(out, "subreaper");
                        }
                        unsafe { libc::_exit(0) };
                    }
                    let r = unsafe {
                        libc::syscall(
                            libc::SYS_clone,
                            (libc::CLONE_PARENT) as libc::c_ulong,
                            0usize,
                            0usize,
                            0usize,
                            0usize,
                        )
                    };
                    if r == 0 {
                        escapee(out, "clone-parent");
                    }
                    unsafe { libc::_exit(0) };
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            unsafe { libc::_exit(0) };
        }
        reap();
        std::thread::sleep(Duration::from_micros(500));
    }
    // Stay, reaping, so that C keeps its parent D.
    let end = Instant::now() + Duration::from_secs(120);
    while Instant::now() < end {
        reap();
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn bigfork(out: &str, mb: usize) {
    let d = std::process::id();
    let dfd = open_score(d);
    let setup = Instant::now();
    let len = mb << 20;
    let page = 4096;
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert!(p != libc::MAP_FAILED);
    unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
    for off in (0..len).step_by(page) {
        unsafe { *(p as *mut u8).add(off) = 1 };
    }
    // Many VMAs: every 8th page read-only.
    for off in (0..len).step_by(page * 8).take(30000) {
        unsafe { libc::mprotect((p as *mut u8).add(off).cast(), page, libc::PROT_READ) };
    }
    note(
        out,
        &format!("# D {d}: setup took {} ms, score {} after it", setup.elapsed().as_millis(), score(dfd)),
    );
    ready();
    let until = Instant::now() + Duration::from_secs(10);
    let mut last = 0;
    let mut forks = 0;
    while Instant::now() < until {
        let before = score(dfd);
        let t = Instant::now();
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let s = score(open_score(std::process::id()));
            if s == 1000 {
                unsafe { libc::_exit(0) };
            }
            escapee(out, "bigfork");
        }
        forks += 1;
        let took = t.elapsed();
        let after = score(dfd);
        last = took.as_millis();
        if before != after {
            note(out, &format!("# D {d} raised during fork {forks} of child {pid} (fork took {last} ms)"));
        }
        reap();
        if after == 1000 {
            break;
        }
    }
    note(out, &format!("# D {d}: {forks} forks, last took {last} ms"));
    let end = Instant::now() + Duration::from_secs(120);
    while Instant::now() < end {
        reap();
        std::thread::sleep(Duration::from_millis(50));
    }
}

extern "C" fn vm_child(_: *mut libc::c_void) -> libc::c_int {
    loop {
        unsafe { libc::pause() };
    }
}

/// vmshare N: N processes sharing D's mm (CLONE_VM, not threads): each write of one's
/// oom_score_adj walks every process of the host (MMF_MULTIPROCESS), and each was born before
/// D's raise, so each gets its own write.
fn vmshare(n: usize) {
    let stack = 64 << 10;
    for _ in 0..n {
        let st = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                stack,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(st != libc::MAP_FAILED);
        let top = unsafe { (st as *mut u8).add(stack) }.cast();
        let r = unsafe { libc::clone(vm_child, top, libc::CLONE_VM | libc::SIGCHLD, std::ptr::null_mut()) };
        assert!(r > 0, "clone");
    }
    ready();
    std::thread::sleep(Duration::from_secs(120));
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a[1] != "vmshare" {
        cap_nproc(400);
    }
    let n = |i: usize, d: usize| a.get(i).map_or(d, |s| s.parse().unwrap());
    let out = a[2].clone();
    match a[1].as_str() {
        "clone-parent" => racers(&out, false, n(3, 150)),
        "subreaper" => racers(&out, true, n(3, 150)),
        "bigfork" => bigfork(&out, a[3].parse().unwrap()),
        "vmshare" => vmshare(n(3, 2000)),
        m => panic!("mode {m}"),
    }
}

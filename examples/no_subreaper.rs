//! `no_subreaper CMD [ARGS]`: runs CMD where `prctl(PR_SET_CHILD_SUBREAPER)` fails with EINVAL,
//! as it does under qemu-user, so the tests of the init's fallback (tests/subreaper.rs) run on the
//! machine's own architecture. A seccomp filter answers that one call; every other call, and every
//! other prctl, goes to the kernel. The filter is inherited by everything CMD starts. Never shipped.

use std::ffi::CString;

const PR_SET_CHILD_SUBREAPER: u32 = 36;
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt: 0, jf: 0, k }
}

fn jeq(k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16, jt, jf, k }
}

fn fail(what: &str) -> ! {
    eprintln!("no_subreaper: {what}: {}", std::io::Error::last_os_error());
    std::process::exit(125);
}

fn main() {
    let args: Vec<CString> = std::env::args()
        .skip(1)
        .map(|a| CString::new(a).unwrap_or_else(|_| fail("an argument holds a NUL byte")))
        .collect();
    if args.is_empty() {
        eprintln!("usage: no_subreaper CMD [ARGS]");
        std::process::exit(2);
    }
    let ld = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    let ret = (libc::BPF_RET | libc::BPF_K) as u16;
    // struct seccomp_data: nr at 0, arch at 4, args[0] at 16 (its low half on little-endian).
    let prog = [
        stmt(ld, 4),
        jeq(AUDIT_ARCH, 0, 5),
        stmt(ld, 0),
        jeq(libc::SYS_prctl as u32, 0, 3),
        stmt(ld, 16),
        jeq(PR_SET_CHILD_SUBREAPER, 0, 1),
        stmt(ret, libc::SECCOMP_RET_ERRNO | libc::EINVAL as u32),
        stmt(ret, libc::SECCOMP_RET_ALLOW),
    ];
    let fprog = libc::sock_fprog { len: prog.len() as u16, filter: prog.as_ptr() as *mut _ };
    // SAFETY: a valid filter program that outlives the call; root needs no no_new_privs for it.
    if unsafe { libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &fprog as *const _) } != 0 {
        fail("cannot install the seccomp filter");
    }
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    // SAFETY: NUL-terminated strings and a NULL-terminated vector, alive across the call.
    unsafe { libc::execvp(argv[0], argv.as_ptr()) };
    fail(&format!("cannot run {:?}", args[0]));
}

//! A seccomp filter for what Landlock leaves open in the TCP port space: an MPTCP socket binds a
//! TCP port (its first subflow is a TCP socket), and Landlock's port rules look at TCP sockets
//! only (protocol IPPROTO_TCP), so a domain that may bind no port but its own could still take
//! any with socket(AF_INET, SOCK_STREAM, IPPROTO_MPTCP), and with an SMC socket where the kernel
//! has them (its own TCP socket takes the port). The filter refuses such sockets, and
//! io_uring (whose socket operation no syscall filter sees), and every syscall of another ABI
//! (32-bit `socketcall`, x32).
//! May use: libc and std only.

use std::io;

/// The process's own syscall ABI, as seccomp names it.
#[cfg(target_arch = "x86_64")]
const ARCH: u32 = 0xC000_003E; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const ARCH: u32 = 0xC000_00B7; // AUDIT_ARCH_AARCH64

/// x32 syscalls carry this bit in their number on x86_64.
const X32_BIT: u32 = 0x4000_0000;

// Offsets in struct seccomp_data: nr, arch, then the arguments (the protocol is the third, its
// low 32 bits first on these little-endian machines).
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
const OFF_ARG0_LOW: u32 = 16;
const OFF_ARG2_LOW: u32 = 16 + 2 * 8;
/// SMC sockets run a TCP socket of their own, bound to their port: AF_SMC, and AF_INET with
/// IPPROTO_SMC (Linux 6.11).
const AF_SMC: u32 = 43;
const IPPROTO_SMC: u32 = 256;

/// What the filter refuses, for the record.
pub const REFUSED: &[&str] = &[
    "socket(IPPROTO_MPTCP)",
    "socket(AF_SMC)",
    "socket(IPPROTO_SMC)",
    "io_uring_setup",
    "another syscall ABI",
];

/// The filter, made before the fork so that the child only installs it.
pub struct Filter(Vec<libc::sock_filter>);

fn stmt(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter { code: code as u16, jt: 0, jf: 0, k }
}

fn jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code: code as u16, jt, jf, k }
}

impl Filter {
    pub fn services() -> Filter {
        use libc::{BPF_ABS, BPF_JEQ, BPF_JGE, BPF_JMP, BPF_K, BPF_LD, BPF_RET, BPF_W};
        let allow = libc::SECCOMP_RET_ALLOW;
        let refuse = |errno: i32| libc::SECCOMP_RET_ERRNO | (errno as u32 & libc::SECCOMP_RET_DATA);
        let ld = BPF_LD | BPF_W | BPF_ABS;
        let jeq = BPF_JMP | BPF_JEQ | BPF_K;
        Filter(vec![
            /* 0 */ stmt(ld, OFF_ARCH),
            /* 1 */ jump(jeq, ARCH, 1, 0),
            /* 2 */ stmt(BPF_RET | BPF_K, refuse(libc::ENOSYS)),
            /* 3 */ stmt(ld, OFF_NR),
            /* 4 */ jump(BPF_JMP | BPF_JGE | BPF_K, X32_BIT, 0, 1),
            /* 5 */ stmt(BPF_RET | BPF_K, refuse(libc::ENOSYS)),
            /* 6 */ jump(jeq, libc::SYS_io_uring_setup as u32, 0, 1),
            /* 7 */ stmt(BPF_RET | BPF_K, refuse(libc::ENOSYS)),
            /* 8 */ jump(jeq, libc::SYS_socket as u32, 0, 5),
            /* 9 */ stmt(ld, OFF_ARG0_LOW),
            /* 10 */ jump(jeq, AF_SMC, 5, 0),
            /* 11 */ stmt(ld, OFF_ARG2_LOW),
            /* 12 */ jump(jeq, libc::IPPROTO_MPTCP as u32, 2, 0),
            /* 13 */ jump(jeq, IPPROTO_SMC, 1, 0),
            /* 14 */ stmt(BPF_RET | BPF_K, allow),
            /* 15 */ stmt(BPF_RET | BPF_K, refuse(libc::EPROTONOSUPPORT)),
            /* 16 */ stmt(BPF_RET | BPF_K, refuse(libc::EAFNOSUPPORT)),
        ])
    }

    /// The program, pointing into this filter: valid while it lives.
    pub fn prog(&self) -> libc::sock_fprog {
        libc::sock_fprog { len: self.0.len() as u16, filter: self.0.as_ptr() as *mut libc::sock_filter }
    }
}

/// Install `prog` on this thread (no_new_privs set before). Async-signal-safe, for a forked
/// child: 0, or the errno.
pub fn install(prog: &libc::sock_fprog) -> i32 {
    // SAFETY: a program whose filter the caller keeps alive; the kernel copies it.
    let r = unsafe {
        libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER as libc::c_ulong, prog as *const _)
    };
    if r == 0 {
        0
    } else {
        crate::kernel::errno::errno_now()
    }
}

/// Whether this kernel takes a seccomp filter at all (CONFIG_SECCOMP_FILTER): asked without
/// installing one (a NULL program is EFAULT where filters exist, EINVAL where they do not).
pub fn available() -> io::Result<()> {
    // SAFETY: a NULL program is only looked at by the kernel, which refuses it.
    let r = unsafe {
        libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER as libc::c_ulong, std::ptr::null::<u8>())
    };
    let e = io::Error::last_os_error();
    match (r, e.raw_os_error()) {
        (_, Some(libc::EFAULT)) => Ok(()),
        _ => Err(e),
    }
}

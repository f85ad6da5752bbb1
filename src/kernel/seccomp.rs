//! A seccomp filter for what Landlock leaves open in the TCP port space. Landlock's port rules
//! look at TCP sockets only (protocol IPPROTO_TCP), and other sockets reach the same port space:
//! an MPTCP socket binds the TCP port of its first subflow, an SMC socket runs a TCP socket of its
//! own, and protocols yet unknown may do the same. So the filter allows, not refuses: an AF_INET
//! or AF_INET6 socket only as plain TCP or UDP (SOCK_STREAM with protocol 0 or IPPROTO_TCP,
//! SOCK_DGRAM with 0 or IPPROTO_UDP; anything else EPROTONOSUPPORT), other families only Unix and
//! netlink (anything else EAFNOSUPPORT, AF_SMC among them); io_uring not at all (its socket
//! operation makes a socket no syscall filter sees), and no syscall of another ABI (32-bit
//! `socketcall`, x32): ENOSYS.
//! May use: libc and std only.

use std::io;

/// The process's own syscall ABI, as seccomp names it.
#[cfg(target_arch = "x86_64")]
const ARCH: u32 = 0xC000_003E; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const ARCH: u32 = 0xC000_00B7; // AUDIT_ARCH_AARCH64

/// x32 syscalls carry this bit in their number on x86_64.
const X32_BIT: u32 = 0x4000_0000;

// Offsets in struct seccomp_data: nr, arch, then the arguments (family, type, protocol), each
// an int read from its low 32 bits on these little-endian machines.
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
const OFF_ARG0_LOW: u32 = 16;
const OFF_ARG1_LOW: u32 = 16 + 8;
const OFF_ARG2_LOW: u32 = 16 + 2 * 8;
/// The socket type without SOCK_NONBLOCK and SOCK_CLOEXEC.
const SOCK_TYPE_MASK: u32 = 0xf;

/// What the filter refuses, for the record.
pub const REFUSED: &[&str] = &[
    "socket(AF_INET/AF_INET6) but TCP (SOCK_STREAM, 0 or IPPROTO_TCP) or UDP (SOCK_DGRAM, 0 or IPPROTO_UDP)",
    "socket(a family but AF_UNIX, AF_INET, AF_INET6, AF_NETLINK)",
    "io_uring_setup, io_uring_enter, io_uring_register",
    "another syscall ABI",
];

/// The filter, made before the fork so that the child only installs it.
pub struct Filter(Vec<libc::sock_filter>);

/// Where a jump goes: the next instruction, a label of the program, or one of its answers.
#[derive(Clone, Copy)]
enum To {
    Next,
    Label(u8),
    Allow,
    NoSys,
    NoProto,
    NoFamily,
}

/// One instruction before its jumps are resolved.
enum Ins {
    Load(u32),
    And(u32),
    Jeq(u32, To, To),
    Jge(u32, To, To),
    Here(u8),
}

/// The instructions as the kernel runs them, each jump made relative, the answers last.
fn assemble(prog: &[Ins]) -> Vec<libc::sock_filter> {
    use libc::{BPF_ABS, BPF_ALU, BPF_AND, BPF_JEQ, BPF_JGE, BPF_JMP, BPF_K, BPF_LD, BPF_RET, BPF_W};
    let refuse = |errno: i32| libc::SECCOMP_RET_ERRNO | (errno as u32 & libc::SECCOMP_RET_DATA);
    let mut at: Vec<(u8, usize)> = Vec::new();
    let mut n = 0;
    for i in prog {
        match i {
            Ins::Here(l) => at.push((*l, n)),
            _ => n += 1,
        }
    }
    // The answers, after the body: allow, ENOSYS, EPROTONOSUPPORT, EAFNOSUPPORT.
    let answers = [
        libc::SECCOMP_RET_ALLOW,
        refuse(libc::ENOSYS),
        refuse(libc::EPROTONOSUPPORT),
        refuse(libc::EAFNOSUPPORT),
    ];
    let index = |to: To, here: usize| -> usize {
        match to {
            To::Next => here + 1,
            To::Label(l) => at.iter().find(|(m, _)| *m == l).map_or(n, |&(_, i)| i),
            To::Allow => n,
            To::NoSys => n + 1,
            To::NoProto => n + 2,
            To::NoFamily => n + 3,
        }
    };
    let mut out = Vec::new();
    for i in prog {
        let here = out.len();
        let rel = |to: To| (index(to, here) - here - 1) as u8;
        let f = |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter { code: code as u16, jt, jf, k };
        out.push(match *i {
            Ins::Here(_) => continue,
            Ins::Load(off) => f(BPF_LD | BPF_W | BPF_ABS, off, 0, 0),
            Ins::And(k) => f(BPF_ALU | BPF_AND | BPF_K, k, 0, 0),
            Ins::Jeq(k, t, e) => f(BPF_JMP | BPF_JEQ | BPF_K, k, rel(t), rel(e)),
            Ins::Jge(k, t, e) => f(BPF_JMP | BPF_JGE | BPF_K, k, rel(t), rel(e)),
        });
    }
    out.extend(answers.iter().map(|&k| libc::sock_filter {
        code: (BPF_RET | BPF_K) as u16,
        jt: 0,
        jf: 0,
        k,
    }));
    out
}

impl Filter {
    pub fn services() -> Filter {
        use To::*;
        const SOCKET: u8 = 0;
        const INET: u8 = 1;
        const DGRAM: u8 = 2;
        let (stream, dgram) = (libc::SOCK_STREAM as u32, libc::SOCK_DGRAM as u32);
        Filter(assemble(&[
            Ins::Load(OFF_ARCH),
            Ins::Jeq(ARCH, Next, NoSys),
            Ins::Load(OFF_NR),
            Ins::Jge(X32_BIT, NoSys, Next),
            Ins::Jeq(libc::SYS_io_uring_setup as u32, NoSys, Next),
            Ins::Jeq(libc::SYS_io_uring_enter as u32, NoSys, Next),
            Ins::Jeq(libc::SYS_io_uring_register as u32, NoSys, Next),
            Ins::Jeq(libc::SYS_socket as u32, Label(SOCKET), Next),
            Ins::Jeq(libc::SYS_socketpair as u32, Label(SOCKET), Allow),
            Ins::Here(SOCKET),
            Ins::Load(OFF_ARG0_LOW),
            Ins::Jeq(libc::AF_INET as u32, Label(INET), Next),
            Ins::Jeq(libc::AF_INET6 as u32, Label(INET), Next),
            Ins::Jeq(libc::AF_UNIX as u32, Allow, Next),
            Ins::Jeq(libc::AF_NETLINK as u32, Allow, NoFamily),
            Ins::Here(INET),
            // Protocol 0 is the type's first protocol: TCP for a stream, UDP for a datagram, but
            // SCTP for a SOCK_SEQPACKET, so the type is looked at as well.
            Ins::Load(OFF_ARG1_LOW),
            Ins::And(SOCK_TYPE_MASK),
            Ins::Jeq(dgram, Label(DGRAM), Next),
            Ins::Jeq(stream, Next, NoProto),
            Ins::Load(OFF_ARG2_LOW),
            Ins::Jeq(0, Allow, Next),
            Ins::Jeq(libc::IPPROTO_TCP as u32, Allow, NoProto),
            Ins::Here(DGRAM),
            Ins::Load(OFF_ARG2_LOW),
            Ins::Jeq(0, Allow, Next),
            Ins::Jeq(libc::IPPROTO_UDP as u32, Allow, NoProto),
        ]))
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

#[cfg(test)]
mod tests {
    use super::Filter;

    /// What socket(family, type, protocol) answers in a child under the filter: 0, or the errno.
    fn under_filter(family: i32, ty: i32, protocol: i32) -> i32 {
        let f = Filter::services();
        let prog = f.prog();
        // SAFETY: the child makes raw syscalls only and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: plain syscalls in the forked child.
            unsafe {
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || super::install(&prog) != 0 {
                    libc::_exit(255);
                }
                let fd = libc::socket(family, ty, protocol);
                libc::_exit(if fd >= 0 { 0 } else { crate::kernel::errno::errno_now() });
            }
        }
        let mut status = 0;
        // SAFETY: our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "the child died: {status:#x}");
        libc::WEXITSTATUS(status)
    }

    /// The filter is an allow-list: plain TCP and UDP pass, with any flags; every other
    /// protocol of the inet families is refused, those this kernel has (UDP-Lite, MPTCP) as well
    /// as those it may not (SCTP, SMC), and so is a family not named.
    #[test]
    fn only_plain_tcp_and_udp_pass() {
        use libc::*;
        let flags = SOCK_NONBLOCK | SOCK_CLOEXEC;
        for (fam, ty, proto) in [
            (AF_INET, SOCK_STREAM, 0),
            (AF_INET6, SOCK_STREAM | flags, IPPROTO_TCP),
            (AF_INET, SOCK_DGRAM, IPPROTO_UDP),
            (AF_INET6, SOCK_DGRAM | flags, 0),
            (AF_UNIX, SOCK_STREAM, 0),
            (AF_NETLINK, SOCK_RAW, 0),
        ] {
            assert_eq!(under_filter(fam, ty, proto), 0, "refused: {fam} {ty} {proto}");
        }
        for (fam, ty, proto) in [
            (AF_INET, SOCK_STREAM, IPPROTO_MPTCP),
            (AF_INET6, SOCK_STREAM | flags, IPPROTO_MPTCP),
            (AF_INET, SOCK_DGRAM, IPPROTO_UDPLITE),
            (AF_INET6, SOCK_DGRAM, IPPROTO_UDPLITE),
            (AF_INET, SOCK_STREAM, IPPROTO_SCTP),
            (AF_INET, SOCK_SEQPACKET, 0),
            (AF_INET, SOCK_STREAM, 256), // IPPROTO_SMC
            (AF_INET, SOCK_STREAM, IPPROTO_UDP),
            (AF_INET, SOCK_DGRAM, IPPROTO_TCP),
            (AF_INET, SOCK_RAW, 0),
            (AF_INET, SOCK_DGRAM, IPPROTO_ICMP),
        ] {
            assert_eq!(under_filter(fam, ty, proto), EPROTONOSUPPORT, "{fam} {ty} {proto}");
        }
        for fam in [43 /* AF_SMC */, AF_PACKET, AF_VSOCK, AF_TIPC, AF_RDS, 41 /* AF_KCM */] {
            assert_eq!(under_filter(fam, SOCK_STREAM, 0), EAFNOSUPPORT, "family {fam}");
        }
    }
}

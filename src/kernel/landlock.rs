//! Landlock: the kernel's own sandbox for an unprivileged process, made of three calls. A ruleset
//! names what it handles (filesystem rights, TCP ports, scopes) and what it allows; a process
//! that restricts itself with it (after no_new_privs) and everything it starts stay in that
//! domain for good: nothing inside can lift it, and the kernel checks it on every call.
//! May use: libc, std and kernel::errno.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::kernel::errno::check;

/// The filesystem rights that change something: writing a file, truncating it, making,
/// removing or re-parenting an entry. Reading, listing and executing are not among them.
pub const FS_WRITE: u64 = (1 << 1) // WRITE_FILE
    | (1 << 4) // REMOVE_DIR
    | (1 << 5) // REMOVE_FILE
    | (1 << 6) // MAKE_CHAR
    | (1 << 7) // MAKE_DIR
    | (1 << 8) // MAKE_REG
    | (1 << 9) // MAKE_SOCK
    | (1 << 10) // MAKE_FIFO
    | (1 << 11) // MAKE_BLOCK
    | (1 << 12) // MAKE_SYM
    | (1 << 13) // REFER (ABI 2)
    | (1 << 14); // TRUNCATE (ABI 3)
/// Of those, the ones a rule on a file (not a directory) may allow.
pub const FS_WRITE_FILE: u64 = (1 << 1) | (1 << 14);
/// bind(2) and connect(2) of TCP sockets, by port (ABI 4).
pub const NET_BIND_TCP: u64 = 1 << 0;
pub const NET_CONNECT_TCP: u64 = 1 << 1;
/// Scopes (ABI 6): no connect to an abstract Unix socket, and no signal, to a process outside
/// the domain.
pub const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
pub const SCOPE_SIGNAL: u64 = 1 << 1;

const CREATE_RULESET_VERSION: u32 = 1 << 0;
const RULE_PATH_BENEATH: libc::c_long = 1;
const RULE_NET_PORT: libc::c_long = 2;

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

#[repr(C)]
struct NetPortAttr {
    allowed_access: u64,
    port: u64,
}

/// The Landlock ABI this kernel offers. ENOSYS: no Landlock in the kernel (or a seccomp filter
/// that answers so); EOPNOTSUPP: built in but not enabled at boot; EPERM: a seccomp filter.
pub fn abi() -> io::Result<u32> {
    // SAFETY: the version query takes no attribute and returns a number, not a descriptor.
    let v = check(unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    })?;
    Ok(v as u32)
}

/// A ruleset being made, not yet enforced on anyone.
pub struct Ruleset(OwnedFd);

impl Ruleset {
    /// One handling these filesystem rights, these TCP rights and these scopes: everything
    /// handled is denied unless a rule allows it.
    pub fn new(fs: u64, net: u64, scoped: u64) -> io::Result<Ruleset> {
        let attr = RulesetAttr { handled_access_fs: fs, handled_access_net: net, scoped };
        // SAFETY: a valid attribute of its declared size; the kernel returns a new descriptor
        // (close-on-exec) that we own.
        let fd = check(unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                &attr as *const RulesetAttr,
                std::mem::size_of::<RulesetAttr>(),
                0u32,
            )
        })?;
        // SAFETY: the kernel just gave us this descriptor.
        Ok(Ruleset(unsafe { OwnedFd::from_raw_fd(fd as RawFd) }))
    }

    /// Allow `access` (NET_BIND_TCP, NET_CONNECT_TCP) on TCP port `port`.
    pub fn allow_port(&self, access: u64, port: u16) -> io::Result<()> {
        let attr = NetPortAttr { allowed_access: access, port: u64::from(port) };
        // SAFETY: a valid attribute for this rule type, on our ruleset descriptor.
        check(unsafe {
            libc::syscall(
                libc::SYS_landlock_add_rule,
                self.0.as_raw_fd(),
                RULE_NET_PORT,
                &attr as *const NetPortAttr,
                0u32,
            )
        })?;
        Ok(())
    }

    /// Allow `access` beneath the file or directory `at` (an O_PATH descriptor of it).
    pub fn allow_beneath(&self, access: u64, at: &OwnedFd) -> io::Result<()> {
        let attr = PathBeneathAttr { allowed_access: access, parent_fd: at.as_raw_fd() };
        // SAFETY: a valid attribute for this rule type, on our ruleset descriptor; `at` is open.
        check(unsafe {
            libc::syscall(
                libc::SYS_landlock_add_rule,
                self.0.as_raw_fd(),
                RULE_PATH_BENEATH,
                &attr as *const PathBeneathAttr,
                0u32,
            )
        })?;
        Ok(())
    }

    /// The descriptor a child enforces with `restrict_self` before its exec.
    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Enforce the ruleset `fd` on this thread and all it will start (no_new_privs set before).
/// Async-signal-safe, for a forked child: 0, or the errno.
pub fn restrict_self(fd: RawFd) -> i32 {
    // SAFETY: a plain syscall on a descriptor number; it reads no memory of ours.
    let r = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32) };
    if r == 0 {
        0
    } else {
        crate::kernel::errno::errno_now()
    }
}

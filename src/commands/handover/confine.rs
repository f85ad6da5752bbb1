//! The Landlock domain each handed-over service is started in (`commands::handover`), and what
//! it is recorded as. The kernel holds it for the service's whole life and everything it
//! starts, so nothing needs to be sampled while the tests run:
//! - TCP `bind` only to the service's own ports (recorded or declared; a port is the first
//!   service's that names it): a port of the tests', or of another service (a declared one), can
//!   be neither taken before its owner nor listened on for an instant;
//! - TCP `connect` only to the services' ports (every service's): a service may reach another, never a
//!   server of the tests' (their reference, a database they fill) nor the outside over TCP;
//! - no signal, and no connect to an abstract Unix socket, outside the service's own domain (the
//!   tests, verify, the killer, another service);
//! - writes (making, removing, renaming, truncating, writing a file) only beneath the temporary
//!   directories and to the harmless devices: a world-writable file elsewhere (a reward the
//!   harness left writable) is not the services' to change.
//!
//! - a seccomp filter after it (`kernel::seccomp`), an allow-list: an inet socket only as plain
//!   TCP or UDP (an MPTCP or SMC socket binds a TCP port, and Landlock's port rules look at TCP
//!   sockets only), other families only Unix and netlink, no io_uring, no syscall of another ABI.
//!
//! Where the kernel lacks any of it the hand-over is refused, never run with less.

use crate::kernel::landlock::{self, Ruleset};
use crate::kernel::seccomp::{self, Filter};
use serde::Serialize;
use std::os::fd::OwnedFd;

/// The ABI the domain needs: 4 for the TCP rules, 6 for the scopes.
pub const NEEDED_ABI: u32 = 6;
/// Where a service may write: what services write as any user may (their temporary files), and
/// which the tests must not read from anyway (any user may plant there).
pub const WRITE_DIRS: &[&str] = &["/tmp", "/var/tmp", "/dev/shm"];
/// Devices a service may open for writing (a daemon's output sent nowhere).
const WRITE_FILES: &[&str] = &["/dev/null", "/dev/zero", "/dev/full"];

/// What confined the services, for `handover.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Domain {
    /// The Landlock ABI of this kernel.
    pub abi: u32,
    /// The TCP ports each service may bind, one list per service in the order of `services`:
    /// its own, no other service's.
    pub bind_tcp: Vec<Vec<u16>>,
    /// The TCP ports every service may connect to: all the services' ports, no other.
    pub connect_tcp: Vec<u16>,
    /// Signals and abstract Unix sockets stay inside each service's own domain.
    pub scopes: Vec<&'static str>,
    /// The only places a service may write (beneath each directory; each device).
    pub fs_write: Vec<String>,
    /// One domain per service: a service cannot signal, or reach the abstract sockets of, another.
    pub per_service: bool,
    /// What the services' seccomp filter refuses: what Landlock leaves open in the TCP port
    /// space (an MPTCP socket binds a TCP port unchecked), and the ways around a syscall filter.
    pub seccomp_refuses: Vec<&'static str>,
}

/// The rulesets the services restrict themselves with before their exec, one per service: each
/// may bind its own `owned` ports only, and connect to every service's; Err: the line that names
/// what this kernel lacks, or what failed.
pub fn make(owned: &[Vec<u16>]) -> Result<(Vec<Ruleset>, Filter, Domain), String> {
    let abi = landlock::abi().map_err(|e| missing(&e))?;
    if abi < NEEDED_ABI {
        return Err(format!(
            "the kernel's Landlock ABI is {abi}, and the services' domain needs {NEEDED_ABI} (Linux 6.12: \
             TCP ports from 4, signal and abstract-socket scopes from 6): hand over on a newer kernel"
        ));
    }
    let mut all: Vec<u16> = owned.iter().flatten().copied().collect();
    all.sort_unstable();
    all.dedup();
    let mut rulesets = Vec::new();
    let mut fs_write = Vec::new();
    for own in owned {
        let (rs, written) = ruleset(own, &all)?;
        rulesets.push(rs);
        fs_write = written;
    }
    seccomp::available().map_err(|e| {
        format!(
            "the kernel takes no seccomp filter ({e}), and the services' filter keeps them from \
             MPTCP sockets, which Landlock's port rules do not cover: hand over on a kernel built with \
             CONFIG_SECCOMP_FILTER"
        )
    })?;
    let domain = Domain {
        abi,
        bind_tcp: owned.to_vec(),
        connect_tcp: all,
        scopes: vec!["signal", "abstract_unix_socket"],
        fs_write,
        per_service: true,
        seccomp_refuses: seccomp::REFUSED.to_vec(),
    };
    Ok((rulesets, Filter::services(), domain))
}

/// One service's ruleset: bind on `own`, connect on `all`, the scopes, the writable places (and
/// which of them exist here).
fn ruleset(own: &[u16], all: &[u16]) -> Result<(Ruleset, Vec<String>), String> {
    let fail =
        |what: &str, e: std::io::Error| format!("cannot make the services' Landlock domain: {what}: {e}");
    let rs = Ruleset::new(
        landlock::FS_WRITE,
        landlock::NET_BIND_TCP | landlock::NET_CONNECT_TCP,
        landlock::SCOPE_SIGNAL | landlock::SCOPE_ABSTRACT_UNIX_SOCKET,
    )
    .map_err(|e| fail("landlock_create_ruleset", e))?;
    for &p in all {
        let access = match own.contains(&p) {
            true => landlock::NET_BIND_TCP | landlock::NET_CONNECT_TCP,
            false => landlock::NET_CONNECT_TCP,
        };
        rs.allow_port(access, p).map_err(|e| fail(&format!("port {p}"), e))?;
    }
    let mut fs_write = Vec::new();
    for (paths, access, dir) in
        [(WRITE_DIRS, landlock::FS_WRITE, true), (WRITE_FILES, landlock::FS_WRITE_FILE, false)]
    {
        for &p in paths {
            let Some(fd) = opened(p, dir)? else { continue };
            rs.allow_beneath(access, &fd).map_err(|e| fail(p, e))?;
            fs_write.push(p.to_string());
        }
    }
    Ok((rs, fs_write))
}

/// The line for a kernel that cannot make a domain at all.
fn missing(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ENOSYS) => "the kernel has no Landlock (landlock_create_ruleset: ENOSYS), which confines the \
                               handed-over services: hand over on Linux 6.12 or later built with it"
            .into(),
        Some(libc::EOPNOTSUPP) => "Landlock is built into this kernel but not enabled, and it confines the \
                                   handed-over services: add landlock to the kernel's lsm= boot parameter"
            .into(),
        Some(libc::EPERM) => "landlock_create_ruleset is refused (EPERM: a seccomp profile?), and it confines \
                              the handed-over services: allow the landlock syscalls in the container's seccomp \
                              profile"
            .into(),
        _ => format!("cannot ask the kernel for Landlock, which confines the handed-over services: {e}"),
    }
}

/// `p` opened as a place to allow writes beneath (O_PATH), when it exists and is what it should
/// be (a directory, or not one); None when it is absent or something else.
fn opened(p: &str, dir: bool) -> Result<Option<OwnedFd>, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_PATH).open(p) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot open {p} for the services' Landlock domain: {e}")),
    };
    let m = f.metadata().map_err(|e| format!("{p}: {e}"))?;
    Ok((m.is_dir() == dir).then(|| OwnedFd::from(f)))
}

//! The TCP sockets that listen in this network namespace, as /proc/net/tcp and tcp6 show them:
//! the freeze records which killed process held one (a service the tests may need back), and
//! `verify --hand-over` waits until the restarted service holds one again. The sandbox shapes
//! how many sockets there are, so each table is read to a bound, and a table cut there says so.

use crate::record::evidence::Endpoint;
use std::io::{self, Read};

/// Bytes read of each table: about 50,000 sockets.
pub const TABLE_READ: u64 = 8 << 20;

/// One listening socket: where, whose (the UID that made it) and its inode (what a process's
/// descriptor links to, `socket:[inode]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listening {
    pub at: Endpoint,
    pub uid: u32,
    pub inode: u64,
}

/// Every listening TCP socket of this network namespace; the bool is true when an answer was
/// cut at its bound (some may be missing). Asked of the kernel's socket diagnostics (its
/// listening hash alone); where that is refused (a seccomp profile), read from /proc/net/tcp
/// and tcp6.
pub fn listening() -> io::Result<(Vec<Listening>, bool)> {
    match from_diag() {
        Ok(l) => Ok(l),
        Err(e) => {
            log::debug!("sock_diag: {e}; reading /proc/net/tcp instead");
            from_tables()
        }
    }
}

fn from_diag() -> io::Result<(Vec<Listening>, bool)> {
    use crate::kernel::sockdiag::listening_tcp;
    let mut out = Vec::new();
    let mut cut = false;
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        let (found, c) = match listening_tcp(family, TABLE_READ as usize) {
            Ok(r) => r,
            // No IPv6 in this kernel: nothing listens there.
            Err(e) if family == libc::AF_INET6 as u8 && e.raw_os_error() == Some(libc::ENOENT) => {
                (vec![], false)
            }
            Err(e) => return Err(e),
        };
        cut |= c;
        out.extend(found.into_iter().map(|l| Listening {
            at: Endpoint { addr: addr_text(l.family, &l.addr), port: l.port },
            uid: l.uid,
            inode: l.inode,
        }));
    }
    Ok((out, cut))
}

/// An address in network order as the /proc tables' reader writes it.
fn addr_text(family: u8, a: &[u8; 16]) -> String {
    if family == libc::AF_INET as u8 {
        format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3])
    } else {
        let groups: Vec<String> =
            a.chunks(2).map(|g| format!("{:x}", u16::from_be_bytes([g[0], g[1]]))).collect();
        groups.join(":")
    }
}

fn from_tables() -> io::Result<(Vec<Listening>, bool)> {
    let mut out = Vec::new();
    let mut cut = false;
    for (path, v6) in [("/proc/net/tcp", false), ("/proc/net/tcp6", true)] {
        let mut text = Vec::new();
        match std::fs::File::open(path) {
            Ok(f) => {
                f.take(TABLE_READ + 1).read_to_end(&mut text)?;
            }
            // No IPv6 in this kernel: no table to read.
            Err(e) if v6 && e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io::Error::new(e.kind(), format!("{path}: {e}"))),
        }
        if text.len() as u64 > TABLE_READ {
            cut = true;
            text.truncate(TABLE_READ as usize);
        }
        out.extend(parse(&text, v6));
    }
    Ok((out, cut))
}

/// The inodes of the sockets among the first `limit` descriptors of process `pid`, as its
/// /proc/PID/fd links name them (`socket:[inode]`). Err when the kernel refuses to show a link
/// (root without CAP_SYS_PTRACE reading another user's process): the caller asks again with the
/// process's own filesystem IDs, where it may.
pub fn socket_inodes(pid: i32, limit: usize) -> io::Result<Vec<u64>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))?.take(limit) {
        let link = match std::fs::read_link(entry?.path()) {
            Ok(l) => l,
            Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM)) => return Err(e),
            // Closed since the listing.
            Err(_) => continue,
        };
        found.extend(
            link.to_str().and_then(|l| l.strip_prefix("socket:[")?.strip_suffix(']')?.parse::<u64>().ok()),
        );
    }
    Ok(found)
}

/// The audit session of process `pid` (/proc/PID/sessionid): the kernel gives a new one to each
/// write of an unset loginuid, and only CAP_AUDIT_CONTROL changes it after, so it tells apart
/// services started each with a loginuid write of its own, whatever they fork or setsid. None:
/// unreadable, or no session (the kernel's "unset").
pub fn audit_session(pid: i32) -> Option<u32> {
    let t = std::fs::read_to_string(format!("/proc/{pid}/sessionid")).ok()?;
    t.trim().parse::<u32>().ok().filter(|&s| s != u32::MAX)
}

/// The listening sockets of one table's text; a line that does not parse is skipped (the
/// kernel writes these lines; a cut last line is expected).
pub fn parse(text: &[u8], v6: bool) -> Vec<Listening> {
    text.split(|&b| b == b'\n').skip(1).filter_map(|l| line(l, v6)).collect()
}

/// `sl local rem st tx:rx tr:when retr uid timeout inode ...`; LISTEN is state 0A.
fn line(l: &[u8], v6: bool) -> Option<Listening> {
    let l = std::str::from_utf8(l).ok()?;
    let f: Vec<&str> = l.split_ascii_whitespace().take(10).collect();
    if f.len() < 10 || f[3] != "0A" {
        return None;
    }
    let (addr, port) = f[1].split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let addr = if v6 { v6_text(addr)? } else { v4_text(addr)? };
    Some(Listening { at: Endpoint { addr, port }, uid: f[7].parse().ok()?, inode: f[9].parse().ok()? })
}

/// The kernel prints each 32-bit word of the address in host order (x86: little-endian).
fn word(hex: &str) -> Option<[u8; 4]> {
    if hex.len() != 8 {
        return None;
    }
    Some(u32::from_str_radix(hex, 16).ok()?.to_ne_bytes())
}

/// Dotted quad.
fn v4_text(hex: &str) -> Option<String> {
    let mut b = [0u8; 16];
    b[..4].copy_from_slice(&word(hex)?);
    Some(addr_text(libc::AF_INET as u8, &b))
}

/// Eight groups of hex, uncompressed ("0:0:0:0:0:0:0:1"): plain to read and to compare, and
/// without the standard library's shortening code in the binary.
fn v6_text(hex: &str) -> Option<String> {
    if hex.len() != 32 || !hex.is_ascii() {
        return None;
    }
    let mut b = [0u8; 16];
    for i in 0..4 {
        b[i * 4..i * 4 + 4].copy_from_slice(&word(&hex[i * 8..i * 8 + 8])?);
    }
    let groups: Vec<String> =
        b.chunks(2).map(|g| format!("{:x}", u16::from_be_bytes([g[0], g[1]]))).collect();
    Some(groups.join(":"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &[u8] = b"  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  4242        0 123456 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F90 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000  4242        0 123457 1 0000000000000000 100 0 0 10 0
   2: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 99 1
   3: 00000000:00";

    #[test]
    fn listening_lines_only() {
        let got = parse(TCP, false);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].at.port, 8080);
        assert_eq!(got[0].at.addr, "127.0.0.1");
        assert_eq!((got[0].uid, got[0].inode), (4242, 123456));
        assert_eq!(got[1].at.addr, "0.0.0.0");
        assert_eq!(got[1].at.port, 22);
    }

    #[test]
    fn ipv6_words() {
        let t = b"h\n 0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 0:0 0:0 0 65532 0 7 1\n";
        let got = parse(t, true);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].at.addr, "0:0:0:0:0:0:0:1");
        assert_eq!(got[0].uid, 65532);
    }

    #[test]
    fn garbage_is_skipped() {
        assert!(parse(b"\n\xff\xfe 0A\n1 2 3 0A 5 6 7 8 9 10\n", false).is_empty());
    }
}

#[cfg(test)]
mod diag_tests {
    use super::*;

    /// Both ways of asking name the same listeners (a socket of this test's own among them).
    #[test]
    fn the_kernel_and_the_tables_agree() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let key = |v: (Vec<Listening>, bool)| {
            let mut k: Vec<(String, u16, u32, u64)> =
                v.0.into_iter().map(|l| (l.at.addr, l.at.port, l.uid, l.inode)).collect();
            k.sort();
            k
        };
        let diag = key(from_diag().expect("sock_diag"));
        let tables = key(from_tables().expect("/proc/net/tcp"));
        assert_eq!(diag, tables);
        assert!(diag.iter().any(|k| k.0 == "127.0.0.1" && k.1 == port), "{diag:?}");
    }
}

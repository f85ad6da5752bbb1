//! The reads the walk's evidence makes of one stopped process (`freeze::evidence`, on its reader
//! threads): its exe link, the first bytes of its command line, and for a process that held a
//! listening socket its descriptors, cwd and environment. Each is read as the init first and,
//! where the kernel refuses root without CAP_SYS_PTRACE, again with the process's own filesystem
//! IDs. A read that fails is "not shown", never a reason: the evidence decides nothing. May use:
//! kernel, observe.

use crate::kernel::{creds, process::Pid};
use crate::record::evidence::Endpoint;
use std::collections::HashMap;
use std::io::{self, Read};

/// Endpoints kept per service, bytes of one environment read, descriptors looked at per process.
const LISTEN_KEEP: usize = 16;
const ENV_READ: usize = 16 << 10;
const FD_SCAN: usize = 1024;

/// Where a process listened, its cwd and the first bytes of its environment with whether there
/// was more; each None that was not shown.
pub struct ServiceRead {
    pub listen: Vec<Endpoint>,
    pub cwd: Option<String>,
    pub env: Option<(Vec<u8>, bool)>,
}

/// Where a process listened (its descriptors that are listening sockets), and if anywhere, its
/// cwd and environment. Each read as the init first, then as the process's own user.
pub fn service(
    pid: Pid,
    dir: &str,
    table: &HashMap<u64, Endpoint>,
    creds: Option<(u32, u32)>,
) -> io::Result<Option<ServiceRead>> {
    let scan = || -> io::Result<Vec<Endpoint>> {
        let mut found: Vec<Endpoint> = Vec::new();
        for at in crate::observe::sockets::socket_inodes(pid, FD_SCAN)?.iter().filter_map(|i| table.get(i)) {
            if !found.contains(at) && found.len() < LISTEN_KEEP {
                found.push(at.clone());
            }
        }
        Ok(found)
    };
    let Some(listen) = as_owner(creds, scan)? else { return Ok(None) };
    if listen.is_empty() {
        return Ok(None);
    }
    let cwd = as_owner(creds, || std::fs::read_link(format!("{dir}/cwd")))?
        .map(|p| p.to_string_lossy().into_owned());
    let env = as_owner(creds, || prefix(&format!("{dir}/environ"), ENV_READ))?;
    Ok(Some(ServiceRead { listen, cwd, env }))
}

/// `f` as this thread is; where the kernel refuses that (root without CAP_SYS_PTRACE reading
/// another user's process), again with the process's own filesystem IDs. Ok(None): not shown.
/// Err only when this thread's IDs could not be switched back.
fn as_owner<T>(creds: Option<(u32, u32)>, f: impl Fn() -> io::Result<T>) -> io::Result<Option<T>> {
    match f() {
        Ok(v) => Ok(Some(v)),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM)) => match creds {
            Some((uid, gid)) => Ok(creds::as_fs_user(uid, gid, f)?.and_then(Result::ok)),
            None => Ok(None),
        },
        Err(_) => Ok(None),
    }
}

thread_local! {
    /// One read buffer per reader thread: a fresh `limit`-sized buffer per process costs an
    /// allocation and page faults each time with musl's allocator, which hands freed pages back.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The first `limit` bytes of a file, and whether there was more; reads no further.
pub fn prefix(path: &str, limit: usize) -> io::Result<(Vec<u8>, bool)> {
    let f = std::fs::File::open(path)?;
    SCRATCH.with(|cell| {
        let mut buf = cell.borrow_mut();
        buf.clear();
        buf.reserve(limit + 1);
        f.take(limit as u64 + 1).read_to_end(&mut buf)?;
        let more = buf.len() > limit;
        Ok((buf[..buf.len().min(limit)].to_vec(), more))
    })
}

/// The exe link. Root without CAP_SYS_PTRACE (Docker's default) may not read another user's;
/// with this thread's filesystem IDs switched to the process's own it may, if the process is
/// dumpable. None: no exe (zombie, kernel thread), not shown, or gone.
pub fn exe(link: &str, creds: Option<(u32, u32)>) -> io::Result<Option<String>> {
    let lossy = |p: std::path::PathBuf| p.to_string_lossy().into_owned();
    match std::fs::read_link(link) {
        Ok(p) => Ok(Some(lossy(p))),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM)) => match creds {
            Some((uid, gid)) => {
                Ok(creds::as_fs_user(uid, gid, || std::fs::read_link(link))?.and_then(Result::ok).map(lossy))
            }
            None => Ok(None),
        },
        Err(_) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_reads_stop_at_the_limit() {
        let p = std::env::temp_dir().join(format!("quiesce-prefix-{}", std::process::id()));
        std::fs::write(&p, vec![7u8; 10_000]).unwrap();
        let (b, more) = prefix(p.to_str().unwrap(), 4096).unwrap();
        assert_eq!((b.len(), more), (4096, true));
        std::fs::write(&p, vec![7u8; 4096]).unwrap();
        assert!(!prefix(p.to_str().unwrap(), 4096).unwrap().1);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn filesystem_ids_switch_for_one_thread_and_come_back() {
        let fs_line = || {
            let st = std::fs::read_to_string("/proc/thread-self/status").unwrap();
            let uid = st.lines().find(|l| l.starts_with("Uid:")).unwrap().to_string();
            let gid = st.lines().find(|l| l.starts_with("Gid:")).unwrap().to_string();
            (
                uid.split_whitespace().nth(4).unwrap().to_string(),
                gid.split_whitespace().nth(4).unwrap().to_string(),
            )
        };
        std::thread::spawn(move || {
            let inside = creds::as_fs_user(4242, 4343, fs_line).unwrap().expect("the switch takes as root");
            assert_eq!(inside, ("4242".to_string(), "4343".to_string()));
            assert_eq!(fs_line(), ("0".to_string(), "0".to_string()));
        })
        .join()
        .unwrap();
        // The process's other threads never changed.
        assert_eq!(fs_line(), ("0".to_string(), "0".to_string()));
    }
}

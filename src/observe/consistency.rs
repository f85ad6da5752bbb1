//! A consistent observation: a process table in which every process alive at its final instant
//! was read while alive. A plain listing is not one: a process listed and then read as gone may
//! have forked a child after the listing passed, and that child is in no table. A sandbox process
//! that hops to a new pid faster than the init reads would never be seen.
//!
//! The PID namespace's last allocated pid (`/proc/sys/kernel/ns_last_pid`) says whether any
//! process or thread was created meanwhile. Read it before the listing; after reading every
//! process, read it again. If it did not move, nothing was created while the table was taken, so
//! every process alive now existed before the listing began and was listed and read. If it moved,
//! the pids handed out in between are the only ones that can hold a process the table lacks:
//! read exactly those (or list again when they are many) and check again, until a pass creates
//! nothing or the deadline passes. Processes reaped while the table is taken need no special
//! care: a hop that exits is a zombie child of the init, which does not reap while it observes.
//!
//! One more turn: the counter moves when a pid is allocated, a little before the new process is
//! visible in /proc (measured: up to ~300 µs on a loaded machine). A fork that allocated before
//! the first read can attach its child after the listing passed it; its parent is alive until the
//! child is attached, so either the table shows the parent alive or a final listing, taken after
//! every read, shows the child. A quiet pass therefore ends with that listing, and any pid in it
//! that the table lacks is read and the check repeated.
//!
//! What this assumes: nobody rewrites ns_last_pid (that needs CAP_SYS_ADMIN or
//! CAP_CHECKPOINT_RESTORE over the namespace, which a container's processes lack by default),
//! and the counter does not come back to the same value during one pass. Pids are handed out
//! cyclically, so it does after as many allocations as there are free pids: in a namespace whose
//! pid space is nearly full that is a handful (docs/threat-model.md, "A pid space nearly full").

use crate::procs::{Detail, Reader, Snapshot};
use crate::sys::Pid;
use std::io;
use std::path::Path;
use std::time::Instant;

/// Pids handed out since the last check that are worth probing one by one; more means a fresh
/// listing is cheaper.
const PROBE_MAX: u64 = 256;

/// Why no consistent table could be had in time.
#[derive(Debug)]
pub struct Churn {
    /// Pids handed out during the last pass.
    pub created: u64,
    pub passes: usize,
}

/// The last pid allocated in the reader's own PID namespace.
pub fn last_pid(root: &Path) -> io::Result<Pid> {
    let path = root.join("sys/kernel/ns_last_pid");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "cannot read {}: {e}: a consistent process table needs it (a kernel with \
                 CONFIG_CHECKPOINT_RESTORE, /proc without subset=pid)",
                path.display()
            ),
        )
    })?;
    text.trim().parse().map_err(|_| io::Error::other(format!("{} is not a pid", path.display())))
}

/// Pids handed out after `from` up to and including `to`, allowing for wrap-around.
pub fn allocated_between(from: Pid, to: Pid, pid: Pid) -> bool {
    if to >= from {
        pid > from && pid <= to
    } else {
        pid > from || pid <= to
    }
}

fn distance(from: Pid, to: Pid) -> u64 {
    if to >= from {
        (to - from) as u64
    } else {
        // Wrapped: at least this many, and more than any probe is worth.
        u64::MAX
    }
}

/// A consistent table of the whole PID namespace, read into `snap` (an earlier observation, whose
/// loginuids that were set are reused: its room is the new table's), with the number of passes it
/// took; or Churn when processes kept being created until `deadline`.
pub fn observe(reader: &Reader, snap: &mut Snapshot, deadline: Instant) -> io::Result<Result<usize, Churn>> {
    let root = reader.root().to_path_buf();
    let mut covered = last_pid(&root)?;
    reader.refresh(snap, &[], None)?;
    let mut pass = reader.pass()?;
    let mut passes = 1;
    loop {
        let now = last_pid(&root)?;
        if now == covered {
            // The counter moves when a pid is allocated, a little before the new process shows
            // in /proc: a fork whose pid was allocated before `covered` was read may attach its
            // child after the listing passed it. Its parent is alive until then, so either the
            // table shows that parent alive, or the child is attached by now: a last listing,
            // after every read, finds any such child.
            let missing: Vec<Pid> =
                reader.pids()?.into_iter().filter(|pid| !snap.procs.contains_key(pid)).collect();
            if missing.is_empty() && last_pid(&root)? == covered {
                return Ok(Ok(passes));
            }
            passes += 1;
            let mut batch = Vec::with_capacity(missing.len());
            for pid in missing {
                batch.push((pid, pass.read(pid, Detail::Light, snap.procs.get(&pid))?));
            }
            snap.procs.apply(batch);
            if Instant::now() >= deadline {
                return Ok(Err(Churn { created: 0, passes }));
            }
            continue;
        }
        if Instant::now() >= deadline {
            return Ok(Err(Churn { created: distance(covered, now), passes }));
        }
        passes += 1;
        // Every pid in (covered, now] was handed out before this pass begins.
        if distance(covered, now) <= PROBE_MAX {
            let mut pid = covered;
            let mut batch = Vec::new();
            while pid != now {
                pid += 1;
                batch.push((pid, pass.read(pid, Detail::Light, snap.procs.get(&pid))?));
            }
            snap.procs.apply(batch);
        } else {
            let mut listed = reader.pids()?;
            listed.sort_unstable();
            // Not listed now: exited (anything created since is in the next pass's range).
            snap.procs.retain(|pid, _| listed.binary_search(pid).is_ok());
            let mut batch = Vec::new();
            for pid in listed {
                if snap.procs.contains_key(&pid) && !allocated_between(covered, now, pid) {
                    continue;
                }
                batch.push((pid, pass.read(pid, Detail::Light, snap.procs.get(&pid))?));
            }
            snap.procs.apply(batch);
        }
        covered = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_wrap() {
        assert!(allocated_between(10, 20, 11));
        assert!(allocated_between(10, 20, 20));
        assert!(!allocated_between(10, 20, 10));
        assert!(!allocated_between(10, 20, 21));
        assert!(allocated_between(32000, 305, 32001));
        assert!(allocated_between(32000, 305, 300));
        assert!(!allocated_between(32000, 305, 306));
        assert_eq!(distance(10, 20), 10);
        assert_eq!(distance(20, 10), u64::MAX);
    }

    #[test]
    fn a_quiet_table_is_consistent_at_once_and_a_new_child_is_found() {
        let r = Reader::default();
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        let mut snap = Snapshot::default();
        observe(&r, &mut snap, deadline).unwrap().unwrap();
        assert!(snap.procs.contains_key(&crate::sys::getpid()));
        assert!(last_pid(r.root()).unwrap() > 0);
    }
}

//! A refresh: the table of the last observation read again in its own room, so that PID 1 holds
//! one table while it tracks. May use: kernel, observe.

use crate::kernel::process::{self, Pid};
use crate::observe::procs::model::{Detail, Proc};
use crate::observe::procs::pass::Pass;
use crate::observe::procs::reader::{several_cores, Reader, SPLIT_MIN};
use crate::observe::procs::table::{Table, GONE};
use std::io;

impl Reader {
    /// Like `snapshot_deciding(Light, Some(snap), uids)`, read into `snap`'s own room: every pid
    /// listed now is read again into its entry (its last entry is what a loginuid already set is
    /// reused from), a pid listed for the first time is added, and an entry whose pid is no
    /// longer listed goes. No second table is built beside it; once this returns Ok(true) the
    /// table is exactly what a fresh observation would have read.
    ///
    /// `abort` (the init's periodic refresh) is asked before every process (one syscall against
    /// the several a read costs: when a CPU storm leaves the init 1% of a core, 32 processes took
    /// a quarter of a second); when it says yes, Ok(false) comes back at once. With `abort`, the
    /// table is the last complete observation until this one completes: what the reading finds
    /// changed, gone or new is held aside (only the entries that differ, so a quiet namespace
    /// costs next to nothing) and applied at the end; an aborted or failed refresh leaves the
    /// table exactly as it was, since the freeze decides from it. Without `abort` (a table the
    /// caller throws away when a read fails: the freeze's own), entries are read into place and
    /// a large table is read by two threads, half of it each.
    pub fn refresh(
        &self,
        snap: &mut Table,
        uids: &[u32],
        abort: Option<&dyn Fn() -> bool>,
    ) -> io::Result<bool> {
        crate::observe::proctrust::check(&self.root)?;
        let mut pids = self.pids()?;
        pids.sort_unstable();
        pids.dedup();
        let slots = &mut snap.v[..];
        let part = |slots: &mut [Proc], pids: &[Pid], added: &mut Vec<Proc>| -> io::Result<()> {
            let mut pass = self.pass()?;
            pass.deciding = uids;
            merge(&mut pass, slots, pids, added)
        };
        if let Some(abort) = abort {
            let mut pass = self.pass()?;
            pass.deciding = uids;
            let Some(pending) = merge_pending(&mut pass, slots, &pids, abort)? else {
                return Ok(false);
            };
            pending.commit(snap);
            return Ok(true);
        }
        let mut added = Vec::new();
        let done = if slots.len() < SPLIT_MIN || !several_cores() {
            part(slots, &pids, &mut added)
        } else {
            // Each half of the table with the pids listed in its range; pids above the first
            // half's last entry are the second half's.
            let mid = slots.len() / 2;
            let (lo, hi) = slots.split_at_mut(mid);
            let cut = pids.partition_point(|&p| p < hi[0].pid);
            let (lo_pids, hi_pids) = pids.split_at(cut);
            let second = std::sync::Mutex::new(Some(hi));
            let run_second = || -> io::Result<Vec<Proc>> {
                let taken = second.lock().unwrap_or_else(|e| e.into_inner()).take();
                let mut more = Vec::new();
                match taken {
                    Some(hi) => part(hi, hi_pids, &mut more).map(|()| more),
                    None => Ok(more),
                }
            };
            let (mine, theirs) = std::thread::scope(|s| {
                let helper = std::thread::Builder::new()
                    .name("quiesce-observe".into())
                    .stack_size(256 * 1024)
                    .spawn_scoped(s, run_second);
                let mine = part(lo, lo_pids, &mut added);
                let theirs = match helper {
                    Ok(h) => h.join().unwrap_or_else(|_| Err(io::Error::other("observation helper failed"))),
                    // No thread (a pids limit): this one reads the second half too.
                    Err(_) => run_second(),
                };
                (mine, theirs)
            });
            match (mine, theirs) {
                (Ok(()), Ok(mut more)) => {
                    added.append(&mut more);
                    Ok(())
                }
                (Err(e), _) | (_, Err(e)) => Err(e),
            }
        };
        // Whatever happened, the table is put back in order: gone entries out, new ones in.
        snap.settle(added);
        done?;
        if !snap.contains_key(&process::getpid()) {
            return Err(io::Error::other(format!(
                "{} does not list this process: the process table is unknown",
                self.root.display()
            )));
        }
        Ok(true)
    }
}

/// What a refresh with an abort found, held aside until it completes: the entries that read
/// differently (by position), those gone (by position, ascending) and the pids new to the table.
struct Pending {
    changed: Vec<(usize, Proc)>,
    gone: Vec<usize>,
    added: Vec<Proc>,
}

impl Pending {
    fn commit(self, table: &mut Table) {
        for (i, p) in self.changed {
            table.v[i] = p;
        }
        for i in self.gone {
            table.v[i].pid = GONE;
        }
        table.settle(self.added);
    }
}

/// Like `merge`, leaving `slots` as they are: Ok(None) when `abort` said stop.
fn merge_pending(
    pass: &mut Pass,
    slots: &[Proc],
    pids: &[Pid],
    abort: &dyn Fn() -> bool,
) -> io::Result<Option<Pending>> {
    let mut out = Pending { changed: Vec::new(), gone: Vec::new(), added: Vec::new() };
    let mut i = 0;
    for &pid in pids {
        if abort() {
            return Ok(None);
        }
        while i < slots.len() && slots[i].pid < pid {
            out.gone.push(i);
            i += 1;
        }
        if i < slots.len() && slots[i].pid == pid {
            match pass.read(pid, Detail::Light, Some(&slots[i]))? {
                Some(p) if p != slots[i] => out.changed.push((i, p)),
                Some(_) => {}
                None => out.gone.push(i),
            }
            i += 1;
        } else if let Some(p) = pass.read(pid, Detail::Light, None)? {
            out.added.push(p);
        }
    }
    out.gone.extend(i..slots.len());
    Ok(Some(out))
}

/// Read `pids` (sorted, each once) into `slots` (sorted by pid): a pid with an entry is read
/// into it, knowing the entry; one without goes to `added`; an entry whose pid is not listed, or
/// that reads as exited, is marked GONE.
fn merge(pass: &mut Pass, slots: &mut [Proc], pids: &[Pid], added: &mut Vec<Proc>) -> io::Result<()> {
    let mut i = 0;
    for &pid in pids {
        while i < slots.len() && slots[i].pid < pid {
            slots[i].pid = GONE;
            i += 1;
        }
        if i < slots.len() && slots[i].pid == pid {
            match pass.read(pid, Detail::Light, Some(&slots[i]))? {
                Some(p) => slots[i] = p,
                None => slots[i].pid = GONE,
            }
            i += 1;
        } else if let Some(p) = pass.read(pid, Detail::Light, None)? {
            added.push(p);
        }
    }
    for p in &mut slots[i..] {
        p.pid = GONE;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refresh in the table's own room ends as a fresh observation would: a process listed now
    /// is in it with what it is now, one that is gone is not, and one it never saw is added.
    #[test]
    fn a_refresh_in_place_reads_what_a_fresh_observation_reads() {
        let r = Reader::default();
        let me = process::getpid();
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let pid = child.id() as Pid;
        // A table with an entry whose pid no process holds, and a stale one of this process.
        let mut snap = Table::of(&[Proc::fixture(i32::MAX - 7, 1, 5, 0), Proc::fixture(me, 1, 5, 0)]);
        assert!(r.refresh(&mut snap, &[], None).unwrap());
        assert!(!snap.contains_key(&(i32::MAX - 7)), "a pid no process holds stays");
        assert!(snap.contains_key(&pid), "a new process is not added");
        let fresh = r.snapshot(Detail::Light).unwrap();
        assert_eq!(snap[&me].start_time, fresh[&me].start_time);
        assert!(snap.keys_sorted(), "the table is out of order");
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(r.refresh(&mut snap, &[], None).unwrap());
        assert!(!snap.contains_key(&pid), "a reaped process stays");
        // Aborted at once: nothing read, nothing lost that was not known gone.
        let before = snap.len();
        assert!(!r.refresh(&mut snap, &[], Some(&|| true)).unwrap());
        assert_eq!(snap.len(), before);
    }

    /// A tracking refresh cut off near its end leaves the table the last complete observation:
    /// the freeze classifies it and notes whose parent can vouch, so an entry dropped, replaced or
    /// added by a reading that never finished would change what it decides.
    #[test]
    fn a_refresh_cut_off_leaves_the_last_complete_observation() {
        let r = Reader::default();
        let me = process::getpid();
        let listed = r.pids().unwrap();
        // A pid no process holds, below this one, so that the reading passes it before the cut.
        let free = (2..me).rev().find(|p| !listed.contains(p)).expect("a free pid below this process");
        assert_ne!(me, 1, "run as PID 1: no pid below this one to leave out");
        // The last complete observation, but for pid 1 (new to the table when listed), this
        // process with another start time (read again), and an entry of the free pid.
        let mut table = r.snapshot(Detail::Light).unwrap().v;
        let mut stale_me = table.iter().find(|p| p.pid == me).unwrap().clone();
        stale_me.start_time = 5;
        table.retain(|p| p.pid != me && p.pid != 1);
        table.push(stale_me);
        table.push(Proc::fixture(free, 1, 7, 4242));
        let mut snap = Table::from_procs(table);
        let before = snap.clone();
        // Cut off before the last pid listed: every entry below it has been passed.
        let n = r.pids().unwrap().len();
        let calls = std::cell::Cell::new(0usize);
        let abort = || {
            calls.set(calls.get() + 1);
            calls.get() >= n
        };
        assert!(!r.refresh(&mut snap, &[], Some(&abort)).unwrap());
        assert!(calls.get() > 1, "the reading was cut off before it started");
        assert!(snap.contains_key(&free), "an entry the cut-off reading found unlisted was dropped");
        assert_eq!(snap[&me].start_time, 5, "an entry was replaced by a reading that never finished");
        assert!(!snap.contains_key(&1), "a pid new to the table was added");
        assert_eq!(snap, before, "a cut-off refresh changed the table");
        // Completed, it is what a fresh observation reads.
        assert!(r.refresh(&mut snap, &[], Some(&|| false)).unwrap());
        assert!(!snap.contains_key(&free));
        assert_ne!(snap[&me].start_time, 5);
    }
}

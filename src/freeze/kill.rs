//! The kill: SIGKILL through every channel (kill(-1) as each sandbox UID, a pidfd of each
//! process, a pidfd of each sandbox process group's leader), and which processes each channel
//! must reach.

use crate::decide::taint::Tainted;
use crate::freeze::progress::{live, ms, Run};
use crate::freeze::target;
use crate::kernel::process::{self, Pid};
use crate::observe::procs::model::Proc;
use crate::observe::procs::reader::Reader;
use crate::observe::procs::table::Table;
use crate::observe::settle;
use std::collections::BTreeMap;
use std::io;
use std::time::{Duration, Instant};

/// Depth of every process in the tree, in the table's order, each computed once: a 4,096-deep
/// chain must not cost a walk up the chain per comparison.
fn depths(t: &Table) -> Vec<u32> {
    let mut memo: Vec<Option<u32>> = vec![None; t.len()];
    let mut chain: Vec<usize> = Vec::new();
    for start in 0..t.len() {
        chain.clear();
        let mut cur = Some(start);
        let mut base = 0;
        // Bounded by the table: a cycle (pid reuse between reads) ends the walk.
        while chain.len() <= t.len() {
            let Some(i) = cur else { break };
            if let Some(d) = memo[i] {
                base = d + 1;
                break;
            }
            chain.push(i);
            cur = t.position(t.at(i).ppid);
        }
        for (k, &i) in chain.iter().rev().enumerate() {
            memo[i].get_or_insert(base + k as u32);
        }
    }
    memo.into_iter().map(|d| d.unwrap_or(0)).collect()
}

/// Could kill(-1) from a thread switched to a sandbox UID miss this process? Its permission
/// check looks at the leader's real and saved UIDs only, and a leader that exited while other
/// threads run is not a reliable target.
pub fn missable(p: &Proc, uids: &[u32]) -> bool {
    match p.threads.iter().find(|t| t.tid == p.pid) {
        None => true,
        Some(l) => matches!(l.state, 'Z' | 'X') || !(uids.contains(&l.uids[0]) || uids.contains(&l.uids[2])),
    }
}

/// Which live sandbox processes a kill signals through a channel of their own (a pidfd, their
/// group), besides kill(-1) as the sandbox UIDs.
#[derive(Clone, Copy)]
pub enum Reach<'u> {
    /// Every one.
    All,
    /// Those kill(-1) may have missed, and those the stop observation saw running: the only ones
    /// that can have left its reach since. A stopped process acts again only once something
    /// continues it (its own SIGCONT timer), and then the proof finds and kills whatever it did.
    /// A process holding a UID outside the sandbox's (a setuid program's root) counts as
    /// running: continued, it switches for good in one call.
    Unsettled(&'u [u32]),
}

impl Reach<'_> {
    pub fn needs(&self, p: &Proc) -> bool {
        match *self {
            Reach::All => true,
            Reach::Unsettled(uids) => {
                missable(p, uids) || !p.stopped() || p.all_uids().any(|u| !uids.contains(&u))
            }
        }
    }
}

/// What one kill aims at: the live sandbox processes of an observation that `reach` names.
#[derive(Clone, Copy)]
struct Aim<'a> {
    snap: &'a Table,
    tainted: &'a Tainted,
    reach: Reach<'a>,
}

/// Signal the processes aimed at through pidfds, children before parents.
fn signal_each(reader: &Reader, aim: Aim, sig: i32) -> io::Result<usize> {
    let Aim { snap, tainted, reach } = aim;
    let mut targets: Vec<&Proc> = live(snap, tainted).filter(|p| reach.needs(p)).collect();
    let depth = depths(snap);
    targets.sort_by_key(|p| std::cmp::Reverse(snap.position(p.pid).map_or(0, |i| depth[i])));
    let mut n = 0;
    let mut pass = reader.pass()?;
    for p in targets {
        if target::signal_in(&mut pass, p, sig)? {
            n += 1;
        }
    }
    Ok(n)
}

/// Process groups all of whose live members are sandbox processes, led by a sandbox process the
/// observation saw. A group signal reaches the whole group at once, and a fork in progress cannot
/// slip past it (the kernel restarts a fork that a group signal interrupts): the one channel that
/// catches a root-owned escapee that hops to a new pid faster than a pidfd can follow, as long as
/// it stays in its group. Only groups with a live member `reach` names (a stopped process cannot
/// fork, exec or hop, so a group of stopped members kill(-1) reaches has no one the group signal
/// adds).
fn sandbox_groups<'a>(aim: Aim<'a>) -> Vec<&'a Proc> {
    let Aim { snap, tainted, reach } = aim;
    let own = process::getpgrp();
    // Per group: all live members are sandbox processes; some live member needs the group signal.
    let mut groups: BTreeMap<Pid, (bool, bool)> = BTreeMap::new();
    for p in snap.values().filter(|p| p.alive()) {
        let ok = tainted.contains_key(&p.pid);
        let needs = reach.needs(p);
        let g = groups.entry(p.pgid).or_insert((true, false));
        g.0 &= ok;
        g.1 |= needs;
    }
    groups
        .into_iter()
        .filter(|&(g, (all, needs))| all && needs && g != own)
        .filter_map(|(g, _)| snap.get(&g).filter(|l| tainted.contains_key(&l.pid)))
        .collect()
}

/// Signal whole sandbox process groups through a pidfd of each leader (checked against its
/// start time), never by number: a group number can be reused by a root session between the
/// observation and the signal, the leader's kernel pid object cannot. Kernels before 6.9 cannot
/// signal a group through a pidfd; there only the per-process channels act.
fn kill_groups(reader: &Reader, aim: Aim, sig: i32) -> io::Result<usize> {
    let mut n = 0;
    for leader in sandbox_groups(aim) {
        let h = match target::Handle::open(reader, leader.pid, leader.start_time)? {
            Ok(h) => h,
            Err(_) => continue,
        };
        match h.signal_group(sig) {
            Ok(true) => n += 1,
            Ok(false) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                log::debug!("this kernel cannot signal a process group through a pidfd");
                return Ok(n);
            }
            Err(e) => {
                return Err(io::Error::new(e.kind(), format!("signal process group {}: {e}", leader.pid)))
            }
        }
    }
    Ok(n)
}

/// How long the kill waits, at most, for the processes it killed to exit before the proof's
/// observation (which then finds what is left, kills it again and looks again).
const EXIT_WAIT: Duration = Duration::from_secs(1);

impl Run<'_> {
    /// The first kill, of what the stop observed: every channel at once, then a short wait for
    /// the killed processes to exit.
    pub fn kill(&mut self, snap: &Table, tainted: &Tainted) -> Result<(), String> {
        let t = Instant::now();
        // kill(-1) reaches every stopped process it can reach, and anything one of them forks
        // before dying; the other channels go to the rest. A process some SIGCONT restarted after
        // the stop observation and that left kill(-1)'s reach meanwhile is the proof's to find.
        let uids = self.policy.uids.clone();
        let reach = if self.unstopped.is_empty() { Reach::Unsettled(&uids) } else { Reach::All };
        self.kill_channels(snap, tainted, reach)?;
        let sent = Instant::now();
        let killed: Vec<settle::Target> = live(snap, tainted).map(|p| (p.pid, Some(p.start_time))).collect();
        let left =
            settle::wait(self.reader, &killed, settle::Goal::Dead, (sent + EXIT_WAIT).min(self.deadline));
        let exited = Instant::now();
        // The zombies are left for after the proof: each costs it one stat read (a dead process's
        // line says all there is), no more than reaping it costs here, and the kill is over sooner.
        log::debug!(
            "kill: signals sent in {:?}, waited {:?} for exits ({left} of a sample left)",
            sent - t,
            exited - sent,
        );
        self.phases.kill = ms(t.elapsed());
        Ok(())
    }

    /// Every channel: the kernel-atomic kill(-1) as each sandbox UID, then pidfds and process
    /// groups for the processes `reach` names.
    pub fn kill_channels(&mut self, snap: &Table, tainted: &Tainted, reach: Reach) -> Result<(), String> {
        let sig = libc::SIGKILL;
        self.cred
            .kill_all_as(&self.policy.uids, sig)
            .map_err(|e| format!("credential switch failed: {e}"))?;
        let aim = Aim { snap, tainted, reach };
        signal_each(self.reader, aim, sig).map_err(|e| format!("signal failed: {e}"))?;
        kill_groups(self.reader, aim, sig).map_err(|e| format!("signal failed: {e}"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::procs::model::Thread;

    fn stopped(mut p: Proc) -> Proc {
        p.state = 'T';
        p.threads.iter_mut().for_each(|t| t.state = 'T');
        p
    }

    #[test]
    fn the_first_kill_leaves_to_kill_minus_one_only_what_it_surely_reaches() {
        let uids = [4242];
        let reach = Reach::Unsettled(&uids);
        // Stopped, every UID the sandbox's: kill(-1) as 4242 reaches it and all it can become.
        assert!(!reach.needs(&stopped(Proc::fixture(10, 1, 5, 4242))));
        // Running: it may fork or change anything before the kill.
        assert!(reach.needs(&Proc::fixture(11, 1, 5, 4242)));
        // Root leader (tainted by lineage or history): kill(-1) as 4242 misses it.
        assert!(reach.needs(&stopped(Proc::fixture(12, 1, 5, 0))));
        // A setuid program's effective and saved root: continued, it is root for good in one call.
        let mut suid = stopped(Proc::fixture(13, 1, 5, 4242));
        suid.threads[0].uids = [4242, 0, 0, 0];
        assert!(reach.needs(&suid));
        // A leader that is a zombie while another thread runs.
        let mut gone = stopped(Proc::fixture(14, 1, 5, 4242));
        gone.threads[0].state = 'Z';
        gone.threads.push(Thread { tid: 15, state: 'T', uids: [4242; 4], gids: [0; 4], creds: true });
        assert!(reach.needs(&gone));
        assert!(Reach::All.needs(&stopped(Proc::fixture(10, 1, 5, 4242))));
    }
}

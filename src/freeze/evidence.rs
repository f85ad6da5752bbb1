//! The walk's evidence: what a person needs to recognise each killed process (its command line
//! and executable), read with a bound on size and a bound on time. Evidence never decides
//! anything: the stop, the kills and the proof read stat, status and loginuid only. The records
//! it fills in are `record::evidence`'s; the walk, its bounds and its readers are here.
//!
//! Size. The sandbox chooses its command lines: at most `CMDLINE_READ` bytes of each are read,
//! and at most `CMDLINE_KEEP` bytes of JSON kept (marked `truncated`); the whole list is at most
//! `MARKER_BUDGET` bytes of JSON, and what does not fit is only counted.
//!
//! Time. Reading /proc/PID/cmdline takes the target's mmap lock, which the target can make
//! wait forever (a thread faulting on a file of its own FUSE mount while another waits in
//! mmap()). So the reads run on a reader thread of the init (`freeze::readers`), started before the command; the
//! walk waits for each answer at most `READ_WAIT` and never past its own deadline. A reader that
//! does not answer is left where it is stuck, its target is recorded as unreadable and never
//! read again while that reader is stuck on it, and a new reader takes the rest. At most
//! `MAX_STUCK` readers may be stuck at once; past that, or when no thread can be started (a
//! pids limit), evidence is recorded as unreadable. Processes sharing one memory map
//! (clone(CLONE_VM)) are separate targets: one held lock can strand every reader allowed.
//!
//! Services. A target that held a listening TCP socket is a service the verifier's tests may
//! need back (`verify --hand-over`): for at most `MAX_SERVICES` of them the walk also records
//! where they listened, their working directory and their environment, each within its own bound
//! (`ENV_KEEP`), beside the process entries and outside their budget. A descriptor table or an
//! environment the reader may not see leaves that service unrecorded or without its environment.
//!
//! Speed. The reads are the kernel's CPU work; a large walk hands them to two readers in turn
//! (a second core halves it), each answering in the order it was asked. The second reader is
//! started for the walk that needs it; when it cannot be, the first takes everything.

use crate::decide::taint::Reasons;
use crate::freeze::readers::{pool, spawn, Job, Pool, Reply, Worker, LANES, LANES_FROM, MAX_STUCK};
use crate::kernel::process::Pid;
use crate::observe::procs::model::Proc;
use crate::observe::procs::reader::Reader;
use crate::record::evidence::{Endpoint, Evidence, Service};
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

/// Bytes of JSON kept of a command line, and of an executable's path.
pub const CMDLINE_KEEP: usize = 4096;
pub const EXE_KEEP: usize = 1024;
/// Bytes of JSON of the whole `processes` list of a marker.
pub const MARKER_BUDGET: usize = 1 << 20;

/// Services recorded per freeze, and bytes of JSON kept of one environment (what is read of
/// each: `observe::evidence`).
pub const MAX_SERVICES: usize = 8;
pub const ENV_KEEP: usize = 8 << 10;

/// How long the walk waits for one answer before it leaves the reader behind: a healthy read
/// takes microseconds (the sandbox is stopped by then), and `MAX_STUCK` of these fit in the
/// walk's most.
pub const READ_WAIT: Duration = Duration::from_millis(500);
/// The walk's share of what is left of the freeze budget, and its most.
const WALK_SHARE: u32 = 4;
const WALK_MAX: Duration = Duration::from_secs(2);
/// Reads handed to the readers ahead of the answers.
const WINDOW: usize = 64;

/// What the walk gathered: the entries kept, and how many did not fit the marker.
#[derive(Debug, Default)]
pub struct Gathered {
    pub processes: Vec<Evidence>,
    /// The kept processes that listened, at most `MAX_SERVICES`.
    pub services: Vec<Service>,
    pub omitted: u64,
    /// Bytes of JSON `processes` takes.
    pub bytes: usize,
}

impl Gathered {
    /// Every process the walk recorded, kept or only counted.
    pub fn count(&self) -> usize {
        self.processes.len() + self.omitted as usize
    }
}

/// One stopped sandbox process, as the light observation saw it.
pub struct Target {
    evidence: Evidence,
    /// The leader's UID and GID when its real, effective and saved IDs agree: the kernel then
    /// shows its exe link to a reader with those filesystem IDs, CAP_SYS_PTRACE or not.
    creds: Option<(u32, u32)>,
}

impl Target {
    pub fn of(p: &Proc, reasons: Reasons) -> Target {
        let mut uids: Vec<u32> = p.all_uids().collect();
        uids.sort();
        uids.dedup();
        let creds = p.threads.iter().find(|t| t.tid == p.pid).and_then(|l| {
            let same = |ids: &[u32; 4]| ids[0] == ids[1] && ids[1] == ids[2];
            (same(&l.uids) && same(&l.gids)).then_some((l.uids[0], l.gids[0]))
        });
        Target {
            evidence: Evidence {
                pid: p.pid,
                ppid: p.ppid,
                uids,
                comm: p.comm.to_string(),
                cmdline: None,
                exe: None,
                start_time: p.start_time,
                reason: reasons.iter().map(|r| r.as_str().to_string()).collect(),
                truncated: false,
                unreadable: true,
            },
            creds,
        }
    }

    /// The most JSON this entry can take once read.
    fn reserve(&self) -> usize {
        json_size(&self.evidence) + CMDLINE_KEEP + EXE_KEEP + 1
    }

    fn key(&self) -> (Pid, u64) {
        (self.evidence.pid, self.evidence.start_time)
    }
}

/// When the walk must end, given the freeze's deadline.
pub fn walk_deadline(now: Instant, freeze_deadline: Instant) -> Instant {
    now + (freeze_deadline.saturating_duration_since(now) / WALK_SHARE).min(WALK_MAX)
}

/// What was read belongs to a target only if its pid still named it. A pid names another
/// process only once the kernel hands it out again, which moves the namespace's pid counter
/// past it (nothing in the container may set it: see consistency). So only the pids handed out
/// since `since` (the counter read before the observation that identified the targets) are
/// checked, by their start time now; the rest cost nothing. Without both counter readings every
/// entry is checked. A mismatch drops what was read: the entry is unreadable.
fn drop_reused(out: &mut Gathered, since: Option<Pid>) {
    let reader = Reader::default();
    let now = since.and_then(|_| crate::observe::consistency::last_pid(reader.root()).ok());
    let mut pass = reader.pass().ok();
    for e in out.processes.iter_mut().filter(|e| e.cmdline.is_some() || e.exe.is_some()) {
        let suspect = match (since, now) {
            (Some(a), Some(b)) => crate::observe::consistency::allocated_between(a, b, e.pid),
            _ => true,
        };
        if !suspect {
            continue;
        }
        let now_start = pass.as_mut().and_then(|p| p.start_time(e.pid).ok().flatten());
        if now_start != Some(e.start_time) {
            out.services.retain(|s| (s.pid, s.start_time) != (e.pid, e.start_time));
            e.cmdline = None;
            e.exe = None;
            e.truncated = false;
            e.unreadable = true;
        }
    }
}

/// The arguments of a command line, decoded lossily, in at most `budget` bytes of JSON;
/// true when something was cut.
fn keep_args(raw: &[u8], budget: usize) -> (Vec<String>, bool) {
    let raw = raw.strip_suffix(&[0]).unwrap_or(raw);
    let mut out = Vec::new();
    if raw.is_empty() {
        return (out, false);
    }
    let mut used = 2; // []
    for arg in raw.split(|&b| b == 0) {
        let comma = usize::from(!out.is_empty());
        let s = String::from_utf8_lossy(arg);
        let (kept, cut) = keep_str(&s, budget.saturating_sub(used + comma));
        if cut && kept.is_empty() {
            return (out, true);
        }
        used += comma + json_str_len(&kept);
        out.push(kept);
        if cut {
            return (out, true);
        }
    }
    (out, false)
}

/// The longest prefix of `s` that takes at most `budget` bytes as a JSON string; true if cut.
fn keep_str(s: &str, budget: usize) -> (String, bool) {
    if json_str_len(s) <= budget {
        return (s.to_string(), false);
    }
    let mut used = 2;
    let mut end = 0;
    for (i, c) in s.char_indices() {
        used += json_char_len(c);
        if used > budget {
            break;
        }
        end = i + c.len_utf8();
    }
    (s[..end].to_string(), true)
}

/// Bytes of one character in a JSON string as serde_json writes it.
fn json_char_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\u{8}' | '\u{c}' | '\n' | '\r' | '\t' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

fn json_str_len(s: &str) -> usize {
    2 + s.chars().map(json_char_len).sum::<usize>()
}

struct Count(usize);

impl io::Write for Count {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0 += b.len();
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Bytes of compact JSON, counted without building it.
fn json_size<T: Serialize>(v: &T) -> usize {
    let mut c = Count(0);
    match serde_json::to_writer(&mut c, v) {
        Ok(()) => c.0,
        Err(_) => usize::MAX / 4,
    }
}

fn finish(t: Target, reply: Option<Reply>) -> (Evidence, Option<Service>) {
    let mut e = t.evidence;
    let Some(r) = reply else { return (e, None) };
    if r.key != (e.pid, e.start_time) {
        log::error!(
            "evidence reader answered for {:?} when {} was asked; recorded as unreadable",
            r.key,
            e.pid
        );
        return (e, None);
    }
    let service = r.service.map(|crate::observe::evidence::ServiceRead { listen, cwd, env }| {
        let mut truncated = false;
        let cwd = cwd.map(|c| {
            let (c, cut) = keep_str(&c, EXE_KEEP);
            truncated |= cut;
            c
        });
        let env = env.map(|(raw, more)| {
            let (vars, cut) = keep_args(&raw, ENV_KEEP);
            truncated |= more || cut;
            vars
        });
        Service { pid: e.pid, start_time: e.start_time, listen, cwd, env, truncated }
    });
    if let Some(exe) = r.exe {
        let (exe, cut) = keep_str(&exe, EXE_KEEP);
        e.exe = Some(exe);
        e.truncated |= cut;
    }
    if let Some((raw, more)) = r.cmdline {
        let (args, cut) = keep_args(&raw, CMDLINE_KEEP);
        e.cmdline = Some(args);
        e.truncated |= more || cut;
        e.unreadable = false;
    }
    (e, service)
}

/// A target waiting for its answer from the reader of `lane`; `sent` is false when it will not
/// be read.
struct InFlight {
    target: Target,
    reserve: usize,
    sent: bool,
    lane: usize,
}

struct Walk<'a> {
    pool: MutexGuard<'a, Pool>,
    until: Instant,
    /// A thread could not be started during this walk: do not try again for every target.
    spawn_failed: bool,
    /// Lanes this walk uses, and the one the next target goes to.
    lanes: usize,
    next: usize,
    listening: Option<Arc<Listening>>,
}

impl Walk<'_> {
    /// Start a reader for `lane`, unless that could make more than `MAX_STUCK` stuck: the
    /// readers of the other lanes count too, since each of them can still be left behind.
    fn start(&mut self, lane: usize) -> Result<(), String> {
        self.pool.stuck.retain(|s| !s.lock().done);
        let others = self.pool.workers.iter().enumerate().filter(|&(l, w)| l != lane && w.is_some()).count();
        if self.pool.stuck.len() + others >= MAX_STUCK {
            return Err(format!(
                "{} readers are stuck in the kernel and {others} more may be (at most {MAX_STUCK})",
                self.pool.stuck.len()
            ));
        }
        self.pool.workers[lane] = Some(spawn().map_err(|e| format!("cannot start a reader thread ({e})"))?);
        Ok(())
    }

    /// The reader of `lane`, started if there is none and the limits allow.
    fn worker(&mut self, lane: usize) -> Option<&Worker> {
        if self.pool.workers[lane].is_none() && !self.spawn_failed {
            if let Err(e) = self.start(lane) {
                log::warn!("evidence: {e}; the rest is unreadable");
                self.spawn_failed = true;
            }
        }
        self.pool.workers[lane].as_ref()
    }

    /// Use a second lane when the walk is large, there is a second core and its reader runs or
    /// can be started now (within the same limits); otherwise the first lane takes everything.
    fn widen(&mut self, targets: usize) {
        if targets < LANES_FROM || !crate::observe::procs::reader::several_cores() {
            return;
        }
        if self.pool.workers[1].is_none() {
            if let Err(e) = self.start(1) {
                log::debug!("evidence: one reader for this walk: {e}");
                return;
            }
        }
        self.lanes = LANES;
    }

    /// A reader left behind is stuck on this target: reading it again would only strand another.
    fn stuck_on(&self, key: (Pid, u64)) -> bool {
        self.pool.stuck.iter().any(|s| {
            let s = s.lock();
            !s.done && s.current == Some(key)
        })
    }

    /// Hand a target to the reader of `lane`; false when it will not be read.
    fn send(&mut self, t: &Target, lane: usize) -> bool {
        if Instant::now() >= self.until || self.stuck_on(t.key()) {
            return false;
        }
        let listening = self.listening.clone().filter(|l| t.evidence.uids.iter().any(|u| l.uids.contains(u)));
        let job = || Job {
            pid: t.evidence.pid,
            start_time: t.evidence.start_time,
            creds: t.creds,
            listening: listening.clone(),
        };
        let Some(w) = self.worker(lane) else { return false };
        if w.jobs.send(job()).is_ok() {
            return true;
        }
        // The reader ended (it could not restore its credentials): once more with a new one.
        self.pool.workers[lane] = None;
        self.worker(lane).is_some_and(|w| w.jobs.send(job()).is_ok())
    }

    /// The lane for the next target.
    fn lane(&mut self) -> usize {
        let l = self.next % self.lanes;
        self.next = self.next.wrapping_add(1);
        l
    }

    /// Stop waiting for the reader of `lane`; it is left where it is.
    fn abandon(&mut self, lane: usize, pid: Pid) {
        if let Some(w) = self.pool.workers[lane].take() {
            let mut s = w.slot.lock();
            s.abandoned = true;
            if !s.done {
                log::warn!(
                    "evidence: reading pid {pid} did not finish in time (it may wait on a lock the process \
                     holds); recorded as unreadable, that reader is left behind"
                );
                drop(s);
                self.pool.stuck.push(w.slot.clone());
            }
        }
    }
}

/// Read the evidence of every target, in order, within the bounds above and before `until`.
/// `since`: the pid counter read before the observation the targets come from. The targets are
/// made as the walk takes them: only those that fit the marker are ever built (the sandbox
/// chooses how many there are), the rest are counted; `count` is how many `targets` yields.
pub fn gather(
    targets: impl Iterator<Item = Target>,
    count: usize,
    until: Instant,
    since: Option<Pid>,
) -> Gathered {
    let listening = listening_table();
    let mut walk = Walk { pool: pool(), until, spawn_failed: false, lanes: 1, next: 0, listening };
    walk.widen(count);
    let mut targets = targets.peekable();
    let mut taken = 0;
    let mut out = Gathered::default();
    let mut used = 2; // []
    let mut reserved = 0;
    let mut flight: VecDeque<InFlight> = VecDeque::new();
    loop {
        while flight.len() < WINDOW {
            let Some(next) = targets.peek() else { break };
            let reserve = next.reserve();
            if used + reserved + reserve > MARKER_BUDGET {
                break;
            }
            let Some(target) = targets.next() else { break };
            taken += 1;
            let lane = walk.lane();
            let sent = walk.send(&target, lane);
            reserved += reserve;
            flight.push_back(InFlight { target, reserve, sent, lane });
        }
        let Some(head) = flight.pop_front() else {
            // Nothing in flight and the next does not fit (or there is none): the rest is counted.
            out.omitted = count.saturating_sub(taken) as u64;
            break;
        };
        let reply = if head.sent { wait(&mut walk, &head, &mut flight) } else { None };
        reserved -= head.reserve;
        let (e, service) = finish(head.target, reply);
        used += json_size(&e) + usize::from(!out.processes.is_empty());
        out.processes.push(e);
        if let Some(s) = service.filter(|_| out.services.len() < MAX_SERVICES) {
            out.services.push(s);
        }
    }
    out.bytes = used;
    drop_reused(&mut out, since);
    out
}

/// The listening sockets by inode, and the UIDs that made them: only a target with one of those
/// UIDs has its descriptors looked at (a walk of a thousand processes, none of which could own
/// one, costs nothing more). A socket is its maker's: a process that holds one another user made
/// (a server that bound as root and dropped to its own user) is not recognised by it, and its
/// first process, which bound it, is.
pub(super) struct Listening {
    pub(super) by_inode: HashMap<u64, Endpoint>,
    uids: Vec<u32>,
}

/// The listening sockets of the namespace by inode, for the walk to recognise its targets'
/// descriptors; None when nothing listens or the tables cannot be read (then no service is
/// recorded, and a hand-over finds none to start: never a reason to fail the freeze).
fn listening_table() -> Option<Arc<Listening>> {
    match crate::observe::sockets::listening() {
        Ok((l, _)) if l.is_empty() => None,
        Ok((l, cut)) => {
            if cut {
                log::warn!(
                    "evidence: the socket tables were cut at their bound; a service may go unrecorded"
                );
            }
            let mut uids: Vec<u32> = l.iter().map(|s| s.uid).collect();
            uids.sort_unstable();
            uids.dedup();
            Some(Arc::new(Listening { by_inode: l.into_iter().map(|s| (s.inode, s.at)).collect(), uids }))
        }
        Err(e) => {
            log::warn!("evidence: cannot read the socket tables ({e}); no service is recorded");
            None
        }
    }
}

/// Record a process first seen alive after the walk, from the observation alone, within the
/// same budget (what does not fit is counted).
pub fn add_late(g: &mut Gathered, t: Target) {
    let size = json_size(&t.evidence) + usize::from(!g.processes.is_empty());
    if g.bytes.max(2) + size > MARKER_BUDGET {
        g.omitted += 1;
        return;
    }
    g.bytes = g.bytes.max(2) + size;
    g.processes.push(t.evidence);
}

/// The answer for `head`, or None once its reader is left behind; what was handed to that
/// reader after it goes to a new one in its lane. Each reader answers in the order it was asked,
/// and every target asked of it before `head` has had its answer.
fn wait(walk: &mut Walk, head: &InFlight, flight: &mut VecDeque<InFlight>) -> Option<Reply> {
    let left = walk.until.saturating_duration_since(Instant::now());
    let got = match walk.pool.workers[head.lane].as_ref() {
        Some(w) => w.replies.recv_timeout(READ_WAIT.min(left)),
        None => Err(RecvTimeoutError::Disconnected),
    };
    match got {
        Ok(r) => Some(r),
        Err(_) => {
            walk.abandon(head.lane, head.target.evidence.pid);
            for f in flight.iter_mut().filter(|f| f.sent && f.lane == head.lane) {
                f.sent = walk.send(&f.target, f.lane);
            }
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lengths_match_serde_json() {
        for s in
            ["", "a", "é", "\u{fffd}\u{fffd}", "\"\\", "\n\t\r\u{8}\u{c}", "\u{1}\u{1f}\u{7f}", "\u{2028}x"]
        {
            assert_eq!(json_str_len(s), serde_json::to_string(s).unwrap().len(), "{s:?}");
        }
    }

    #[test]
    fn command_lines_are_cut_to_the_budget() {
        assert_eq!(keep_args(b"", 100), (vec![], false));
        assert_eq!(
            keep_args(b"sh\0-c\0\0x\0", 100),
            (vec!["sh".into(), "-c".into(), "".into(), "x".into()], false)
        );
        // 0xFF decodes to U+FFFD, three bytes of JSON each.
        let raw: Vec<u8> = [b"sh\0".as_slice(), &[0xFF; 5000]].concat();
        let (args, cut) = keep_args(&raw, CMDLINE_KEEP);
        assert!(cut);
        let json = serde_json::to_string(&args).unwrap();
        assert!(json.len() <= CMDLINE_KEEP && json.len() > CMDLINE_KEEP - 4, "{}", json.len());
        assert_eq!(args[0], "sh");
        // Control bytes take six bytes of JSON each.
        let (args, cut) = keep_args(&[1u8; 3000], 1000);
        assert!(cut && serde_json::to_string(&args).unwrap().len() <= 1000);
        // Nothing fits: nothing kept.
        assert_eq!(keep_args(b"abc", 3), (vec![], true));
    }

    #[test]
    fn reads_this_process() {
        let me = Reader::default()
            .read(crate::kernel::process::getpid(), crate::observe::procs::model::Detail::Light)
            .unwrap()
            .unwrap();
        let got = gather(
            [Target::of(&me, Reasons::of(&[crate::decide::taint::Reason::Uid]))].into_iter(),
            1,
            Instant::now() + Duration::from_secs(5),
            None,
        );
        assert_eq!(got.omitted, 0);
        let e = &got.processes[0];
        assert!(!e.unreadable && e.cmdline.as_ref().is_some_and(|c| !c.is_empty()), "{e:?}");
        assert!(e.exe.is_some(), "{e:?}");
    }

    #[test]
    fn past_the_deadline_nothing_is_read_and_everything_is_recorded() {
        let me = Reader::default()
            .read(crate::kernel::process::getpid(), crate::observe::procs::model::Detail::Light)
            .unwrap()
            .unwrap();
        let got = gather((0..3).map(|_| Target::of(&me, Reasons::default())), 3, Instant::now(), None);
        assert_eq!(got.processes.len(), 3);
        assert!(got.processes.iter().all(|e| e.unreadable && e.cmdline.is_none()));
    }
}

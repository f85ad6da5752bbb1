//! Freeze requests and their results. Each `quiesce freeze` writes a request file of its own in
//! `requests/`, so no request overwrites another; the init takes each away by rename before it
//! reads it, runs one freeze per request, and answers each in `results/REQUEST_ID.json`, where
//! that client alone looks. A freeze signal with no request file (`docker kill -s USR1`) makes
//! one freeze with no nonce.
//!
//! A request is taken only on a signal from the process it names: its id carries the client's
//! pid, and the init takes a request when that pid sent the freeze signal. A bare signal (from
//! outside, or from any other process) never takes a request written before it, so a request
//! planted by a root process of the container cannot ride the orchestrator's signal to set the
//! nonce, the attested paths or the client of its freeze. Standard signals coalesce, so a client
//! signals again while its request waits (`signal_until_taken`).

use crate::kernel::{
    process::{self, Pid},
    random,
};
use crate::state::files::FileError;
use crate::state::launches::Launch;
use crate::state::{self, dir::FreezeState, dir::StateDir, dir::Status};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub const REQUESTS: &str = "requests";
pub const RESULTS: &str = "results";
/// A nonce longer than this is refused: it is carried into the marker.
pub const MAX_NONCE: usize = 1024;
/// Attest paths one request may name at most.
pub const MAX_ATTEST: usize = 16;
/// Requests taken per wake; the rest wait for the next pass of the init's loop.
const PER_WAKE: usize = 16;
/// Directory entries looked at per wake, however many there are.
const SCAN_LIMIT: usize = 4096;
/// Results kept; older ones are pruned.
const KEEP_RESULTS: usize = 64;
/// A request taken by the init; clients never write names starting with a dot.
const TAKEN: &str = ".taken.";
/// Client pids of recent requests, remembered to tell their signals from bare ones.
const SERVED: usize = 64;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Request {
    pub nonce: Option<String>,
    pub request_id: String,
    /// The client's pid: its signal may arrive after its request was taken, and must not then
    /// count as a bare signal.
    #[serde(default)]
    pub pid: Option<Pid>,
    /// The client's start time (clock ticks since boot), as it read it itself: with the pid, its
    /// identity (a later process with that pid is another one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<u64>,
    /// Not a freeze: `quiesce exec` recording its launch (see `launches`), answered once taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch: Option<Launch>,
    /// Paths to attest after this freeze besides the init's own (within those it allows).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attest: Vec<String>,
}

/// A request id: 32 lowercase hex digits, the first 16 the client's clock in nanoseconds, so
/// that names sort by arrival, the next 8 the client's pid, the last 8 random. It is used as a
/// file name, so nothing else is accepted.
pub fn valid_id(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The pid a request id names (None: not an id, or pid 0, which no client in the namespace has
/// and a bare signal from outside carries).
pub fn id_pid(id: &str) -> Option<Pid> {
    let pid = id.get(16..24).filter(|_| valid_id(id)).and_then(|h| u32::from_str_radix(h, 16).ok())?;
    Pid::try_from(pid).ok().filter(|&p| p > 0)
}

fn new_request_id(pid: Pid) -> io::Result<String> {
    let mut rnd = [0u8; 4];
    random::getrandom(&mut rnd)?;
    Ok(format!("{:016x}{:08x}{}", now_nanos(), pid as u32, state::dir::hex(&rnd)))
}

fn now_nanos() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// A request no signal of its client took within this long of the init first seeing it is
/// removed (its client gave up or died; one of a live client is signalled again long before).
/// Timed by the init's monotonic clock, never by the wall-clock time in the request's name: the
/// wall clock set forward between a client's write and its signal would make a waiting request
/// look abandoned (its client then waits for an answer that never comes), and set back, would
/// keep an abandoned one for ever.
const UNCLAIMED: Duration = Duration::from_secs(120);

/// Parse a request file named `name`: JSON, its id equal to its name, a bounded nonce.
pub fn parse_request(bytes: &[u8], name: &str) -> Result<Request, String> {
    let r: Request = serde_json::from_slice(bytes).map_err(|e| format!("not a freeze request: {e}"))?;
    if r.request_id != name || !valid_id(&r.request_id) {
        return Err("its request_id is not its file name".into());
    }
    if r.pid.is_none() || r.pid != id_pid(name) {
        return Err("its pid is not the one its name carries".into());
    }
    if r.nonce.as_ref().is_some_and(|n| n.len() > MAX_NONCE) {
        return Err(format!("its nonce is longer than {MAX_NONCE} bytes"));
    }
    if let Some(l) = &r.launch {
        l.check()?;
    }
    if r.attest.len() > MAX_ATTEST || r.attest.iter().any(|p| p.len() > 4096) {
        return Err(format!("it names more than {MAX_ATTEST} attest paths, or one longer than 4096 bytes"));
    }
    Ok(r)
}

/// The client side: write a freeze request of our own and return its id. `start_time`: this
/// process's own, which makes it the init's own during the freeze (not another process that
/// takes its pid).
pub fn submit(
    state: &StateDir,
    nonce: Option<String>,
    start_time: Option<u64>,
    attest: Vec<String>,
) -> Result<String, String> {
    if nonce.as_ref().is_some_and(|n| n.len() > MAX_NONCE) {
        return Err(format!("--nonce is longer than {MAX_NONCE} bytes: use a shorter one"));
    }
    if attest.len() > MAX_ATTEST || attest.iter().any(|p| p.len() > 4096) {
        return Err(format!("at most {MAX_ATTEST} --attest paths of at most 4096 bytes each"));
    }
    submit_request(state, nonce, start_time, None, attest)
}

/// The client side: write a launch record as a request and return its id.
pub fn submit_launch(state: &StateDir, launch: Launch) -> Result<String, String> {
    submit_request(state, None, None, Some(launch), Vec::new())
}

fn submit_request(
    state: &StateDir,
    nonce: Option<String>,
    start_time: Option<u64>,
    launch: Option<Launch>,
    attest: Vec<String>,
) -> Result<String, String> {
    let dir = state.sub(REQUESTS)?;
    let pid = process::getpid();
    let id = new_request_id(pid).map_err(|e| format!("cannot make a request id: {e}"))?;
    let req = Request { nonce, request_id: id.clone(), pid: Some(pid), start_time, launch, attest };
    let body = serde_json::to_vec(&req).map_err(|e| e.to_string())?;
    // The temp file's name starts with a dot, so the init never takes a half-written request.
    // Not synced: a request need not outlive a crash (the init empties requests/ at its start),
    // and each fsync is a sleep that, under a fork storm, waits long for the CPU again.
    dir.write_atomic_deferred(&id, &body, 0o644)
        .map_err(|e| format!("cannot write the request in {}: {e} (run this as root)", dir.path.display()))?;
    Ok(id)
}

/// The client side: whether the init has taken request `id` (it renames it away first).
pub fn taken(state: &StateDir, id: &str) -> Result<bool, String> {
    let dir = state.sub(REQUESTS)?;
    match dir.stat(id) {
        Ok(_) => Ok(false),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(format!("cannot look for request {}: {e}", dir.file(id).display())),
    }
}

/// The client side: take back a request whose signal could not be sent.
pub fn withdraw(state: &StateDir, id: &str) -> Result<(), String> {
    let dir = state.sub(REQUESTS)?;
    dir.remove(id).map_err(|e| format!("cannot withdraw request {}: {e}", dir.file(id).display()))
}

/// The client side: the final result of request `id`, once the init wrote it.
pub fn read_result(results: &StateDir, id: &str) -> Result<Option<Status>, String> {
    match results.read(&format!("{id}.json")) {
        Ok(b) => state::dir::parse_status(&b).map(Some),
        Err(FileError::Missing(_)) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// What `Intake::next` hands the init's loop.
#[derive(Debug, PartialEq, Eq)]
pub enum Job {
    /// No freeze to run now.
    Idle,
    /// A freeze asked for by a freeze signal with no request of its sender: no nonce, no client.
    Bare,
    /// A freeze asked for by this request.
    Request(Request),
}

/// The init side.
pub struct Intake {
    requests: StateDir,
    results: StateDir,
    /// Freezes to run, one per pass of the init's loop (never `Job::Idle`).
    queue: VecDeque<Job>,
    /// The last take left requests behind.
    more: bool,
    /// Requests must be looked for once the queue is empty.
    look: bool,
    /// Senders of freeze signals whose requests may still wait.
    senders: Vec<Pid>,
    served: VecDeque<Pid>,
    /// Launch records taken and not yet handed to the init (request id, record).
    launches: Vec<(String, Launch)>,
    /// Requests no signal claimed yet, and when a take first listed each.
    unclaimed: HashMap<String, Instant>,
}

impl Intake {
    /// Fresh `requests/` and `results/`: what a previous init left answers nothing of ours.
    /// Removed through the state dir's descriptor: its path may lead elsewhere by now. Both are
    /// root's alone: a sandbox process that could list `requests/` would see a freeze coming
    /// (its request renamed away) before the freeze's start point.
    pub fn new(state: &StateDir) -> Result<Intake, String> {
        for sub in [REQUESTS, RESULTS] {
            state.remove_tree(sub).map_err(|e| format!("stale {sub}/: {e}"))?;
        }
        Ok(Intake {
            requests: state.ensure_sub(REQUESTS)?,
            results: state.ensure_sub(RESULTS)?,
            queue: VecDeque::new(),
            more: false,
            look: false,
            senders: Vec::new(),
            served: VecDeque::new(),
            launches: Vec::new(),
            unclaimed: HashMap::new(),
        })
    }

    /// The next freeze to run. `signal_senders` are the pids that sent the freeze signal since
    /// the last call. Requests are looked for after a signal or when the last take left some,
    /// and only once the freezes already taken have run; only the requests of the senders are
    /// taken.
    pub fn next(&mut self, signal_senders: &[Pid]) -> Job {
        let fresh: Vec<Pid> = signal_senders.iter().copied().filter(|p| !self.senders.contains(p)).collect();
        for &p in &fresh {
            if self.senders.len() < SERVED {
                self.senders.push(p);
            }
        }
        self.look |= !signal_senders.is_empty();
        if self.look && self.queue.is_empty() {
            let (listed, waiting) = self.take();
            // A signal with no request of its sender, from a sender no earlier take served (a
            // client signals again while its request waits, and may once more after), is bare.
            if fresh.iter().any(|p| !listed.contains(p) && !self.served.contains(p)) {
                self.queue.push_back(Job::Bare);
            }
            self.senders.retain(|p| waiting.contains(p));
            self.look = self.more;
        }
        self.queue.pop_front().unwrap_or(Job::Idle)
    }

    /// Freezes are waiting: the init's loop must come round again without sleeping.
    pub fn busy(&self) -> bool {
        !self.queue.is_empty() || self.look
    }

    /// Take up to PER_WAKE requests of the pending senders, oldest first. Returns the senders
    /// that had a request listed, and those whose requests still wait.
    fn take(&mut self) -> (Vec<Pid>, Vec<Pid>) {
        // Listed through the descriptor opened at start: the path may lead to a directory the
        // sandbox user made, which could hide requests or name its own.
        let (listed, left) = match self.requests.list(SCAN_LIMIT) {
            Ok(l) => l,
            Err(e) => {
                log::error!("cannot list freeze requests in {}: {e}", self.requests.path.display());
                self.more = false;
                return (Vec::new(), Vec::new());
            }
        };
        // A name that is not UTF-8 is not one a client writes: left alone (only root can write here).
        let mut names: Vec<String> = listed.into_iter().filter_map(|n| n.into_string().ok()).collect();
        // Leftovers of a take that failed half-way are removed; clients' temp files are theirs.
        for n in names.iter().filter(|n| n.starts_with(TAKEN)) {
            self.remove(n);
        }
        names.retain(|n| !n.starts_with('.'));
        names.sort();
        // A request waits for its own client's signal; one that is no request's name, or that
        // no signal claimed for long, goes.
        let now = Instant::now();
        let (mut mine, mut other): (Vec<String>, Vec<String>) =
            names.into_iter().partition(|n| id_pid(n).is_some_and(|p| self.senders.contains(&p)));
        // A set, not the list: a root agent may fill the directory, and a scan of the list per
        // remembered name would grow with the square of it.
        let listed: std::collections::HashSet<&String> = other.iter().collect();
        self.unclaimed.retain(|n, _| listed.contains(n));
        for n in &other {
            self.unclaimed.entry(n.clone()).or_insert(now);
        }
        other.retain(|n| {
            !valid_id(n) || self.unclaimed.get(n).is_some_and(|&seen| now.duration_since(seen) > UNCLAIMED)
        });
        for n in &other {
            log::warn!("freeze request {n} removed: no signal of the process it names took it");
            self.remove(n);
            self.unclaimed.remove(n);
        }
        let listed: Vec<Pid> = mine.iter().filter_map(|n| id_pid(n)).collect();
        let rest = if mine.len() > PER_WAKE { mine.split_off(PER_WAKE) } else { Vec::new() };
        let mut waiting: Vec<Pid> = rest.iter().filter_map(|n| id_pid(n)).collect();
        if left {
            // Not every name was listed: every sender may still have one waiting.
            waiting = self.senders.clone();
        }
        self.more = !waiting.is_empty();
        for name in mine {
            let taken = format!("{TAKEN}{name}");
            // Taken away before it is read: what is read is what was there, once.
            match self.requests.rename(&name, &taken) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => {
                    log::error!("cannot take freeze request {name}: {e}");
                    continue;
                }
            }
            let parsed =
                self.requests.read(&taken).map_err(|e| e.to_string()).and_then(|b| parse_request(&b, &name));
            self.remove(&taken);
            match parsed {
                Ok(mut req) => {
                    if let Some(pid) = req.pid {
                        if self.served.len() >= SERVED {
                            self.served.pop_front();
                        }
                        self.served.push_back(pid);
                    }
                    match req.launch.take() {
                        Some(l) => self.launches.push((req.request_id, l)),
                        None => self.queue.push_back(Job::Request(req)),
                    }
                }
                Err(e) => {
                    log::warn!("freeze request {name} refused: {e}");
                    if valid_id(&name) {
                        self.answer(&refusal(&name, &e));
                    }
                }
            }
        }
        (listed, waiting)
    }

    fn remove(&self, name: &str) {
        if let Err(e) = self.requests.remove(name) {
            log::warn!("cannot remove {}: {e}", self.requests.file(name).display());
        }
    }

    /// The launch records taken since the last call; each is to be answered with
    /// `answer_launch` once the init holds it.
    pub fn take_launches(&mut self) -> Vec<(String, Launch)> {
        std::mem::take(&mut self.launches)
    }

    /// Tell the `quiesce exec` that sent request `id` that its launch is recorded.
    pub fn answer_launch(&self, id: &str) {
        self.answer(&Status {
            id: id.to_string(),
            request_id: Some(id.to_string()),
            state: FreezeState::LaunchRecorded,
            ..Status::default()
        });
    }

    /// Write a final status where the client that asked for it looks, then prune old results.
    pub fn answer(&self, st: &Status) {
        let Some(id) = st.request_id.as_deref().filter(|i| valid_id(i)) else { return };
        let name = format!("{id}.json");
        let written = state::dir::status_json(st).and_then(|b| self.results.write_atomic(&name, &b, 0o644));
        if let Err(e) = written {
            log::error!("cannot write {}: {e}", self.results.file(&name).display());
        }
        self.prune();
    }

    /// Keep the newest KEEP_RESULTS results. Listed, looked at and removed through the results
    /// directory's descriptor: what the path leads to now may be any directory of root's.
    fn prune(&self) {
        let names = match self.results.list(SCAN_LIMIT) {
            Ok((n, _)) => n,
            Err(e) => {
                log::warn!("cannot list {} to prune it: {e}", self.results.path.display());
                return;
            }
        };
        let mut all: Vec<((i64, i64), String)> = names
            .into_iter()
            .filter_map(|n| n.into_string().ok())
            .filter(|n| !n.starts_with('.'))
            .filter_map(|n| {
                let st = self.results.stat(&n).ok()?;
                (st.st_mode & libc::S_IFMT == libc::S_IFREG).then_some(((st.st_mtime, st.st_mtime_nsec), n))
            })
            .collect();
        if all.len() <= KEEP_RESULTS {
            return;
        }
        all.sort();
        for (_, n) in &all[..all.len() - KEEP_RESULTS] {
            if let Err(e) = self.results.remove(n) {
                log::warn!("cannot prune {}: {e}", self.results.file(n).display());
            }
        }
    }
}

/// The answer to a request that could not be read.
fn refusal(request_id: &str, why: &str) -> Status {
    Status {
        id: state::dir::new_id().unwrap_or_default(),
        request_id: Some(request_id.to_string()),
        nonce: None,
        state: FreezeState::Failed,
        reason: Some(format!("request refused: {why}")),
        survivors: vec![],
        killed: 0,
        unstopped: 0,
        phases_ms: Default::default(),
        history: 0,
        unreaped_zombies: 0,
        started_unix_ms: 0,
        attestation: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::path::PathBuf;

    fn state_dir(tag: &str) -> (PathBuf, StateDir) {
        let d = std::env::temp_dir().join(format!("quiesce-req-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        let sd = StateDir::create(&d).unwrap();
        (d, sd)
    }

    fn done(req: &Request) -> Status {
        Status { state: FreezeState::Quiescent, ..refusal(&req.request_id, "") }
    }

    #[test]
    fn every_request_is_taken_once_and_answered_on_its_own() {
        let (d, sd) = state_dir("many");
        let mut intake = Intake::new(&sd).unwrap();
        let ids: Vec<String> =
            (0..40).map(|i| submit(&sd, Some(format!("n{i}")), None, vec![]).unwrap()).collect();
        let me = process::getpid();
        let mut got = Vec::new();
        let mut senders = vec![me];
        for _ in 0..100 {
            match intake.next(&senders) {
                Job::Request(r) => got.push(r),
                Job::Bare => panic!("a bare freeze while requests waited"),
                Job::Idle => break,
            }
            senders.clear();
            assert!(intake.queue.len() < PER_WAKE, "at most one take's worth waits");
        }
        assert!(!intake.busy());
        let got_ids: Vec<&str> = got.iter().map(|r| r.request_id.as_str()).collect();
        assert_eq!(got_ids, ids.iter().map(String::as_str).collect::<Vec<_>>(), "oldest first, each once");
        // The client's late signal is not a bare one; a signal from elsewhere is.
        assert_eq!(intake.next(&[me]), Job::Idle);
        assert_eq!(intake.next(&[0]), Job::Bare);
        for r in &got {
            intake.answer(&done(r));
        }
        let results = sd.sub(RESULTS).unwrap();
        let last = &got[got.len() - 1];
        assert_eq!(
            read_result(&results, &last.request_id).unwrap().unwrap().request_id,
            Some(last.request_id.clone())
        );
        // Old results are pruned.
        assert!(fs::read_dir(&results.path).unwrap().count() <= KEEP_RESULTS);
        assert_eq!(fs::read_dir(sd.file(REQUESTS)).unwrap().count(), 0);
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_bad_request_is_answered_as_refused() {
        let (d, sd) = state_dir("bad");
        let mut intake = Intake::new(&sd).unwrap();
        // Each names pid 123 (0x7b), which sends the signal.
        let id = "00000000000000010000007b00000001";
        fs::write(sd.file(REQUESTS).join(id), b"{not json").unwrap();
        let other = "00000000000000020000007b00000002";
        fs::write(sd.file(REQUESTS).join(other), format!(r#"{{"nonce":null,"request_id":"{id}"}}"#)).unwrap();
        assert_eq!(intake.next(&[123]), Job::Idle);
        let results = sd.sub(RESULTS).unwrap();
        for i in [id, other] {
            let st = read_result(&results, i).unwrap().unwrap();
            assert_eq!(st.state, FreezeState::Failed);
            assert!(st.reason.unwrap().contains("request refused"));
        }
        // A link planted as a request is refused, not followed.
        let third = "00000000000000030000007b00000003";
        std::os::unix::fs::symlink("/etc/passwd", sd.file(REQUESTS).join(third)).unwrap();
        assert_eq!(intake.next(&[123]), Job::Idle);
        assert!(read_result(&results, third).unwrap().unwrap().reason.unwrap().contains("symlink"));
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_signal_takes_only_the_requests_of_its_sender() {
        let (d, sd) = state_dir("senders");
        let mut intake = Intake::new(&sd).unwrap();
        let me = process::getpid();
        // Planted: a request naming another process (a root process of the container may write
        // one), and one naming pid 0, which a bare signal from outside carries.
        let write = |id: &str, pid: Pid| {
            let body = format!(r#"{{"nonce":"planted","request_id":"{id}","pid":{pid}}}"#);
            fs::write(sd.file(REQUESTS).join(id), body).unwrap();
        };
        let planted = format!("{:016x}{:08x}00000001", now_nanos(), me as u32 + 1);
        write(&planted, me + 1);
        let zero = format!("{:016x}0000000000000002", now_nanos());
        write(&zero, 0);
        let mine = submit(&sd, Some("mine".into()), None, vec![]).unwrap();
        // A bare signal takes none of them: a freeze with no request.
        assert_eq!(intake.next(&[0]), Job::Bare);
        assert_eq!(intake.next(&[]), Job::Idle);
        assert!(!taken(&sd, &planted).unwrap() && !taken(&sd, &mine).unwrap());
        // The client's signal takes its own request only.
        assert!(matches!(intake.next(&[me]), Job::Request(r) if r.request_id == mine));
        assert!(taken(&sd, &mine).unwrap());
        assert!(!taken(&sd, &planted).unwrap() && !taken(&sd, &zero).unwrap());
        // Its process's signal takes the planted one (then it is that process's own request).
        assert!(matches!(intake.next(&[me + 1]), Job::Request(r) if r.nonce.as_deref() == Some("planted")));
        // A request whose name and body disagree on the pid is refused.
        let liar = format!("{:016x}{:08x}00000003", now_nanos(), me as u32);
        write(&liar, me + 1);
        assert_eq!(intake.next(&[me]), Job::Idle);
        let results = sd.sub(RESULTS).unwrap();
        assert!(read_result(&results, &liar).unwrap().unwrap().reason.unwrap().contains("pid"));
        // One no signal claims for long goes, however old its name says it is.
        let old = format!("{:016x}{:08x}00000004", 1u64, me as u32 + 2);
        write(&old, me + 2);
        assert_eq!(intake.next(&[0]), Job::Bare);
        assert!(!taken(&sd, &old).unwrap(), "a request first seen now stays");
        backdate(&mut intake, &old);
        assert_eq!(intake.next(&[0]), Job::Bare);
        assert!(taken(&sd, &old).unwrap(), "an unclaimed request is removed");
        assert!(!taken(&sd, &zero).unwrap(), "a fresh one stays");
        fs::remove_dir_all(d).unwrap();
    }

    /// As if the init had first seen request `id` longer ago than UNCLAIMED.
    fn backdate(intake: &mut Intake, id: &str) {
        let seen = intake.unclaimed.get_mut(id).expect("a request listed as unclaimed");
        *seen = seen.checked_sub(UNCLAIMED + Duration::from_secs(1)).expect("a clock older than UNCLAIMED");
    }

    #[test]
    fn a_request_written_before_the_wall_clock_moved_waits_for_its_client() {
        let (d, sd) = state_dir("clock");
        let mut intake = Intake::new(&sd).unwrap();
        let me = process::getpid();
        let hour = 3_600_000_000_000u64;
        // Written by its client, which has not signalled yet; the clock then set forward or back
        // by an hour: the name says an hour ago, or an hour ahead.
        let write = |id: &str, pid: Pid| {
            let body = format!(r#"{{"nonce":"waits","request_id":"{id}","pid":{pid}}}"#);
            fs::write(sd.file(REQUESTS).join(id), body).unwrap();
        };
        let behind = format!("{:016x}{:08x}00000001", now_nanos() - hour, me as u32 + 1);
        let ahead = format!("{:016x}{:08x}00000002", now_nanos() + hour, me as u32 + 2);
        write(&behind, me + 1);
        write(&ahead, me + 2);
        // Another client's freeze takes its own request and leaves both to their clients.
        let mine = submit(&sd, Some("mine".into()), None, vec![]).unwrap();
        assert!(matches!(intake.next(&[me]), Job::Request(r) if r.request_id == mine));
        assert!(!taken(&sd, &behind).unwrap() && !taken(&sd, &ahead).unwrap());
        assert!(matches!(intake.next(&[me + 1]), Job::Request(r) if r.request_id == behind));
        // One whose client never signals goes once the init's own clock says it waited too long.
        assert_eq!(intake.next(&[0]), Job::Bare);
        assert!(!taken(&sd, &ahead).unwrap());
        backdate(&mut intake, &ahead);
        assert_eq!(intake.next(&[0]), Job::Bare);
        assert!(taken(&sd, &ahead).unwrap(), "a request an hour ahead is removed once unclaimed");
        assert!(intake.unclaimed.is_empty(), "nothing is remembered of requests gone");
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn ids_and_nonces_are_checked() {
        let id = new_request_id(4242).unwrap();
        assert!(valid_id(&id));
        assert_eq!(id_pid(&id), Some(4242));
        assert_eq!(id_pid("0000000000000001000000000000000f"), None, "pid 0 is no client's");
        assert!(!valid_id("../../etc/passwd000000000000000000"));
        assert!(!valid_id("ABCDEF00000000000000000000000000"));
        let id = "0123456789abcdef0123456789abcdef";
        let long = "x".repeat(MAX_NONCE + 1);
        let body = serde_json::to_vec(&Request {
            nonce: Some(long),
            request_id: id.into(),
            pid: id_pid(id),
            start_time: None,
            launch: None,
            attest: vec![],
        })
        .unwrap();
        assert!(parse_request(&body, id).unwrap_err().contains("nonce"));
    }
}

//! The attestation worker as the init sees it: started after a quiescent freeze when paths are
//! named, handed its job on a pipe, killed on its time budget, at the next freeze and at
//! shutdown (with everything else), reaped like any other child; what it said goes into
//! status.json. Nothing here hashes or walks: PID 1 only starts, watches and reaps.

use crate::attest::job::{self, Job};
use crate::attest::walk::Bounds;
use crate::kernel::{fdio, process::Pid, reap, signal};
use crate::state::dir::AttestationState;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

/// What the init was told to attest.
#[derive(Debug, Clone, Default)]
pub struct Setup {
    pub paths: Vec<PathBuf>,
    pub allow: Vec<PathBuf>,
    pub bounds: Bounds,
}

/// Past its own time bound, the worker gets this long to say so before it is killed.
const SLACK: Duration = Duration::from_secs(2);
/// How long a freeze waits for the worker it killed to be reaped.
const REAP_WAIT: Duration = Duration::from_millis(300);

pub struct Worker {
    pub pid: Pid,
    pub deadline: Instant,
    out: OwnedFd,
    killed_for: Option<String>,
}

/// An absolute path with no `.` or `..` in it, as text.
pub fn plain_path(p: &Path) -> Result<String, String> {
    let shown = p.display();
    if !p.is_absolute() {
        return Err(format!("attest path {shown} is not absolute: name it from /"));
    }
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(n) => out.push(n),
            _ => return Err(format!("attest path {shown} has '.' or '..' in it: name the tree itself")),
        }
    }
    out.to_str().map(str::to_string).ok_or_else(|| format!("attest path {shown} is not UTF-8"))
}

fn within(p: &str, tree: &str) -> bool {
    tree == "/" || p == tree || (p.starts_with(tree) && p.as_bytes().get(tree.len()) == Some(&b'/'))
}

/// Check the init's own paths at start (a bad one is refused before the command runs).
pub fn check_setup(s: &Setup) -> Result<(), String> {
    for p in s.paths.iter().chain(&s.allow) {
        plain_path(p)?;
    }
    Ok(())
}

/// The paths to attest after this freeze: the init's own and the request's, which must lie
/// within one of the init's trees; none nested in another (it would be listed twice). Known
/// before the marker is signed, which claims them. A refused request path is in the list all
/// the same, as given, with the refusal beside it: the marker then says an attestation was asked
/// for, and verify refuses without one rather than pass without it.
pub fn paths_for(s: &Setup, asked: &[String]) -> (Vec<String>, Option<String>) {
    let mut refused = None;
    let plain = |p: &Path, refused: &mut Option<String>| {
        plain_path(p).unwrap_or_else(|e| {
            refused.get_or_insert(e);
            p.to_string_lossy().into_owned()
        })
    };
    let allowed: Vec<String> = s.paths.iter().chain(&s.allow).map(|p| plain(p, &mut refused)).collect();
    let mut all: Vec<String> = s.paths.iter().map(|p| plain(p, &mut refused)).collect();
    for a in asked {
        let p = plain(Path::new(a), &mut refused);
        if !allowed.iter().any(|t| within(&p, t)) {
            refused.get_or_insert_with(|| {
                format!("{p} is not within the trees this init attests or allows: add it with --attest-allow")
            });
        }
        all.push(p);
    }
    all.sort();
    all.dedup();
    let outer: Vec<String> = all.clone();
    all.retain(|p| !outer.iter().any(|o| o != p && within(p, o)));
    (all, refused)
}

/// Start the worker with its job; the key's seed goes only through the pipe.
pub fn start(job: &Job) -> Result<Worker, String> {
    use std::process::{Command, Stdio};
    let mut body = serde_json::to_vec(job).map_err(|e| format!("cannot write the attestation job: {e}"))?;
    if body.len() > job::MAX_JOB {
        zeroize::Zeroize::zeroize(&mut body);
        return Err(format!("the attestation job is larger than {} bytes: name fewer paths", job::MAX_JOB));
    }
    let spawned = Command::new("/proc/self/exe")
        .arg(job::WORKER_FLAG)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            zeroize::Zeroize::zeroize(&mut body);
            return Err(format!("cannot start the attestation worker: {e}"));
        }
    };
    let pid = child.id() as Pid;
    // Smaller than a pipe's buffer: the write completes whether the worker reads or not.
    let written = child.stdin.take().map(|mut i| i.write_all(&body));
    zeroize::Zeroize::zeroize(&mut body);
    let out: Option<OwnedFd> = child.stdout.take().map(OwnedFd::from);
    let worker = |out| Worker {
        pid,
        deadline: Instant::now() + Duration::from_secs(job.bounds.seconds) + SLACK,
        out,
        killed_for: None,
    };
    match (written, out) {
        (Some(Ok(())), Some(out)) => {
            if let Err(e) = fdio::set_nonblocking(out.as_raw_fd()) {
                log::warn!("attestation worker {pid}: cannot make its pipe non-blocking: {e}");
            }
            Ok(worker(out))
        }
        (w, out) => {
            // Killed; the reaper takes it like any child.
            if let Err(e) = signal::kill(pid, libc::SIGKILL) {
                log::error!("cannot kill attestation worker {pid}: {e}");
            }
            let why = match w {
                Some(Err(e)) => format!("cannot hand the attestation worker its job: {e}"),
                _ => "the attestation worker has no pipes".into(),
            };
            drop(out);
            Err(why)
        }
    }
}

impl Worker {
    /// Kill it (an unreaped child: its pid cannot be anyone else's), saying why.
    pub fn kill(&mut self, why: String) {
        if self.killed_for.is_none() {
            if let Err(e) = signal::kill(self.pid, libc::SIGKILL) {
                log::error!("cannot kill attestation worker {}: {e}", self.pid);
            }
            self.killed_for = Some(why);
            // Its reaping is what is waited for now; the loop must not wake for it again.
            self.deadline = Instant::now() + Duration::from_secs(3600);
        }
    }

    /// Killed for a freeze that starts: reaped here within a short bound; Some(pid) when it
    /// was not, and the freeze must count it as the init's own.
    pub fn end_for_freeze(mut self) -> Option<Pid> {
        self.kill("a new freeze started".into());
        let until = Instant::now() + REAP_WAIT;
        loop {
            match reap::try_reap(self.pid) {
                Ok(Some(_)) => return None,
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(5)),
                Ok(None) => return Some(self.pid),
                Err(e) => {
                    log::warn!("attestation worker {}: {e}", self.pid);
                    return None;
                }
            }
        }
    }

    /// The attestation's state and reason once the worker was reaped with `code`.
    pub fn finish(self, code: i32) -> (AttestationState, Option<String>) {
        let mut buf = [0u8; job::SAID_MAX + 1];
        let n = fdio::read_some(&self.out, &mut buf).unwrap_or(0);
        let said = String::from_utf8_lossy(&buf[..n]).trim().to_string();
        if code == 0 && self.killed_for.is_none() {
            return (AttestationState::Attested, (!said.is_empty()).then_some(said));
        }
        let why = self.killed_for.or_else(|| (code == 1 && !said.is_empty()).then_some(said));
        (
            AttestationState::Failed,
            Some(why.unwrap_or_else(|| format!("the attestation worker ended with status {code}"))),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_paths_stay_within_the_inits_trees() {
        let s = Setup { paths: vec!["/w".into()], allow: vec!["/srv/out".into()], bounds: Bounds::default() };
        let ok = |v: &[&str]| (v.iter().map(|p| p.to_string()).collect::<Vec<_>>(), None);
        assert_eq!(paths_for(&s, &[]), ok(&["/w"]));
        assert_eq!(paths_for(&s, &["/w/sub".into()]), ok(&["/w"]));
        assert_eq!(paths_for(&s, &["/srv/out/r".into()]), ok(&["/srv/out/r", "/w"]));
        assert!(paths_for(&s, &["/w/../etc".into()]).1.unwrap_or_default().contains("'..'"));
        assert!(paths_for(&s, &["w".into()]).1.unwrap_or_default().contains("absolute"));
        // A refused path is listed all the same, for the marker to claim.
        let (claim, refused) = paths_for(&s, &["/srv/outside".into()]);
        assert_eq!(claim, vec!["/srv/outside", "/w"]);
        assert!(refused.unwrap_or_default().contains("--attest-allow"));
        assert_eq!(paths_for(&Setup::default(), &["/etc".into()]).0, vec!["/etc"]);
        assert_eq!(paths_for(&Setup::default(), &[]), ok(&[]));
    }

    #[test]
    fn a_job_larger_than_a_pipe_holds_is_refused_before_any_worker_starts() {
        let freeze = crate::attest::statement::Freeze {
            id: "i".into(),
            jti: "i".into(),
            nonce: None,
            container: crate::record::container::Container {
                boot_id: "b".into(),
                pid_ns: 1,
                hostname: "h".into(),
                init_start: 1,
            },
            sandbox_uids: vec![4242],
            killed: 0,
            phases_ms: Default::default(),
        };
        let job = Job {
            state_dir: "/run/quiesce".into(),
            paths: (0..17).map(|i| format!("/w{i}/{}", "x".repeat(4000))).collect(),
            bounds: Bounds::default(),
            threads: 2,
            freeze,
            seed: "00".repeat(32),
        };
        assert!(start(&job).err().unwrap_or_default().contains("name fewer paths"));
    }
}

//! `quiesce verify`: the verifier's gate. Every check can fail, each failure has its own exit
//! code, and the command runs only when all of them pass.

use crate::cli::args::VerifyArgs;
use crate::decide::taint::Policy;
use crate::marker::{self, jws::Bad, jws::Claims};
use crate::observe::procs::model::Detail;
use crate::observe::procs::reader::Reader;
use crate::state;
use crate::state::dir::{AttestationState, FreezeState, StateDir};
use crate::state::files::{self, FileError};
use ed25519_dalek::VerifyingKey;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Exit codes, one per class of failure (docs/marker.md lists them).
pub mod code {
    pub const USAGE: i32 = 2;
    pub const MISSING: i32 = 10;
    pub const MALFORMED: i32 = 11;
    pub const SIGNATURE: i32 = 12;
    pub const CLAIMS: i32 = 13;
    pub const TIME: i32 = 14;
    pub const CONTAINER: i32 = 15;
    pub const LIVE: i32 = 16;
    pub const UNSAFE: i32 = 17;
    pub const POLICY: i32 = 18;
    pub const ATTESTATION: i32 = 19;
    pub const HANDOVER: i32 = 20;
}

#[derive(Serialize)]
struct Report {
    ok: bool,
    check: &'static str,
    message: String,
    code: i32,
    jti: Option<String>,
    nonce: Option<String>,
}

/// A refusal: its exit code, the check that refused, and the line that says why.
pub struct Fail(i32, &'static str, String);

fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Seconds the re-check may take beyond the attestation's own time bound.
const RECHECK_SLACK_S: u64 = 5;

/// A file named with --attestation: its signature is what counts, not its owner.
const NAMED_ATTESTATION: files::Rule = files::Rule { root_owned: false, ..files::ATTESTATION };

/// The attestation, when there is one, `--attest` asks for one or the marker says its freeze
/// attests trees: signed with the marker's key, of the marker's freeze, covering what
/// `--attest` and the marker name, and the trees unchanged since.
/// Ok(None): none there and none asked for; Ok(Some(n)): n files re-checked.
fn check_attestation(
    args: &VerifyArgs,
    dir: Option<&StateDir>,
    key: &VerifyingKey,
    claims: &Claims,
) -> Result<Option<usize>, Fail> {
    use crate::attest::{name, recheck};
    let Some((text, shown)) = read_attestation(args, dir, claims)? else {
        return Ok(None);
    };
    let body = crate::attest::dsse::open(&text, key)
        .map_err(|e| attestation_fail(format!("attestation {} {e}", shown.display())))?;
    let st = statement_of(&body, &shown, claims)?;
    check_coverage(args, claims, &st)?;
    let ignore: Vec<String> = args.attest_ignore.iter().map(|p| name::encode(plain(p).as_bytes())).collect();
    // The walk keeps its time bound between entries only: one read can wait in the kernel for
    // good (a FUSE mount that never answers), past every signal. The re-check runs in a process
    // of its own, and verify gives up on it at the bound and leaves it there.
    let limit = Duration::from_secs(st.predicate.bounds.seconds.saturating_add(RECHECK_SLACK_S));
    let job = recheck::Recheck { ignore, threads: crate::kernel::process::cpus().clamp(1, 2) };
    let job = recheck::job(&job, &body).map_err(attestation_fail)?;
    drop(body);
    match run_recheck(job, limit) {
        Ok(recheck::Verdict::Same(n)) => Ok(Some(n)),
        Ok(recheck::Verdict::Differs(d)) => {
            Err(attestation_fail(format!("the tree is not the one attested: {d}")))
        }
        Err(e) => Err(attestation_fail(e)),
    }
}

fn attestation_fail(m: String) -> Fail {
    Fail(code::ATTESTATION, "attestation", m)
}

/// A path as the attestation names it: no trailing slash, the root as "/".
fn plain(p: &str) -> String {
    let t = p.trim_end_matches('/');
    if t.is_empty() {
        "/".to_string()
    } else {
        t.to_string()
    }
}

/// The attestation's bytes and where they were read; None when there is none and none is
/// wanted. One the init is still writing is waited for, until the marker is --max-age old.
fn read_attestation(
    args: &VerifyArgs,
    dir: Option<&StateDir>,
    claims: &Claims,
) -> Result<Option<(Vec<u8>, PathBuf)>, Fail> {
    let fail = attestation_fail;
    // The marker's claim counts as --attest for its paths: it was signed before the attestation
    // ran, so a missing envelope (removed, or never written) is a refusal, not a pass.
    let none_wanted = args.attest.is_empty() && claims.attest.is_empty();
    let (mut read, shown) = match (&args.attestation, dir) {
        (Some(p), _) => (files::read_path(p, NAMED_ATTESTATION), p.clone()),
        (None, Some(d)) => {
            (d.read_with(state::dir::ATTESTATION, files::ATTESTATION), d.file(state::dir::ATTESTATION))
        }
        (None, None) if none_wanted => return Ok(None),
        (None, None) => return Err(fail(
            "an attestation is asked for (--attest, or the marker's attest): name it with --attestation FILE"
                .into(),
        )),
    };
    let until = Instant::now()
        + Duration::from_secs(claims.iat.saturating_add(args.max_age).saturating_sub(now_unix()));
    let text = loop {
        match read {
            Ok(t) => break t,
            Err(FileError::Missing(_)) if none_wanted && args.attestation.is_none() => return Ok(None),
            Err(FileError::Missing(_)) => {
                // What the init said of it, when it said anything.
                let st = dir
                    .and_then(|d| d.read(state::dir::STATUS).ok())
                    .and_then(|b| state::dir::parse_status(&b).ok());
                let running = st.as_ref().is_some_and(|s| {
                    s.id == claims.jti
                        && (s.state == FreezeState::Freezing
                            || s.attestation.as_ref().is_some_and(|a| a.state == AttestationState::Running))
                });
                if let (true, Some(d), None) = (running && Instant::now() < until, dir, &args.attestation) {
                    std::thread::sleep(Duration::from_millis(100));
                    read = d.read_with(state::dir::ATTESTATION, files::ATTESTATION);
                    continue;
                }
                let said = st
                    .and_then(|s| s.attestation)
                    .map(|a| {
                        format!(
                            " (the init's attestation: {}{})",
                            a.state,
                            a.reason.map(|r| format!(": {r}")).unwrap_or_default()
                        )
                    })
                    .unwrap_or_default();
                let fix = if running {
                    "wait for it (quiesce freeze --wait), or verify with a larger --max-age"
                } else {
                    "freeze again with the paths attested (--attest)"
                };
                return Err(fail(format!("no attestation at {}{said}; {fix}", shown.display())));
            }
            Err(FileError::Unsafe(m)) => return Err(Fail(code::UNSAFE, "state-dir", m)),
            Err(e) => return Err(fail(e.to_string())),
        }
    };
    Ok(Some((text, shown)))
}

/// The statement's head, once it is a quiesce statement of the marker's freeze.
pub fn statement_of(
    body: &[u8],
    shown: &Path,
    claims: &Claims,
) -> Result<crate::attest::statement::Head, Fail> {
    use crate::attest::statement;
    let fail = attestation_fail;
    let st: statement::Head = serde_json::from_slice(body)
        .map_err(|e| fail(format!("attestation {} is not a quiesce statement: {e}", shown.display())))?;
    if st.kind != statement::STATEMENT_TYPE || st.predicate_type != statement::PREDICATE_TYPE {
        return Err(fail(format!(
            "attestation {} is a {} of {}, not a {} of {}",
            shown.display(),
            st.kind,
            st.predicate_type,
            statement::STATEMENT_TYPE,
            statement::PREDICATE_TYPE
        )));
    }
    if st.predicate.freeze.jti != claims.jti {
        return Err(fail(format!(
            "attestation is of freeze {}, the marker of freeze {}: freeze again",
            st.predicate.freeze.jti, claims.jti
        )));
    }
    Ok(st)
}

/// Every path --attest or the marker names is under one the attestation covers.
fn check_coverage(
    args: &VerifyArgs,
    claims: &Claims,
    st: &crate::attest::statement::Head,
) -> Result<(), Fail> {
    use crate::attest::name;
    let fail = attestation_fail;
    for want in args.attest.iter().chain(&claims.attest) {
        let w = name::encode(plain(want).as_bytes());
        let covered = st.predicate.paths.iter().any(|p| {
            p.path == "/"
                || w == p.path
                || (w.starts_with(&p.path) && w.as_bytes().get(p.path.len()) == Some(&b'/'))
        });
        if !covered {
            return Err(fail(format!(
                "the attestation does not cover {want}, which --attest or the marker names: name it with the init's --attest"
            )));
        }
    }
    Ok(())
}

/// Start the re-check process, hand it its job and wait for its verdict within `limit`.
fn run_recheck(body: Vec<u8>, limit: Duration) -> Result<crate::attest::recheck::Verdict, String> {
    use std::io::{Read, Write};
    use std::process::{Command, Stdio};
    let mut child = Command::new("/proc/self/exe")
        .arg(crate::attest::recheck::RECHECK_FLAG)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        // Not verify's stderr: a re-check left waiting in the kernel would hold it open, and
        // whoever reads verify's output would wait with it.
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the re-check of the attested trees: {e}"))?;
    let until = Instant::now() + limit;
    let mut stdin = child.stdin.take();
    let mut stdout = child.stdout.take();
    // The job is written and the verdict read on a thread: the child may never read or answer.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("quiesce-recheck".into())
        .spawn(move || {
            let sent = stdin.take().map(|mut i| i.write_all(&body));
            let mut out = Vec::new();
            let read = stdout.as_mut().map(|o| o.read_to_end(&mut out));
            let _ = tx.send((sent, read, out));
        })
        .map_err(|e| format!("cannot start the re-check: {e}"))?;
    let answer = rx.recv_timeout(until.saturating_duration_since(Instant::now()));
    let Ok((sent, read, out)) = answer else {
        // Left where it waits: SIGKILL ends it once the read it waits on returns.
        if let Err(e) = crate::kernel::signal::kill(child.id() as crate::kernel::process::Pid, libc::SIGKILL)
        {
            eprintln!("quiesce verify: cannot kill the re-check {}: {e}", child.id());
        }
        return Err(format!(
            "the re-check of the attested trees did not end within {} s (a mount that does not answer?): \
             unmount it, or attest a tree without it",
            limit.as_secs()
        ));
    };
    let status = child.wait().map_err(|e| format!("cannot wait for the re-check: {e}"))?;
    match (sent, read) {
        (Some(Ok(())), Some(Ok(_))) if status.success() => serde_json::from_slice(&out)
            .map_err(|e| format!("the re-check answered what verify cannot read: {e}")),
        _ => Err(format!("the re-check of the attested trees failed ({status})")),
    }
}

fn check(args: &VerifyArgs, expected_uids: &[u32]) -> Result<(Claims, Option<usize>), Fail> {
    key_from_outside(args)?;
    let needs_dir = args.marker.is_none() || args.public_key.is_none();
    let dir = if needs_dir {
        Some(StateDir::open(&args.state.state_dir).map_err(|e| Fail(code::UNSAFE, "state-dir", e))?)
    } else {
        None
    };
    let (token, marker_path) = read_marker(args, dir.as_ref())?;
    let (key, key_path) = read_key(args, dir.as_ref())?;
    let claims = signed_claims(&token, &marker_path, &key, &key_path)?;
    check_claims(args, expected_uids, &claims)?;
    check_age(args, &claims)?;
    check_container(&claims)?;
    // Before the live probe: the wait for a running attestation and the re-walk take time, and
    // the probe is the last look before the verifier starts.
    let attested = check_attestation(args, dir.as_ref(), &key, &claims)?;
    if !args.no_live_probe {
        live_probe(args, dir.as_ref(), expected_uids, &claims)?;
    }
    Ok((claims, attested))
}

fn no_dir() -> Fail {
    Fail(code::USAGE, "state-dir", "no state dir to read from".into())
}

/// The marker's text and where it was read.
fn read_marker(args: &VerifyArgs, dir: Option<&StateDir>) -> Result<(String, PathBuf), Fail> {
    // A state-dir file is checked on its descriptor (root-owned, no link); a marker named on
    // the command line only needs to be a regular file: its signature is what counts.
    let marker_error = |check: &'static str| {
        move |e: FileError| match e {
            FileError::Missing(m) => {
                Fail(code::MISSING, "marker", format!("no marker at {m}; run 'quiesce freeze --wait' first"))
            }
            FileError::Unsafe(m) => Fail(code::UNSAFE, check, m),
            FileError::Unreadable(m) => Fail(code::MISSING, "marker", m),
        }
    };
    let (token, marker_path) = match (&args.marker, dir) {
        (Some(p), _) => (files::read_path(p, files::ANY).map_err(marker_error("marker"))?, p.clone()),
        (None, Some(d)) => {
            (d.read(state::dir::MARKER).map_err(marker_error("state-dir"))?, d.file(state::dir::MARKER))
        }
        (None, None) => return Err(no_dir()),
    };
    let token = String::from_utf8(token).map_err(|_| {
        Fail(code::MALFORMED, "marker", format!("marker {} is not text", marker_path.display()))
    })?;
    Ok((token, marker_path))
}

/// The public key the marker must verify with, and where it was read.
fn read_key(args: &VerifyArgs, dir: Option<&StateDir>) -> Result<(VerifyingKey, PathBuf), Fail> {
    let (key, key_path) = match (&args.public_key, dir) {
        (Some(p), _) => {
            (marker::jws::load_public(p).map_err(|e| Fail(code::SIGNATURE, "key", e))?, p.clone())
        }
        (None, Some(d)) => {
            let text = d.read(state::dir::PUBKEY).map_err(|e| match e {
                FileError::Unsafe(m) => Fail(code::UNSAFE, "state-dir", m),
                e => Fail(code::SIGNATURE, "key", e.to_string()),
            })?;
            let k = marker::jws::parse_public(&text).map_err(|e| {
                Fail(
                    code::SIGNATURE,
                    "key",
                    format!("public key {}: {e}", d.file(state::dir::PUBKEY).display()),
                )
            })?;
            (k, d.file(state::dir::PUBKEY))
        }
        (None, None) => return Err(no_dir()),
    };
    Ok((key, key_path))
}

/// The claims, once the signature verifies with `key`.
fn signed_claims(
    token: &str,
    marker_path: &Path,
    key: &VerifyingKey,
    key_path: &Path,
) -> Result<Claims, Fail> {
    marker::jws::verify(token, key).map_err(|b| match b {
        Bad::Malformed(m) => {
            Fail(code::MALFORMED, "marker", format!("marker {} is malformed: {m}", marker_path.display()))
        }
        Bad::Algorithm(a) => {
            Fail(code::SIGNATURE, "alg", format!("marker algorithm '{a}' refused: only EdDSA is accepted"))
        }
        Bad::Signature => Fail(
            code::SIGNATURE,
            "signature",
            format!("marker signature does not verify with {}", key_path.display()),
        ),
    })
}

/// Where a root agent is accepted, the key comes from outside: the state dir is root's, and so
/// the agent's to rewrite, `signing.pub` and the marker included (it can sign a marker of its
/// own with the nonce of the request it read, and make the real freeze fail to write one).
fn key_from_outside(args: &VerifyArgs) -> Result<(), Fail> {
    if !args.accept_root_agent {
        return Ok(());
    }
    let inside = |p: &std::path::Path| {
        let canon = |q: &std::path::Path| std::fs::canonicalize(q).unwrap_or_else(|_| q.to_path_buf());
        canon(p).starts_with(canon(&args.state.state_dir))
    };
    match &args.public_key {
        Some(k) if !inside(k) => Ok(()),
        _ => Err(Fail(
            code::POLICY,
            "public-key",
            "--accept-root-agent needs --public-key FILE from outside the state dir: a root agent can \
             rewrite signing.pub and the marker there; keep the public key the init printed at start \
             (or the one of --signing-key) and copy it in after the freeze"
                .into(),
        )),
    }
}

/// What the marker says of the freeze: its issuer, result, survivors, UIDs, nonce and the
/// configuration it was signed in.
fn check_claims(args: &VerifyArgs, expected_uids: &[u32], claims: &Claims) -> Result<(), Fail> {
    let claim = |ok: bool, what: &'static str, msg: String| {
        if ok {
            Ok(())
        } else {
            Err(Fail(code::CLAIMS, what, msg))
        }
    };
    claim(claims.iss == "quiesce", "iss", format!("marker iss is '{}', expected 'quiesce'", claims.iss))?;
    claim(
        claims.result == "quiescent",
        "result",
        format!("marker result is '{}', expected 'quiescent'", claims.result),
    )?;
    claim(claims.survivors == 0, "survivors", format!("marker reports {} survivor(s)", claims.survivors))?;
    // Markers of versions before the claim was carried were all "uid".
    let sandbox = claims.sandbox.as_deref().unwrap_or("uid");
    claim(
        matches!(sandbox, "uid" | "lineage"),
        "sandbox",
        format!("marker sandbox '{}' is neither 'uid' nor 'lineage'", sandbox.escape_debug()),
    )?;
    if let Some(want) = &args.require_sandbox {
        if sandbox != want {
            return Err(Fail(
                code::POLICY,
                "sandbox",
                format!(
                    "marker says sandbox={sandbox}, and --require-sandbox asks for sandbox={want}: \
                     start the init with {}",
                    if want == "lineage" { "--sandbox-lineage" } else { "--sandbox-user" }
                ),
            ));
        }
    }
    let by_lineage = sandbox == "lineage";
    claim(
        by_lineage || !claims.sandbox_uids.is_empty(),
        "sandbox_uids",
        "marker names no sandbox UID".into(),
    )?;
    if !expected_uids.is_empty() {
        let mut a = claims.sandbox_uids.clone();
        let mut b = expected_uids.to_vec();
        a.sort();
        a.dedup();
        b.sort();
        b.dedup();
        claim(a == b, "sandbox_uids", format!("marker sandbox UIDs {a:?} are not the expected {b:?}"))?;
    }
    if let Some(n) = &args.nonce {
        claim(
            claims.nonce.as_deref() == Some(n.as_str()),
            "nonce",
            format!("marker nonce {:?} is not the expected one", claims.nonce),
        )?;
    }
    // What the freeze could rest on: a marker from a configuration the verifier does not accept
    // proves less than it needs (docs/threat-model.md, "What the configuration changes").
    let policy = |asked: bool, got: Option<bool>, want: bool, what: &'static str, flag: &str, fix: &str| {
        if !asked || got == Some(want) {
            return Ok(());
        }
        let said = got.map_or("does not say".to_string(), |v| format!("says {what}={v}"));
        Err(Fail(code::POLICY, what, format!("marker {said}, and {flag} asks for {what}={want}: {fix}")))
    };
    policy(
        args.require_lineage,
        claims.lineage,
        true,
        "lineage",
        "--require-lineage",
        "run the init where it can write loginuids (not from a login session, without --no-lineage)",
    )?;
    // A sandbox process that became root can keep another root process of the container working
    // for it (docs/threat-model.md, "A sandbox process that is root"): a marker signed where that
    // was possible proves nothing about the verifier's surroundings, so it is refused unless the
    // orchestrator says it accepts exactly that.
    // A root agent can do all that a sandbox process made root can: a marker of a sandbox of
    // lineage alone is refused unless the orchestrator accepts a root agent, and then a setuid
    // binary adds nothing.
    if by_lineage {
        if args.accept_root_agent {
            return Ok(());
        }
        return Err(Fail(
            code::POLICY,
            "sandbox",
            "marker says sandbox=lineage: its agent may have been root, and a root agent can act through \
             another root process of the container, which no freeze can tell apart (docs/threat-model.md, \
             \"Root agents\"): accept it with --accept-root-agent, or run the agent as a user (--sandbox-user)"
                .into(),
        ));
    }
    let accepted = args.accept_privilege_escalation && !args.require_no_setuid;
    if !accepted && claims.setuid != Some(false) {
        let said = claims.setuid.map_or("does not say whether".to_string(), |_| "says".to_string());
        return Err(Fail(
            code::POLICY,
            "setuid",
            format!(
                "marker {said} a setuid binary could make a sandbox process root (setuid=true): run the \
                 container with --security-opt no-new-privileges (Kubernetes: allowPrivilegeEscalation: \
                 false) and give the agent no sudo, or accept it with --accept-privilege-escalation"
            ),
        ));
    }
    Ok(())
}

fn check_age(args: &VerifyArgs, claims: &Claims) -> Result<(), Fail> {
    let now = now_unix();
    if claims.iat > now + 60 {
        return Err(Fail(code::TIME, "iat", format!("marker is from {} s in the future", claims.iat - now)));
    }
    if now.saturating_sub(claims.iat) > args.max_age {
        return Err(Fail(
            code::TIME,
            "iat",
            format!(
                "marker is {} s old, older than --max-age {}: freeze again",
                now - claims.iat,
                args.max_age
            ),
        ));
    }
    Ok(())
}

/// The marker was made in this container, by this init.
fn check_container(claims: &Claims) -> Result<(), Fail> {
    let here = crate::observe::container::this_container()
        .map_err(|e| Fail(code::CONTAINER, "container", format!("cannot identify this container: {e}")))?;
    if here.pid_ns != claims.container.pid_ns || here.boot_id != claims.container.boot_id {
        return Err(Fail(
            code::CONTAINER,
            "container",
            "marker was made in another container or boot".into(),
        ));
    }
    if here.init_start != claims.container.init_start {
        return Err(Fail(
            code::CONTAINER,
            "container",
            "marker was made by an earlier init of this container".into(),
        ));
    }
    Ok(())
}

/// The last look before the verifier starts: no sandbox process alive now.
fn live_probe(
    args: &VerifyArgs,
    dir: Option<&StateDir>,
    expected_uids: &[u32],
    claims: &Claims,
) -> Result<(), Fail> {
    let mut uids = claims.sandbox_uids.clone();
    uids.extend_from_slice(expected_uids);
    let snap = Reader::default()
        .snapshot(Detail::Light)
        .map_err(|e| Fail(code::LIVE, "live-probe", format!("live probe failed: {e}")))?;
    // The init says whether a loginuid marks a sandbox launch here; without its word, it does.
    let published = match dir {
        Some(d) => crate::state::published::published_in(d).ok().flatten(),
        None => crate::state::published::published(&args.state.state_dir),
    };
    // A sandbox of lineage alone: every process its launches tagged, whatever its UIDs, and
    // whatever sandbox.json says (with a root agent it is the agent's to rewrite).
    let by_lineage = args.accept_root_agent
        || claims.sandbox.as_deref() == Some("lineage")
        || published.as_ref().is_some_and(|p| p.tag.is_some());
    let lineage = by_lineage || published.as_ref().is_none_or(|p| p.lineage);
    let mut policy = Policy::new(uids, lineage);
    if by_lineage {
        policy.tags.push(crate::decide::taint::LINEAGE_TAG);
    }
    let tainted = policy.classify(&snap);
    let alive: Vec<String> = tainted
        .keys()
        .filter_map(|pid| snap.get(pid))
        .filter(|p| p.alive())
        .map(|p| format!("{} ({}, uid {})", p.pid, p.comm, p.uid()))
        .collect();
    if !alive.is_empty() {
        return Err(Fail(
            code::LIVE,
            "live-probe",
            format!("{} sandbox process(es) alive now: {}", alive.len(), alive.join(", ")),
        ));
    }
    Ok(())
}

pub fn run(args: VerifyArgs, expected_uids: Vec<u32>) -> i32 {
    // A root process of the container that a root escapee could ptrace into forking for it; the
    // exec of the verifier makes it dumpable again as the kernel decides.
    if let Err(e) = crate::kernel::process::set_not_dumpable() {
        eprintln!("quiesce verify: cannot mark this process non-dumpable: {e}");
        return 2;
    }
    let result = check(&args, &expected_uids);
    let report = match &result {
        Ok((c, attested)) => Report {
            ok: true,
            check: "all",
            message: match attested {
                Some(n) => format!(
                    "marker and attestation ({n} files unchanged) verified and no sandbox process is alive"
                ),
                None => "marker verified and no sandbox process is alive".into(),
            },
            code: 0,
            jti: Some(c.jti.clone()),
            nonce: c.nonce.clone(),
        },
        Err(Fail(code, check, msg)) => {
            Report { ok: false, check, message: msg.clone(), code: *code, jti: None, nonce: None }
        }
    };
    if args.json {
        println!("{}", serde_json::to_string(&report).unwrap_or_default());
    }
    if !report.ok {
        eprintln!("quiesce verify: {} check failed: {}", report.check, report.message);
        return report.code;
    }
    log::info!("{}", report.message);
    if args.command.is_empty() {
        if !args.json {
            eprintln!("quiesce verify: ok");
        }
        return 0;
    }
    let plan = match crate::spawn::plan::Plan::new(&args.command, None) {
        Ok(plan) => plan,
        Err(e) => {
            eprintln!("quiesce verify: {e}");
            return code::USAGE;
        }
    };
    let Some(claims) = result.ok().map(|(c, _)| c).filter(|_| args.hand_over) else {
        return plan.exec_in_place();
    };
    with_services(&args, &claims, &expected_uids, &plan)
}

/// The command run beside the services the freeze killed, started again confined
/// (`commands::handover`): its exit status, or HANDOVER when they cannot all listen again (the
/// command then does not run) or cannot all be stopped after it. verify stays the command's
/// parent: a signal to end it (the harness's timeout) goes to the command, and the services are
/// stopped after, however the command ended.
fn with_services(
    args: &VerifyArgs,
    claims: &Claims,
    expected_uids: &[u32],
    plan: &crate::spawn::plan::Plan,
) -> i32 {
    use crate::commands::handover;
    use crate::kernel::signal;
    let signals = match signal::block_all_signals().and_then(|_| signal::SignalFd::new()) {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!("quiesce verify: hand-over check failed: cannot take its signals: {e}");
            return code::HANDOVER;
        }
    };
    let running = match handover::start(args, claims, expected_uids) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("quiesce verify: hand-over check failed: {e}");
            return code::HANDOVER;
        }
    };
    let status = run_forwarding(plan, &signals);
    match running.end() {
        Ok(()) => status,
        Err(e) => {
            eprintln!("quiesce verify: hand-over check failed: the services' end: {e}");
            code::HANDOVER
        }
    }
}

/// Start the command and wait for it, passing on every signal that ends a process; its status
/// (128 + the signal that ended verify's wait for one that never started).
fn run_forwarding(plan: &crate::spawn::plan::Plan, signals: &crate::kernel::signal::SignalFd) -> i32 {
    use crate::kernel::{reap, signal};
    // One asked for before the command started: it does not start.
    while let Ok(Some((sig, _))) = signals.read() {
        if matches!(sig, libc::SIGTERM | libc::SIGINT | libc::SIGHUP | libc::SIGQUIT) {
            return 128 + sig;
        }
    }
    let pid = match plan.spawn(crate::init::logging::line) {
        Ok(pid) => pid,
        Err(e) => {
            eprintln!("quiesce verify: cannot start the command: {e}");
            return 126;
        }
    };
    loop {
        match reap::try_reap(pid) {
            Ok(Some(code)) => return code,
            Ok(None) => {}
            Err(e) => {
                eprintln!("quiesce verify: cannot wait for the command: {e}");
                return code::USAGE;
            }
        }
        let _ = signals.wait(Some(std::time::Duration::from_millis(500)));
        while let Ok(Some((sig, _))) = signals.read() {
            if sig != libc::SIGCHLD {
                if let Err(e) = signal::kill(pid, sig) {
                    // ESRCH: it has just ended, and the next turn reaps it.
                    if e.raw_os_error() != Some(libc::ESRCH) {
                        eprintln!("quiesce verify: cannot pass signal {sig} to the command: {e}");
                    }
                }
            }
        }
    }
}

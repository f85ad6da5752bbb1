//! The readers of untrusted bytes, one entry per fuzz target (fuzz/fuzz_targets/, docs/testing.md).
//! Each entry hands its bytes to the very function the binary reads them with, and asserts what
//! must hold of any answer (a round trip, two readers agreeing): libFuzzer reports a failed
//! assertion like any other panic. Built only with `--cfg fuzzing`, which cargo fuzz sets; nothing
//! here reaches the binary. Not a floor: no folder of src/ may use it (`scripts/layers`).

use crate::attest::{compare, dsse, name, recheck};
use crate::cli::{args::InitArgs, quickargs};
use crate::commands::{freeze, verify};
use crate::marker::jws;
use crate::observe::procs::parse;
use crate::state::{dir, published, requests};
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use base64::Engine;
use clap::Parser;
use ed25519_dalek::{Signer, SigningKey};
use std::path::Path;

/// The key every signed input is signed with: a fixed one, so a crash replays.
fn key() -> SigningKey {
    SigningKey::from_bytes(&[7; 32])
}

/// The bytes up to the first newline and those after it (all of them, and none, without one).
fn split_line(b: &[u8]) -> (&[u8], &[u8]) {
    match b.iter().position(|&c| c == b'\n') {
        Some(i) => (&b[..i], &b[i + 1..]),
        None => (b, &[]),
    }
}

/// /proc/PID/stat and /proc/PID/task/TID/stat as `Pass` reads them: whole, and for the state alone.
pub fn proc_stat(b: &[u8]) {
    let whole = parse::parse_stat(b);
    let state = parse::stat_state(b);
    if let (Ok(s), Ok(c)) = (&whole, &state) {
        assert_eq!(s.state, *c, "the state read alone is the one the whole line gives");
    }
}

/// /proc/PID/status and its threads' as `Pass` reads them (lossy UTF-8, as there), and its
/// TracerPid line as `Pass::tracer` reads it.
pub fn proc_status(b: &[u8]) {
    let text = String::from_utf8_lossy(b);
    let whole = parse::parse_status_threads(&text);
    let short = parse::parse_status(&text);
    assert_eq!(whole.map(|s| (s.state, s.uids, s.gids)).ok(), short.ok(), "the two status readers agree");
    let _ = parse::tracer_pid(b);
}

/// /proc/PID/cmdline as `Reader::evidence` and `Reader::second_arg` read it (at most
/// CMDLINE_READ bytes, as there).
pub fn proc_cmdline(b: &[u8]) {
    let b = &b[..b.len().min(crate::observe::procs::reader::CMDLINE_READ)];
    let words = parse::cmdline_words(b);
    assert!(words.iter().all(|w| !w.is_empty()), "no empty word");
    let second = parse::second_word(b);
    assert!(second.len() <= b.len() && !second.contains(&0), "the second word is one word of the line");
}

/// The entries of /proc and of /proc/PID/task (NUL-separated names here) as the reader lists them.
pub fn proc_tasks(b: &[u8]) {
    for name in b.split(|&c| c == 0) {
        if let Some(pid) = parse::listed_pid(name) {
            assert_eq!(parse::listed_pid(pid.to_string().as_bytes()), Some(pid));
        }
    }
}

/// A freeze request or launch record as the init takes it: its file name, a newline, its bytes.
pub fn request(b: &[u8]) {
    let (name, body) = split_line(b);
    let Ok(name) = std::str::from_utf8(name) else { return };
    let Ok(r) = requests::parse_request(body, name) else { return };
    assert!(r.request_id == name && requests::valid_id(name), "a taken request is named by its id");
    assert!(r.pid.is_some() && r.pid == requests::id_pid(name), "its pid is the one its name carries");
    assert!(r.launch.as_ref().is_none_or(|l| l.check().is_ok()), "its launch record names a launch");
    let again = serde_json::to_vec(&r).map(|b| requests::parse_request(&b, name));
    assert!(matches!(again, Ok(Ok(ref a)) if *a == r), "a taken request written again reads the same");
}

/// status.json and results/ID.json as `verify` and `freeze` read them, and the line `freeze` shows.
pub fn status_json(b: &[u8]) {
    let Ok(st) = dir::parse_status(b) else { return };
    let _ = freeze::status_line(&st);
    let again = serde_json::to_vec(&st).map(|b| dir::parse_status(&b));
    assert!(matches!(again, Ok(Ok(ref a)) if *a == st), "a status written again reads the same");
}

/// sandbox.json as `freeze`, `exec` and `ps` read it.
pub fn sandbox_json(b: &[u8]) {
    let _ = published::parse(b);
}

/// The marker as `verify` reads it: the file's text checked with a key that did not sign it,
/// then its first line as the JWS header and the rest as its payload, signed with that key, so
/// that the claims are read too.
pub fn marker(b: &[u8]) {
    let key = key();
    if let Ok(text) = std::str::from_utf8(b) {
        assert!(jws::verify(text, &key.verifying_key()).is_err(), "only the key's signature verifies");
    }
    let (header, payload) = split_line(b);
    let mut token = format!("{}.{}", B64URL.encode(header), B64URL.encode(payload));
    let sig = key.sign(token.as_bytes());
    token = format!("{token}.{}", B64URL.encode(sig.to_bytes()));
    match jws::verify(&token, &key.verifying_key()) {
        Err(jws::Bad::Signature) => panic!("a token signed with the key fails its signature"),
        Err(_) => {}
        Ok(claims) => {
            let again = jws::sign(&key, &claims).map(|t| jws::verify(&t, &key.verifying_key()));
            assert!(matches!(again, Ok(Ok(ref c)) if *c == claims), "claims signed again read the same");
        }
    }
}

/// The PEM keys as `verify` (public) and the init (private) read them.
pub fn key_pem(b: &[u8]) {
    if let Ok(k) = jws::parse_public(b) {
        assert_eq!(
            jws::parse_public(jws::public_pem(&k).as_bytes()).ok(),
            Some(k),
            "a public key round-trips"
        );
    }
    if let Ok(k) = jws::parse_private(b) {
        let again = jws::parse_private(jws::private_pem(&k).as_bytes()).map(|a| a.to_bytes());
        assert_eq!(again.ok(), Some(k.to_bytes()), "a private key round-trips");
    }
}

/// The DSSE envelope as `verify` opens it: the file's bytes with a key that did not sign them,
/// then the bytes as a payload signed with that key, which must open to themselves.
pub fn dsse(b: &[u8]) {
    let key = key();
    assert!(dsse::open(b, &key.verifying_key()).is_err(), "only the key's signature opens");
    let env = dsse::sign(&key, b);
    let opened = env.as_ref().map(|e| dsse::open(e, &key.verifying_key()));
    assert!(matches!(opened, Ok(Ok(ref p)) if p == b), "a signed payload opens to itself");
}

/// The in-toto statement (a signed envelope's payload) as `verify` checks it against the marker
/// (whose jti is the first line here), then as the re-check reads its job: the names decoded and
/// the statement compared with trees that hold nothing and with itself (the walk of the trees
/// themselves is left out: it reads the filesystem).
pub fn statement(b: &[u8]) {
    let (jti, body) = split_line(b);
    let mut claims = jws::sample_claims();
    claims.jti = String::from_utf8_lossy(jti).into_owned();
    let _ = verify::statement_of(body, Path::new("attestation"), &claims);
    let ignore = claims.attest.iter().map(|p| name::encode(p.as_bytes())).collect();
    let Ok(job) = recheck::job(&recheck::Recheck { ignore, threads: 1 }, body) else { return };
    let Ok((job, st)) = recheck::parse_job(&job) else { return };
    for p in &st.predicate.paths {
        let _ = name::decode(&p.path);
    }
    let _ = compare::compare(&st, &[], &[], &job.ignore).line();
    let _ = compare::compare(&st, &st.subject, &st.predicate.paths, &job.ignore).line();
}

/// Attestation names, both ways: any bytes encode to a name that decodes to them; any text
/// decodes to bytes or is refused; a long name is cut for a message without a panic.
pub fn attest_name(b: &[u8]) {
    let enc = name::encode(b);
    assert_eq!(name::decode(&enc).as_deref(), Ok(b), "a name decodes to its bytes");
    assert!(enc.chars().all(|c| c == '%' || !c.is_control()), "a name holds no control character");
    let _ = name::shown(b);
    if let Ok(text) = std::str::from_utf8(b) {
        if let Ok(bytes) = name::decode(text) {
            assert_eq!(name::decode(&name::encode(&bytes)), Ok(bytes), "decoded bytes round-trip");
        }
        let _ = name::cut(text);
    }
}

/// The init's command line as its fast path reads it (NUL-separated arguments, UTF-8 only, as
/// `main` refuses the rest): a line it accepts is one clap reads the same.
pub fn quickargs(b: &[u8]) {
    let Ok(args) = b
        .split(|&c| c == 0)
        .map(|a| std::str::from_utf8(a).map(str::to_string))
        .collect::<Result<Vec<_>, _>>()
    else {
        return;
    };
    let env_options = quickargs::env_has_options(std::env::vars_os().map(|(k, _)| k));
    let Some(quick) = quickargs::parse(&args, env_options) else { return };
    let argv = std::iter::once("quiesce".to_string()).chain(args.iter().cloned());
    match InitArgs::try_parse_from(argv) {
        Ok(c) => assert_eq!(format!("{c:?}"), format!("{quick:?}"), "{args:?}: the fast path and clap agree"),
        Err(e) => panic!("{args:?}: the fast path took {quick:?}, clap refused it ({:?})", e.kind()),
    }
}

/// /proc/net/tcp and tcp6 as the freeze's walk and `verify --hand-over` read them: only
/// listening lines are taken, and each address reads as its family writes it.
pub fn proc_net_tcp(b: &[u8]) {
    for (v6, parts, sep) in [(false, 4, '.'), (true, 8, ':')] {
        for l in crate::observe::sockets::parse(b, v6) {
            assert_eq!(l.at.addr.split(sep).count(), parts, "an address of its family: {}", l.at.addr);
        }
    }
}

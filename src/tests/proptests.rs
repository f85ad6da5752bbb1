//! Property tests for every parser of outside data: request files and statuses, the marker and
//! its JSON, PEM keys, /etc/passwd and /etc/group, /proc stat and status, mountinfo lines. For any input: no
//! panic, allocation bounded by the input's size, a one-line error for garbage; and round trips
//! where a writer exists.
//!
//! `PROPTEST_CASES=N` sets the number of cases per property (default 256, under a second in all).

use crate::kernel::users;
use crate::marker::{self, jws::Claims};
use crate::observe::procs;
use crate::record::freeze::{Phases, Survivor};
use crate::state::requests::{self, Request};
use crate::state::{self, dir::FreezeState, dir::Status};
use proptest::prelude::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Counts the bytes each thread allocates, so a property can bound a parser's allocation.
struct Counting;

thread_local! {
    static ALLOCATED: Cell<usize> = const { Cell::new(0) };
}

fn count(n: usize) {
    let _ = ALLOCATED.try_with(|a| a.set(a.get().saturating_add(n)));
}

// SAFETY: every call goes straight to the system allocator; counting touches only a
// thread-local Cell, which needs no allocation.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count(l.size());
        System.alloc(l)
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        count(l.size());
        System.alloc_zeroed(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        count(new);
        System.realloc(p, l, new)
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// Run `f` and return what it allocated in all (an upper bound of its peak).
fn allocated_by<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let before = ALLOCATED.with(|a| a.get());
    let r = f();
    (r, ALLOCATED.with(|a| a.get()) - before)
}

/// What a parser may allocate for `len` bytes of input: linear, with a fixed allowance.
fn bounded(len: usize) -> usize {
    64 * len + (64 << 10)
}

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256);
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

fn one_line(e: &str) -> bool {
    !e.is_empty() && !e.contains('\n')
}

/// Text that looks half like what a parser expects: its own separators, digits and words.
fn textish() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            Just(":".to_string()),
            Just("\n".to_string()),
            Just(" ".to_string()),
            Just("(".to_string()),
            Just(")".to_string()),
            Just("{".to_string()),
            Just("}".to_string()),
            Just("\"".to_string()),
            Just(",".to_string()),
            Just(".".to_string()),
            Just("-----BEGIN PRIVATE KEY-----\n".to_string()),
            Just("-----END PUBLIC KEY-----\n".to_string()),
            Just("Uid:".to_string()),
            Just("State:".to_string()),
            "[0-9]{1,12}",
            "[a-zA-Z+/=_-]{1,12}",
            any::<String>(),
        ],
        0..64,
    )
    .prop_map(|v| v.concat())
}

fn request_id() -> impl Strategy<Value = String> {
    "[0-9a-f]{32}"
}

fn status() -> impl Strategy<Value = Status> {
    let survivor = (any::<i32>(), any::<u32>(), any::<char>(), any::<String>())
        .prop_map(|(pid, uid, state, comm)| Survivor { pid, uid, state, comm });
    let phases = any::<[u64; 5]>().prop_map(|p| Phases {
        stop: p[0],
        walk: p[1],
        kill: p[2],
        probe: p[3],
        total: p[4],
    });
    (
        any::<String>(),
        proptest::option::of(request_id()),
        proptest::option::of(any::<String>()),
        prop::sample::select(vec![FreezeState::Freezing, FreezeState::Quiescent, FreezeState::Failed]),
        proptest::option::of(any::<String>()),
        prop::collection::vec(survivor, 0..4),
        any::<usize>(),
        phases,
    )
        .prop_map(|(id, request_id, nonce, state, reason, survivors, killed, phases_ms)| Status {
            id,
            request_id,
            nonce,
            state,
            reason,
            survivors,
            killed,
            unstopped: killed / 2,
            phases_ms,
            history: killed / 3,
            unreaped_zombies: killed / 4,
            started_unix_ms: 0,
            attestation: None,
        })
}

fn key() -> ed25519_dalek::SigningKey {
    ed25519_dalek::SigningKey::from_bytes(&[7u8; 32])
}

fn token() -> String {
    let claims = Claims {
        iat: 1_700_000_000,
        jti: "0123".into(),
        nonce: Some("n".into()),
        attest: vec![],
        ..crate::marker::jws::sample_claims()
    };
    marker::jws::sign(&key(), &claims).unwrap()
}

/// A token changed in one place: a byte replaced, inserted or removed.
#[derive(Debug, Clone)]
enum Mutation {
    Replace(usize, char),
    Insert(usize, char),
    Remove(usize),
}

fn mutate(t: &str, m: &Mutation) -> String {
    let mut chars: Vec<char> = t.chars().collect();
    match *m {
        Mutation::Replace(i, c) => {
            let i = i % chars.len();
            chars[i] = c;
        }
        Mutation::Insert(i, c) => chars.insert(i % (chars.len() + 1), c),
        Mutation::Remove(i) => {
            chars.remove(i % chars.len());
        }
    }
    chars.into_iter().collect()
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let c = prop_oneof![Just('.'), Just('A'), Just('_'), Just('-'), Just('='), Just(' '), any::<char>()];
    prop_oneof![
        (any::<usize>(), c.clone()).prop_map(|(i, c)| Mutation::Replace(i, c)),
        (any::<usize>(), c).prop_map(|(i, c)| Mutation::Insert(i, c)),
        any::<usize>().prop_map(Mutation::Remove),
    ]
}

/// A passwd entry the parser must read back: fields without ':' or newlines.
fn passwd_user() -> impl Strategy<Value = users::User> {
    // 4294967295 is refused as an ID (it means "unchanged" to the kernel): never written.
    ("[a-z_][a-z0-9_.-]{0,31}", 0..u32::MAX, 0..u32::MAX, "/[a-zA-Z0-9/ ._-]{0,40}")
        .prop_map(|(name, uid, gid, home)| users::User { name, uid, gid, home })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn request_files_never_panic_and_refuse_garbage(bytes in prop::collection::vec(any::<u8>(), 0..2048), text in textish(), id in request_id()) {
        for input in [&bytes[..], text.as_bytes()] {
            let (r, used) = allocated_by(|| requests::parse_request(input, &id));
            prop_assert!(used <= bounded(input.len()), "{used} bytes for {}", input.len());
            if let Err(e) = r {
                prop_assert!(one_line(&e), "{e}");
            }
        }
    }

    #[test]
    fn request_files_round_trip(id in request_id(), nonce in proptest::option::of(any::<String>()), pid in proptest::option::of(any::<i32>())) {
        let req = Request { nonce, request_id: id.clone(), pid, start_time: None, launch: None, attest: vec![] };
        let body = serde_json::to_vec(&req).unwrap();
        let back = requests::parse_request(&body, &id);
        // Only a request whose pid is the one its name carries (never 0) is read.
        if req.nonce.as_ref().is_some_and(|n| n.len() > requests::MAX_NONCE)
            || req.pid.is_none()
            || req.pid != requests::id_pid(&id)
        {
            prop_assert!(back.is_err());
        } else {
            prop_assert_eq!(back.unwrap(), req.clone());
        }
        // Named in the id, the pid is read back.
        let named = Request { pid: requests::id_pid(&id), ..req.clone() };
        let back = requests::parse_request(&serde_json::to_vec(&named).unwrap(), &id);
        prop_assert_eq!(back.is_ok(), named.pid.is_some() && named.nonce.as_ref().is_none_or(|n| n.len() <= requests::MAX_NONCE));
        // Under another name it is refused: the name is what the result is written under.
        let other = format!("{}0", &id[..31]);
        if other != id {
            prop_assert!(requests::parse_request(&body, &other).is_err());
        }
    }

    #[test]
    fn statuses_never_panic_and_refuse_garbage(bytes in prop::collection::vec(any::<u8>(), 0..4096), text in textish()) {
        for input in [&bytes[..], text.as_bytes()] {
            let (r, used) = allocated_by(|| state::dir::parse_status(input));
            prop_assert!(used <= bounded(input.len()));
            if let Err(e) = r {
                prop_assert!(one_line(&e), "{e}");
            }
        }
    }

    #[test]
    fn statuses_round_trip(st in status()) {
        let text = state::dir::status_json(&st).unwrap();
        prop_assert_eq!(state::dir::parse_status(&text).unwrap(), st);
    }

    #[test]
    fn markers_from_arbitrary_text_are_refused(text in textish(), bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let k = key().verifying_key();
        let lossy = String::from_utf8_lossy(&bytes).into_owned();
        for input in [&text, &lossy] {
            let (r, used) = allocated_by(|| marker::jws::verify(input, &k));
            prop_assert!(used <= bounded(input.len()));
            match r {
                Ok(c) => prop_assert!(false, "accepted {input:?}: {c:?}"),
                Err(marker::jws::Bad::Malformed(m)) | Err(marker::jws::Bad::Algorithm(m)) => prop_assert!(!m.contains('\n')),
                Err(marker::jws::Bad::Signature) => {}
            }
        }
    }

    #[test]
    fn mutated_markers_are_refused(m in mutation(), m2 in mutation()) {
        let t = token();
        let k = key().verifying_key();
        for bad in [mutate(&t, &m), mutate(&mutate(&t, &m), &m2)] {
            let (r, used) = allocated_by(|| marker::jws::verify(&bad, &k));
            prop_assert!(used <= bounded(bad.len()));
            // Only surrounding whitespace may change and still verify.
            if r.is_ok() {
                prop_assert_eq!(bad.trim(), t.as_str());
            }
        }
    }

    #[test]
    fn pem_keys_never_panic_and_round_trip(seed in any::<[u8; 32]>(), text in textish(), m in mutation()) {
        let input = text.as_bytes();
        let (r, used) = allocated_by(|| marker::jws::parse_private(input));
        prop_assert!(used <= bounded(input.len()));
        if let Err(e) = r {
            prop_assert!(one_line(&e));
        }
        let (r, used) = allocated_by(|| marker::jws::parse_public(input));
        prop_assert!(used <= bounded(input.len()));
        if let Err(e) = r {
            prop_assert!(one_line(&e));
        }
        let k = ed25519_dalek::SigningKey::from_bytes(&seed);
        let pem = marker::jws::private_pem(&k);
        prop_assert_eq!(marker::jws::parse_private(pem.as_bytes()).unwrap().to_bytes(), seed);
        let public = marker::jws::public_pem(&k.verifying_key());
        prop_assert_eq!(marker::jws::parse_public(public.as_bytes()).unwrap(), k.verifying_key());
        // A changed PEM either fails or still names a key: never a panic.
        let _ = marker::jws::parse_private(mutate(&pem, &m).as_bytes());
        let _ = marker::jws::parse_public(mutate(&public, &m).as_bytes());
    }

    #[test]
    fn passwd_and_group_never_panic(text in textish(), spec in textish()) {
        let (_, used) = allocated_by(|| users::parse_passwd(&text));
        prop_assert!(used <= bounded(text.len()));
        if let Err(e) = users::resolve(&spec, &text) {
            prop_assert!(one_line(&e), "{e}");
        }
        let u = users::User { name: "agent".into(), uid: 1000, gid: 1000, home: "/".into() };
        let (gids, used) = allocated_by(|| users::groups_of(&u, &text));
        prop_assert!(used <= bounded(text.len()));
        prop_assert_eq!(gids[0], 1000);
    }

    #[test]
    fn passwd_round_trips(us in prop::collection::vec(passwd_user(), 0..8), noise in "[#][^\n]{0,20}") {
        let mut text = format!("{noise}\n");
        for u in &us {
            text.push_str(&format!("{}:x:{}:{}:gecos:{}:/bin/sh\n", u.name, u.uid, u.gid, u.home));
        }
        prop_assert_eq!(users::parse_passwd(&text), us);
    }

    #[test]
    fn stat_lines_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048), text in textish()) {
        for input in [&bytes[..], text.as_bytes()] {
            let (r, used) = allocated_by(|| procs::parse::parse_stat(input));
            prop_assert!(used <= bounded(input.len()));
            if let Err(e) = r {
                prop_assert!(one_line(&e), "{e}");
            }
        }
    }

    #[test]
    fn stat_lines_round_trip(
        pid in 1..i32::MAX,
        comm in prop::collection::vec(any::<u8>(), 0..16),
        state in "[RSDZTtXxKWPI]",
        ppid in 0..i32::MAX,
        pgid in 0..i32::MAX,
        sid in 0..i32::MAX,
        start in any::<u64>(),
    ) {
        // A process names itself: comm holds any bytes, parentheses, spaces and newlines too.
        let mut line = format!("{pid} (").into_bytes();
        line.extend_from_slice(&comm);
        line.extend_from_slice(format!(") {state} {ppid} {pgid} {sid} 34816 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 {start} 1000 100 18446744073709551615\n").as_bytes());
        let st = procs::parse::parse_stat(&line).unwrap();
        prop_assert_eq!(st.pid, pid);
        prop_assert_eq!(st.comm, String::from_utf8_lossy(&comm).into_owned());
        prop_assert_eq!(st.state.to_string(), state);
        prop_assert_eq!((st.ppid, st.pgid, st.sid, st.start_time), (ppid, pgid, sid, start));
    }

    #[test]
    fn status_files_never_panic_and_round_trip(
        text in textish(),
        state in "[RSDZT]",
        uids in any::<[u32; 4]>(),
        gids in any::<[u32; 4]>(),
        noise in "[A-Za-z]{1,12}:\t[^\n]{0,30}".prop_filter("not a line the parser reads", |n| {
            !["State:", "Uid:", "Gid:", "Threads:", "Tgid:"].iter().any(|k| n.starts_with(k))
        }),
    ) {
        let (r, used) = allocated_by(|| procs::parse::parse_status(&text));
        prop_assert!(used <= bounded(text.len()));
        if let Err(e) = r {
            prop_assert!(one_line(&e), "{e}");
        }
        let doc = format!(
            "Name:\tx\n{noise}\nState:\t{state} (sleeping)\nUid:\t{}\t{}\t{}\t{}\nGid:\t{}\t{}\t{}\t{}\nThreads:\t1\n",
            uids[0], uids[1], uids[2], uids[3], gids[0], gids[1], gids[2], gids[3]
        );
        let (s, u, g) = procs::parse::parse_status(&doc).unwrap();
        prop_assert_eq!((s.to_string(), u, g), (state, uids, gids));
    }

    #[test]
    fn mount_lines_never_panic_and_find_the_topmost(
        text in textish(),
        opts in "[a-z=,0-9]{0,40}",
        hide in "(0|1|2|4|off|noaccess|invisible|ptraceable)",
    ) {
        let (r, used) = allocated_by(|| crate::observe::proctrust::opts_of(&text, "/proc"));
        prop_assert!(used <= bounded(text.len()));
        if let Some((_, sup)) = r {
            let _ = crate::observe::proctrust::parse_opts(&sup);
        }
        let _ = crate::observe::proctrust::parse_opts(&opts);
        let info = format!(
            "22 1 0:5 / /proc rw - proc proc rw\n{text}\n30 22 0:6 / /proc rw - proc proc rw,hidepid={hide}\n"
        );
        let (fstype, sup) = crate::observe::proctrust::opts_of(&info, "/proc").unwrap();
        prop_assert_eq!(fstype, "proc");
        let hidden = crate::observe::proctrust::parse_opts(&sup).hidepid != crate::observe::proctrust::HidePid::Off;
        prop_assert_eq!(hidden, !matches!(hide.as_str(), "0" | "off"));
    }

    #[test]
    fn attested_names_round_trip_and_stay_printable(bytes in prop::collection::vec(any::<u8>(), 0..256), text in any::<String>()) {
        for b in [bytes.as_slice(), text.as_bytes()] {
            let n = crate::attest::name::encode(b);
            prop_assert_eq!(crate::attest::name::decode(&n).unwrap(), b.to_vec());
            let unprintable = |c: char| c.is_control() || c == '\u{2028}' || c == '\u{2029}';
            prop_assert!(!n.chars().any(unprintable), "{:?}", n);
            // The encoding is a function of the bytes alone: printable UTF-8 stays as it is.
            if !text.contains(|c: char| c == '%' || unprintable(c)) {
                prop_assert_eq!(crate::attest::name::encode(text.as_bytes()), text.clone());
            }
        }
    }
}

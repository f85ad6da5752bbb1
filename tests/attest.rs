//! The attestation of the frozen trees, on the real kernel: the init as PID 1 of a PID namespace,
//! a workspace the sandbox UID made as an adversary would, the statement checked here and by
//! securesystemslib and hashlib, verify's re-check, and every way an attestation fails.

mod common;
use base64::Engine;
use common::*;
use sha2::{Digest, Sha256};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const UID: u32 = 4242;
const PY: &str = "/usr/bin/python3";

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

/// `quiesce freeze --wait --json` naming more paths to attest; (exit code, status).
fn freeze_attesting(c: &Container, nonce: &str, attest: &[&str]) -> (i32, serde_json::Value) {
    let q = quiesce();
    let st = c.state.to_str().unwrap().to_string();
    let mut args =
        vec![q.to_str().unwrap(), "freeze", "--state-dir", &st, "--wait", "--json", "--nonce", nonce];
    for a in attest {
        args.extend_from_slice(&["--attest", a]);
    }
    args.extend_from_slice(&["--timeout", "100"]);
    let out = c.exec(&args);
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| serde_json::json!({ "client_stderr": stderr(&out) }));
    (code(&out), v)
}

fn envelope_path(c: &Container) -> PathBuf {
    c.state.join("quiescence.intoto.jsonl")
}

/// The statement inside the state dir's envelope.
fn statement(c: &Container) -> serde_json::Value {
    let env: serde_json::Value = serde_json::from_slice(&std::fs::read(envelope_path(c)).unwrap()).unwrap();
    let body = base64::engine::general_purpose::STANDARD.decode(env["payload"].as_str().unwrap()).unwrap();
    serde_json::from_slice(&body).unwrap()
}

/// Run a shell script as the sandbox UID inside the container (it exits before the freeze).
fn as_sandbox(c: &Container, script: &str) {
    let out = c.exec_as(UID, &["sh", "-c", script]);
    assert!(out.status.success(), "{script}: {}", stderr(&out));
}

fn sha256_hex(p: &[u8]) -> String {
    let data = std::fs::read(std::ffi::OsStr::from_bytes(p)).unwrap();
    Sha256::digest(&data).iter().map(|b| format!("{b:02x}")).collect()
}

fn attested_state(st: &serde_json::Value) -> (String, String) {
    let a = &st["attestation"];
    (a["state"].as_str().unwrap_or("").to_string(), a["reason"].as_str().unwrap_or("").to_string())
}

/// The check by tools nobody here wrote: securesystemslib verifies the Ed25519 signature over
/// DSSE's PAE (written here from the spec), hashlib recomputes every subject's digest.
const PY_CHECK: &str = r#"
import base64, hashlib, json, sys, urllib.parse
from cryptography.hazmat.primitives import serialization
from securesystemslib.signer import SSlibKey, Signature
env = json.loads(open(sys.argv[1], "rb").read())
pub = serialization.load_pem_public_key(open(sys.argv[2], "rb").read())
raw = pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
body = base64.b64decode(env["payload"])
ptype = env["payloadType"]
assert ptype == "application/vnd.in-toto+json", ptype
pae = b"DSSEv1 %d %s %d %s" % (len(ptype), ptype.encode(), len(body), body)
sig = env["signatures"][0]
# keyid: the marker's kid, the RFC 7638 thumbprint of the public key.
b64u = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
jwk = '{"crv":"Ed25519","kty":"OKP","x":"%s"}' % b64u(raw)
assert sig["keyid"] == b64u(hashlib.sha256(jwk.encode()).digest()), sig["keyid"]
# securesystemslib names keys by hex ids of its own.
local = hashlib.sha256(sig["keyid"].encode()).hexdigest()
key = SSlibKey(local, "ed25519", "ed25519", {"public": raw.hex()})
key.verify_signature(Signature(local, base64.b64decode(sig["sig"]).hex()), pae)
st = json.loads(body)
assert st["_type"] == "https://in-toto.io/Statement/v1", st["_type"]
names = [s["name"] for s in st["subject"]]
assert names == sorted(names), "subjects not sorted"
for s in st["subject"]:
    path = urllib.parse.unquote_to_bytes(s["name"])
    h = hashlib.sha256(open(path, "rb").read()).hexdigest()
    assert h == s["digest"]["sha256"], s["name"]
print("ok", len(names))
"#;

#[test]
fn the_statement_names_every_file_and_verify_refuses_a_changed_tree() {
    let ws = scratch("ws");
    let outside = scratch("outside");
    let w = s(&ws).to_string();
    let c = sandbox(UID, &["--attest", &w]);
    as_sandbox(
        &c,
        &format!(
            "cd {w} && echo alpha > a && mkdir -p sub/deeper && echo f > sub/deeper/f && \
             echo nl > \"$(printf 'new\\nline')\" && echo bad > \"$(printf 'bad\\377name')\" && \
             echo 100 > 'per%cent' && ln -s loop2 loop1 && ln -s loop1 loop2 && mkfifo fifo && \
             echo secret > {o}/secret && ln {o}/secret hl",
            o = s(&outside)
        ),
    );
    let (rc, st) = freeze_attesting(&c, "n-1", &[]);
    assert_eq!(rc, 0, "{st}");
    assert_eq!(st["state"], "quiescent", "{st}");
    assert_eq!(attested_state(&st).0, "attested", "{st}");
    assert_eq!(c.status_file()["attestation"]["state"], "attested");

    let stm = statement(&c);
    assert_eq!(stm["_type"], "https://in-toto.io/Statement/v1");
    assert_eq!(stm["predicateType"], "https://quiesce.dev/attestation/frozen-tree/v1");
    let claims = c.marker_claims();
    let fr = &stm["predicate"]["freeze"];
    assert_eq!(fr["jti"], claims["jti"]);
    assert_eq!(fr["nonce"], "n-1");
    assert_eq!(fr["sandbox_uids"], serde_json::json!([UID]));
    assert_eq!(fr["container"], claims["container"]);
    let names: Vec<String> =
        stm["subject"].as_array().unwrap().iter().map(|x| x["name"].as_str().unwrap().to_string()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    let want: Vec<String> = ["a", "bad%FFname", "hl", "new%0Aline", "per%25cent", "sub/deeper/f"]
        .iter()
        .map(|n| format!("{w}/{n}"))
        .collect();
    assert_eq!(names, want);
    for (x, raw) in stm["subject"].as_array().unwrap().iter().zip([
        &b"a"[..],
        b"bad\xffname",
        b"hl",
        b"new\nline",
        b"per%cent",
        b"sub/deeper/f",
    ]) {
        let p = [w.as_bytes(), b"/", raw].concat();
        assert_eq!(x["digest"]["sha256"].as_str().unwrap(), sha256_hex(&p), "{}", x["name"]);
    }
    let path = &stm["predicate"]["paths"][0];
    assert_eq!(path["path"], w.as_str());
    assert_eq!(path["directories"], 2);
    assert_eq!(path["symlinks"][format!("{w}/loop1")], "loop2");
    assert_eq!(path["symlinks"][format!("{w}/loop2")], "loop1");
    assert_eq!(path["special"][format!("{w}/fifo")]["kind"], "fifo");
    assert_eq!(path["hardlinks"], serde_json::json!([{ "names": [format!("{w}/hl")], "links": 2 }]));

    // Tools nobody here wrote agree.
    let out = output(
        Command::new(PY).arg("-c").arg(PY_CHECK).arg(envelope_path(&c)).arg(c.state.join("signing.pub")),
    );
    assert!(out.status.success(), "securesystemslib/hashlib: {}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok 6");

    // Unchanged: the verifier runs.
    let ok = c.verify(&["--attest", &w, "--", "echo", "scored"]);
    assert_scored(&ok, "verify of an unchanged attested tree");

    // A write after the freeze, a new file and a removed one: refused, each named, in one line.
    let root_writes = format!("echo beta >> {w}/a && echo n > {w}/new && rm {w}/sub/deeper/f");
    assert!(c.exec(&["sh", "-c", &root_writes]).status.success());
    let bad = c.verify(&["--", "echo", "scored"]);
    assert_eq!(code(&bad), 19, "{}", stderr(&bad));
    assert!(bad.stdout.is_empty(), "the verifier ran");
    let e = stderr(&bad);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.contains(&format!("changed {w}/a")), "{e}");
    assert!(e.contains(&format!("added {w}/new")), "{e}");
    assert!(e.contains(&format!("removed {w}/sub/deeper/f")), "{e}");

    // The orchestrator names what it writes on purpose.
    let ig = |p: &str| format!("{w}/{p}");
    let (a, n, f) = (ig("a"), ig("new"), ig("sub"));
    let ok = c.verify(&[
        "--attest-ignore",
        &a,
        "--attest-ignore",
        &n,
        "--attest-ignore",
        &f,
        "--",
        "echo",
        "scored",
    ]);
    assert_scored(&ok, "verify with --attest naming the tree");

    // A symlink retargeted is a change too.
    assert!(c.exec(&["sh", "-c", &format!("ln -sfn elsewhere {w}/loop1")]).status.success());
    let bad = c.verify(&["--attest-ignore", &a, "--attest-ignore", &n, "--attest-ignore", &f]);
    assert_eq!(code(&bad), 19, "{}", stderr(&bad));
    assert!(stderr(&bad).contains(&format!("changed {w}/loop1")), "{}", stderr(&bad));

    // An envelope whose statement was edited does not verify; one of an earlier freeze is not
    // this marker's.
    let old = c.path("old.intoto.jsonl");
    std::fs::copy(envelope_path(&c), &old).unwrap();
    let mut env: serde_json::Value = serde_json::from_slice(&std::fs::read(&old).unwrap()).unwrap();
    let mut body = statement(&c);
    body["subject"][0]["digest"]["sha256"] = serde_json::json!("00".repeat(32));
    env["payload"] = base64::engine::general_purpose::STANDARD.encode(body.to_string()).into();
    let forged = c.path("forged.intoto.jsonl");
    std::fs::write(&forged, env.to_string()).unwrap();
    let bad = c.verify(&["--attestation", s(&forged)]);
    assert_eq!(code(&bad), 19, "{}", stderr(&bad));
    assert!(stderr(&bad).contains("does not verify"), "{}", stderr(&bad));
    let (rc, st) = freeze_attesting(&c, "n-2", &[]);
    assert_eq!((rc, attested_state(&st).0.as_str()), (0, "attested"), "{st}");
    let bad = c.verify(&["--attestation", s(&old)]);
    assert_eq!(code(&bad), 19, "{}", stderr(&bad));
    assert!(stderr(&bad).contains("is of freeze"), "{}", stderr(&bad));
}

#[test]
fn an_empty_directory_renamed_or_moved_is_a_change() {
    let ws = scratch("ws-dirs");
    let w = s(&ws).to_string();
    let c = sandbox(UID, &["--attest", &w]);
    as_sandbox(&c, &format!("cd {w} && mkdir empty sub && echo f > sub/f"));
    let (rc, st) = freeze_attesting(&c, "n-dirs", &[]);
    assert_eq!((rc, attested_state(&st).0.as_str()), (0, "attested"), "{st}");
    let path = &statement(&c)["predicate"]["paths"][0];
    assert_eq!(path["directories"], 2);
    assert_eq!(path["directory_names"], serde_json::json!([format!("{w}/empty"), format!("{w}/sub")]));
    let ok = c.verify(&["--", "echo", "scored"]);
    assert_scored(&ok, "verify of the attested directories");

    // Renamed: as many directories and files as attested, every file unchanged.
    assert!(c.exec(&["mv", &format!("{w}/empty"), &format!("{w}/moved")]).status.success());
    let bad = c.verify(&["--", "echo", "scored"]);
    assert_eq!(code(&bad), 19, "{}", stderr(&bad));
    assert!(bad.stdout.is_empty(), "the verifier ran");
    let e = stderr(&bad);
    assert!(e.contains(&format!("added {w}/moved")) && e.contains(&format!("removed {w}/empty")), "{e}");

    // Moved below another directory.
    assert!(c.exec(&["mv", &format!("{w}/moved"), &format!("{w}/sub/")]).status.success());
    let bad = c.verify(&[]);
    assert_eq!(code(&bad), 19, "{}", stderr(&bad));
    assert!(stderr(&bad).contains(&format!("added {w}/sub/moved")), "{}", stderr(&bad));

    // Named as written on purpose: scored.
    let (e1, e2) = (format!("{w}/empty"), format!("{w}/sub/moved"));
    let ok = c.verify(&["--attest-ignore", &e1, "--attest-ignore", &e2, "--", "echo", "scored"]);
    assert_scored(&ok, "verify with the changed paths ignored by name");
}

/// `top`, made by the sandbox user, holding `chains` chains of `levels` directories, each named
/// by 255 bytes (the chain's number, padded with `n`).
fn chains_of_long_names(c: &Container, top: &str, chains: usize, levels: usize) {
    let mk = r#"
import os, sys
os.mkdir(sys.argv[1])
top = os.open(sys.argv[1], os.O_RDONLY)
for c in range(int(sys.argv[2])):
    fd = top
    for _ in range(int(sys.argv[3])):
        n = str(c).rjust(255, "n")
        os.mkdir(n, dir_fd=fd)
        sub = os.open(n, os.O_RDONLY, dir_fd=fd)
        if fd != top:
            os.close(fd)
        fd = sub
    if fd != top:
        os.close(fd)
"#;
    let out = c.exec_as(UID, &[PY, "-c", mk, top, &chains.to_string(), &levels.to_string()]);
    assert!(out.status.success(), "{top}: {}", stderr(&out));
}

#[test]
fn names_longer_than_their_bound_fail_the_attestation() {
    let base = scratch("names");
    let b = s(&base).to_string();
    let c = sandbox(UID, &["--attest-allow", &b]);
    // Few entries, long names: 26 chains of 250 directories named by 255 bytes, 209 MB of paths.
    let names = format!("{b}/names");
    chains_of_long_names(&c, &names, 26, 250);

    let (rc, st) = freeze_attesting(&c, "names", &[&names]);
    assert_eq!((rc, st["state"].as_str()), (0, Some("quiescent")), "{st}");
    let (state, reason) = attested_state(&st);
    assert_eq!(state, "failed", "{st}");
    assert!(reason.contains("more than 201326592 bytes of names and link targets"), "{reason}");
    assert!(reason.len() < 600, "the reason names a path cut short: {} bytes", reason.len());
    assert!(!envelope_path(&c).exists(), "a partial statement was written");
    let bad = c.verify(&["--", "echo", "scored"]);
    assert_eq!(code(&bad), 19, "{}", stderr(&bad));
    assert!(bad.stdout.is_empty(), "the verifier ran");
}

#[test]
fn a_reason_shows_a_long_path_by_its_ends_and_keeps_its_fix() {
    let base = scratch("longpath");
    let b = s(&base).to_string();
    let c = sandbox(UID, &["--attest-allow", &b]);
    // 300 levels of 255-byte names: the deepest path is 77 KB, more than the init keeps of a
    // reason (4 KB); shown whole, it pushed out the bound and its fix.
    let long = format!("{b}/long");
    chains_of_long_names(&c, &long, 1, 300);
    let (rc, st) = freeze_attesting(&c, "long", &[&long]);
    assert_eq!((rc, st["state"].as_str()), (0, Some("quiescent")), "{st}");
    let (state, reason) = attested_state(&st);
    assert_eq!(state, "failed", "{st}");
    let fix = "is deeper than 256 levels: raise --attest-max-depth";
    assert!(reason.contains(fix), "{reason}");
    assert!(reason.starts_with(&format!("{long}/nnn")) && reason.len() < 1000, "{reason}");
    let bad = c.verify(&["--", "echo", "scored"]);
    assert_eq!(code(&bad), 19, "{}", stderr(&bad));
    assert!(stderr(&bad).contains(fix) && stderr(&bad).len() < 2000, "{}", stderr(&bad));
    assert!(bad.stdout.is_empty(), "the verifier ran");
}

/// Remove a tree too deep for a recursive removal: down by relative steps, then up.
fn remove_deep(top: &Path, levels: usize) {
    let script = "import os, sys\nos.chdir(sys.argv[1])\nn = 0\nwhile os.path.isdir('d'):\n    os.chdir('d'); n += 1\nfor _ in range(n):\n    os.chdir('..'); os.rmdir('d')\n";
    let out = output(Command::new(PY).arg("-c").arg(script).arg(top));
    assert!(out.status.success(), "removing {levels} levels: {}", stderr(&out));
}

#[test]
fn every_bound_fails_the_attestation_and_never_the_freeze() {
    let base = scratch("bounds");
    let b = s(&base).to_string();
    let c = sandbox(UID, &["--attest-allow", &b, "--attest-max-files", "1000"]);
    // A terabyte that is all holes, 10,000 levels, 1,500 empty files: all the sandbox's.
    as_sandbox(
        &c,
        &format!(
            "cd {b} && mkdir sparse many deep && truncate -s 1T sparse/huge && \
             cd many && seq 1 1500 | xargs touch"
        ),
    );
    let deep = format!("{b}/deep");
    let mk =
        "import os, sys\nos.chdir(sys.argv[1])\nfor _ in range(10000):\n    os.mkdir('d'); os.chdir('d')\n";
    let out = c.exec_as(UID, &[PY, "-c", mk, &deep]);
    assert!(out.status.success(), "{}", stderr(&out));
    for (tree, why) in [
        ("sparse", "more than 17179869184 bytes"),
        ("deep", "is deeper than 256 levels"),
        ("many", "more than 1000 entries"),
    ] {
        let t = Instant::now();
        let (rc, st) = freeze_attesting(&c, tree, &[&format!("{b}/{tree}")]);
        assert_eq!(rc, 0, "{tree}: {st}");
        assert_eq!(st["state"], "quiescent", "{tree}: {st}");
        let (state, reason) = attested_state(&st);
        assert_eq!(state, "failed", "{tree}: {st}");
        assert!(reason.contains(why), "{tree}: {reason}");
        assert!(t.elapsed() < Duration::from_secs(60), "{tree}: {:?}", t.elapsed());
        assert!(!envelope_path(&c).exists(), "{tree}: a partial statement was written");
        assert!(c.marker_exists(), "{tree}: the freeze's marker stays");
        // The marker names the path, so a plain verify refuses, with the init's reason.
        assert_eq!(c.marker_claims()["attest"], serde_json::json!([format!("{b}/{tree}")]));
        let bad = c.verify(&["--", "echo", "scored"]);
        assert_eq!(code(&bad), 19, "{tree}: {}", stderr(&bad));
        assert!(stderr(&bad).contains(why), "{tree}: {}", stderr(&bad));
        assert!(bad.stdout.is_empty(), "{tree}: the verifier ran");
    }
    // Only within what the init allows.
    let (rc, st) = freeze_attesting(&c, "outside", &["/etc"]);
    assert_eq!(rc, 0, "{st}");
    let (state, reason) = attested_state(&st);
    assert_eq!(state, "failed", "{st}");
    assert!(reason.contains("--attest-allow"), "{reason}");
    // The refused path is claimed all the same: no envelope covers it, and a plain verify
    // refuses rather than pass.
    assert_eq!(c.marker_claims()["attest"], serde_json::json!(["/etc"]));
    let bad = c.verify(&[]);
    assert_eq!(code(&bad), 19, "{}", stderr(&bad));
    assert!(stderr(&bad).contains("--attest-allow"), "{}", stderr(&bad));
    // verify asked for an attestation that failed: refused, with the init's reason.
    let bad = c.verify(&["--attest", &b]);
    assert_eq!(code(&bad), 19, "{}", stderr(&bad));
    assert!(stderr(&bad).contains("--attest-allow"), "{}", stderr(&bad));
    remove_deep(Path::new(&deep), 10_000);
}

#[test]
fn a_file_a_root_process_changes_while_it_is_hashed_fails_the_attestation() {
    let ws = scratch("busy");
    let w = s(&ws).to_string();
    let c = sandbox(UID, &["--attest", &w]);
    as_sandbox(&c, &format!("truncate -s 3G {w}/big"));
    // A root service of the task's, writing on after the freeze (the freeze does not end it).
    let _writer = c.start_ready(
        c.exec_cmd(&[
            "sh",
            "-c",
            &format!("echo $$ > \"$ADV_READY.tmp\" && mv \"$ADV_READY.tmp\" \"$ADV_READY\"; while :; do echo x >> {w}/big; sleep 0.005; done"),
        ]),
        "root writer",
    );
    let (rc, st) = freeze_attesting(&c, "busy", &[]);
    assert_eq!(rc, 0, "{st}");
    assert_eq!(st["state"], "quiescent", "{st}");
    let (state, reason) = attested_state(&st);
    assert_eq!(state, "failed", "{st}");
    assert!(reason.contains(&format!("{w}/big changed while it was attested")), "{reason}");
    assert!(!envelope_path(&c).exists());
}

/// Wait until status.json says the attestation runs.
fn wait_running(c: &Container) {
    wait_for("the attestation to run", Duration::from_secs(30), || {
        c.status_file()["attestation"]["state"] == "running"
    });
}

fn freeze_no_wait(c: &Container) {
    let q = quiesce();
    let out = c.exec(&[q.to_str().unwrap(), "freeze", "--state-dir", s(&c.state)]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn sigterm_during_hashing_shuts_the_init_down_as_always() {
    let ws = scratch("term");
    let w = s(&ws).to_string();
    let mut c = sandbox(UID, &["--attest", &w]);
    as_sandbox(&c, &format!("truncate -s 15G {w}/big"));
    freeze_no_wait(&c);
    wait_running(&c);
    let t = Instant::now();
    c.signal(libc::SIGTERM);
    let rc = c.wait_code(Duration::from_secs(20));
    // The command (sleep) ended by the forwarded SIGTERM, as without an attestation.
    assert_eq!(rc, 143);
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert!(!envelope_path(&c).exists());
}

#[test]
fn the_time_bound_fails_the_attestation_and_the_init_goes_on() {
    let ws = scratch("slow");
    let w = s(&ws).to_string();
    let c = sandbox(UID, &["--attest", &w, "--attest-timeout", "1"]);
    as_sandbox(&c, &format!("truncate -s 15G {w}/big"));
    let (rc, st) = freeze_attesting(&c, "slow", &[]);
    assert_eq!(rc, 0, "{st}");
    let (state, reason) = attested_state(&st);
    assert_eq!(state, "failed", "{st}");
    assert!(reason.contains("time bound"), "{reason}");
    assert!(!envelope_path(&c).exists());
    // The init still freezes, and the next attestation of a small tree works.
    assert!(c.exec(&["sh", "-c", &format!("rm {w}/big && echo x > {w}/x")]).status.success());
    let (rc, st) = freeze_attesting(&c, "again", &[]);
    assert_eq!((rc, attested_state(&st).0.as_str()), (0, "attested"), "{st}");
}

#[test]
fn another_mount_below_the_path_is_recorded_and_not_entered() {
    let ws = scratch("mounts");
    let other = scratch("reward");
    let w = s(&ws).to_string();
    // The paths through the variable, ':' between them, as an image's ENV would set them.
    let u = UID.to_string();
    let c = Container::start_with(
        Opts {
            init_args: vec!["--sandbox-user", &u],
            env: vec![("QUIESCE_ATTEST", format!("{w}:{}", s(&other)))],
            ..Default::default()
        },
        &["sleep", "1000000"],
    );
    wait_for("sandbox.json", Duration::from_secs(10), || c.state.join("sandbox.json").exists());
    as_sandbox(
        &c,
        &format!("mkdir {w}/bind {w}/tmpfs {w}/src && echo in > {w}/src/f && echo 1 > {}/reward", s(&other)),
    );
    // A bind mount of the same file system (same device, another mount) and a tmpfs, made in the
    // container's own mount namespace as a task's setup would.
    let mounts =
        format!("mount --bind {w}/src {w}/bind && mount -t tmpfs none {w}/tmpfs && echo t > {w}/tmpfs/x");
    let out = c.exec(&["sh", "-c", &mounts]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (rc, st) = freeze_attesting(&c, "mounts", &[]);
    assert_eq!((rc, attested_state(&st).0.as_str()), (0, "attested"), "{st}");
    let stm = statement(&c);
    let names: Vec<&str> =
        stm["subject"].as_array().unwrap().iter().map(|x| x["name"].as_str().unwrap()).collect();
    let mut want = vec![format!("{}/reward", s(&other)), format!("{w}/src/f")];
    want.sort();
    assert_eq!(names, want, "only the files of these mounts");
    assert_eq!(stm["predicate"]["paths"].as_array().unwrap().len(), 2);
    let ours =
        stm["predicate"]["paths"].as_array().unwrap().iter().find(|p| p["path"] == w.as_str()).unwrap();
    let skipped = &ours["skipped"];
    for m in ["bind", "tmpfs"] {
        assert_eq!(skipped[format!("{w}/{m}")], "another mount: not entered", "{skipped}");
    }
    let out = c.exec(&["sh", "-c", &format!("umount {w}/bind {w}/tmpfs")]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn the_workers_exit_is_never_the_commands() {
    let ws = scratch("exit");
    let w = s(&ws).to_string();
    let go = ws.join("go");
    let cmd = format!("while [ ! -e {} ]; do sleep 0.05; done; exit 7", s(&go));
    let mut c = Container::start(
        &["--sandbox-user", &UID.to_string(), "--attest", &w, "--after-freeze", "exit"],
        &["sh", "-c", &cmd],
    );
    wait_for("sandbox.json", Duration::from_secs(10), || c.state.join("sandbox.json").exists());
    as_sandbox(&c, &format!("echo x > {w}/x"));
    let (rc, st) = freeze_attesting(&c, "exit", &[]);
    assert_eq!((rc, attested_state(&st).0.as_str()), (0, "attested"), "{st}");
    // The worker exited (0) and was reaped: the init goes on with its command.
    std::thread::sleep(Duration::from_millis(300));
    assert!(c.alive(), "the init took the worker's exit for the command's");
    std::fs::write(&go, b"").unwrap();
    assert_eq!(c.wait_code(Duration::from_secs(20)), 7);
}

#[test]
fn a_fuse_mount_that_never_answers_fails_the_attestation_on_its_time_bound() {
    let test = "a_fuse_mount_that_never_answers_fails_the_attestation_on_its_time_bound";
    if !Path::new("/dev/fuse").exists() {
        skip(test, "no /dev/fuse on this machine");
        return;
    }
    let ws = scratch("fuse");
    let w = s(&ws).to_string();
    let c = sandbox(UID, &["--attest", &w, "--attest-timeout", "1"]);
    let mnt = ws.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    // Root's: a FUSE file system that answers INIT and nothing else. Looking at its root blocks
    // the worker in the kernel, where its own clock cannot stop it and SIGKILL may not.
    let _d = c.launch_root(&["fuse-daemon", s(&mnt)]);
    let t = Instant::now();
    let (rc, st) = freeze_attesting(&c, "fuse", &[]);
    assert_eq!(rc, 0, "{st}");
    assert_eq!(st["state"], "quiescent", "{st}");
    let (state, reason) = attested_state(&st);
    assert_eq!(state, "failed", "{st}");
    assert!(reason.contains("time bound of 1 s"), "{reason}");
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    assert!(!envelope_path(&c).exists());
    // The init goes on: the next freeze is quiescent, whatever became of the stuck worker.
    let (rc, st) = c.freeze("after");
    assert_eq!((rc, st["state"].as_str()), (0, Some("quiescent")), "{st}");
}

/// A FUSE mount that never answers, mounted inside an attested tree after the freeze: verify's
/// re-check blocks in the kernel on it, and verify still refuses within the attestation's time
/// bound and a few seconds more (exit 19), rather than hold the verifier's gate forever.
#[test]
fn verify_gives_up_on_a_mount_that_never_answers_within_its_bound() {
    let test = "verify_gives_up_on_a_mount_that_never_answers_within_its_bound";
    if !Path::new("/dev/fuse").exists() {
        skip(test, "no /dev/fuse on this machine");
        return;
    }
    let ws = scratch("fusev");
    let w = s(&ws).to_string();
    let c = sandbox(UID, &["--attest", &w, "--attest-timeout", "2"]);
    let mnt = ws.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    std::fs::write(ws.join("f"), b"kept").unwrap();
    let (rc, st) = freeze_attesting(&c, "fusev", &[]);
    assert_eq!(rc, 0, "{st}");
    assert_eq!(attested_state(&st).0, "attested", "{st}");
    let _d = c.launch_root(&["fuse-daemon", s(&mnt)]);
    let t = Instant::now();
    let out = c.verify(&["--nonce", "fusev", "--", "echo", "scored"]);
    let took = t.elapsed();
    assert_eq!(code(&out), 19, "{}", stderr(&out));
    assert!(stderr(&out).contains("did not end within"), "{}", stderr(&out));
    assert!(out.stdout.is_empty(), "the verifier ran");
    assert!(took < Duration::from_secs(30), "verify took {took:?}");
}

/// A directory above a named path that is a symlink (a sandbox-owned tree the init allows, with
/// a link to /etc in it): the path is attested where it is or not at all, never where the link
/// leads.
#[test]
fn a_link_above_a_named_path_fails_the_attestation() {
    let ws = scratch("linkabove");
    let w = s(&ws).to_string();
    let c = sandbox(UID, &["--attest-allow", &w]);
    std::os::unix::fs::symlink("/etc", ws.join("res")).unwrap();
    let asked = format!("{w}/res/ssh");
    let (rc, st) = freeze_attesting(&c, "linkabove", &[&asked]);
    assert_eq!((rc, st["state"].as_str()), (0, Some("quiescent")), "{st}");
    let (state, reason) = attested_state(&st);
    assert_eq!(state, "failed", "{st}");
    assert!(reason.contains("is a symlink"), "{reason}");
    assert!(!envelope_path(&c).exists());
}

/// Write status.json as the init does (whole, by a rename), changed by `edit`.
fn edit_status(c: &Container, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut st = c.status_file();
    edit(&mut st);
    let tmp = c.state.join(".status.json.test");
    std::fs::write(&tmp, st.to_string()).unwrap();
    std::fs::rename(&tmp, c.state.join("status.json")).unwrap();
}

/// The marker names what its freeze attests, signed before the attestation runs: a plain
/// verify (no --attest) refuses when the envelope is gone, as it would with --attest.
#[test]
fn the_marker_names_the_attested_paths_and_a_missing_envelope_is_refused() {
    let ws = scratch("claim");
    let w = s(&ws).to_string();
    let c = sandbox(UID, &["--attest", &w]);
    as_sandbox(&c, &format!("echo a > {w}/a"));
    let (rc, st) = freeze_attesting(&c, "claim", &[]);
    assert_eq!((rc, attested_state(&st).0.as_str()), (0, "attested"), "{st}");
    let claims = c.marker_claims();
    assert_eq!(claims["attest"], serde_json::json!([w]), "{claims}");
    let ok = c.verify(&["--", "echo", "scored"]);
    assert_scored(&ok, "verify of the attested tree");

    // A root process removes the envelope: the marker still says one was made.
    std::fs::remove_file(envelope_path(&c)).unwrap();
    let bad = c.verify(&["--", "echo", "scored"]);
    assert_eq!(code(&bad), 19, "{}", stderr(&bad));
    assert!(bad.stdout.is_empty(), "the verifier ran");
    let e = stderr(&bad);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.contains("no attestation at"), "{e}");
    assert!(e.contains("(the init's attestation: attested"), "{e}");
}

#[test]
fn without_attest_paths_the_marker_claims_none_and_verify_passes_as_before() {
    let c = sandbox(UID, &[]);
    let (rc, st) = c.freeze("plain");
    assert_eq!((rc, st["state"].as_str()), (0, Some("quiescent")), "{st}");
    assert!(st.get("attestation").is_none_or(|a| a.is_null()), "{st}");
    let claims = c.marker_claims();
    assert!(claims.get("attest").is_none(), "{claims}");
    let ok = c.verify(&["--", "echo", "scored"]);
    assert_scored(&ok, "verify of a marker with no attestation");
}

/// A freeze asked without --wait: verify finds the attestation still running and waits for it,
/// then checks it.
#[test]
fn verify_waits_for_an_attestation_still_running() {
    let ws = scratch("waitrun");
    let w = s(&ws).to_string();
    let c = sandbox(UID, &["--attest", &w]);
    as_sandbox(&c, &format!("truncate -s 3G {w}/big"));
    freeze_no_wait(&c);
    wait_running(&c);
    assert!(!envelope_path(&c).exists());
    let ok = c.verify(&["--", "echo", "scored"]);
    assert_scored(&ok, "verify while the attestation still runs");
    assert_eq!(c.status_file()["attestation"]["state"], "attested");
}

/// Waiting is bounded: by the attestation's own end (its time bound, which the init enforces),
/// and, should status.json never say it ended, by the marker's --max-age.
#[test]
fn verify_waits_for_a_running_attestation_only_within_its_bound() {
    let ws = scratch("waitbound");
    let w = s(&ws).to_string();
    let c = sandbox(UID, &["--attest", &w, "--attest-timeout", "1"]);
    as_sandbox(&c, &format!("truncate -s 15G {w}/big"));
    freeze_no_wait(&c);
    wait_running(&c);
    let t = Instant::now();
    let bad = c.verify(&["--", "echo", "scored"]);
    assert_eq!(code(&bad), 19, "{}", stderr(&bad));
    assert!(stderr(&bad).contains("(the init's attestation: failed: the time bound"), "{}", stderr(&bad));
    assert!(bad.stdout.is_empty(), "the verifier ran");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());

    // An init that never says (status.json left at running): refused once the marker is
    // --max-age old.
    assert!(c.exec(&["sh", "-c", &format!("rm {w}/big && echo x > {w}/x")]).status.success());
    let (rc, st) = freeze_attesting(&c, "small", &[]);
    assert_eq!((rc, attested_state(&st).0.as_str()), (0, "attested"), "{st}");
    std::fs::remove_file(envelope_path(&c)).unwrap();
    edit_status(&c, |st| st["attestation"] = serde_json::json!({"state": "running", "reason": null}));
    let t = Instant::now();
    let bad = c.verify(&["--max-age", "4", "--", "echo", "scored"]);
    assert_eq!(code(&bad), 19, "{}", stderr(&bad));
    let e = stderr(&bad);
    assert!(e.contains("(the init's attestation: running); wait for it"), "{e}");
    assert!(
        t.elapsed() >= Duration::from_secs(1) && t.elapsed() < Duration::from_secs(10),
        "{:?}",
        t.elapsed()
    );
}

/// Root without the capabilities that let it read what it does not own, as an engine that drops
/// them (Kubernetes' `drop: [ALL]` plus what the init needs) would run it.
const NO_DAC: [&str; 5] = [
    "setpriv",
    "--inh-caps",
    "-dac_override,-dac_read_search",
    "--bounding-set",
    "-dac_override,-dac_read_search",
];

/// A directory the sandbox locked (mode 000) where the worker has no capability to read past
/// modes: recorded as skipped, with the error, and a re-check with the same rights agrees. A
/// file the worker cannot open is not skipped: it fails the attestation, and verify refuses.
#[test]
fn an_entry_the_worker_may_not_read_is_skipped_and_verify_agrees() {
    let ws = scratch("eacces");
    let w = s(&ws).to_string();
    let u = UID.to_string();
    let c = Container::start_with(
        Opts {
            init_args: vec!["--sandbox-user", &u, "--attest", &w],
            prefix: NO_DAC.to_vec(),
            ..Default::default()
        },
        &["sleep", "1000000"],
    );
    wait_for("sandbox.json", Duration::from_secs(10), || c.state.join("sandbox.json").exists());
    as_sandbox(
        &c,
        &format!("cd {w} && echo a > a && mkdir locked && echo in > locked/f && chmod 000 locked"),
    );
    let (rc, st) = freeze_attesting(&c, "eacces", &[]);
    assert_eq!((rc, attested_state(&st).0.as_str()), (0, "attested"), "{st}");
    let stm = statement(&c);
    let names: Vec<&str> =
        stm["subject"].as_array().unwrap().iter().map(|x| x["name"].as_str().unwrap()).collect();
    assert_eq!(names, vec![format!("{w}/a")]);
    let skipped = &stm["predicate"]["paths"][0]["skipped"];
    let why = skipped[format!("{w}/locked")].as_str().unwrap_or("");
    assert!(why.starts_with("unreadable: Permission denied"), "{skipped}");

    let q = quiesce();
    let st_dir = s(&c.state).to_string();
    let verify_no_dac = |extra: &[&str]| {
        let mut a = NO_DAC.to_vec();
        a.extend_from_slice(&[q.to_str().unwrap(), "verify", "--state-dir", &st_dir]);
        a.extend_from_slice(extra);
        c.exec(&a)
    };
    let ok = verify_no_dac(&["--", "echo", "scored"]);
    assert_scored(&ok, "verify without CAP_DAC_OVERRIDE of a tree the worker could not read all of");
    // A verify that may read it sees what the worker could not: not the tree attested.
    let bad = c.verify(&[]);
    assert_eq!(code(&bad), 19, "{}", stderr(&bad));
    assert!(stderr(&bad).contains(&format!("added {w}/locked/f")), "{}", stderr(&bad));

    // A file it cannot open: the attestation fails, naming it; the freeze does not.
    assert!(c.exec(&["chmod", "000", &format!("{w}/a")]).status.success());
    let (rc, st) = freeze_attesting(&c, "eacces-file", &[]);
    assert_eq!((rc, st["state"].as_str()), (0, Some("quiescent")), "{st}");
    let (state, reason) = attested_state(&st);
    assert_eq!(state, "failed", "{st}");
    assert!(reason.contains(&format!("cannot read {w}/a: Permission denied")), "{reason}");
    let bad = verify_no_dac(&["--", "echo", "scored"]);
    assert_eq!(code(&bad), 19, "{}", stderr(&bad));
    assert!(stderr(&bad).contains("Permission denied"), "{}", stderr(&bad));
}

/// The old envelope cannot be removed at the start of a freeze (a directory with something in
/// it where the envelope was): the freeze fails before its kill, and leaves no marker that
/// the stale name could be taken with.
#[test]
fn an_old_envelope_that_cannot_be_removed_fails_the_freeze_and_leaves_no_marker() {
    let ws = scratch("stale");
    let w = s(&ws).to_string();
    let c = sandbox(UID, &["--attest", &w]);
    as_sandbox(&c, &format!("echo x > {w}/x"));
    let (rc, st) = freeze_attesting(&c, "first", &[]);
    assert_eq!((rc, attested_state(&st).0.as_str()), (0, "attested"), "{st}");
    std::fs::remove_file(envelope_path(&c)).unwrap();
    std::fs::create_dir(envelope_path(&c)).unwrap();
    std::fs::write(envelope_path(&c).join("kept"), b"x").unwrap();
    let (rc, st) = freeze_attesting(&c, "second", &[]);
    assert_ne!(rc, 0, "{st}");
    assert_eq!(st["state"], "failed", "{st}");
    let reason = st["reason"].as_str().unwrap_or("");
    assert!(reason.contains("cannot remove the old attestation"), "{st}");
    assert!(st.get("attestation").is_none_or(|a| a.is_null()), "{st}");
    assert!(!c.marker_exists(), "a marker beside an envelope that was not removed");
    let bad = c.verify(&["--", "echo", "scored"]);
    assert_eq!(code(&bad), 10, "{}", stderr(&bad));
    // Cleared, the next freeze attests again.
    std::fs::remove_dir_all(envelope_path(&c)).unwrap();
    let (rc, st) = freeze_attesting(&c, "third", &[]);
    assert_eq!((rc, attested_state(&st).0.as_str()), (0, "attested"), "{st}");
}

/// The worker cannot be started: the init's binary sits on a mount remounted noexec after it
/// started, so executing /proc/self/exe is refused. The attestation fails with the reason, the
/// freeze stays quiescent with its marker, and a plain verify refuses (the marker claims the
/// path).
#[test]
fn a_worker_that_cannot_start_fails_the_attestation_and_not_the_freeze() {
    let ws = scratch("noexec");
    let w = s(&ws).to_string();
    let bin = scratch("noexec-bin");
    let b = s(&bin).to_string();
    let init = bin.join("quiesce");
    std::fs::copy(quiesce(), &init).unwrap();
    let u = UID.to_string();
    let mount = format!("mount --bind {b} {b} && exec \"$@\"");
    let c = Container::start_with(
        Opts {
            init_args: vec!["--sandbox-user", &u, "--attest", &w],
            wrap: vec!["sh", "-c", &mount, "sh"],
            init_bin: Some(init.clone()),
            ..Default::default()
        },
        &["sleep", "1000000"],
    );
    wait_for("sandbox.json", Duration::from_secs(10), || c.state.join("sandbox.json").exists());
    as_sandbox(&c, &format!("echo x > {w}/x"));
    let out = c.exec(&["mount", "-o", "remount,bind,noexec", &b]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (rc, st) = freeze_attesting(&c, "noexec", &[]);
    assert_eq!((rc, st["state"].as_str()), (0, Some("quiescent")), "{st}");
    let (state, reason) = attested_state(&st);
    assert_eq!(state, "failed", "{st}");
    assert!(reason.contains("cannot start the attestation worker"), "{reason}");
    assert_eq!(c.status_file()["attestation"]["state"], "failed");
    assert!(c.marker_exists(), "the freeze's marker stays");
    assert!(!envelope_path(&c).exists());
    let bad = c.verify(&["--", "echo", "scored"]);
    assert_eq!(code(&bad), 19, "{}", stderr(&bad));
    assert!(stderr(&bad).contains("cannot start the attestation worker"), "{}", stderr(&bad));
    // Executable again, the next freeze attests.
    let out = c.exec(&["mount", "-o", "remount,bind,exec", &b]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (rc, st) = freeze_attesting(&c, "exec", &[]);
    assert_eq!((rc, attested_state(&st).0.as_str()), (0, "attested"), "{st}");
}

/// The live probe is the last look before the verifier starts: a sandbox process started while
/// verify waited for the attestation is found, and the verifier does not run.
#[test]
fn a_sandbox_process_started_while_verify_waits_is_found_after_the_wait() {
    let ws = scratch("waitlive");
    let w = s(&ws).to_string();
    let c = sandbox(UID, &["--attest", &w]);
    as_sandbox(&c, &format!("truncate -s 4G {w}/big"));
    freeze_no_wait(&c);
    wait_running(&c);
    let q = quiesce();
    let mut v =
        c.exec_cmd(&[q.to_str().unwrap(), "verify", "--state-dir", s(&c.state), "--", "echo", "scored"]);
    let waiting =
        v.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    as_sandbox(&c, "sleep 1000 > /dev/null 2>&1 &");
    assert_eq!(c.status_file()["attestation"]["state"], "running", "the attestation ended before the launch");
    let out = waiting.wait_with_output().unwrap();
    assert_eq!(code(&out), 16, "{}", stderr(&out));
    assert!(out.stdout.is_empty(), "the verifier ran");
    assert_eq!(c.status_file()["attestation"]["state"], "attested");
}

//! The marker and the verify gate: one test per check that makes it fail, and the real path.

mod common;
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const PY: &str = "/usr/bin/python3";

/// Run `cmd` (bounded) and demand success.
fn ok(cmd: &mut Command) -> std::process::Output {
    let out = output(cmd);
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

fn openssl_key(dir: &Path) -> PathBuf {
    let key = dir.join("signing.key");
    ok(Command::new("openssl").args(["genpkey", "-algorithm", "ed25519", "-out"]).arg(&key));
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    key
}

/// A signing key in a directory of its own, removed with it.
struct Key {
    path: PathBuf,
    _dir: Scratch,
}

impl std::ops::Deref for Key {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.path
    }
}

/// A frozen container signed with an openssl-made key; returns it with the key.
fn frozen(uid: u32, nonce: &str) -> (Container, Key) {
    frozen_with(uid, nonce, false)
}

/// `frozen`, in a container where setuid binaries work (`setuid`) or not.
fn frozen_with(uid: u32, nonce: &str, setuid: bool) -> (Container, Key) {
    let keydir = scratch("key");
    std::fs::set_permissions(&keydir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let key = Key { path: openssl_key(&keydir), _dir: keydir };
    let u = uid.to_string();
    let c = Container::start_with(
        Opts {
            init_args: vec!["--sandbox-user", &u, "--signing-key", key.to_str().unwrap()],
            setuid,
            ..Default::default()
        },
        &["sleep", "1000000"],
    );
    let w = c.launch(uid, &["sleepers", "20"]);
    assert_eq!(c.children_of(w.pid).len(), 20);
    let (code, st) = c.freeze(nonce);
    assert_eq!(code, 0, "{st}");
    assert_eq!(st["state"], "quiescent", "{st}");
    assert!(st["killed"].as_u64().unwrap_or(0) >= 21, "{st}");
    (c, key)
}

fn code(out: &std::process::Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

fn marker(c: &Container) -> String {
    read(&c.state.join("quiescence.jws")).trim().to_string()
}

/// Write a token to a file in the container dir and verify it with the state dir's key.
fn verify_token(c: &Container, token: &str, extra: &[&str]) -> std::process::Output {
    let f = c.path("forged.jws");
    std::fs::write(&f, token).unwrap();
    let mut args = vec!["--marker", f.to_str().unwrap()];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "echo", "scored"]);
    c.verify(&args)
}

/// Sign `claims` (JSON) with PyJWT, as an attacker with some key would.
fn pyjwt_sign(claims: &serde_json::Value, key: &Path, alg: &str) -> String {
    let script = r#"
import sys, json, jwt
from cryptography.hazmat.primitives import serialization
claims = json.loads(sys.argv[1]); alg = sys.argv[3]
data = open(sys.argv[2], "rb").read()
if alg == "EdDSA":
    print(jwt.encode(claims, serialization.load_pem_private_key(data, None), algorithm=alg))
else:
    # PyJWT rightly refuses a PEM key as an HMAC secret; an attacker builds the token by hand.
    import hmac, hashlib, base64
    b = lambda x: base64.urlsafe_b64encode(x).rstrip(b"=").decode()
    signing = b(b'{"alg":"HS256","typ":"JWT"}') + "." + b(json.dumps(claims).encode())
    print(signing + "." + b(hmac.new(data, signing.encode(), hashlib.sha256).digest()))
"#;
    let out = ok(Command::new(PY).arg("-c").arg(script).arg(claims.to_string()).arg(key).arg(alg));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn claims_of(token: &str) -> serde_json::Value {
    use base64::Engine;
    let p = token.split('.').nth(1).unwrap();
    serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(p).unwrap()).unwrap()
}

fn refused(out: &std::process::Output, want: i32, what: &str) {
    assert_eq!(code(out), want, "{what}: {}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stdout.is_empty(), "{what}: the command ran");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{what}: {err}");
}

#[test]
fn end_to_end_and_pyjwt_verifies_the_real_marker() {
    let (c, _key) = frozen(4401, "nonce-42");
    let out = c.verify(&["--nonce", "nonce-42", "--sandbox-user", "4401", "--", "sh", "-c", "echo scored"]);
    assert_scored(&out, "verify with the nonce and sandbox user");

    let script = r#"
import sys, jwt
from cryptography.hazmat.primitives import serialization
pub = serialization.load_pem_public_key(open(sys.argv[2], "rb").read())
c = jwt.decode(open(sys.argv[1]).read().strip(), pub, algorithms=["EdDSA"])
print(c["iss"], c["result"], c["survivors"], c["nonce"], c["sandbox_uids"], len(c["processes"]) >= 21)
"#;
    let out = output(
        Command::new(PY)
            .arg("-c")
            .arg(script)
            .arg(c.state.join("quiescence.jws"))
            .arg(c.state.join("signing.pub")),
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "quiesce quiescent 0 nonce-42 [4401] True",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let claims = claims_of(&marker(&c));
    for k in ["boot_id", "pid_ns", "hostname", "init_start"] {
        assert!(!claims["container"][k].is_null(), "{k}");
    }
    for k in ["stop", "walk", "kill", "probe", "total"] {
        assert!(claims["phases_ms"][k].is_u64(), "{k}");
    }
    let p = &claims["processes"][0];
    for k in ["pid", "ppid", "uids", "comm", "cmdline", "reason"] {
        assert!(!p[k].is_null(), "{k}");
    }
}

#[test]
fn missing_and_truncated_markers() {
    let (c, _) = frozen(4402, "n");
    std::fs::remove_file(c.state.join("quiescence.jws")).unwrap();
    refused(&c.verify(&["--", "echo", "scored"]), 10, "missing");
    refused(&verify_token(&c, "eyJhbGciOiJFZERTQSJ9.eyJ", &[]), 11, "truncated");
    refused(&verify_token(&c, "", &[]), 11, "empty");
}

#[test]
fn tampered_payload_header_and_wrong_key() {
    let (c, _) = frozen(4403, "n");
    let t = marker(&c);
    let parts: Vec<&str> = t.split('.').collect();
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut claims = claims_of(&t);
    claims["nonce"] = "other".into();
    let payload = b64.encode(claims.to_string());
    refused(&verify_token(&c, &format!("{}.{}.{}", parts[0], payload, parts[2]), &[]), 12, "payload");
    let header = b64.encode(r#"{"alg":"EdDSA","typ":"JWT","kid":"x"}"#);
    refused(&verify_token(&c, &format!("{}.{}.{}", header, parts[1], parts[2]), &[]), 12, "header");

    let other = scratch("otherkey");
    let key = openssl_key(&other);
    let pubkey = other.join("other.pub");
    ok(Command::new("openssl").args(["pkey", "-pubout", "-in"]).arg(&key).arg("-out").arg(&pubkey));
    refused(&c.verify(&["--public-key", pubkey.to_str().unwrap(), "--", "echo", "scored"]), 12, "wrong key");
    // Signed by another key altogether, with perfect claims.
    refused(&verify_token(&c, &pyjwt_sign(&claims_of(&t), &key, "EdDSA"), &[]), 12, "forged");
}

#[test]
fn alg_none_and_hs256_with_the_public_key_are_refused() {
    let (c, _) = frozen(4404, "n");
    let t = marker(&c);
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let none = format!("{}.{}.", b64.encode(r#"{"alg":"none","typ":"JWT"}"#), t.split('.').nth(1).unwrap());
    refused(&verify_token(&c, &none, &[]), 12, "alg none");
    let hs = pyjwt_sign(&claims_of(&t), &c.state.join("signing.pub"), "HS256");
    refused(&verify_token(&c, &hs, &[]), 12, "HS256");
}

#[test]
fn expired_future_nonce_and_uids() {
    let (c, key) = frozen(4405, "right");
    let t = marker(&c);
    let mut old = claims_of(&t);
    old["iat"] = (old["iat"].as_u64().unwrap() - 700).into();
    refused(&verify_token(&c, &pyjwt_sign(&old, &key, "EdDSA"), &[]), 14, "expired");
    let mut fut = claims_of(&t);
    fut["iat"] = (fut["iat"].as_u64().unwrap() + 3600).into();
    refused(&verify_token(&c, &pyjwt_sign(&fut, &key, "EdDSA"), &[]), 14, "future");
    std::thread::sleep(Duration::from_millis(1100));
    refused(&c.verify(&["--max-age", "0", "--", "echo", "scored"]), 14, "max-age");
    refused(&c.verify(&["--nonce", "wrong", "--", "echo", "scored"]), 13, "nonce");
    refused(&c.verify(&["--sandbox-user", "4406", "--", "echo", "scored"]), 13, "uids");
    let mut bad = claims_of(&t);
    bad["survivors"] = 1.into();
    refused(&verify_token(&c, &pyjwt_sign(&bad, &key, "EdDSA"), &[]), 13, "survivors");
    // The untouched marker still passes: every refusal above came from its one check.
    let out = c.verify(&["--nonce", "right", "--sandbox-user", "4405", "--", "echo", "scored"]);
    assert_scored(&out, "verify of the untouched marker");
}

/// The marker says what configuration the freeze ran in; a verifier that demands one refuses
/// markers that do not say so, with exit 18. This namespace has no no_new_privs (setuid binaries
/// work, Docker's default): its marker is refused unless the verifier accepts exactly that; and
/// lineage is on unless the init is told otherwise.
#[test]
fn a_policy_on_lineage_and_setuid_refuses_markers_from_other_configurations() {
    let (c, key) = frozen_with(4408, "p", true);
    let t = marker(&c);
    let claims = claims_of(&t);
    assert_eq!(claims["setuid"], true, "{claims}");
    let lineage = claims["lineage"].as_bool().expect("the marker says whether lineage was on");
    // Refused by default, naming the fix in one line; accepted only by name.
    refused(&c.verify(&["--", "echo", "scored"]), 18, "setuid by default");
    let said = String::from_utf8_lossy(&c.verify(&["--", "echo", "scored"]).stderr).to_string();
    assert!(said.contains("no-new-privileges") && said.contains("--accept-privilege-escalation"), "{said}");
    refused(&c.verify(&["--require-no-setuid", "--", "echo", "scored"]), 18, "setuid");
    let accepted = c.verify(&["--accept-privilege-escalation", "--", "echo", "scored"]);
    assert_scored(&accepted, "verify with --accept-privilege-escalation");
    let by_env = c.exec(&[
        "env",
        "QUIESCE_ACCEPT_PRIVILEGE_ESCALATION=1",
        quiesce().to_str().unwrap(),
        "verify",
        "--state-dir",
        c.state.to_str().unwrap(),
        "--",
        "echo",
        "scored",
    ]);
    assert_scored(&by_env, "verify accepting privilege escalation by the environment");
    // The old option still refuses, whatever the variable says (0 or 1).
    for v in ["0", "1"] {
        let out = c.exec(&[
            "env",
            &format!("QUIESCE_ACCEPT_PRIVILEGE_ESCALATION={v}"),
            quiesce().to_str().unwrap(),
            "verify",
            "--state-dir",
            c.state.to_str().unwrap(),
            "--require-no-setuid",
            "--",
            "echo",
            "scored",
        ]);
        refused(&out, 18, &format!("--require-no-setuid with the variable at {v}"));
    }
    let acc = ["--accept-privilege-escalation"];
    let with_lineage =
        c.verify(&["--require-lineage", "--accept-privilege-escalation", "--", "echo", "scored"]);
    if lineage {
        assert_scored(&with_lineage, "verify with --require-lineage of a marker with lineage");
    } else {
        refused(&with_lineage, 18, "lineage unavailable here");
    }
    let mut off = claims.clone();
    off["lineage"] = false.into();
    refused(
        &verify_token(&c, &pyjwt_sign(&off, &key, "EdDSA"), &["--require-lineage", acc[0]]),
        18,
        "lineage off",
    );
    let mut silent = claims.clone();
    silent.as_object_mut().unwrap().remove("setuid");
    silent["setuid"] = serde_json::Value::Null;
    refused(&verify_token(&c, &pyjwt_sign(&silent, &key, "EdDSA"), &[]), 18, "says nothing");
    let mut nnp = claims.clone();
    nnp["setuid"] = false.into();
    let out = verify_token(&c, &pyjwt_sign(&nnp, &key, "EdDSA"), &["--require-no-setuid"]);
    assert_scored(&out, "verify --require-no-setuid of a marker that says setuid: false");
    // A marker that says setuid: false passes without any option.
    let out = verify_token(&c, &pyjwt_sign(&nnp, &key, "EdDSA"), &[]);
    assert_scored(&out, "verify of a marker that says setuid: false");

    // An init with no_new_privs (Docker's no-new-privileges): its marker says setuid: false.
    let u = "4409";
    let n = Container::start_with(
        Opts {
            init_args: vec!["--sandbox-user", u],
            prefix: vec!["setpriv", "--no-new-privs"],
            ..Default::default()
        },
        &["sleep", "1000000"],
    );
    wait_for("n's sandbox", Duration::from_secs(10), || n.state.join("sandbox.json").exists());
    let _w = n.launch(4409, &["sleepers", "5"]);
    let (code, st) = n.freeze("q");
    assert_eq!(code, 0, "{st}");
    assert_eq!(claims_of(&marker(&n))["setuid"], false);
    let out = n.verify(&["--require-no-setuid", "--nonce", "q", "--", "echo", "scored"]);
    assert_scored(&out, "verify --require-no-setuid of a marker signed with no-new-privileges");
}

#[test]
fn marker_from_another_pid_namespace_is_refused() {
    let (a, key) = frozen(4407, "n");
    let u = "4407";
    let b = Container::start(
        &["--sandbox-user", u, "--signing-key", key.to_str().unwrap()],
        &["sleep", "1000000"],
    );
    wait_for("b's state", Duration::from_secs(5), || b.state.join("signing.pub").exists());
    refused(&verify_token(&b, &marker(&a), &[]), 15, "copied marker");
}

#[test]
fn live_sandbox_process_at_verify_time() {
    let (c, _) = frozen(4408, "n");
    // A root respawner starts a new sandbox process after the proof.
    let _w = c.launch(4408, &["pause"]);
    refused(&c.verify(&["--", "echo", "scored"]), 16, "live");
    let out = c.verify(&["--no-live-probe", "--", "echo", "scored"]);
    assert_scored(&out, "verify with --no-live-probe");
}

#[test]
fn unsafe_state_dirs_and_keys_are_refused() {
    let (c, _) = frozen(4409, "n");
    std::fs::set_permissions(&c.state, std::fs::Permissions::from_mode(0o775)).unwrap();
    refused(&c.verify(&["--", "echo", "scored"]), 17, "group-writable");
    std::fs::set_permissions(&c.state, std::fs::Permissions::from_mode(0o755)).unwrap();
    let link = c.path("link");
    std::os::unix::fs::symlink(&c.state, &link).unwrap();
    let q = quiesce();
    let out = c.exec(&[
        q.to_str().unwrap(),
        "verify",
        "--state-dir",
        link.to_str().unwrap(),
        "--",
        "echo",
        "scored",
    ]);
    refused(&out, 17, "symlink");

    // The init refuses a group-readable key, and a symlinked state dir, before running anything.
    let d = scratch("badkey");
    let key = openssl_key(&d);
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).unwrap();
    let ran = d.join("ran");
    let init = |state: &Path, extra: &[&Path]| {
        let mut cmd = Command::new(quiesce());
        cmd.args(["--sandbox-user", "4409", "--state-dir"]).arg(state);
        for k in extra {
            cmd.arg("--signing-key").arg(k);
        }
        output(cmd.args(["--", "touch"]).arg(&ran))
    };
    let out = init(&d.join("state"), &[&key]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("chmod 600"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!ran.exists());
    let out = init(&link, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("symlink"));
    assert!(!ran.exists());
}

#[test]
fn keygen_writes_a_usable_pair() {
    let d = scratch("keygen");
    ok(Command::new(quiesce()).args(["keygen", "--out"]).arg(d.join("k")));
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(d.join("k/signing.key")).unwrap().mode() & 0o777, 0o600);
    ok(Command::new("openssl").args(["pkey", "-noout", "-in"]).arg(d.join("k/signing.key")));
    ok(Command::new("openssl").args(["pkey", "-pubin", "-noout", "-in"]).arg(d.join("k/signing.pub")));
}

#[test]
fn freeze_request_without_an_init_times_out_with_2() {
    let d = scratch("noinit");
    let state = d.join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Inside a fresh namespace whose PID 1 is a plain shell: nobody answers the request.
    let out = output(
        Command::new("unshare").args(["--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c"]).arg(
            format!(
                "trap '' USR1; {} freeze --state-dir {} --wait --timeout 0.5",
                quiesce().display(),
                state.display()
            ),
        ),
    );
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
}

//! The Kubernetes examples, checked without a cluster: the pod files against what the init
//! itself asks for, and the volume layouts they use reproduced on the kernel.

mod common;
use common::*;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The capabilities the init names when it has none, as `capabilities.add` spells them.
fn needed_caps() -> Vec<String> {
    let d = scratch("k8s-caps");
    let out = output(
        Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "--kill-child", "setpriv", "--inh-caps=-all"])
            .args(["--bounding-set=-all", "--"])
            .arg(quiesce())
            .arg("--state-dir")
            .arg(d.join("state"))
            .args(["--sandbox-user", "4290", "--", "true"]),
    );
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{err}");
    let list = err
        .split("capabilities.add: [")
        .nth(1)
        .and_then(|r| r.split(']').next())
        .unwrap_or_else(|| panic!("no capabilities.add in: {err}"));
    list.split(',').map(|s| s.trim().to_string()).collect()
}

#[test]
fn pod_files_carry_what_the_init_needs() {
    let yaml = Command::new("python3").args(["-c", "import yaml"]).output();
    if !yaml.is_ok_and(|o| o.status.success()) {
        skip(
            "pod_files_carry_what_the_init_needs",
            "python3 with the yaml module is missing (Debian: python3-yaml; scripts/test installs it)",
        );
        return;
    }
    let caps = needed_caps();
    assert!(caps.len() >= 3, "{caps:?}");
    let check = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/kubernetes/check.py");
    let out = output(Command::new("python3").arg(check).arg("--caps").arg(caps.join(",")).arg("--self-test"));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A Secret volume holding a key pair from `quiesce keygen`; returns the volume.
fn keygen_secret(d: &Path) -> PathBuf {
    secret_volume(d, &["signing.key", "signing.pub"], |real| {
        let out = output(Command::new(quiesce()).arg("keygen").arg("--out").arg(real));
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    })
}

/// As pod.yaml lays it out: the state dir one the init creates inside an emptyDir (0777, not
/// sticky, root's), the key from a Secret. Then why the pod's initContainer makes the emptyDir
/// 0755: in a 0777 one the sandbox user can rename the state dir away.
#[test]
fn an_emptydir_state_volume_and_a_secret_key_work() {
    let uid = 4291;
    let u = uid.to_string();
    let keys = scratch("k8s-secret");
    let vol = keygen_secret(&keys);
    let key = vol.join("signing.key");
    let c = Container::start_with(
        Opts {
            init_args: vec!["--sandbox-user", &u, "--signing-key", key.to_str().unwrap()],
            // The container's directory becomes the emptyDir before the init starts.
            prefix: vec!["sh", "-c", "chmod 0777 \"$D\" && exec \"$@\"", "sh"],
            ..Default::default()
        },
        &["sleep", "1000000"],
    );
    // The harness returns once the init runs; its state dir comes a moment later.
    wait_for("the init's sandbox.json", READY_TIMEOUT, || c.state.join("sandbox.json").exists());
    let parent = std::fs::metadata(&c.dir).unwrap();
    assert_eq!(parent.mode() & 0o7777, 0o777);
    let st = std::fs::metadata(&c.state).unwrap();
    assert_eq!((st.uid(), st.mode() & 0o7777), (0, 0o755), "the state dir the init made");

    let _w = c.launch(uid, &["sleepers", "2"]);
    let (code, st) = c.freeze("n-k8s");
    assert_eq!(code, 0, "{st}");
    let pubkey = vol.join("signing.pub");
    let out =
        c.verify(&["--public-key", pubkey.to_str().unwrap(), "--nonce", "n-k8s", "--", "echo", "scored"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_scored(&out, "verify with the pod's public key");

    let (s, moved) = (c.state.to_str().unwrap().to_string(), c.path("moved"));
    let rename_as_agent = || c.exec_as(uid, &["mv", &s, moved.to_str().unwrap()]);
    // After the initContainer's chmod 0755: refused.
    chmod(&c.dir, 0o755);
    let out = rename_as_agent();
    assert_ne!(out.status.code(), Some(0), "the agent renamed the state dir out of a 0755 parent");
    assert!(c.state.exists());
    // Without it: the agent can.
    chmod(&c.dir, 0o777);
    let out = rename_as_agent();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!c.state.exists() && moved.exists());
    // ... and leave a link in its place to a directory of root's. The init writes through the
    // directory it opened at start, never through the path: its next freeze lands in the moved
    // directory, nothing in root's, and verify refuses what is at the path now.
    let roots = c.path("roots");
    std::fs::create_dir(&roots).unwrap();
    chmod(&roots, 0o700);
    let out = c.exec_as(uid, &["ln", "-s", roots.to_str().unwrap(), &s]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let before = std::fs::read(moved.join("status.json")).unwrap();
    c.signal(libc::SIGUSR1);
    wait_for("the next freeze's status in the moved directory", READY_TIMEOUT, || {
        std::fs::read(moved.join("status.json"))
            .is_ok_and(|now| now != before && !now.windows(8).any(|w| w == b"freezing"))
    });
    let planted: Vec<_> = std::fs::read_dir(&roots).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(planted.is_empty(), "the init wrote through the planted link: {planted:?}");
    let out = c.verify(&["--public-key", pubkey.to_str().unwrap(), "--", "echo", "scored"]);
    assert_ne!(out.status.code(), Some(0), "verify accepted a linked state dir");
    assert!(out.stdout.is_empty(), "the verifier ran");
    chmod(&c.dir, 0o1777);
}

/// The init says so when its state dir's parent lets others rename it (a 0777 emptyDir without
/// the pod's chmod), and is silent once the parent is root's and 0755, or sticky.
#[test]
fn a_state_dir_parent_others_may_write_is_named_at_start() {
    for (m, warned) in [(0o777, true), (0o775, true), (0o755, false), (0o1777, false)] {
        let d = scratch("k8s-parent");
        let vol = d.join("vol");
        std::fs::create_dir(&vol).unwrap();
        chmod(&vol, m);
        let out = output(
            Command::new("unshare")
                .args(["--pid", "--fork", "--mount-proc", "--kill-child"])
                .arg(quiesce())
                .arg("--state-dir")
                .arg(vol.join("state"))
                .args(["--sandbox-user", "4292", "--", "echo", "ran"]),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "mode {m:o}: {err}");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ran", "mode {m:o}");
        let said = err.contains("rename the state dir") && err.contains("root's and 0755");
        assert_eq!(said, warned, "mode {m:o}: {err}");
    }
}

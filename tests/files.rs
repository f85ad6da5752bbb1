//! Files quiesce trusts, through the real binary: keys reached through links (as a Kubernetes
//! Secret volume mounts them), and state-dir files that are links or not root's.

mod common;
use common::*;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

/// A Secret volume holding an Ed25519 key made by openssl; returns the key's link.
fn key_secret(d: &Path) -> PathBuf {
    let vol = secret_volume(d, &["key"], |real| {
        let out = Command::new("openssl")
            .args(["genpkey", "-algorithm", "ed25519", "-out"])
            .arg(real.join("key"))
            .output()
            .unwrap();
        assert!(out.status.success());
    });
    vol.join("key")
}

#[test]
fn a_signing_key_behind_secret_volume_links_loads_and_a_writable_directory_is_refused() {
    let d = scratch("secret");
    let key = key_secret(&d);
    let k = key.to_str().unwrap();
    let mut c = Container::start(&["--sandbox-user", "4251", "--signing-key", k], &["sleep", "1000000"]);
    let _w = c.launch(4251, &["sleepers", "2"]);
    let (code, st) = c.freeze("n");
    assert_eq!(code, 0, "{st}");
    // The marker is signed by that key: verify with its public half, given through links too.
    let real = d.join("secret/..2026_11_30_x");
    let out = Command::new("openssl")
        .args(["pkey", "-pubout", "-in"])
        .arg(real.join("key"))
        .arg("-out")
        .arg(real.join("key.pub"))
        .output()
        .unwrap();
    assert!(out.status.success());
    symlink("..data/key.pub", d.join("secret/key.pub")).unwrap();
    let pubkey = d.join("secret/key.pub");
    let out = c.verify(&["--public-key", pubkey.to_str().unwrap(), "--", "echo", "scored"]);
    assert_scored(&out, "verify with the public key from a Secret volume");
    c.signal(libc::SIGTERM);
    c.wait_code(T);

    // The same key behind a directory others may write in, or that another uid owns.
    let refused = |what: &str, dir: &Path, fix: &str| {
        let ran = d.join("ran");
        let out = Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "--kill-child"])
            .arg(quiesce())
            .arg("--state-dir")
            .arg(d.join("state"))
            .args(["--sandbox-user", "4251", "--signing-key", k, "--", "touch"])
            .arg(&ran)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{what}: {err}");
        assert!(!ran.exists(), "{what}: the command ran");
        assert_eq!(err.lines().count(), 1, "{what}: {err}");
        assert!(err.contains(&format!("{} on its path", dir.display())), "{what}: {err}");
        assert!(err.contains(fix), "{what}: {err}");
    };
    chmod(&real, 0o775);
    refused("group-writable", &real, "chmod go-w");
    chmod(&real, 0o757);
    refused("world-writable", &real, "chmod go-w");
    chmod(&real, 0o755);
    std::os::unix::fs::chown(&real, Some(4251), None).unwrap();
    refused("owned by 4251", &real, "chown root");
    std::os::unix::fs::chown(&real, Some(0), None).unwrap();
    // Without the sticky bit the volume's root guards nothing.
    chmod(&d.join("secret"), 0o777);
    refused("world-writable, not sticky", &d.join("secret"), "chmod go-w");
}

#[test]
fn state_dir_files_that_are_links_or_not_roots_are_refused_by_verify() {
    let mut c = Container::start(&["--sandbox-user", "4252"], &["sleep", "1000000"]);
    let _w = c.launch(4252, &["sleepers", "2"]);
    let (code, st) = c.freeze("n");
    assert_eq!(code, 0, "{st}");
    let passes = |c: &Container| {
        let out = c.verify(&["--", "echo", "scored"]);
        assert_scored(&out, "verify");
    };
    let refused = |c: &Container, what: &str, want: &str| {
        let out = c.verify(&["--", "echo", "scored"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(17), "{what}: {err}");
        assert!(out.stdout.is_empty(), "{what}: the verifier ran");
        assert_eq!(err.lines().count(), 1, "{what}: {err}");
        assert!(err.contains(want), "{what}: {err}");
    };
    passes(&c);
    for name in ["signing.pub", "quiescence.jws"] {
        let f = c.state.join(name);
        let copy = c.path(name);
        std::fs::copy(&f, &copy).unwrap();
        std::fs::rename(&f, c.path(&format!("{name}.orig"))).unwrap();
        symlink(&copy, &f).unwrap();
        refused(&c, &format!("{name} as a link"), "is a symlink");
        std::fs::remove_file(&f).unwrap();
        std::fs::rename(c.path(&format!("{name}.orig")), &f).unwrap();
        passes(&c);
        std::os::unix::fs::chown(&f, Some(4252), None).unwrap();
        refused(&c, &format!("{name} owned by 4252"), "owned by uid 4252");
        std::os::unix::fs::chown(&f, Some(0), None).unwrap();
        chmod(&f, 0o666);
        refused(&c, &format!("{name} writable by others"), "chmod go-w");
        chmod(&f, 0o644);
        passes(&c);
    }
    c.signal(libc::SIGTERM);
    c.wait_code(T);
}

//! The orchestrator's way in: the path every exec of quiesce takes (the freeze client, verify, a
//! tagged launch) runs as root, so nothing in the container may redirect it. Under a directory
//! (`/run/quiesce-harbor/quiesce`, the Harbor switch's layout before) a root process renames the
//! directory above the read-only mount and plants its own file; a read-only file bind mount at a
//! path in `/` is a mount point, which no process without CAP_SYS_ADMIN can rename, unlink or
//! mount over, in a directory (`/`) that cannot be renamed. Each claim on the real kernel, in a
//! root of the test's own (a private mount namespace, chroot), never the host's directories.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

/// A root of the test's own, as an engine makes one: itself a mount, BusyBox for the shell, and
/// the binary bind-mounted read-only at each path (the Harbor switch's old one, Docker's
/// injected init's, the fixed one). `attack` runs in it as root without
/// CAP_SYS_ADMIN (`agent_caps`: the setpriv options; empty keeps every capability), then the
/// orchestrator's exec of each path prints what answered. All in a mount namespace of its own.
fn in_a_root(tag: &str, agent_caps: &[&str], attack: &str) -> Option<String> {
    let busybox = ["/bin/busybox", "/usr/bin/busybox"].into_iter().map(Path::new).find(|p| p.exists())?;
    let dir = scratch(tag);
    let script = r#"set -e
R=$D/root
mkdir -p "$R/bin" "$R/run/quiesce-harbor" "$R/sbin" "$R/tmp"
cp "$BB" "$R/bin/busybox"
for a in sh mv rm mkdir mount printf echo chmod cat cp; do ln -s busybox "$R/bin/$a"; done
mount --bind "$R" "$R"
: > "$R/quiesce"; : > "$R/run/quiesce-harbor/quiesce"; : > "$R/sbin/docker-init"
for p in /quiesce /run/quiesce-harbor/quiesce /sbin/docker-init; do
    mount --bind "$Q" "$R$p"; mount -o remount,bind,ro "$R$p"
done
setpriv "$@" -- chroot "$R" /bin/sh -c "$ATTACK" 2>&1 || true
for p in /run/quiesce-harbor/quiesce /sbin/docker-init /quiesce; do
    printf '%s: ' "$p"; chroot "$R" "$p" --version 2>&1 || true
done
"#;
    let mut c = Command::new("unshare");
    c.args([
        "--mount",
        "--propagation",
        "private",
        "--pid",
        "--fork",
        "--kill-child",
        "sh",
        "-c",
        script,
        "sh",
    ])
    .args(if agent_caps.is_empty() { &["--reuid", "0"][..] } else { agent_caps })
    .env("D", &*dir)
    .env("BB", busybox)
    .env("Q", quiesce())
    .env("ATTACK", attack);
    let out = output(&mut c);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{tag}:\n{said}");
    Some(said)
}

const NO_SYS_ADMIN: &[&str] = &["--bounding-set", "-sys_admin"];
// What the agent plants where the orchestrator's path leads: its own "quiesce".
const FORGE: &str = "printf '#!/bin/sh\\necho forged\\n' > /evil && chmod 755 /evil";

#[test]
fn a_root_process_redirects_a_path_under_a_directory_but_not_a_mount_in_root() {
    let attack = format!(
        "{FORGE}; mv /run/quiesce-harbor /run/real && mkdir /run/quiesce-harbor && \
         cp /evil /run/quiesce-harbor/quiesce && \
         chmod 755 /run/quiesce-harbor/quiesce && echo swapped; \
         mv /sbin /sbin.real && mkdir /sbin && cp /evil /sbin/docker-init && echo 'sbin swapped'; \
         mv /quiesce /q2 || echo 'rename refused'; rm -f /quiesce || echo 'unlink refused'; \
         mv / /r2 || echo 'root rename refused'; mount --bind /evil /quiesce || echo 'mount refused'"
    );
    let Some(out) = in_a_root("wayin", NO_SYS_ADMIN, &attack) else {
        skip("a_root_process_redirects_a_path_under_a_directory_but_not_a_mount_in_root", "no busybox");
        return;
    };
    // The old layout: the directory above the mount is renamed, and the agent's file answers.
    assert!(out.contains("swapped"), "{out}");
    assert!(out.contains("/run/quiesce-harbor/quiesce: forged"), "{out}");
    // The engine's own mount of its injected init: /sbin is a plain directory.
    assert!(out.contains("sbin swapped") && out.contains("/sbin/docker-init: forged"), "{out}");
    // The fixed path: rename and unlink of a mount point, and rename of /, give EBUSY; a mount
    // over it, EPERM without CAP_SYS_ADMIN; the real binary still answers.
    assert_eq!(out.matches("Device or resource busy").count(), 3, "{out}");
    for refused in ["rename refused", "unlink refused", "root rename refused", "mount refused"] {
        assert!(out.contains(refused), "{refused}: {out}");
    }
    assert!(out.contains("/quiesce: quiesce "), "{out}");
}

#[test]
fn with_cap_sys_admin_a_mount_over_the_fixed_path_redirects_it() {
    // The control: what the engines' default set lacks is what the fixed path rests on.
    let Some(out) =
        in_a_root("wayin-admin", &[], &format!("{FORGE}; mount --bind /evil /quiesce && echo mounted"))
    else {
        skip("with_cap_sys_admin_a_mount_over_the_fixed_path_redirects_it", "no busybox");
        return;
    };
    assert!(out.contains("mounted") && out.contains("/quiesce: forged"), "{out}");
}

#[test]
fn a_client_run_from_a_second_bind_mount_of_the_init_binary_is_this_binary() {
    // The engine-injected init's recipe: the engine mounts the binary at its own path
    // (/sbin/docker-init), the orchestrator binds the same host file read-only at /quiesce and
    // execs that. The freeze client's identity (src/freeze/client.rs: "runs this binary") is
    // the executable's device and inode, which a bind mount keeps; a copy is another binary.
    let uid = 4295;
    let u = uid.to_string();
    let dir = scratch("wayin-bind");
    let second = dir.join("second");
    let copy = dir.join("copy");
    std::fs::write(&second, b"").unwrap();
    copy_executable(&quiesce(), &copy);
    let bind = format!(
        "mount --bind {q} {s} && mount -o remount,bind,ro {s} && exec \"$@\" 2>>{d}/init.log",
        q = quiesce().display(),
        s = second.display(),
        d = dir.display()
    );
    let mut c = Container::start_with(
        Opts {
            init_args: vec!["-v", "--sandbox-user", &u],
            wrap: vec!["sh", "-c", &bind, "sh"],
            ..Default::default()
        },
        &["sleep", "1000000"],
    );
    c.wait_published();
    let st = c.state.to_str().unwrap().to_string();
    let log = || std::fs::read_to_string(dir.join("init.log")).unwrap_or_default();
    for (bin, nonce) in [(second.to_str().unwrap(), "second"), (copy.to_str().unwrap(), "copy")] {
        let out = output(&mut c.exec_cmd(&[
            bin,
            "freeze",
            "--state-dir",
            &st,
            "--wait",
            "--json",
            "--nonce",
            nonce,
        ]));
        assert_eq!(out.status.code(), Some(0), "{bin}: {}", String::from_utf8_lossy(&out.stderr));
        if bin == second.to_str().unwrap() {
            assert!(!log().contains("is not taken for the init's own"), "{}", log());
        }
    }
    // The control: the same request from a copy is refused as another binary.
    assert!(log().contains("does not run this binary"), "{}", log());
    drop(c);
}

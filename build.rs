//! The one-line version `quiesce --version` prints and the marker's `version` claim carries:
//! `0.1.0 (x86_64-unknown-linux-musl, git 2088d958b2ac)`, `-dirty` after the commit when tracked
//! files differ from it. Not tini's ` - git.COMMIT` form: some Docker versions slice their own
//! init commit to the length of the one they read there, and a longer one panics `docker info`.
//!
//! The commit comes from, in order: QUIESCE_GIT_COMMIT (a build from a tree without .git, e.g. a
//! container build that leaves .git out), the git checkout this package is the root of, the
//! `.cargo_vcs_info.json` that `cargo package` writes, or else `unknown`. Nothing here reads the
//! clock or a path, so the string is the same for every build of the same commit and target.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        // `git status` may otherwise refresh the index, a write into the checkout a build must not make.
        .env("GIT_OPTIONAL_LOCKS", "0")
        .output()
        .ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// (commit, dirty) of the git checkout whose top is `dir`, and the files whose change changes them.
fn from_git(dir: &Path) -> Option<(String, bool, Vec<PathBuf>)> {
    // A package vendored inside another project's checkout is not that project's commit.
    let top = PathBuf::from(git(dir, &["rev-parse", "--show-toplevel"])?);
    if top.canonicalize().ok()? != dir.canonicalize().ok()? {
        return None;
    }
    let commit = git(dir, &["rev-parse", "--short=12", "HEAD"])?;
    let dirty = !git(dir, &["status", "--porcelain", "--untracked-files=no"])?.is_empty();
    let abs = |p: String| if Path::new(&p).is_absolute() { PathBuf::from(p) } else { dir.join(p) };
    let git_dir = abs(git(dir, &["rev-parse", "--git-dir"])?);
    let common = abs(git(dir, &["rev-parse", "--git-common-dir"])?);
    let mut watch = vec![git_dir.join("HEAD"), git_dir.join("index"), common.join("packed-refs")];
    if let Some(r) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
        watch.push(common.join(r));
    }
    Some((commit, dirty, watch))
}

/// (commit, dirty) from the `.cargo_vcs_info.json` of a packaged crate.
fn from_vcs_info(dir: &Path) -> Option<(String, bool)> {
    let text = std::fs::read_to_string(dir.join(".cargo_vcs_info.json")).ok()?;
    let field = |name: &str| {
        let at = text.find(&format!("\"{name}\""))? + name.len() + 2;
        let rest = text[at..].trim_start().strip_prefix(':')?.trim_start();
        Some(rest.split([',', '}', '\n']).next()?.trim().trim_matches('"').to_string())
    };
    let sha = field("sha1")?;
    Some((sha.get(..12)?.to_string(), field("dirty").as_deref() == Some("true")))
}

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let target = std::env::var("TARGET").expect("cargo sets TARGET");
    let version = std::env::var("CARGO_PKG_VERSION").expect("cargo sets CARGO_PKG_VERSION");
    println!("cargo:rerun-if-env-changed=QUIESCE_GIT_COMMIT");
    for p in ["build.rs", "Cargo.toml", "Cargo.lock", "src", ".cargo_vcs_info.json"] {
        if dir.join(p).exists() {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    let commit = match std::env::var("QUIESCE_GIT_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ => match from_git(&dir) {
            Some((commit, dirty, watch)) => {
                for p in watch.iter().filter(|p| p.exists()) {
                    println!("cargo:rerun-if-changed={}", p.display());
                }
                format!("{commit}{}", if dirty { "-dirty" } else { "" })
            }
            None => match from_vcs_info(&dir) {
                Some((commit, dirty)) => format!("{commit}{}", if dirty { "-dirty" } else { "" }),
                None => "unknown".into(),
            },
        },
    };
    println!("cargo:rustc-env=QUIESCE_VERSION={version} ({target}, git {commit})");
}

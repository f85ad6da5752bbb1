//! The setups the reproductions of the proof's edges share: the unfollowed setuid launch an
//! escapee starts from, the report of a marker signed beside a live escapee, and the knobs that
//! let a person try other shapes of an attack by hand. Uses only the harness in `common`.

use super::{quiesce, Container, Workload};
use std::str::FromStr;

/// `quiesce exec --user UID --allow-setuid --no-lineage -- BIN ARGS...`: a launch the init does
/// not follow (no lineage tag) whose setuid-root binaries may make root processes, the way a
/// sandbox user escapes to root unseen.
pub fn unfollowed_exec(uid: u32, bin: &str, args: &[&str]) -> Vec<String> {
    let q = quiesce();
    let u = uid.to_string();
    let head = [q.to_str().unwrap(), "exec", "--user", &u, "--allow-setuid", "--no-lineage", "--", bin];
    head.iter().chain(args).map(|a| a.to_string()).collect()
}

impl Container {
    /// An unfollowed launch (`unfollowed_exec`) entered from outside, waited for until ready.
    pub fn launch_unfollowed(&self, uid: u32, bin: &str, args: &[&str]) -> Workload {
        self.start_ready(
            self.exec_cmd(&unfollowed_exec(uid, bin, args)),
            &format!("{args:?} as {uid}, unfollowed"),
        )
    }
}

/// Says on stderr what a marker signed while the escapee's process `pid` lived lets through: the
/// marker's claims, the process as the namespace shows it, and what `quiesce verify` does with
/// the marker. The test counts the round and fails at its end, after every round has reported.
pub fn report_forged(c: &Container, round: usize, pid: i32) {
    let claims = c.marker_claims();
    let v = c.verify(&["--", "echo", "scored"]);
    eprintln!(
        "round {round}: FORGED: marker nonce {} survivors {} processes {}; escapee's process {pid} uid {:?} \
         ppid {:?}; verify exit {:?} stdout '{}' stderr '{}'",
        claims["nonce"],
        claims["survivors"],
        claims["processes"].as_array().map_or(0, |a| a.len()),
        c.status_line(pid, "Uid"),
        c.stat(pid).map(|s| s.ppid),
        v.status.code(),
        String::from_utf8_lossy(&v.stdout).trim(),
        String::from_utf8_lossy(&v.stderr).trim()
    );
}

/// A knob of an attack, for trying its other shapes by hand: the environment variable `name`
/// read as a `T`, or `default` when it is not set.
#[track_caller]
pub fn knob<T: FromStr>(name: &str, default: T) -> T {
    knob_set(name).unwrap_or(default)
}

/// A knob that changes the attack only when set. A value that does not read as a `T` fails the
/// test: a mistyped knob must not run the default shape unnoticed.
#[track_caller]
pub fn knob_set<T: FromStr>(name: &str) -> Option<T> {
    let v = std::env::var(name).ok()?;
    let parsed = v.parse().ok();
    if parsed.is_none() {
        panic!("{name}={v:?} does not read as a {}", std::any::type_name::<T>());
    }
    parsed
}

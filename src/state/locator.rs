//! Where the init of this PID namespace keeps its state: a file at a fixed path, named for the
//! namespace, so that `quiesce exec` pointed at no state dir, or at another one, still finds the
//! init it must tell about its launch. An init that cannot write it refuses to start with a state
//! dir other than the default (`init::start`); so an init that runs is found, and a launch beside
//! one is never left unrecorded without a word.

use crate::state::dir::StateDir;
use crate::state::files::FileError;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Root's directory of locators, one per PID namespace that runs an init.
pub const LOCATOR_DIR: &str = "/run/quiesce-inits";

/// What the init of a PID namespace says of itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Locator {
    pub state_dir: PathBuf,
    /// The init's pid and start time in its namespace: a locator an earlier init left names a
    /// process that is gone, or another one.
    pub pid: i32,
    pub start_time: u64,
}

/// The locator's file name for the PID namespace whose inode is `pid_ns`.
pub fn file_name(pid_ns: u64) -> String {
    format!("pidns-{pid_ns}.json")
}

fn this_namespace() -> Result<u64, String> {
    crate::kernel::stat::ns_inode("/proc/self/ns/pid")
        .map_err(|e| format!("cannot read this PID namespace: {e}"))
}

/// The init side: say where this init keeps its state.
pub fn publish(loc: &Locator) -> Result<(), String> {
    let dir = StateDir::create(Path::new(LOCATOR_DIR))?;
    let body = serde_json::to_vec(loc).map_err(|e| e.to_string())?;
    let name = file_name(this_namespace()?);
    dir.write_atomic(&name, &body, 0o644)
        .map_err(|e| format!("cannot write {}: {e}", dir.file(&name).display()))
}

/// The client side: what the init of this PID namespace said of itself, if it said anything.
/// An error: a locator is there but cannot be trusted (not root's, a link), never the same as none.
pub fn find() -> Result<Option<Locator>, String> {
    if std::fs::symlink_metadata(LOCATOR_DIR).is_err() {
        return Ok(None);
    }
    let dir = StateDir::open(Path::new(LOCATOR_DIR))?;
    let name = file_name(this_namespace()?);
    match dir.read(&name) {
        Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| {
            format!("{}: not what a quiesce init writes ({e}): remove it", dir.file(&name).display())
        }),
        Err(FileError::Missing(_)) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_locator_reads_back_as_written() {
        let l = Locator { state_dir: "/tmp/q state".into(), pid: 7, start_time: 99 };
        let b = serde_json::to_vec(&l).unwrap();
        assert_eq!(serde_json::from_slice::<Locator>(&b).unwrap(), l);
        assert_eq!(file_name(4026531836), "pidns-4026531836.json");
    }
}

//! What the init hands its attestation worker on a pipe: the paths, the bounds, the freeze's
//! facts and the signing key. Never through the environment or the command line, which any
//! process of the container may read in /proc.

use super::statement::Freeze;
use super::walk::Bounds;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The hidden option that makes the binary an attestation worker (never an init's option).
pub const WORKER_FLAG: &str = "--attest-worker";
/// A job larger than this is refused: it must fit in a pipe's buffer, so that the init's write
/// never waits for the worker.
pub const MAX_JOB: usize = 60 << 10;
/// The most the worker says back (its one line, before the newline): the init reads it only
/// after reaping the worker, so it must fit in a pipe's buffer, and the init keeps this much.
pub const SAID_MAX: usize = 4000;

#[derive(Serialize, Deserialize)]
pub struct Job {
    pub state_dir: PathBuf,
    pub paths: Vec<String>,
    pub bounds: Bounds,
    pub threads: usize,
    pub freeze: Freeze,
    /// The Ed25519 seed, hex.
    pub seed: String,
}

pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok())).collect()
}

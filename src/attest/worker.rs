//! The attestation worker: a process of its own (the init's binary, re-executed as root with
//! the init's credentials), so that hashing never runs on PID 1's thread nor grows its memory.
//! It walks, hashes, builds, signs and writes the envelope atomically, then says on stdout in
//! one line what it did or why it failed; its exit status says which (0: attested).

use super::job::{self, Job};
use super::{dsse, statement, tree};
use crate::state::{self, dir::StateDir};
use ed25519_dalek::SigningKey;
use std::io::{Read, Write};
use zeroize::Zeroize;

fn run(job: &Job, key: &SigningKey) -> Result<String, String> {
    let dir = StateDir::open(&job.state_dir)?;
    let started = std::time::Instant::now();
    let paths: Vec<Vec<u8>> = job.paths.iter().map(|p| p.as_bytes().to_vec()).collect();
    let c = tree::collect(&paths, &job.bounds, job.threads)?;
    let files = c.subjects.len();
    let bytes: u64 = c.paths.iter().map(|(_, e)| e.bytes).sum();
    let st = statement::build(c.subjects, c.paths, job.freeze.clone(), job.bounds);
    let body = serde_json::to_vec(&st).map_err(|e| format!("cannot write the statement: {e}"))?;
    drop(st);
    let env = dsse::sign(key, &body)?;
    dir.write_atomic(state::dir::ATTESTATION, &env, 0o644)
        .map_err(|e| format!("cannot write {}: {e}", dir.file(state::dir::ATTESTATION).display()))?;
    Ok(format!(
        "{files} file(s), {bytes} bytes in {} path(s), {} ms",
        paths.len(),
        started.elapsed().as_millis()
    ))
}

pub fn main() -> i32 {
    // It holds the signing key: no core dump, no tracer of its own UID.
    let said = match crate::kernel::process::set_not_dumpable() {
        Err(e) => Err(format!("cannot mark the attestation worker non-dumpable: {e}")),
        Ok(()) => {
            let mut text = Vec::new();
            match std::io::stdin().take(job::MAX_JOB as u64 + 1).read_to_end(&mut text) {
                Err(e) => Err(format!("cannot read the job: {e}")),
                Ok(_) => {
                    let parsed = serde_json::from_slice::<Job>(&text)
                        .map_err(|e| format!("not an attestation job: {e}"));
                    text.zeroize();
                    parsed.and_then(|mut j| {
                        let seed = job::unhex(&j.seed).and_then(|s| <[u8; 32]>::try_from(s).ok());
                        j.seed.zeroize();
                        let key =
                            SigningKey::from_bytes(&seed.ok_or("the job's key is not a 32-byte hex seed")?);
                        run(&j, &key)
                    })
                }
            }
        }
    };
    let (code, line) = match said {
        Ok(l) => (0, l),
        Err(e) => (1, e),
    };
    // The init reads this after it reaps the worker: more than a pipe's buffer would block the
    // write, and the worker with it, until its time bound. Nothing more is said.
    if let Err(e) = writeln!(std::io::stdout(), "{}", said_bounded(&line)) {
        // The init then knows only the exit status; the log keeps what could not be said.
        let _ =
            writeln!(std::io::stderr(), "quiesce: attestation worker: cannot tell the init ({e}): {line}");
    }
    code
}

/// A reason's first `job::SAID_MAX` bytes, cut at a character: what the init keeps of it.
fn said_bounded(line: &str) -> &str {
    let mut end = line.len().min(job::SAID_MAX);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    &line[..end]
}

#[cfg(test)]
mod tests {
    #[test]
    fn what_the_worker_says_fits_what_the_init_reads() {
        let long = format!("{}é{}", "a".repeat(super::job::SAID_MAX - 1), "b".repeat(70_000));
        let said = super::said_bounded(&long);
        assert_eq!(said.len(), super::job::SAID_MAX - 1, "cut at a character");
        assert_eq!(super::said_bounded("short"), "short");
    }
}

//! verify's re-check of the attested trees, run in a process of its own. A read that never
//! returns (a FUSE mount that does not answer) holds its caller in the kernel past any signal,
//! SIGKILL included, so a thread of verify's would keep verify from exiting: a child can be left
//! there, and verify still answers within its bound.

use crate::attest::{compare, name, statement, tree};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};

/// The hidden argument that makes the binary a re-check process.
pub const RECHECK_FLAG: &str = "--attest-recheck";

/// What the re-check is given on its stdin: this as one line of JSON, then the statement's
/// bytes as verify found them signed (not parsed and written again: a million subjects).
#[derive(Serialize, Deserialize)]
pub struct Recheck {
    /// Encoded paths not to compare (`--attest-ignore`).
    pub ignore: Vec<String>,
    pub threads: usize,
}

/// The re-check's stdin.
pub fn job(r: &Recheck, statement: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = serde_json::to_vec(r).map_err(|e| format!("cannot write the re-check's job: {e}"))?;
    out.push(b'\n');
    out.extend_from_slice(statement);
    Ok(out)
}

/// Its answer on stdout, one JSON line.
#[derive(Serialize, Deserialize)]
pub enum Verdict {
    /// Unchanged: this many files.
    Same(usize),
    /// What differs, or why the trees could not be read again, in one line.
    Differs(String),
}

/// Walk the statement's paths again and compare.
pub fn run(r: &Recheck, st: &statement::Statement) -> Verdict {
    let paths: Result<Vec<Vec<u8>>, String> =
        st.predicate.paths.iter().map(|p| name::decode(&p.path)).collect();
    let paths = match paths {
        Ok(p) => p,
        Err(e) => return Verdict::Differs(format!("the statement names a path it cannot hold: {e}")),
    };
    let now = match tree::collect(&paths, &st.predicate.bounds, r.threads) {
        Ok(n) => n,
        Err(e) => return Verdict::Differs(e),
    };
    let subjects = statement::subjects(now.subjects);
    let facts: Vec<statement::PathFacts> =
        now.paths.into_iter().map(|(p, e)| statement::facts(&p, e)).collect();
    let d = compare::compare(st, &subjects, &facts, &r.ignore);
    if d.is_empty() {
        Verdict::Same(subjects.len())
    } else {
        Verdict::Differs(d.line())
    }
}

/// The job as `job` wrote it: its line, then the statement.
pub fn parse_job(input: &[u8]) -> serde_json::Result<(Recheck, statement::Statement)> {
    // JSON as serde writes it has no raw newline: the first one ends the job's line.
    let (line, st) = input.split_at(input.iter().position(|&b| b == b'\n').unwrap_or(input.len()));
    let job = serde_json::from_slice::<Recheck>(line)?;
    Ok((job, serde_json::from_slice::<statement::Statement>(st.get(1..).unwrap_or_default())?))
}

/// The re-check process: its job on stdin, its verdict on stdout; exit 0 once it has answered.
pub fn main() -> i32 {
    let mut input = Vec::new();
    if let Err(e) = std::io::stdin().take(1 << 30).read_to_end(&mut input) {
        eprintln!("quiesce: re-check: cannot read its job: {e}");
        return 2;
    }
    let (job, st) = match parse_job(&input) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("quiesce: re-check: its job is not what verify writes: {e}");
            return 2;
        }
    };
    let out = serde_json::to_vec(&run(&job, &st)).unwrap_or_default();
    match std::io::stdout().write_all(&out) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("quiesce: re-check: cannot answer: {e}");
            2
        }
    }
}

//! Attestation of the frozen trees: after a quiescent freeze, an in-toto Statement of every file
//! under the named paths, in a DSSE envelope signed with the marker's key. The walk (walk), the
//! hash of one file (digest), both on threads (tree), names as text (name), the statement, the
//! envelope (dsse), what the init hands the worker (job), the worker process (worker), what
//! verify finds changed since (compare), and verify's re-check process (recheck).
//! May use: kernel, record, state, and marker's key id. Never runs on PID 1's thread: the init
//! starts `worker` as a process of its own, and verify starts `recheck`.

pub mod compare;
mod digest;
pub mod dsse;
pub mod job;
pub mod name;
pub mod recheck;
pub mod statement;
pub mod tree;
pub mod walk;
pub mod worker;

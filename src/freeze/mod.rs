//! Act and prove: one freeze conducted by run through its steps, stop, walk, kill, proof and
//! orphans (progress: the freeze as it goes from step to step), signal as a sandbox UID (cred),
//! signal one observed process PID-reuse-safely (target), read the walk's bounded evidence
//! (evidence) on its reader threads (readers), and tell the client that asked for the freeze from a process that claims to be it
//! (client). May use: kernel, record, observe, decide. The freeze is the conductor of one freeze;
//! it never signs: it returns an outcome for the init to sign.

pub mod client;
pub mod cred;
pub mod evidence;
mod kill;
mod orphans;
mod progress;
mod proof;
pub mod readers;
pub mod run;
mod stop;
pub mod target;
mod walk;

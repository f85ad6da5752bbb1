//! Act and prove: stop, walk, kill (run), signal as a sandbox UID (cred), and read the walk's
//! bounded evidence (evidence). May use: kernel, state, observe, decide. The freeze is the
//! conductor of one freeze; it never signs: it returns an outcome for the init to sign.

pub mod cred;
pub mod evidence;
mod run;

pub use run::*;

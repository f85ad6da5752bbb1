pub mod cred;
pub mod evidence;
mod run;

pub use run::*;

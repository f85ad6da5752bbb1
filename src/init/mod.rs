pub mod logging;
mod run;
pub mod spawn;

pub use run::*;

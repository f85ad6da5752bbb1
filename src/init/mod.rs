pub mod logging;
mod run;
pub mod spawn;
mod start;

pub use run::*;
pub use start::run_init;

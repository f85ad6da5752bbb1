//! PID 1's duties: start-up and its refusals (start), the loop that reaps, forwards, freezes and
//! signs (run), starting the command (spawn), and log output that cannot block (logging).
//! May use every folder below it. Once the command runs, nothing here may end the init by error.

mod attesting;
pub mod logging;
mod run;
pub mod spawn;
mod start;

pub use attesting::{check_setup as check_attest_setup, Setup as AttestSetup};
pub use run::*;
pub use start::run_init;

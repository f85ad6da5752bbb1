//! PID 1's duties: start-up and its refusals (start), the loop over its events (run), reaping
//! (reaper), one freeze from request to signed marker (freezing), the tracking refresh and launch
//! records (tracking), the sandbox's processes made the OOM killer's first choice (oom), the end of the container (shutdown), the attestation worker (attesting),
//! log output that cannot block (logging), and the detached
//! sidecar's set-up and ready line (sidecar).
//! May use every folder below it. Once the command runs, nothing here may end the init by error.

pub mod attesting;
mod freezing;
pub mod logging;
pub mod oom;
mod reaper;
pub mod run;
mod shutdown;
pub mod sidecar;
pub mod start;
pub mod tracking;

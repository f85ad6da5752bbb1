//! The client subcommands that run beside the init: ps, exec, freeze, keygen, and verify (the
//! verifier's gate); and sidecar, which starts an init beside a PID 1 that is not quiesce.
//! May use every folder, init's spawn included; the init never uses them.

pub mod exec;
pub mod freeze;
pub mod keygen;
pub mod ps;
pub mod sidecar;
pub mod verify;

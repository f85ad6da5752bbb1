//! The client subcommands that run beside the init: ps, exec, freeze, keygen, and verify (the
//! verifier's gate) with its hand-over of services; and sidecar, which starts an init beside a PID 1 that is not quiesce.
//! May use every folder; the init never uses them.

pub mod exec;
pub mod freeze;
pub mod handover;
pub mod keygen;
pub mod ps;
pub mod sidecar;
pub mod verify;

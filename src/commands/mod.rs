//! The client subcommands that run beside the init: ps, exec, freeze, keygen, and verify (the
//! verifier's gate). May use every folder, init's spawn included; the init never uses them.

pub mod exec;
pub mod freeze;
pub mod keygen;
pub mod ps;
pub mod verify;

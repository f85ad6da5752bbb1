//! The client subcommands that run beside the init: ps, exec, freeze, keygen, and verify (the
//! verifier's gate). May use every folder, init's spawn included; the init never uses them.

mod exec;
mod freeze;
mod keygen;
mod ps;
pub mod verify;

pub use exec::exec;
pub use freeze::freeze;
pub use keygen::keygen;
pub use ps::ps;

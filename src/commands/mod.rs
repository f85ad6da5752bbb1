mod exec;
mod freeze;
mod keygen;
mod ps;
pub mod verify;

pub use exec::exec;
pub use freeze::freeze;
pub use keygen::keygen;
pub use ps::ps;

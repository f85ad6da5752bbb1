mod dir;
pub mod files;
mod published;
pub mod removal;
pub mod requests;

pub use dir::*;
pub use published::*;

mod dir;
pub mod files;
pub mod removal;
pub mod requests;

pub use dir::*;

mod args;
pub mod quickargs;

pub use args::*;

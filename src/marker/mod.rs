mod jws;
pub mod keypem;

pub use jws::*;

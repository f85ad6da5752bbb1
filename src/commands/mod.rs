mod client;
pub mod verify;

pub use client::*;

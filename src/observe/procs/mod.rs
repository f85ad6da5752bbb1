//! The process table as /proc shows it.
//!
//! A process that vanished between listing and reading has exited. Any other failure is
//! *unknown* and is returned as an error: it is never read as "no such process".
//! May use: kernel, observe (proctrust). Never decides who is a sandbox process, never signals.

pub mod model;
pub mod parse;
pub mod pass;
pub mod read;
pub mod reader;
pub mod refresh;
pub mod table;

//! The fuzz targets' way in (fuzz/, docs/testing.md): a second crate root over the same folders
//! as src/main.rs, empty unless built with `--cfg fuzzing` (cargo fuzz sets it). The binary is
//! built from src/main.rs alone and never links this; a fuzz build reaches the readers of
//! untrusted bytes through the one public module, `fuzz`. Items no fuzz target reaches are dead
//! here by design: the binary's build is where dead code is found.
#![cfg(fuzzing)]
#![allow(dead_code)]

mod attest;
mod cli;
mod commands;
mod decide;
mod freeze;
pub mod fuzz;
mod init;
mod kernel;
mod marker;
mod observe;
mod record;
mod spawn;
mod state;

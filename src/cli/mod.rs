//! The command line: clap's arguments (args) and the fast reader of the common init line
//! (quickargs). May use: kernel, state. Parses and checks values only; never acts.

pub mod args;
pub mod quickargs;

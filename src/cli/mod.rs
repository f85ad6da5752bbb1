//! The command line: clap's arguments (args) and the fast reader of the common init line
//! (quickargs). May use: kernel (signal names), state (the default directory) and attest (the
//! walk's bounds, which the --attest-max-* options fill). Parses and checks values only; never acts.

pub mod args;
pub mod quickargs;

//! Test-only modules, built for `cargo test` alone: property tests of the parsers (proptests) and
//! the parse-cost benchmark against procfs-core (parsebench).

mod parsebench;
mod proptests;

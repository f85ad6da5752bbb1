//! Decide: who counts as a sandbox process (taint), and who appeared with no parent to vouch for
//! it (newcomers). May use: kernel, state (its launch records), observe. Never signals, never
//! writes: it reads tables it is given and answers with reasons.

pub mod newcomers;
pub mod taint;

//! The records a freeze leaves, as the marker, the attestation and status.json spell them: what
//! the walk recorded of each killed process and of each service (evidence), the container a
//! marker names (container), the freeze's phase times and a survivor (freeze). Plain data with
//! its serde spelling, defined once below everything that produces or reads it.
//! May use: std and serde; nothing of the crate. Never reads /proc, signals or writes: the
//! folders above fill these records in (observe, freeze), store them (state) and sign them
//! (marker).

pub mod container;
pub mod evidence;
pub mod freeze;

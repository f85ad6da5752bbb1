//! The container a marker names: read from /proc by `observe::container`, signed and checked by
//! the marker as it is given.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Container {
    pub boot_id: String,
    pub pid_ns: u64,
    pub hostname: String,
    pub init_start: u64,
}

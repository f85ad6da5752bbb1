//! What a freeze leaves besides its processes: how long each of its steps took, and each
//! sandbox process its proof found alive. status.json and the marker's claims carry them.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Survivor {
    pub pid: i32,
    pub uid: u32,
    pub state: char,
    pub comm: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Phases {
    pub stop: u64,
    pub walk: u64,
    pub kill: u64,
    pub probe: u64,
    pub total: u64,
}

//! The walk's records of the killed processes, as a marker's `processes` and `services` hold
//! them: gathered within their bounds by `freeze::evidence`, read back by the marker and by
//! `verify --hand-over`.

use serde::{Deserialize, Serialize};

/// One killed process as the walk recorded it (within the bounds of `freeze::evidence`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Evidence {
    pub pid: i32,
    pub ppid: i32,
    pub uids: Vec<u32>,
    pub comm: String,
    /// None: not read (`unreadable`).
    pub cmdline: Option<Vec<String>>,
    pub exe: Option<String>,
    pub start_time: u64,
    pub reason: Vec<String>,
    /// The command line or the exe path was cut to its cap.
    #[serde(default)]
    pub truncated: bool,
    /// The command line could not be read in time (or at all).
    #[serde(default)]
    pub unreadable: bool,
}
/// A killed process that listened on TCP: what a hand-over needs to start it again (its command
/// line and executable are in its `Evidence`, found by pid and start time).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Service {
    pub pid: i32,
    pub start_time: u64,
    pub listen: Vec<Endpoint>,
    /// None: not shown to the reader.
    pub cwd: Option<String>,
    /// `NAME=value` entries; None: not shown to the reader.
    pub env: Option<Vec<String>>,
    /// The working directory or the environment was cut to its cap.
    #[serde(default)]
    pub truncated: bool,
}

/// Where a socket listens (read by `observe::sockets`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    /// As the kernel's address text reads: "127.0.0.1", "::".
    pub addr: String,
    pub port: u16,
}

//! The state directory: status, marker, public key, what the init publishes (sandbox.json),
//! freeze requests and their results; files read and removed through descriptors only.
//! May use: kernel. Knows nothing of /proc or of the freeze: it stores what it is given.

pub mod dir;
pub mod files;
pub mod launches;
pub mod locator;
pub mod published;
pub mod removal;
pub mod requests;

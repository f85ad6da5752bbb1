//! The state directory: status, marker, public key, what the init publishes (sandbox.json),
//! freeze requests and their results, a sidecar's lock, log and ready line (sidecar); files read
//! and removed through descriptors only.
//! May use: kernel, record. Reads no /proc and runs no freeze: it stores what it is given. It
//! holds the status and its states (`dir`, whose phases and survivors are `record::freeze`'s)
//! and the request queue's policy (`requests`: whose signal takes which request), because the
//! marker, the init and the client commands all read them and sit above it.

pub mod dir;
pub mod files;
pub mod launches;
pub mod locator;
pub mod published;
pub mod removal;
pub mod requests;
pub mod sidecar;

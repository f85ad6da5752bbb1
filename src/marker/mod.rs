//! Sign and check the marker: the compact JWS and its claims (jws), Ed25519 keys as PEM (keypem).
//! May use: kernel, state, and the records observe and freeze produce. Never reads /proc: it signs
//! and checks what it is given.

pub mod jws;
pub mod keypem;

//! Sign and check the marker: the compact JWS and its claims (jws), Ed25519 keys as PEM (keypem).
//! May use: kernel, record (the records it signs), state (its file reads). Never reads /proc: it
//! signs and checks what it is given.

pub mod jws;
pub mod keypem;

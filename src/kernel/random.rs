//! Random bytes from the kernel (getrandom(2), through the getrandom crate).
//! May use: getrandom and std only.

use std::io;

pub fn getrandom(buf: &mut [u8]) -> io::Result<()> {
    getrandom::getrandom(buf).map_err(|e| io::Error::other(format!("getrandom: {e}")))
}

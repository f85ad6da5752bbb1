//! The container this process runs in, as a marker names it (`record::container`): read here,
//! where /proc is read, so that the marker only signs and checks what it is given.

use crate::record::container::Container;
use std::fs;
use std::io;

/// The container this process runs in, as a marker names it.
pub fn this_container() -> io::Result<Container> {
    let boot_id = fs::read_to_string("/proc/sys/kernel/random/boot_id")?.trim().to_string();
    let pid_ns = crate::kernel::stat::ns_inode("/proc/self/ns/pid")?;
    let hostname = fs::read_to_string("/proc/sys/kernel/hostname")?.trim().to_string();
    let init_start = crate::observe::procs::reader::Reader::default()
        .start_time(1)?
        .ok_or_else(|| io::Error::other("/proc/1 is missing: mount proc for this PID namespace"))?;
    Ok(Container { boot_id, pid_ns, hostname, init_start })
}

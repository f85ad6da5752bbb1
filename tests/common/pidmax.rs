//! A PID namespace's own pid_max (Linux 6.14 keeps one per namespace): small enough that a test
//! fills the pid space, or makes the pid counter come round, with a few hundred processes.

use super::{read, Container};
use std::path::Path;

/// Is pid_max kept per PID namespace here (Linux 6.14)? On older kernels writing it inside the
/// namespace would change the host's: the test must not even try.
pub fn pid_max_per_namespace() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut nums = release.split(|c: char| !c.is_ascii_digit()).filter_map(|n| n.parse::<u32>().ok());
    let (major, minor) = (nums.next().unwrap_or(0), nums.next().unwrap_or(0));
    (major, minor) >= (6, 14)
}

/// Give the container's namespace a pid_max of its own; the host's must not change.
pub fn own_pid_max_of(c: &Container, pid_max: u32) {
    let host = read(Path::new("/proc/sys/kernel/pid_max"));
    // Read back from inside: a sysctl file shows the value of the reader's own namespace.
    let out = c.exec(&[
        "sh",
        "-c",
        &format!("echo {pid_max} > /proc/sys/kernel/pid_max; cat /proc/sys/kernel/pid_max"),
    ]);
    assert!(
        out.status.success(),
        "cannot set the namespace's pid_max: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), pid_max.to_string());
    assert_eq!(read(Path::new("/proc/sys/kernel/pid_max")), host, "the host's pid_max changed");
}

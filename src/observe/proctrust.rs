//! May /proc be believed? An observation that shows no sandbox process proves something only if
//! the procfs it came from is this PID namespace's and hides nothing from the init. Checked before
//! every observation: each is a reason to fail, never to certify.

use crate::kernel::{creds, process, stat};
use std::io;
use std::path::Path;

/// The `hidepid=` of a procfs mount: what it hides from a reader that may not ptrace the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HidePid {
    Off,
    /// 1 / noaccess: entries listed, their contents unreadable.
    NoAccess,
    /// 2 / invisible, 4 / ptraceable: entries not even listed.
    Invisible,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOpts {
    pub hidepid: HidePid,
    /// `gid=`: members of this group see everything despite hidepid.
    pub gid: Option<u32>,
    /// `subset=pid`: /proc/sys and the rest are hidden.
    pub subset_pid: bool,
}

/// Parse the super options of a procfs mount ("rw,hidepid=invisible,gid=5").
pub fn parse_opts(opts: &str) -> MountOpts {
    let mut m = MountOpts { hidepid: HidePid::Off, gid: None, subset_pid: false };
    for o in opts.split(',') {
        if let Some(v) = o.strip_prefix("hidepid=") {
            m.hidepid = match v {
                "0" | "off" => HidePid::Off,
                "1" | "noaccess" => HidePid::NoAccess,
                // Anything unknown hides as much as the worst known value.
                _ => HidePid::Invisible,
            };
        } else if let Some(v) = o.strip_prefix("gid=") {
            m.gid = v.parse().ok();
        } else if o == "subset=pid" {
            m.subset_pid = true;
        }
    }
    m
}

/// The super options of the mount at `mount_point` in a mountinfo text: the last (topmost) one.
/// Fields: id parent major:minor root mount-point options [optional...] - fstype source super.
pub fn opts_of(mountinfo: &str, mount_point: &str) -> Option<(String, String)> {
    let mut found = None;
    for line in mountinfo.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() < 7 || f[4] != mount_point {
            continue;
        }
        let Some(dash) = f.iter().position(|&x| x == "-") else { continue };
        if let (Some(fstype), Some(sup)) = (f.get(dash + 1), f.get(dash + 3)) {
            found = Some((fstype.to_string(), sup.to_string()));
        }
    }
    found
}

fn untrusted(root: &Path, why: String) -> io::Error {
    io::Error::other(format!("{} cannot be trusted: {why} (the process table is unknown)", root.display()))
}

/// Fail unless `root` is a procfs of the init's own PID namespace that hides nothing from it.
pub fn check(root: &Path) -> io::Result<()> {
    let shown = root.display().to_string();
    if !stat::is_procfs(&shown).map_err(|e| untrusted(root, format!("statfs: {e}")))? {
        return Err(untrusted(root, "it is not a procfs mount: mount proc there".into()));
    }
    // In a procfs of another PID namespace, "self" names another pid or nothing at all.
    let me = process::getpid();
    match std::fs::read_link(root.join("self")) {
        Ok(t) if t.to_str() == Some(me.to_string().as_str()) => {}
        Ok(t) => {
            return Err(untrusted(
                root,
                format!("it belongs to another PID namespace (self is {}, not {me})", t.display()),
            ))
        }
        Err(e) => {
            return Err(untrusted(root, format!("it belongs to another PID namespace (self: {e})")));
        }
    }
    let info = std::fs::read_to_string(root.join("self/mountinfo"))
        .map_err(|e| untrusted(root, format!("cannot read its mountinfo: {e}")))?;
    let Some((fstype, sup)) = opts_of(&info, &shown) else {
        return Err(untrusted(root, "it is not listed in this mount namespace's mountinfo".into()));
    };
    if fstype != "proc" {
        return Err(untrusted(root, format!("the mount there is {fstype}, not proc")));
    }
    let o = parse_opts(&sup);
    if o.hidepid != HidePid::Off
        && !crate::kernel::capcheck::effective(caps::Capability::CAP_SYS_PTRACE)
        && !o.gid.is_some_and(creds::in_group)
    {
        return Err(untrusted(
            root,
            format!(
                "it is mounted with {} and the init lacks CAP_SYS_PTRACE, so other users' \
                 processes are hidden from it: remount without hidepid or grant CAP_SYS_PTRACE",
                sup.split(',').find(|x| x.starts_with("hidepid=")).unwrap_or("hidepid")
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_options() {
        assert_eq!(parse_opts("rw").hidepid, HidePid::Off);
        assert_eq!(parse_opts("rw,hidepid=invisible,gid=5").hidepid, HidePid::Invisible);
        assert_eq!(parse_opts("rw,hidepid=invisible,gid=5").gid, Some(5));
        assert_eq!(parse_opts("rw,hidepid=2").hidepid, HidePid::Invisible);
        assert_eq!(parse_opts("rw,hidepid=4").hidepid, HidePid::Invisible);
        assert_eq!(parse_opts("rw,hidepid=ptraceable").hidepid, HidePid::Invisible);
        assert_eq!(parse_opts("rw,hidepid=1").hidepid, HidePid::NoAccess);
        assert_eq!(parse_opts("rw,hidepid=what").hidepid, HidePid::Invisible);
        assert!(parse_opts("rw,subset=pid").subset_pid);
    }

    #[test]
    fn mountinfo_topmost_wins() {
        let mi = "22 1 0:5 / /proc rw,nosuid - proc proc rw\n\
                  30 22 0:40 / /proc rw - tmpfs none rw\n\
                  31 1 0:41 / /procx rw - proc proc rw,hidepid=2\n";
        assert_eq!(opts_of(mi, "/proc"), Some(("tmpfs".into(), "rw".into())));
        assert_eq!(opts_of(mi, "/procx"), Some(("proc".into(), "rw,hidepid=2".into())));
        assert_eq!(opts_of(mi, "/nope"), None);
        assert_eq!(opts_of("garbage line\n\n", "/proc"), None);
    }
}

//! Users and groups from the container's own /etc/passwd and /etc/group.
//! A static binary must not depend on NSS, so the files are read directly.

use std::fs;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
}

/// Resolve a USER argument: a numeric UID or a name in `passwd`.
/// A numeric UID without a passwd entry is fine (its primary group is then the UID itself).
pub fn resolve(spec: &str, passwd: &str) -> Result<User, String> {
    let spec = spec.trim();
    // Errors quote the argument; control characters in it must not break the one-line error.
    let shown = spec.escape_debug().to_string();
    if spec.is_empty() {
        return Err("empty user name: give a user name or a numeric UID".into());
    }
    if spec.bytes().all(|b| b.is_ascii_digit()) {
        let uid: u32 = spec
            .parse()
            .map_err(|_| format!("user '{shown}' is not a valid UID: use a number below 4294967295"))?;
        if uid == u32::MAX {
            return Err(format!("user '{shown}' is not a valid UID: use a number below 4294967295"));
        }
        return Ok(entries(passwd).find(|u| u.uid == uid).map(Entry::user).unwrap_or(User {
            name: spec.to_string(),
            uid,
            gid: uid,
            home: "/".into(),
        }));
    }
    if !spec.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-$".contains(&b)) {
        return Err(format!("user '{shown}' is malformed: give a user name or a numeric UID"));
    }
    entries(passwd)
        .find(|u| u.name == spec)
        .map(Entry::user)
        .ok_or_else(|| format!("user '{shown}' is not in /etc/passwd: add it or give a numeric UID"))
}

/// Resolve a sandbox user: like `resolve`, but root is refused.
pub fn resolve_sandbox(spec: &str, passwd: &str) -> Result<User, String> {
    let u = resolve(spec, passwd)?;
    if u.uid == 0 {
        return Err(format!(
            "sandbox user '{}' is UID 0: the sandbox user must not be root",
            spec.escape_debug()
        ));
    }
    Ok(u)
}

pub fn read_passwd() -> String {
    fs::read_to_string("/etc/passwd").unwrap_or_default()
}

pub fn read_group() -> String {
    fs::read_to_string("/etc/group").unwrap_or_default()
}

pub fn resolve_uids(specs: &[String]) -> Result<Vec<u32>, String> {
    if specs.is_empty() {
        return Ok(Vec::new());
    }
    let pw = read_passwd();
    let mut out = Vec::new();
    for s in specs {
        let u = resolve_sandbox(s, &pw)?.uid;
        if !out.contains(&u) {
            out.push(u);
        }
    }
    Ok(out)
}

/// Every well-formed entry (the property tests compare it with what they wrote).
#[cfg(test)]
pub(crate) fn parse_passwd(text: &str) -> Vec<User> {
    entries(text).map(Entry::user).collect()
}

/// One passwd line, borrowed: a lookup allocates only for the entry it returns.
struct Entry<'a> {
    name: &'a str,
    uid: u32,
    gid: u32,
    home: &'a str,
}

impl Entry<'_> {
    fn user(self) -> User {
        User { name: self.name.to_string(), uid: self.uid, gid: self.gid, home: self.home.to_string() }
    }
}

/// The well-formed entries of `text`: seven or more fields with numeric UID and GID. 4294967295
/// is no ID: to setresuid and setresgid it means "leave unchanged", so a user with it would run
/// as root.
fn entries(text: &str) -> impl Iterator<Item = Entry<'_>> {
    text.lines().filter(|l| !l.starts_with('#')).filter_map(|l| {
        let mut f = l.split(':');
        let name = f.next()?;
        let (uid, gid) = (f.nth(1)?, f.next()?);
        let home = f.nth(1)?;
        f.next()?;
        let id = |s: &str| s.parse::<u32>().ok().filter(|&n| n != u32::MAX);
        Some(Entry { name, uid: id(uid)?, gid: id(gid)?, home })
    })
}

/// Supplementary groups of `user`: every group that lists the name, plus the primary group.
pub fn groups_of(user: &User, group: &str) -> Vec<u32> {
    let mut gids = vec![user.gid];
    for l in group.lines().filter(|l| !l.starts_with('#')) {
        let f: Vec<&str> = l.split(':').collect();
        if f.len() < 4 {
            continue;
        }
        if f[3].split(',').any(|m| m == user.name) {
            if let Ok(g) = f[2].parse::<u32>() {
                if !gids.contains(&g) {
                    gids.push(g);
                }
            }
        }
    }
    gids
}

#[cfg(test)]
mod tests {
    use super::*;
    const PW: &str = "root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000::/home/agent:/bin/sh\n#c\nbad:line\n";
    const GR: &str = "agent:x:1000:\nwork:x:2000:agent,bob\nother:x:3000:bob\n";

    #[test]
    fn an_entry_with_the_id_that_means_unchanged_is_no_user() {
        for line in ["evil:x:4294967295:4243::/tmp:/bin/sh\n", "evil:x:4243:4294967295::/tmp:/bin/sh\n"] {
            assert!(resolve("evil", line).is_err(), "{line}");
        }
    }

    #[test]
    fn names_and_numbers() {
        assert_eq!(resolve("agent", PW).unwrap().uid, 1000);
        assert_eq!(resolve("1000", PW).unwrap().name, "agent");
        let n = resolve("4242", PW).unwrap();
        assert_eq!((n.uid, n.gid), (4242, 4242));
    }

    #[test]
    fn refusals_name_the_user() {
        assert!(resolve_sandbox("root", PW).unwrap_err().contains("'root'"));
        assert!(resolve_sandbox("0", PW).unwrap_err().contains("UID 0"));
        assert!(resolve("nobody", PW).unwrap_err().contains("'nobody'"));
        assert!(resolve("a b", PW).unwrap_err().contains("malformed"));
        assert!(resolve("99999999999", PW).is_err());
        assert!(resolve("4294967295", PW).is_err());
        assert!(resolve("", PW).is_err());
    }

    #[test]
    fn groups() {
        let u = resolve("agent", PW).unwrap();
        assert_eq!(groups_of(&u, GR), vec![1000, 2000]);
    }
}

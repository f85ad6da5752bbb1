//! The in-toto Statement v1 of a frozen tree: one subject per regular file (its absolute path,
//! encoded by `name`, and its sha256), sorted by name; the predicate carries the freeze's facts
//! and, per named path, everything that is not a regular file's content.

use super::name;
use super::walk::{Bounds, Entries};
use crate::record::container::Container;
use crate::record::freeze::Phases;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// The project's predicate, versioned: a change to its meaning makes a new version.
pub const PREDICATE_TYPE: &str = "https://quiesce.dev/attestation/frozen-tree/v1";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Statement {
    #[serde(rename = "_type")]
    pub kind: String,
    pub subject: Vec<Subject>,
    #[serde(rename = "predicateType")]
    pub predicate_type: String,
    pub predicate: Predicate,
}

/// A statement without its subjects, which are passed over unread: what verify checks itself.
/// The re-check reads the whole statement, so one without subjects still fails there.
#[derive(Debug, Deserialize)]
pub struct Head {
    #[serde(rename = "_type")]
    pub kind: String,
    #[serde(rename = "predicateType")]
    pub predicate_type: String,
    pub predicate: Predicate,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct Subject {
    pub name: String,
    pub digest: Sha256,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct Sha256 {
    pub sha256: String,
}

/// The freeze the tree was attested after, as its marker names it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Freeze {
    pub id: String,
    /// The marker's `jti` (the freeze id): the statement belongs to that marker alone.
    pub jti: String,
    pub nonce: Option<String>,
    pub container: Container,
    pub sandbox_uids: Vec<u32>,
    pub killed: u64,
    pub phases_ms: Phases,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Predicate {
    pub freeze: Freeze,
    /// How `name` encodes bytes that are not printable UTF-8 (docs/attestation.md).
    pub name_encoding: String,
    pub bounds: Bounds,
    pub paths: Vec<PathFacts>,
    pub version: String,
}

pub const NAME_ENCODING: &str = "quiesce-percent-v1";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct PathFacts {
    pub path: String,
    pub directories: u64,
    /// The directories' names below the path, sorted: a directory added, removed or renamed is
    /// a change even when it holds no file.
    pub directory_names: Vec<String>,
    pub files: u64,
    pub bytes: u64,
    /// name -> link text (never followed)
    pub symlinks: BTreeMap<String, String>,
    /// name -> fifo, socket, char-device or block-device (never opened)
    pub special: BTreeMap<String, Special>,
    /// name -> why it was not looked into (another mount, unreadable)
    pub skipped: BTreeMap<String, String>,
    /// Regular files with more than one link: the names here and the link count, which is
    /// larger than the names when links lead from outside the path.
    pub hardlinks: Vec<HardLink>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Special {
    pub kind: String,
    /// For devices: major and minor, as `MAJOR:MINOR`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdev: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct HardLink {
    pub names: Vec<String>,
    pub links: u32,
}

pub fn facts(path: &[u8], e: Entries) -> PathFacts {
    let enc = |b: &[u8]| name::encode(b);
    let mut hardlinks: Vec<HardLink> = e
        .links
        .into_values()
        .map(|(links, names)| {
            let mut names: Vec<String> = names.iter().map(|n| enc(n)).collect();
            names.sort();
            HardLink { names, links }
        })
        .collect();
    hardlinks.sort();
    PathFacts {
        path: enc(path),
        directories: e.dirs.len() as u64,
        directory_names: {
            let mut d: Vec<String> = e.dirs.iter().map(|n| enc(n)).collect();
            d.sort_unstable();
            d
        },
        files: e.files,
        bytes: e.bytes,
        symlinks: e.symlinks.iter().map(|(n, t)| (enc(n), enc(t))).collect(),
        special: e
            .special
            .iter()
            .map(|(n, kind, rdev)| {
                let dev = kind.ends_with("device").then(|| format!("{}:{}", rdev >> 32, rdev & 0xffff_ffff));
                (enc(n), Special { kind: kind.to_string(), rdev: dev })
            })
            .collect(),
        skipped: e.skipped.into_iter().map(|(n, why)| (enc(&n), why)).collect(),
        hardlinks,
    }
}

/// One file's subject: its name encoded, its digest in hex.
pub fn subject(name: &[u8], digest: &[u8; 32]) -> Subject {
    Subject { name: name::encode(name), digest: Sha256 { sha256: crate::state::dir::hex(digest) } }
}

/// Subjects sorted by name. A walk gives every name once, so the order is total without the
/// digest, and a sort that keeps equal names in place is not needed.
pub fn subjects(mut s: Vec<Subject>) -> Vec<Subject> {
    s.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    s
}

/// The statement of one walk: every file's subject and each named path's other entries.
pub fn build(
    subject: Vec<Subject>,
    paths: Vec<(Vec<u8>, Entries)>,
    freeze: Freeze,
    bounds: Bounds,
) -> Statement {
    Statement {
        kind: STATEMENT_TYPE.into(),
        subject: subjects(subject),
        predicate_type: PREDICATE_TYPE.into(),
        predicate: Predicate {
            freeze,
            name_encoding: NAME_ENCODING.into(),
            bounds,
            paths: paths.into_iter().map(|(p, e)| facts(&p, e)).collect(),
            version: env!("QUIESCE_VERSION").into(),
        },
    }
}

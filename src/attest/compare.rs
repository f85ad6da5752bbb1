//! What differs between an attested tree and the tree now: subjects changed, added or removed,
//! and the same for what is not a file's content. Names under an ignored path are not compared.

use super::statement::{PathFacts, Statement, Subject};
use std::collections::BTreeMap;

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Differences {
    pub changed: Vec<String>,
    pub added: Vec<String>,
    pub removed: Vec<String>,
}

impl Differences {
    pub fn is_empty(&self) -> bool {
        self.changed.is_empty() && self.added.is_empty() && self.removed.is_empty()
    }

    /// One line naming the first few of each.
    pub fn line(&self) -> String {
        let part = |what: &str, v: &Vec<String>| {
            (!v.is_empty()).then(|| {
                let first: Vec<&str> = v.iter().take(3).map(String::as_str).collect();
                let more = if v.len() > 3 { format!(" (+{} more)", v.len() - 3) } else { String::new() };
                format!("{what} {}{more}", first.join(", "))
            })
        };
        [part("changed", &self.changed), part("added", &self.added), part("removed", &self.removed)]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Is the encoded name `n` the path `p` or below it?
fn under(n: &str, p: &str) -> bool {
    let p = p.trim_end_matches('/');
    n == p || (n.starts_with(p) && n.as_bytes().get(p.len()) == Some(&b'/')) || p.is_empty()
}

fn maps<V: PartialEq>(
    then: &BTreeMap<String, V>,
    now: &BTreeMap<String, V>,
    keep: &dyn Fn(&str) -> bool,
    d: &mut Differences,
) {
    for (k, v) in then {
        match now.get(k) {
            Some(w) if w == v => {}
            Some(_) if keep(k) => d.changed.push(k.clone()),
            None if keep(k) => d.removed.push(k.clone()),
            _ => {}
        }
    }
    d.added.extend(now.keys().filter(|k| !then.contains_key(*k) && keep(k)).cloned());
}

pub fn compare(
    then: &Statement,
    subjects: &[Subject],
    paths: &[PathFacts],
    ignore: &[String],
) -> Differences {
    let keep = |n: &str| !ignore.iter().any(|p| under(n, p));
    let mut d = Differences::default();
    let a: BTreeMap<String, &str> =
        then.subject.iter().map(|s| (s.name.clone(), s.digest.sha256.as_str())).collect();
    let b: BTreeMap<String, &str> =
        subjects.iter().map(|s| (s.name.clone(), s.digest.sha256.as_str())).collect();
    maps(&a, &b, &keep, &mut d);
    let empty = PathFacts::default();
    for p in &then.predicate.paths {
        let now = paths.iter().find(|q| q.path == p.path).unwrap_or(&empty);
        maps(&p.symlinks, &now.symlinks, &keep, &mut d);
        maps(&p.special, &now.special, &keep, &mut d);
        maps(&p.skipped, &now.skipped, &keep, &mut d);
        let group = |h: &Vec<super::statement::HardLink>| -> BTreeMap<String, String> {
            h.iter()
                .flat_map(|g| g.names.iter().map(move |n| (n.clone(), format!("{:?} {}", g.names, g.links))))
                .collect()
        };
        maps(&group(&p.hardlinks), &group(&now.hardlinks), &keep, &mut d);
        if p.directories != now.directories && ignore.is_empty() {
            d.changed.push(format!(
                "{} ({} directories attested, {} now)",
                p.path, p.directories, now.directories
            ));
        }
    }
    d.changed.sort();
    d.added.sort();
    d.removed.sort();
    d.changed.dedup();
    d.added.dedup();
    d.removed.dedup();
    d
}

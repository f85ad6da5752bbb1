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
                let first: Vec<String> = v.iter().take(3).map(|n| super::name::cut(n)).collect();
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

/// Subjects compared in one pass over both lists sorted by name (a million names: no map, no copy).
fn merge(then: &[Subject], now: &[Subject], keep: &dyn Fn(&str) -> bool, d: &mut Differences) {
    use std::cmp::Ordering;
    fn sorted(v: &[Subject]) -> Vec<&Subject> {
        let mut r: Vec<&Subject> = v.iter().collect();
        if !r.windows(2).all(|w| w[0].name <= w[1].name) {
            r.sort_by(|x, y| x.name.cmp(&y.name));
        }
        r
    }
    let (a, b) = (sorted(then), sorted(now));
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        let order = match (a.get(i), b.get(j)) {
            (Some(x), Some(y)) => x.name.cmp(&y.name),
            (Some(_), None) => Ordering::Less,
            _ => Ordering::Greater,
        };
        match order {
            Ordering::Less => {
                if keep(&a[i].name) {
                    d.removed.push(a[i].name.clone());
                }
                i += 1;
            }
            Ordering::Greater => {
                if keep(&b[j].name) {
                    d.added.push(b[j].name.clone());
                }
                j += 1;
            }
            Ordering::Equal => {
                if a[i].digest != b[j].digest && keep(&a[i].name) {
                    d.changed.push(a[i].name.clone());
                }
                i += 1;
                j += 1;
            }
        }
    }
}

pub fn compare(
    then: &Statement,
    subjects: &[Subject],
    paths: &[PathFacts],
    ignore: &[String],
) -> Differences {
    let keep = |n: &str| !ignore.iter().any(|p| under(n, p));
    let mut d = Differences::default();
    merge(&then.subject, subjects, &keep, &mut d);
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
        for n in &p.directory_names {
            if now.directory_names.binary_search(n).is_err() && keep(n) {
                d.removed.push(n.clone());
            }
        }
        for n in &now.directory_names {
            if p.directory_names.binary_search(n).is_err() && keep(n) {
                d.added.push(n.clone());
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attest::statement::{Sha256, Subject};

    fn sub(n: &str, d: &str) -> Subject {
        Subject { name: n.into(), digest: Sha256 { sha256: d.into() } }
    }

    #[test]
    fn changed_added_removed_and_ignored() {
        assert!(under("/w/a", "/w") && under("/w", "/w/") && !under("/wx", "/w") && under("/x", "/"));
        let then = vec![sub("/w/a", "1"), sub("/w/b", "2"), sub("/w/c", "3")];
        let now = vec![sub("/w/a", "1"), sub("/w/b", "9"), sub("/w/d", "4")];
        let a: BTreeMap<String, &str> =
            then.iter().map(|s| (s.name.clone(), s.digest.sha256.as_str())).collect();
        let b: BTreeMap<String, &str> =
            now.iter().map(|s| (s.name.clone(), s.digest.sha256.as_str())).collect();
        let mut d = Differences::default();
        merge(&then, &now, &|_| true, &mut d);
        let mut m = Differences::default();
        maps(&a, &b, &|_| true, &mut m);
        assert_eq!(d, m, "the merge and the maps agree");
        assert_eq!(
            (d.changed.clone(), d.added.clone(), d.removed.clone()),
            (vec!["/w/b".to_string()], vec!["/w/d".to_string()], vec!["/w/c".to_string()])
        );
        assert_eq!(d.line(), "changed /w/b; added /w/d; removed /w/c");
        let mut d = Differences::default();
        maps(&a, &b, &|n| !under(n, "/w/b") && !under(n, "/w/d"), &mut d);
        assert_eq!(d.line(), "removed /w/c");
        let many = Differences { changed: (0..5).map(|i| format!("/w/{i}")).collect(), ..Default::default() };
        assert_eq!(many.line(), "changed /w/0, /w/1, /w/2 (+2 more)");
    }
}

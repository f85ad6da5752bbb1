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

    /// A statement of `subjects` (name, digest) and `paths`, the freeze's facts as a real one's.
    fn statement(subjects: &[(&str, &str)], paths: Vec<PathFacts>) -> Statement {
        let subject: Vec<Subject> = subjects.iter().map(|(n, d)| sub(n, d)).collect();
        let v = serde_json::json!({
            "_type": crate::attest::statement::STATEMENT_TYPE,
            "subject": subject,
            "predicateType": crate::attest::statement::PREDICATE_TYPE,
            "predicate": {
                "freeze": {
                    "id": "f", "jti": "f", "nonce": null,
                    "container": {"boot_id": "b", "pid_ns": 1, "hostname": "h", "init_start": 1},
                    "sandbox_uids": [4242], "killed": 1,
                    "phases_ms": {"stop": 0, "walk": 0, "kill": 0, "probe": 0, "total": 0}
                },
                "name_encoding": crate::attest::statement::NAME_ENCODING,
                "bounds": {"files": 10, "bytes": 10, "depth": 10, "seconds": 10},
                "paths": paths,
                "version": "t"
            }
        });
        serde_json::from_value(v).expect("a statement")
    }

    fn facts(path: &str, dirs: &[&str]) -> PathFacts {
        PathFacts {
            path: path.into(),
            directories: dirs.len() as u64,
            directory_names: dirs.iter().map(|d| d.to_string()).collect(),
            ..Default::default()
        }
    }

    fn subs(v: &[(&str, &str)]) -> Vec<Subject> {
        v.iter().map(|(n, d)| sub(n, d)).collect()
    }

    #[test]
    fn an_unchanged_tree_has_no_difference_and_each_kind_alone_is_one() {
        let then = statement(&[("/w/a", "1"), ("/w/b", "2")], vec![facts("/w", &["/w/d"])]);
        let same = compare(&then, &subs(&[("/w/a", "1"), ("/w/b", "2")]), &[facts("/w", &["/w/d"])], &[]);
        assert!(same.is_empty(), "{same:?}");
        assert_eq!(same.line(), "");
        for (now, kind) in [
            (vec![("/w/a", "9"), ("/w/b", "2")], "changed /w/a"),
            (vec![("/w/a", "1"), ("/w/b", "2"), ("/w/c", "3")], "added /w/c"),
            (vec![("/w/a", "1")], "removed /w/b"),
            (vec![("/w/b", "2")], "removed /w/a"),
        ] {
            let d = compare(&then, &subs(&now), &[facts("/w", &["/w/d"])], &[]);
            assert!(!d.is_empty(), "{kind}");
            assert_eq!(d.line(), kind);
        }
        let three = Differences { added: (0..3).map(|i| format!("/w/{i}")).collect(), ..Default::default() };
        assert_eq!(three.line(), "added /w/0, /w/1, /w/2");
    }

    #[test]
    fn subjects_in_any_order_compare_by_name() {
        let then = statement(&[("/w/c", "3"), ("/w/a", "1"), ("/w/b", "2")], vec![]);
        let now = subs(&[("/w/b", "2"), ("/w/c", "3"), ("/w/a", "1")]);
        assert!(compare(&then, &now, &[], &[]).is_empty());
        let d = compare(&then, &subs(&[("/w/z", "0"), ("/w/a", "1")]), &[], &[]);
        assert_eq!(d.line(), "added /w/z; removed /w/b, /w/c");
    }

    #[test]
    fn ignored_names_are_not_compared_and_the_rest_is() {
        let mut p = facts("/w", &["/w/d", "/w/tmp"]);
        p.symlinks.insert("/w/tmp/l".into(), "x".into());
        p.symlinks.insert("/w/l".into(), "x".into());
        p.skipped.insert("/w/tmp/mnt".into(), "another mount".into());
        let then = statement(&[("/w/a", "1"), ("/w/tmp/t", "1")], vec![p.clone(), facts("/v", &[])]);
        let mut q = facts("/w", &["/w/d", "/w/tmp", "/w/tmp/new"]);
        q.symlinks.insert("/w/tmp/l".into(), "y".into());
        q.symlinks.insert("/w/l".into(), "x".into());
        let now = subs(&[("/w/a", "1"), ("/w/tmp/t", "2"), ("/w/tmp/u", "2")]);
        let ignore = vec!["/w/tmp".to_string()];
        let d = compare(&then, &now, &[facts("/v", &[]), q.clone()], &ignore);
        assert!(d.is_empty(), "only ignored names differ: {d:?}");
        let d = compare(&then, &now, &[facts("/v", &[]), q], &[]);
        assert_eq!(
            d.line(),
            "changed /w (2 directories attested, 3 now), /w/tmp/l, /w/tmp/t; added /w/tmp/new, /w/tmp/u; \
             removed /w/tmp/mnt"
        );
        let gone = compare(&then, &subs(&[("/w/a", "1"), ("/w/tmp/t", "1")]), &[facts("/v", &[])], &[]);
        assert_eq!(
            gone.line(),
            "changed /w (2 directories attested, 0 now); removed /w/d, /w/l, /w/tmp (+2 more)"
        );
    }
}

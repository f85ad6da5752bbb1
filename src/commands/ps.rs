//! `quiesce ps`: every process, as a tree, with whom it belongs to and why it counts as sandbox.

use crate::cli::args::PsArgs;
use crate::decide::taint::{Policy, Tainted};
use crate::kernel::process::Pid;
use crate::kernel::users::{self, resolve_uids};
use crate::observe::procs::model::Detail;
use crate::observe::procs::reader::Reader;
use crate::observe::procs::table::Table;
use crate::state::published::published;
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Serialize)]
struct PsRow<'a> {
    pid: Pid,
    ppid: Pid,
    user: String,
    uids: Vec<u32>,
    state: char,
    /// A zombie leader with a live thread is alive; so is one read mid-exec (see procs).
    alive: bool,
    comm: String,
    cmdline: &'a [String],
    depth: usize,
    sandbox: bool,
    reasons: Vec<&'static str>,
}

fn tree_order(snap: &Table) -> Vec<(Pid, usize)> {
    let mut kids: BTreeMap<Pid, Vec<Pid>> = BTreeMap::new();
    let mut roots = Vec::new();
    for p in snap.values() {
        if snap.contains_key(&p.ppid) && p.ppid != p.pid {
            kids.entry(p.ppid).or_default().push(p.pid);
        } else {
            roots.push(p.pid);
        }
    }
    let mut out = Vec::new();
    let mut stack: Vec<(Pid, usize)> = roots.into_iter().rev().map(|p| (p, 0)).collect();
    while let Some((pid, d)) = stack.pop() {
        if out.len() > snap.len() {
            break;
        }
        out.push((pid, d));
        if let Some(k) = kids.get(&pid) {
            stack.extend(k.iter().rev().map(|&c| (c, d + 1)));
        }
    }
    out
}

pub fn ps(args: PsArgs) -> i32 {
    let published = published(&args.state.state_dir);
    // Without word from an init, a loginuid counts: better a process shown as sandbox too many.
    let lineage = published.as_ref().is_none_or(|p| p.lineage);
    let tag = published.as_ref().and_then(|p| p.tag);
    let uids = match resolve_uids(&args.sandbox.users) {
        Ok(u) if u.is_empty() => published.map(|p| p.uids).unwrap_or_default(),
        Ok(u) => u,
        Err(e) => {
            eprintln!("quiesce ps: {e}");
            return 2;
        }
    };
    let snap = match Reader::default().snapshot(Detail::Full) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("quiesce ps: {e}");
            return 1;
        }
    };
    let mut policy = Policy::new(uids.clone(), lineage);
    // A sandbox of lineage alone: what its launches tagged, whatever the UIDs.
    policy.tags.extend(tag);
    let tainted: Tainted = policy.classify(&snap);
    let rows = rows(&snap, &tainted);
    if args.json {
        let doc = serde_json::json!({ "sandbox_uids": uids, "processes": rows });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
        return 0;
    }
    // A closed pipe (ps | head) ends the listing quietly.
    let _ = print(&rows);
    0
}

/// Every process of `snap` as a row, in tree order.
fn rows<'a>(snap: &'a Table, tainted: &Tainted) -> Vec<PsRow<'a>> {
    let pw = users::read_passwd();
    tree_order(snap)
        .into_iter()
        .filter_map(|(pid, depth)| snap.get(&pid).map(|p| (p, depth)))
        .map(|(p, depth)| {
            let mut all: Vec<u32> = p.all_uids().collect();
            all.sort();
            all.dedup();
            let reasons: Vec<&'static str> =
                tainted.get(&p.pid).map(|r| r.iter().map(|x| x.as_str()).collect()).unwrap_or_default();
            PsRow {
                pid: p.pid,
                ppid: p.ppid,
                user: users::resolve(&p.uid().to_string(), &pw)
                    .map(|u| u.name)
                    .unwrap_or_else(|_| p.uid().to_string()),
                uids: all,
                state: p.state,
                alive: p.alive(),
                comm: p.comm.to_string(),
                cmdline: p.cmdline(),
                depth,
                sandbox: !reasons.is_empty(),
                reasons,
            }
        })
        .collect()
}

/// The rows as a table on stdout, a command indented by its depth in the tree.
fn print(rows: &[PsRow]) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let header = ("PID", "PPID", "USER", "S", "SANDBOX");
    writeln!(
        out,
        "{:>7} {:>7} {:<10} {:<2} {:<24} COMMAND",
        header.0, header.1, header.2, header.3, header.4
    )?;
    for r in rows {
        let cmd = if r.cmdline.is_empty() { format!("[{}]", r.comm) } else { r.cmdline.join(" ") };
        let cmd: String = cmd.chars().map(|c| if c.is_control() { '?' } else { c }).collect();
        let reasons = if r.reasons.is_empty() { "-".to_string() } else { r.reasons.join(",") };
        writeln!(
            out,
            "{:>7} {:>7} {:<10} {:<2} {:<24} {}{}",
            r.pid,
            r.ppid,
            r.user,
            r.state,
            reasons,
            "  ".repeat(r.depth.min(20)),
            cmd
        )?;
    }
    Ok(())
}

//! The named trees of one attestation, walked on this thread and hashed on others: the walk
//! hands each regular file to a bounded queue that the hashing threads empty, so the walk and
//! the reads overlap and memory holds at most the queue, not the tree's contents.

use super::statement::{self, Subject};
use super::walk::{self, Bounds, Entries, File, Used};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex};
use std::thread::ScopedJoinHandle;
use std::time::Instant;

pub struct Collected {
    /// Every regular file, its name encoded, in no order.
    pub subjects: Vec<Subject>,
    /// Each named path with what it holds besides file contents.
    pub paths: Vec<(Vec<u8>, Entries)>,
}

/// Batches waiting for a hashing thread at most. A file holds its directory open, so batches
/// in the queue, in the hashers' hands and being filled hold at most (QUEUE + 3) * BATCH
/// directories besides the walk's own (at most --attest-max-depth).
const QUEUE: usize = 2;
/// Files handed over at once: one hand-over (a lock, maybe a wake-up) per batch, not per file,
/// which is what a tree of small files would otherwise spend its time on.
const BATCH: usize = 64;
/// A batch is handed over sooner once its files hold this many bytes.
const BATCH_BYTES: u64 = 8 << 20;
const BUF: usize = 256 << 10;

/// Walk and hash every named path within `bounds`, on `threads` hashing threads.
pub fn collect(paths: &[Vec<u8>], bounds: &Bounds, threads: usize) -> Result<Collected, String> {
    let start = Instant::now();
    let mut used = Used::new(bounds, start);
    let deadline = used.deadline;
    let stop = AtomicBool::new(false);
    let (tx, rx) = mpsc::sync_channel::<Vec<File>>(QUEUE);
    let rx = Mutex::new(rx);
    std::thread::scope(|s| {
        let hashers: Vec<_> = (0..threads.max(1)).map(|_| s.spawn(|| hash(&rx, &stop, deadline))).collect();
        let walked = walk_all(paths, bounds, &mut used, &stop, &tx);
        if walked.is_err() {
            stop.store(true, Ordering::Relaxed);
        }
        drop(tx);
        let (subjects, first_err) = join(hashers);
        // The walk's own failure, unless it only stopped because a hasher had failed first.
        match (walked, first_err) {
            (Err(e), _) if !e.is_empty() => Err(e),
            (_, Some(e)) => Err(e),
            (Err(_), None) => Err("the walk stopped".into()),
            (Ok(paths), None) => Ok(Collected { subjects, paths }),
        }
    })
}

/// A hashing thread: hash the files of every batch from the queue until it closes. The first
/// failure stops every thread (`stop`) and is this one's answer.
fn hash(
    rx: &Mutex<mpsc::Receiver<Vec<File>>>,
    stop: &AtomicBool,
    deadline: Instant,
) -> Result<Vec<Subject>, String> {
    let mut buf = vec![0u8; BUF];
    let mut out = Vec::new();
    let mut failed = None;
    // Drained to the end even after a failure: the walk may be waiting on a full queue, and only
    // the end of the walk closes it.
    loop {
        // A lock poisoned by a panic still hands out the queue: draining goes on.
        let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
        let Ok(batch) = next else { break };
        for f in batch {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            match super::digest::sha256(&f, &mut buf, deadline) {
                // Named here, on the hashing threads: encoding a million names is work too.
                Ok(d) => out.push(statement::subject(&f.name, &d)),
                Err(e) => {
                    stop.store(true, Ordering::Relaxed);
                    failed = Some(e);
                }
            }
        }
    }
    failed.map_or(Ok(out), Err)
}

/// Walk every named path, handing its files to the hashing threads in batches. An empty error:
/// stopped because a hashing thread failed (or they are gone), whose error says why.
fn walk_all(
    paths: &[Vec<u8>],
    bounds: &Bounds,
    used: &mut Used,
    stop: &AtomicBool,
    tx: &mpsc::SyncSender<Vec<File>>,
) -> Result<Vec<(Vec<u8>, Entries)>, String> {
    let mut out = Vec::new();
    let mut batch: Vec<File> = Vec::with_capacity(BATCH);
    let mut bytes = 0;
    for p in paths {
        let mut sink = |f: File| {
            if stop.load(Ordering::Relaxed) {
                return Err(String::new());
            }
            bytes += f.meta.size;
            batch.push(f);
            if batch.len() >= BATCH || bytes >= BATCH_BYTES {
                bytes = 0;
                let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
                return tx.send(full).map_err(|_| String::new());
            }
            Ok(())
        };
        out.push((p.clone(), walk::walk(p, bounds, used, &mut sink)?));
    }
    if !batch.is_empty() {
        tx.send(batch).map_err(|_| String::new())?;
    }
    Ok(out)
}

/// Every hashing thread's files, and the first failure among them.
fn join(hashers: Vec<ScopedJoinHandle<'_, Result<Vec<Subject>, String>>>) -> (Vec<Subject>, Option<String>) {
    let mut subjects = Vec::new();
    let mut first_err: Option<String> = None;
    for h in hashers {
        match h.join() {
            Ok(Ok(v)) => subjects.extend(v),
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert("a hashing thread panicked".into());
            }
        }
    }
    (subjects, first_err)
}

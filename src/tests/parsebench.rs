//! What reading and parsing /proc stat and status cost at 1,000 processes: the hand parsers
//! (observe/procs/parse.rs) against procfs-core's over the same bytes, and reads as the observation does them
//! against reads into one reused buffer. A measurement, not a check (timings are never
//! asserted); bench/bench.py runs it:
//! `cargo test --release --bin quiesce -- --ignored --nocapture parse_cost`.

use crate::kernel::dirfd;
use crate::observe::procs;
use std::fs;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Instant;

const PROCESSES: usize = 1000;
const PASSES: usize = 21;

fn median_us(mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..PASSES)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    t.sort_by(|a, b| a.total_cmp(b));
    t[PASSES / 2]
}

/// Up to PROCESSES pids of this machine, repeated when it runs fewer.
fn pids() -> Vec<String> {
    let mut all: Vec<String> = fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        .collect();
    all.sort();
    all.iter().cycle().take(PROCESSES).cloned().collect()
}

#[test]
#[ignore = "a benchmark: run with --ignored --nocapture"]
fn parse_cost() {
    let pids = pids();
    let files: Vec<(Vec<u8>, Vec<u8>)> = pids
        .iter()
        .filter_map(|p| {
            Some((fs::read(format!("/proc/{p}/stat")).ok()?, fs::read(format!("/proc/{p}/status")).ok()?))
        })
        .collect();
    let n = files.len();

    let read_alloc = median_us(|| {
        for p in &pids {
            let _ = std::hint::black_box(fs::read(format!("/proc/{p}/stat")));
            let _ = std::hint::black_box(fs::read(format!("/proc/{p}/status")));
        }
    });
    let proc_dir = fs::File::open("/proc").expect("/proc");
    let mut buf = Vec::with_capacity(8192);
    let mut read_into = |name: &str| {
        buf.clear();
        if let Ok(fd) =
            dirfd::openat(Some(proc_dir.as_raw_fd()), Path::new(name), libc::O_RDONLY | libc::O_CLOEXEC)
        {
            let _ = fs::File::from(fd).read_to_end(&mut buf);
        }
        std::hint::black_box(&buf);
    };
    let read_reused = median_us(|| {
        for p in &pids {
            read_into(&format!("{p}/stat"));
            read_into(&format!("{p}/status"));
        }
    });

    let mut ok = (0, 0);
    let hand = median_us(|| {
        ok = (0, 0);
        for (stat, status) in &files {
            ok.0 += procs::parse::parse_stat(stat).is_ok() as usize;
            ok.0 +=
                std::str::from_utf8(status).ok().and_then(|s| procs::parse::parse_status(s).ok()).is_some()
                    as usize;
        }
    });
    let crate_parsers = median_us(|| {
        ok.1 = 0;
        for (stat, status) in &files {
            use procfs_core::FromRead;
            ok.1 += procfs_core::process::Stat::from_read(&stat[..]).is_ok() as usize;
            ok.1 += procfs_core::process::Status::from_read(&status[..]).is_ok() as usize;
        }
    });
    println!(
        "processes: {n} (stat and status each; {} distinct)",
        pids.iter().collect::<std::collections::BTreeSet<_>>().len()
    );
    println!("parsed: hand {} of {}, procfs-core {} of {}", ok.0, 2 * n, ok.1, 2 * n);
    println!("read, fs::read per file: {read_alloc:.0} us");
    println!("read, openat into one buffer: {read_reused:.0} us");
    println!("parse, hand: {hand:.0} us");
    println!("parse, procfs-core: {crate_parsers:.0} us");
    println!(
        "read + parse, procfs-core against hand: {:.2}x (reads as today), {:.2}x (reused buffer)",
        (read_alloc + crate_parsers) / (read_alloc + hand),
        (read_reused + crate_parsers) / (read_reused + hand)
    );
}

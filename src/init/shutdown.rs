//! The shutdown once the command has ended: SIGTERM to every process left, SIGKILL after the
//! grace, and the exit code the command's status maps to. May use: kernel, observe.

use crate::freeze;
use crate::kernel::{process, signal};
use crate::observe::procs::model::Detail;
use crate::observe::procs::reader::Reader;
use std::time::{Duration, Instant};

pub(super) enum Shutdown {
    None,
    Terminating { kill_at: Instant },
    Killing { give_up_at: Instant },
}

impl Shutdown {
    /// When the loop must come round again for the shutdown; None before it began.
    pub(super) fn deadline(&self, now: Instant) -> Option<Instant> {
        match *self {
            Shutdown::Terminating { kill_at } => Some(kill_at),
            Shutdown::Killing { give_up_at } => Some(give_up_at.min(now + Duration::from_millis(50))),
            Shutdown::None => None,
        }
    }

    /// One turn of the shutdown once the command ended: true when the init may exit now.
    /// `childless`: the reaper found no child left at all.
    pub(super) fn step(&mut self, childless: bool, grace: Duration) -> bool {
        let now = Instant::now();
        match *self {
            Shutdown::None => {
                if childless && process::getpid() != 1 {
                    return true;
                }
                if signal_rest(libc::SIGTERM) == 0 && childless {
                    return true;
                }
                log::debug!("command ended; terminating the rest with a {grace:?} grace");
                *self = Shutdown::Terminating { kill_at: now + grace };
            }
            Shutdown::Terminating { kill_at } if now >= kill_at => {
                log::info!("grace over; killing what is left");
                signal_rest(libc::SIGKILL);
                *self = Shutdown::Killing { give_up_at: now + Duration::from_secs(5) };
            }
            Shutdown::Killing { give_up_at } if now >= give_up_at => {
                log::error!("processes survived SIGKILL for 5 s (uninterruptible?); exiting anyway");
                return true;
            }
            Shutdown::Killing { .. } => {
                signal_rest(libc::SIGKILL);
            }
            _ => {}
        }
        childless
    }
}

/// Signal every process left: the whole namespace as PID 1, our descendants otherwise.
fn signal_rest(sig: i32) -> usize {
    if process::getpid() == 1 {
        return match signal::kill_all(sig) {
            Ok(()) => 1,
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => 0,
            Err(e) => {
                log::error!("kill(-1, {}) failed: {e}", signal::signal_name(sig));
                0
            }
        };
    }
    let reader = Reader::default();
    let snap = match reader.snapshot(Detail::Light) {
        Ok(s) => s,
        Err(e) => {
            log::error!("shutdown cannot list descendants: {e}");
            return 0;
        }
    };
    let me = process::getpid();
    let mut n = 0;
    for p in snap.values() {
        let mut cur = p.ppid;
        let mut hops = 0;
        while cur > 1 && cur != me && hops < snap.len() {
            cur = snap.get(&cur).map(|q| q.ppid).unwrap_or(0);
            hops += 1;
        }
        if cur == me && p.pid != me && p.alive() {
            match freeze::target::signal(&reader, p, sig) {
                Ok(true) => n += 1,
                Ok(false) => {}
                Err(e) => log::error!("shutdown: {e}"),
            }
        }
    }
    n
}

pub(super) fn remap(code: i32, map: &[u8]) -> i32 {
    if map.iter().any(|&c| c as i32 == code) {
        0
    } else {
        code
    }
}

//! The evidence's reader threads: each reads one stopped process at a time (`observe::evidence`)
//! and answers in the order it was asked. The walk (`freeze::evidence`) hands them targets, waits
//! for each answer within its bound, and leaves behind a reader stuck in the kernel; the pool
//! keeps the readers between walks and those left behind until they come back. The first reader
//! is started before the command runs (`start`), so that a fork bomb at a pids limit cannot keep
//! it from existing at freeze time.

use crate::freeze::evidence::Listening;
use crate::kernel::process::Pid;
use crate::observe::evidence as reads;
use crate::observe::procs::reader::CMDLINE_READ;
use std::io;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};

/// Readers left stuck in the kernel at once; each holds a small stack.
pub(super) const MAX_STUCK: usize = 4;
/// Readers one walk uses at most, and the targets from which it uses more than one.
pub(super) const LANES: usize = 2;
pub(super) const LANES_FROM: usize = 64;

pub(super) struct Job {
    pub(super) pid: Pid,
    pub(super) start_time: u64,
    pub(super) creds: Option<(u32, u32)>,
    /// The listening sockets by inode; None when nothing listens (no descriptor is looked at).
    pub(super) listening: Option<Arc<Listening>>,
}

pub(super) struct Reply {
    pub(super) key: (Pid, u64),
    /// The first bytes of the command line and whether there was more; None: not read.
    pub(super) cmdline: Option<(Vec<u8>, bool)>,
    pub(super) exe: Option<String>,
    /// Where it listened, its cwd and the first bytes of its environment (with whether there
    /// was more), when it listened.
    pub(super) service: Option<reads::ServiceRead>,
}

#[derive(Default)]
pub(super) struct SlotState {
    /// The target the reader is reading right now.
    pub(super) current: Option<(Pid, u64)>,
    /// The walk stopped waiting for this reader: it ends once it is back.
    pub(super) abandoned: bool,
    pub(super) done: bool,
}

/// What a reader thread and the walk share about it.
#[derive(Default)]
pub(super) struct Slot(Mutex<SlotState>);

impl Slot {
    pub(super) fn lock(&self) -> MutexGuard<'_, SlotState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub(super) struct Worker {
    pub(super) jobs: mpsc::Sender<Job>,
    pub(super) replies: mpsc::Receiver<Reply>,
    pub(super) slot: Arc<Slot>,
}

pub(super) struct Pool {
    pub(super) workers: [Option<Worker>; LANES],
    /// Readers left behind, still in the kernel or on their way out.
    pub(super) stuck: Vec<Arc<Slot>>,
}

static POOL: Mutex<Pool> = Mutex::new(Pool { workers: [None, None], stuck: Vec::new() });

pub(super) fn pool() -> MutexGuard<'static, Pool> {
    POOL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Start the reader thread; the init does this before the command runs, so that a fork bomb
/// at a pids limit cannot keep it from existing at freeze time.
pub fn start() -> io::Result<()> {
    let mut p = pool();
    if p.workers[0].is_none() {
        p.workers[0] = Some(spawn()?);
    }
    Ok(())
}

pub(super) fn spawn() -> io::Result<Worker> {
    let (jobs, jobs_rx) = mpsc::channel::<Job>();
    let (replies_tx, replies) = mpsc::channel::<Reply>();
    let slot = Arc::new(Slot::default());
    let mine = slot.clone();
    // The thread inherits the init's mask: every signal blocked.
    std::thread::Builder::new()
        .name("quiesce-evidence".into())
        .stack_size(64 * 1024)
        .spawn(move || serve(jobs_rx, replies_tx, &mine))?;
    Ok(Worker { jobs, replies, slot })
}

fn serve(jobs: mpsc::Receiver<Job>, replies: mpsc::Sender<Reply>, slot: &Slot) {
    for job in jobs {
        {
            let mut s = slot.lock();
            if s.abandoned {
                break;
            }
            s.current = Some((job.pid, job.start_time));
        }
        let read = read(&job);
        {
            let mut s = slot.lock();
            s.current = None;
            if s.abandoned {
                break;
            }
        }
        match read {
            Ok(r) => {
                if replies.send(r).is_err() {
                    break;
                }
            }
            Err(e) => {
                // This thread's filesystem IDs may be wrong now: it must do nothing more.
                log::error!("evidence reader: {e}; that reader stops");
                break;
            }
        }
    }
    slot.lock().done = true;
}

/// Read one process. Err only when this thread's credentials could not be restored.
fn read(job: &Job) -> io::Result<Reply> {
    let dir = format!("/proc/{}", job.pid);
    let exe = reads::exe(&format!("{dir}/exe"), job.creds)?;
    let cmdline = reads::prefix(&format!("{dir}/cmdline"), CMDLINE_READ).ok();
    let service = match &job.listening {
        Some(table) => reads::service(job.pid, &dir, &table.by_inode, job.creds)?,
        None => None,
    };
    // Whether the pid still named the target is settled once for the whole walk (`drop_reused`).
    Ok(Reply { key: (job.pid, job.start_time), cmdline, exe, service })
}

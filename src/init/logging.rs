//! Log output that cannot block the init. The command shares the init's stderr: under
//! `docker run -t` it owns the terminal and can stop its output (`tcflow(TCOOFF)`), and a stalled
//! log reader leaves a full pipe; a blocking write would then hang PID 1 for good.
//!
//! So the init writes on a descriptor of its own: a fresh open file description of what fd 2
//! is (re-opened through /proc/self/fd/2), made non-blocking without touching the command's; on a
//! socket, where re-opening fails, `send(MSG_DONTWAIT)`. A line the output cannot take is dropped
//! and counted, and the count is logged once output flows again.

use log::{Level, LevelFilter, Log, Metadata, Record};
use std::fmt::Write as _;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::Mutex;

/// Longer lines are cut: a pipe takes a write of at most PIPE_BUF bytes whole or not at all.
const MAX_LINE: usize = 4096;

enum Sink {
    /// fd 2 as it is, with blocking writes: subcommands, and regular files (which never block).
    Shared,
    /// A non-blocking descriptor of the init's own.
    Own(OwnedFd),
    /// A socket (fd 2): each write is a non-blocking send. Re-opening a socket through /proc
    /// fails (ENXIO), and send needs no descriptor of its own to be non-blocking.
    Socket(RawFd),
    /// Where stderr cannot be re-opened (no /proc, or a file the init may not open again): a
    /// thread of its own writes, and may block; the init only hands it lines through a bounded
    /// queue, never waiting (only before exiting does it give the thread a bounded time to finish).
    Writer(SyncSender<Vec<u8>>),
    /// Nowhere: no stderr, or one the init cannot write to without risking a hang.
    Off,
}

struct Out {
    sink: Sink,
    /// The unwritten tail of a line the output took only in part.
    pending: Vec<u8>,
    /// Lines dropped since output last flowed.
    dropped: u64,
}

struct Logger {
    level: AtomicUsize,
    out: Mutex<Out>,
}

static LOGGER: Logger = Logger {
    level: AtomicUsize::new(LevelFilter::Error as usize),
    out: Mutex::new(Out { sink: Sink::Shared, pending: Vec::new(), dropped: 0 }),
};

/// The level from QUIESCE_LOG (a level name) or else the count of -v.
fn level(verbose: u8) -> (LevelFilter, Option<String>) {
    let by_count = match verbose {
        0 => LevelFilter::Error,
        1 => LevelFilter::Info,
        2 => LevelFilter::Debug,
        _ => LevelFilter::Trace,
    };
    match std::env::var("QUIESCE_LOG") {
        Ok(v) if !v.trim().is_empty() => match v.trim().parse::<LevelFilter>() {
            Ok(l) => (l, None),
            Err(_) => (
                by_count,
                Some(format!(
                    "QUIESCE_LOG '{v}' is not a level: use off, error, warn, info, debug or trace; \
                     logging at {}",
                    by_count.as_str().to_lowercase()
                )),
            ),
        },
        _ => (by_count, None),
    }
}

/// Install the logger. `private`: the init's non-blocking output; otherwise plain stderr.
/// Returns what the caller should say before the command runs, when the output had to be
/// switched off.
pub fn init(verbose: u8, private: bool) -> Option<String> {
    let (lvl, complaint) = level(verbose);
    let sink = if private { private_sink() } else { Ok(Sink::Shared) };
    let (sink, note) = match sink {
        Ok(s) => (s, None),
        Err(why) => (Sink::Off, Some(format!("{why}: no log output from the init"))),
    };
    if let Ok(mut out) = LOGGER.out.lock() {
        out.sink = sink;
    }
    LOGGER.level.store(lvl as usize, Ordering::Relaxed);
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(lvl);
    }
    if let Some(c) = complaint {
        log::warn!("{c}");
    }
    note
}

/// A descriptor for the init's log lines that no one else's state can block.
fn private_sink() -> Result<Sink, String> {
    let fd2 = match crate::kernel::stat::fstat_fd(2) {
        Ok(st) => st,
        // No stderr at all.
        Err(_) => return Ok(Sink::Off),
    };
    match fd2.st_mode & libc::S_IFMT {
        libc::S_IFREG => Ok(Sink::Shared),
        libc::S_IFSOCK => Ok(Sink::Socket(2)),
        _ => match crate::kernel::dirfd::openat(
            None,
            Path::new("/proc/self/fd/2"),
            libc::O_WRONLY | libc::O_NONBLOCK | libc::O_NOCTTY,
        ) {
            Ok(fd) => Ok(Sink::Own(fd)),
            Err(e) => writer(2).map_err(|t| {
                format!("cannot re-open stderr through /proc/self/fd/2 ({e}) nor start a log thread ({t})")
            }),
        },
    }
}

/// Lines the writer thread may hold before the init drops new ones.
const QUEUE: usize = 64;

/// Lines handed to the writer thread and not yet written (or given up on).
static UNWRITTEN: AtomicUsize = AtomicUsize::new(0);
/// The writer thread has stopped: nobody reads its output any more.
static WRITER_GONE: AtomicBool = AtomicBool::new(false);

/// Give the writer thread up to `budget` to write what it holds: the init calls this before it
/// exits, which would otherwise end the thread with the last lines (an exec failure's) unwritten.
/// Bounded, as the output may be stopped for good; without a writer thread it returns at once.
pub fn drain(budget: std::time::Duration) {
    let end = std::time::Instant::now() + budget;
    while UNWRITTEN.load(Ordering::Acquire) > 0
        && !WRITER_GONE.load(Ordering::Acquire)
        && std::time::Instant::now() < end
    {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Start the writer thread for `fd`. It starts with every signal blocked, as all of the init's
/// threads must: one that took a process-directed signal would keep it from the signalfd.
fn writer(fd: RawFd) -> std::io::Result<Sink> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(QUEUE);
    let old = crate::kernel::signal::block_all_signals()?;
    let started =
        std::thread::Builder::new().name("quiesce-log".into()).stack_size(64 * 1024).spawn(move || {
            for line in rx {
                let mut rest = &line[..];
                while !rest.is_empty() {
                    match crate::kernel::fdio::write(fd, rest) {
                        Ok(n) => rest = &rest[n..],
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {
                            // Nobody reads again: stop, and take the SIGPIPE this thread raised.
                            crate::kernel::signal::take_pending(libc::SIGPIPE);
                            WRITER_GONE.store(true, Ordering::Release);
                            return;
                        }
                        Err(_) => break,
                    }
                }
                UNWRITTEN.fetch_sub(1, Ordering::Release);
            }
        });
    crate::kernel::signal::set_signal_mask(&old)?;
    started.map(|_| Sink::Writer(tx))
}

/// What a write did.
enum Wrote {
    All,
    /// Part of it; the rest is kept as pending.
    Part,
    /// None of it: the output is full, stopped or gone.
    Nothing,
}

impl Out {
    fn write(&mut self, buf: &[u8]) -> Wrote {
        let n = match &self.sink {
            Sink::Off => return Wrote::Nothing,
            Sink::Shared => crate::kernel::fdio::write(2, buf),
            Sink::Own(fd) => crate::kernel::fdio::write(fd.as_raw_fd(), buf),
            Sink::Socket(fd) => crate::kernel::ipc::send_nowait(*fd, buf),
            Sink::Writer(tx) => {
                // Counted before the writer can see it, so the count never goes below zero.
                UNWRITTEN.fetch_add(1, Ordering::AcqRel);
                match tx.try_send(buf.to_vec()) {
                    Ok(()) => Ok(buf.len()),
                    Err(TrySendError::Full(_)) => {
                        UNWRITTEN.fetch_sub(1, Ordering::AcqRel);
                        Err(std::io::Error::from_raw_os_error(libc::EAGAIN))
                    }
                    Err(TrySendError::Disconnected(_)) => {
                        UNWRITTEN.fetch_sub(1, Ordering::AcqRel);
                        self.sink = Sink::Off;
                        return Wrote::Nothing;
                    }
                }
            }
        };
        match n {
            Ok(n) if n >= buf.len() => Wrote::All,
            Ok(0) => Wrote::Nothing,
            Ok(n) => {
                self.pending = buf[n..].to_vec();
                Wrote::Part
            }
            Err(e) => {
                if e.raw_os_error() == Some(libc::EPIPE) {
                    // Nobody will read again. The write raised a SIGPIPE for this thread; take
                    // it, or the init would forward it to the command as if someone had sent it.
                    crate::kernel::signal::take_pending(libc::SIGPIPE);
                    self.sink = Sink::Off;
                }
                Wrote::Nothing
            }
        }
    }

    /// Finish a half-written line, report what was dropped, then write `line`.
    fn emit(&mut self, line: &[u8]) {
        if !self.pending.is_empty() {
            let tail = std::mem::take(&mut self.pending);
            if !matches!(self.write(&tail), Wrote::All) {
                if self.pending.is_empty() {
                    self.pending = tail;
                }
                self.dropped += 1;
                return;
            }
        }
        if self.dropped > 0 {
            let note = format!("quiesce: warn: {} log lines dropped\n", self.dropped);
            match self.write(note.as_bytes()) {
                Wrote::All => self.dropped = 0,
                Wrote::Part => {
                    self.dropped = 1;
                    return;
                }
                Wrote::Nothing => {
                    self.dropped += 1;
                    return;
                }
            }
        }
        if matches!(self.write(line), Wrote::Nothing) {
            self.dropped += 1;
        }
    }
}

fn emit(text: &str) {
    let mut line = String::with_capacity(text.len().min(MAX_LINE) + 1);
    let mut cut = text.len().min(MAX_LINE - 4);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    line.push_str(&text[..cut]);
    if cut < text.len() {
        line.push_str("...");
    }
    line.push('\n');
    if let Ok(mut out) = LOGGER.out.lock() {
        out.emit(line.as_bytes());
    }
}

/// A line as it is (already "quiesce: ..."), at any level, through the same output: for the
/// init's messages that are not log records, such as an exec failure.
pub fn line(args: std::fmt::Arguments) {
    emit(&args.to_string());
}

impl Log for Logger {
    fn enabled(&self, m: &Metadata) -> bool {
        m.level() as usize <= self.level.load(Ordering::Relaxed)
    }

    fn log(&self, r: &Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let mut s = String::new();
        let level = match r.level() {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
            Level::Trace => "trace",
        };
        let _ = write!(s, "quiesce: {level}: {}", r.args());
        emit(&s);
    }

    fn flush(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pipe whose write end is non-blocking, as the init's own descriptor is.
    fn pipe() -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) }, 0);
        use std::os::fd::FromRawFd;
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    fn drain(fd: &OwnedFd) -> String {
        let mut all = Vec::new();
        let mut buf = [0u8; 65536];
        loop {
            let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr() as *mut _, buf.len()) };
            if n <= 0 {
                break;
            }
            all.extend_from_slice(&buf[..n as usize]);
        }
        String::from_utf8_lossy(&all).into_owned()
    }

    #[test]
    fn a_full_pipe_drops_and_counts_lines_then_reports_them() {
        let (r, w) = pipe();
        let mut out = Out { sink: Sink::Own(w), pending: Vec::new(), dropped: 0 };
        let line = b"quiesce: info: a line of forty bytes or so...\n";
        let mut n = 0;
        while out.dropped == 0 {
            out.emit(line);
            n += 1;
            assert!(n < 100_000, "the pipe never filled");
        }
        out.emit(line);
        out.emit(line);
        assert_eq!(out.dropped, 3);
        let first = drain(&r);
        assert_eq!(first.lines().count(), n - 1);
        out.emit(b"after\n");
        assert_eq!(drain(&r), "quiesce: warn: 3 log lines dropped\nafter\n");
        assert_eq!(out.dropped, 0);
    }

    #[test]
    fn the_writer_thread_takes_lines_until_its_queue_is_full() {
        let (r, w) = pipe();
        // The write end blocks, as a shared stderr would.
        assert_eq!(unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETFL, 0) }, 0);
        let mut out = Out { sink: writer(w.as_raw_fd()).unwrap(), pending: Vec::new(), dropped: 0 };
        let line = [b'x'; 1023];
        let mut n = 0;
        while out.dropped == 0 {
            out.emit(&line);
            n += 1;
            assert!(n < 10_000, "the queue never filled");
        }
        // The pipe took what it could (the thread is blocked on the rest), the queue the next.
        assert!(n > QUEUE);
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut seen = String::new();
        while seen.len() < (n - 1) * line.len() && std::time::Instant::now() < until {
            seen += &drain(&r);
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(seen.len(), (n - 1) * line.len(), "every queued line arrives whole");
        out.emit(b"after\n");
        while !seen.contains("after") && std::time::Instant::now() < until {
            seen += &drain(&r);
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(
            seen.ends_with("quiesce: warn: 1 log lines dropped\nafter\n"),
            "{}",
            &seen[seen.len().saturating_sub(200)..]
        );
        drop(w);
    }

    #[test]
    fn a_closed_reader_switches_output_off_without_a_stray_sigpipe() {
        let (r, w) = pipe();
        drop(r);
        let mut out = Out { sink: Sink::Own(w), pending: Vec::new(), dropped: 0 };
        // Blocked, as in the init, so that the SIGPIPE stays pending instead of killing us.
        let _ = crate::kernel::signal::block_all_signals();
        out.emit(b"x\n");
        assert!(matches!(out.sink, Sink::Off));
        assert!(!crate::kernel::signal::signal_pending(libc::SIGPIPE));
    }
}

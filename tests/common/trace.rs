//! One thread of another process held at its system calls (ptrace), so that a test can change
//! the world between two steps of the real binary without a hook in it. Every request comes from
//! the thread that seized the tracee, as ptrace demands; the tracer thread's end detaches it
//! whatever happens, and dropping a `Tracer` detaches it at once, so no test leaves it stopped.

use std::io;

/// `PTRACE_GET_SYSCALL_INFO` (Linux 5.3): the call's number and arguments, or its result,
/// without per-architecture register layouts.
const PTRACE_GET_SYSCALL_INFO: libc::c_long = 0x420e;
const OP_ENTRY: u8 = 1;
const OP_EXIT: u8 = 2;

/// `struct ptrace_syscall_info`: entry holds nr and six arguments, exit the return value.
#[repr(C)]
struct SyscallInfo {
    op: u8,
    _pad: [u8; 3],
    _arch: u32,
    _ip: u64,
    _sp: u64,
    data: [u64; 8],
}

/// A stop at a system call of the traced thread.
#[derive(Debug, Clone, Copy)]
pub enum Call {
    Entry {
        nr: i64,
        args: [u64; 6],
    },
    /// The return value; the call is the last `Entry` seen.
    Exit {
        rval: i64,
    },
}

pub struct Tracer {
    tid: i32,
    attached: bool,
    /// In a ptrace-stop now (a request such as a detach needs one).
    stopped: bool,
}

fn check(r: libc::c_long, what: &str) -> io::Result<libc::c_long> {
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(r)
}

/// The system call itself: the C library's wrapper differs between glibc and musl (the request's
/// type, PEEKDATA's result), the kernel's does not.
fn ptrace(req: libc::c_long, tid: i32, addr: u64, data: u64) -> libc::c_long {
    unsafe { libc::syscall(libc::SYS_ptrace, req, libc::c_long::from(tid), addr, data) }
}

impl Tracer {
    /// Seize the thread `tid` (a host tid) and hold it at its next system call. Err when this
    /// process may not trace it (no CAP_SYS_PTRACE, a Yama scope, a tracer already there).
    pub fn seize(tid: i32) -> io::Result<Tracer> {
        check(ptrace(libc::PTRACE_SEIZE.into(), tid, 0, libc::PTRACE_O_TRACESYSGOOD as u64), "PTRACE_SEIZE")?;
        let mut t = Tracer { tid, attached: true, stopped: false };
        check(ptrace(libc::PTRACE_INTERRUPT.into(), tid, 0, 0), "PTRACE_INTERRUPT")?;
        // The interrupt's stop; then on to system calls.
        t.wait()?;
        t.resume()?;
        Ok(t)
    }

    fn wait(&mut self) -> io::Result<Option<i32>> {
        let mut st = 0;
        loop {
            let r = unsafe { libc::waitpid(self.tid, &mut st, libc::__WALL) };
            if r == self.tid {
                break;
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                self.attached = false;
                return Err(io::Error::new(e.kind(), format!("waitpid on traced {}: {e}", self.tid)));
            }
        }
        if libc::WIFEXITED(st) || libc::WIFSIGNALED(st) {
            self.attached = false;
            self.stopped = false;
            return Ok(None);
        }
        self.stopped = true;
        Ok(Some(st))
    }

    /// Let the thread run to its next system call stop.
    fn resume(&mut self) -> io::Result<()> {
        self.resume_with(0)
    }

    fn resume_with(&mut self, sig: i32) -> io::Result<()> {
        check(ptrace(libc::PTRACE_SYSCALL.into(), self.tid, 0, sig as u64), "PTRACE_SYSCALL")?;
        self.stopped = false;
        Ok(())
    }

    /// Let the thread go on from where it is held and wait for its next system call stop; None
    /// once it has ended. The thread is held there until the next `next` or `detach`.
    pub fn next(&mut self) -> io::Result<Option<Call>> {
        if self.stopped {
            self.resume()?;
        }
        loop {
            let Some(st) = self.wait()? else { return Ok(None) };
            let sig = libc::WSTOPSIG(st);
            if sig == libc::SIGTRAP | 0x80 {
                return self.call().map(Some);
            }
            // A ptrace event (the interrupt, a group stop): nothing to pass on. Otherwise a
            // signal on its way to the thread, which must still get it.
            let event = st >> 16 != 0;
            self.resume_with(if event { 0 } else { sig })?;
        }
    }

    fn call(&self) -> io::Result<Call> {
        let mut info = SyscallInfo { op: 0, _pad: [0; 3], _arch: 0, _ip: 0, _sp: 0, data: [0; 8] };
        let size = std::mem::size_of::<SyscallInfo>() as u64;
        check(
            ptrace(PTRACE_GET_SYSCALL_INFO, self.tid, size, &mut info as *mut SyscallInfo as u64),
            "PTRACE_GET_SYSCALL_INFO",
        )?;
        match info.op {
            OP_ENTRY => {
                let mut args = [0; 6];
                args.copy_from_slice(&info.data[1..7]);
                Ok(Call::Entry { nr: info.data[0] as i64, args })
            }
            OP_EXIT => Ok(Call::Exit { rval: info.data[0] as i64 }),
            op => Err(io::Error::other(format!("a system call stop of kind {op}"))),
        }
    }

    /// `len` bytes of the held thread's memory at `addr`.
    pub fn read_mem(&self, addr: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(len + 8);
        let mut at = addr;
        while out.len() < len {
            // The kernel stores the word at `data`.
            let mut w: u64 = 0;
            check(
                ptrace(libc::PTRACE_PEEKDATA.into(), self.tid, at, &mut w as *mut u64 as u64),
                "PTRACE_PEEKDATA",
            )?;
            out.extend_from_slice(&w.to_ne_bytes());
            at += 8;
        }
        out.truncate(len);
        Ok(out)
    }

    /// The NUL-terminated string at `addr` (a path argument), up to 4096 bytes.
    pub fn read_str(&self, addr: u64) -> io::Result<String> {
        let mut out = Vec::new();
        let mut at = addr;
        while out.len() < 4096 {
            let word = self.read_mem(at, 8)?;
            if let Some(end) = word.iter().position(|&b| b == 0) {
                out.extend_from_slice(&word[..end]);
                return Ok(String::from_utf8_lossy(&out).into_owned());
            }
            out.extend_from_slice(&word);
            at += 8;
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// Let the thread go for good: held at a system call's entry, it makes that call now.
    pub fn detach(mut self) -> io::Result<()> {
        self.release()
    }

    fn release(&mut self) -> io::Result<()> {
        if !self.attached {
            return Ok(());
        }
        if !self.stopped {
            // A detach needs a stop: interrupt, and let any stop that comes first count.
            check(ptrace(libc::PTRACE_INTERRUPT.into(), self.tid, 0, 0), "PTRACE_INTERRUPT")?;
            if self.wait()?.is_none() {
                return Ok(());
            }
        }
        self.attached = false;
        self.stopped = false;
        check(ptrace(libc::PTRACE_DETACH.into(), self.tid, 0, 0), "PTRACE_DETACH").map(|_| ())
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            eprintln!("trace: cannot detach from {}: {e}", self.tid);
        }
    }
}

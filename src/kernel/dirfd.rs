//! Opening and reading through a directory descriptor: openat, a directory (by a path, or by one
//! entry following no link), a regular file for reading, the names a directory holds (getdents64
//! on the descriptor, whatever its path leads to now), a small file whole into a reused buffer, a
//! link's text, a few bytes written to an existing file.
//! May use: libc, std and kernel::errno.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::kernel::errno::check;

/// openat(2) relative to `dir` (None: the working directory). The flags always gain O_CLOEXEC.
pub fn openat(dir: Option<RawFd>, name: &std::path::Path, flags: i32) -> io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    let c = CString::new(name.as_os_str().as_bytes()).map_err(|_| io::Error::other("path with NUL"))?;
    // SAFETY: valid C string; the kernel returns a new descriptor we own.
    let fd =
        check(
            unsafe { libc::openat(dir.unwrap_or(libc::AT_FDCWD), c.as_ptr(), flags | libc::O_CLOEXEC, 0) }
                as _,
        )?;
    // SAFETY: the kernel just gave us this descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Open a directory for reads relative to it (openat): read-only, close-on-exec. Every link on
/// the way is followed, the last one too: for a path the caller was given or chose. One entry of
/// a directory held open goes through `open_dir_at` or `open_subdir_at`, which follow none.
pub fn open_dir(path: &std::path::Path) -> io::Result<OwnedFd> {
    openat(None, path, libc::O_RDONLY | libc::O_DIRECTORY)
}

/// Read the whole file `name` (relative to `dir`) into `buf`, replacing what it held; at most
/// `max` bytes (then Ok(true): there was more). No allocation once `buf` is large enough: the hot
/// loops of an observation reuse one buffer for every file.
pub fn read_file_at(dir: &OwnedFd, name: &std::ffi::CStr, buf: &mut Vec<u8>, max: usize) -> io::Result<bool> {
    buf.clear();
    // SAFETY: a valid descriptor and C string; the kernel returns a new descriptor we own.
    let fd = check(
        unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) } as _,
    )?;
    // SAFETY: the kernel just gave us this descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    loop {
        if buf.len() == buf.capacity() {
            buf.reserve(4096.min(max + 1 - buf.len()).max(1));
        }
        let room = (buf.capacity() - buf.len()).min(max + 1 - buf.len());
        // SAFETY: reads into the spare capacity of `buf`, at most `room` bytes.
        let n =
            unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().add(buf.len()) as *mut libc::c_void, room) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Ok(false);
        }
        // SAFETY: the kernel initialised these `n` bytes.
        unsafe { buf.set_len(buf.len() + n as usize) };
        if buf.len() > max {
            buf.truncate(max);
            return Ok(true);
        }
    }
}

/// Open the directory `name` in `dir` for listing. A link there is refused (ELOOP), and so is
/// anything but a directory (ENOTDIR): what is listed is the entry itself, never where it points.
/// The name as listed (`list_dir`); `open_subdir_at` is the same open (the same flags) for a
/// C-string name. This one goes through `openat` and shares its conversion to a C string rather
/// than keep a second copy of it in the binary.
pub fn open_dir_at(dir: &OwnedFd, name: &std::ffi::OsStr) -> io::Result<OwnedFd> {
    openat(
        Some(dir.as_raw_fd()),
        std::path::Path::new(name),
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
    )
}

/// The names in an open directory (without `.` and `..`), at most `limit` of them; the flag says
/// more were left. Read with getdents64 on the descriptor, so the listing is of the directory
/// the descriptor holds, whatever its path leads to now.
pub fn list_dir(dir: &OwnedFd, limit: usize) -> io::Result<(Vec<std::ffi::OsString>, bool)> {
    use std::os::unix::ffi::OsStrExt;
    let mut names = Vec::new();
    let more = each_entry(dir, limit, |name| names.push(std::ffi::OsStr::from_bytes(name).to_os_string()))?;
    Ok((names, more))
}

/// Hand every name of an open directory (without `.` and `..`) to `f`, at most `limit` of them,
/// without an allocation per name; true when more were left.
pub fn each_entry(dir: &OwnedFd, limit: usize, mut f: impl FnMut(&[u8])) -> io::Result<bool> {
    // d_ino (8), d_off (8), d_reclen (2), d_type (1), then the name and its NUL.
    const NAME_AT: usize = 19;
    let mut buf = vec![0u8; 32 << 10];
    let mut seen = 0;
    // Every read that returns anything returns at least one entry, so this ends after at most
    // `limit` + 3 reads (`.`, `..`, and the one that says there is more).
    loop {
        // SAFETY: the kernel writes at most buf.len() bytes into buf.
        let n = check(unsafe {
            libc::syscall(libc::SYS_getdents64, dir.as_raw_fd(), buf.as_mut_ptr(), buf.len())
        })? as usize;
        if n == 0 {
            return Ok(false);
        }
        let mut off = 0;
        while off + NAME_AT <= n {
            let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
            if reclen < NAME_AT || off + reclen > n {
                return Err(io::Error::other("getdents64 returned a malformed entry"));
            }
            let raw = &buf[off + NAME_AT..off + reclen];
            let name = &raw[..raw.iter().position(|&b| b == 0).unwrap_or(raw.len())];
            off += reclen;
            if name == b"." || name == b".." {
                continue;
            }
            if seen == limit {
                return Ok(true);
            }
            seen += 1;
            f(name);
        }
    }
}

/// Open the regular file `name` in `dir` for reading: no link followed, no FIFO waited for, no
/// terminal taken, and no access time written where the kernel allows it (owner or CAP_FOWNER).
pub fn open_file_at(dir: &OwnedFd, name: &std::ffi::CStr) -> io::Result<OwnedFd> {
    let base = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
    let open = |flags: i32| {
        // SAFETY: a valid descriptor and C string; the kernel returns a new descriptor we own.
        check(unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags) } as _)
            // SAFETY: the kernel just gave us this descriptor.
            .map(|fd| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
    };
    match open(base | libc::O_NOATIME) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => open(base),
        r => r,
    }
}

/// Write `bytes` to the existing file `name` in `dir` in one write, following no link, creating
/// nothing: for the small control files of /proc, which take a value in one write or refuse it.
pub fn write_file_at(dir: &OwnedFd, name: &std::ffi::CStr, bytes: &[u8]) -> io::Result<()> {
    let flags = libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: a valid descriptor and C string; the kernel returns a new descriptor we own.
    let fd = check(unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags) } as _)?;
    // SAFETY: the kernel just gave us this descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    // SAFETY: a valid descriptor and a buffer of that length.
    let n = check(unsafe { libc::write(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) } as _)?;
    if n as usize != bytes.len() {
        return Err(io::Error::other(format!("wrote {n} of {} bytes", bytes.len())));
    }
    Ok(())
}

/// Open the directory `name` in `dir` for listing, following no link (a C-string name): the open
/// of `open_dir_at`, without a conversion per directory of a walk.
pub fn open_subdir_at(dir: &OwnedFd, name: &std::ffi::CStr) -> io::Result<OwnedFd> {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a valid descriptor and C string; the kernel returns a new descriptor we own.
    let fd = check(unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags) } as _)?;
    // SAFETY: the kernel just gave us this descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// The text of the link `name` in `dir`, never followed (at most PATH_MAX bytes).
pub fn read_link_at(dir: &OwnedFd, name: &std::ffi::CStr) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: the kernel writes at most buf.len() bytes into buf.
    let n = check(unsafe {
        libc::readlinkat(dir.as_raw_fd(), name.as_ptr(), buf.as_mut_ptr() as *mut libc::c_char, buf.len())
    } as _)? as usize;
    buf.truncate(n);
    Ok(buf)
}

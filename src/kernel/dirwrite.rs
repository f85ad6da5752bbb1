//! Changes to the entries of a directory held open: create (exclusively), rename, unlink, make
//! and remove directories, chmod, and sync the directory so that a rename is durable. No link is
//! followed; each name is one entry of `dir`, never a path.
//! May use: libc, std and kernel::{errno, dirfd, stat}.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::kernel::dirfd::openat;
use crate::kernel::errno::check;

fn cstr(name: &str) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::other("file name with NUL"))
}

/// Create `name` in `dir` for writing: it must not exist, and no link is followed.
pub fn create_excl_at(dir: &OwnedFd, name: &str, mode: u32) -> io::Result<std::fs::File> {
    let c = cstr(name)?;
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a valid descriptor and C string; the kernel returns a new descriptor we own.
    let fd = check(unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags, mode as libc::c_uint) } as _)?;
    // SAFETY: the kernel just gave us this descriptor.
    Ok(std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd as RawFd) }))
}

/// Open `name` in `dir` for reading and writing, created with `mode` when missing (`truncate`:
/// emptied), following no link: a root-only file of the state dir (the sidecar's lock and log).
/// Refused unless it is a regular file of root's; its mode is set to `mode` on the descriptor.
pub fn open_private_at(dir: &OwnedFd, name: &str, mode: u32, truncate: bool) -> io::Result<std::fs::File> {
    let c = cstr(name)?;
    let trunc = if truncate { libc::O_TRUNC } else { 0 };
    let flags = libc::O_RDWR | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY | trunc;
    // SAFETY: a valid descriptor and C string; the kernel returns a new descriptor we own.
    let fd = check(unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags, mode as libc::c_uint) } as _)?;
    // SAFETY: the kernel just gave us this descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    let st = crate::kernel::stat::fstat(&fd)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_uid != 0 {
        return Err(io::Error::other(format!("{name} is not a regular file of root's: remove it")));
    }
    fchmod(&fd, mode)?;
    Ok(std::fs::File::from(fd))
}

/// Rename `from` to `to`, both in `dir`.
pub fn rename_at(dir: &OwnedFd, from: &str, to: &str) -> io::Result<()> {
    let (f, t) = (cstr(from)?, cstr(to)?);
    // SAFETY: a valid descriptor and C strings.
    check(unsafe { libc::renameat(dir.as_raw_fd(), f.as_ptr(), dir.as_raw_fd(), t.as_ptr()) } as _).map(drop)
}

/// Remove the file `name` from `dir`.
pub fn unlink_at(dir: &OwnedFd, name: &str) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: a valid descriptor and C string.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) } as _).map(drop)
}

/// Make the directory `name` in `dir` with exactly `mode` (the umask does not apply).
pub fn mkdir_at(dir: &OwnedFd, name: &str, mode: u32) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: a valid descriptor and C string.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), mode as libc::mode_t) } as _)?;
    // SAFETY: as above; `dir` is ours and only root may write in it, so `name` is what we made.
    check(unsafe { libc::fchmodat(dir.as_raw_fd(), c.as_ptr(), mode as libc::mode_t, 0) } as _).map(drop)
}

/// Make the directory `name` in `dir`, `mode` less the umask, and nothing else: where others
/// may write in `dir`, a chmod by name could follow a link put there since.
pub fn mkdir_only_at(dir: &OwnedFd, name: &str, mode: u32) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: a valid descriptor and C string.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), mode as libc::mode_t) } as _).map(drop)
}

pub fn fchmod(fd: &OwnedFd, mode: u32) -> io::Result<()> {
    // SAFETY: a valid descriptor.
    check(unsafe { libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t) } as _).map(drop)
}

/// Remove the empty directory `name` from `dir`.
pub fn rmdir_at(dir: &OwnedFd, name: &std::ffi::OsStr) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = CString::new(name.as_bytes()).map_err(|_| io::Error::other("file name with NUL"))?;
    // SAFETY: a valid descriptor and C string.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), libc::AT_REMOVEDIR) } as _).map(drop)
}

/// Remove the non-directory `name` from `dir` (EISDIR when it is a directory).
pub fn unlink_os_at(dir: &OwnedFd, name: &std::ffi::OsStr) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = CString::new(name.as_bytes()).map_err(|_| io::Error::other("file name with NUL"))?;
    // SAFETY: a valid descriptor and C string.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) } as _).map(drop)
}

/// Make the entries of `dir` durable (a rename is durable only once its directory is synced).
pub fn sync_dir(dir: &OwnedFd) -> io::Result<()> {
    let fd = openat(Some(dir.as_raw_fd()), std::path::Path::new("."), libc::O_RDONLY | libc::O_DIRECTORY)?;
    std::fs::File::from(fd).sync_all()
}

//! What a file is, asked of the kernel without opening it for reading: fstat, fstatat and statx
//! (following no link), the file system a path is on (procfs, read-only), a namespace's inode.
//! May use: libc, std and kernel::errno.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use crate::kernel::errno::check;

/// Inode of a namespace link such as /proc/1/ns/pid: the namespace's identity.
pub fn ns_inode(path: &str) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::metadata(path)?.ino())
}

/// Is `path` a mounted procfs?
pub fn is_procfs(path: &str) -> io::Result<bool> {
    let c = CString::new(path).map_err(|_| io::Error::other("path with NUL"))?;
    // SAFETY: valid C string and out struct.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        check(libc::statfs(c.as_ptr(), &mut st) as _)?;
        // f_type is signed on glibc and unsigned on musl; the magic fits either.
        Ok(st.f_type as u64 == libc::PROC_SUPER_MAGIC as u64)
    }
}

/// fstat(2): owner, mode and type of what the descriptor refers to (O_PATH descriptors too).
pub fn fstat(fd: &OwnedFd) -> io::Result<libc::stat> {
    // SAFETY: a valid descriptor and a local out struct.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        check(libc::fstat(fd.as_raw_fd(), &mut st) as _)?;
        Ok(st)
    }
}

/// Is the file system of `fd` mounted read-only (statvfs's ST_RDONLY)?
pub fn read_only(fd: &OwnedFd) -> io::Result<bool> {
    // SAFETY: a valid descriptor and a local out struct.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        check(libc::fstatvfs(fd.as_raw_fd(), &mut st) as _)?;
        Ok(st.f_flag & libc::ST_RDONLY != 0)
    }
}

/// fstat(2) of a descriptor we do not own (e.g. 2).
pub fn fstat_fd(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: fstat only inspects the descriptor; the out struct is local.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        check(libc::fstat(fd, &mut st) as _)?;
        Ok(st)
    }
}

/// fstatat(2) of `name` relative to `dir`, following no link.
pub fn fstatat(dir: &OwnedFd, name: &std::ffi::CStr) -> io::Result<libc::stat> {
    // SAFETY: a valid descriptor, C string and local out struct.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        check(libc::fstatat(dir.as_raw_fd(), name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) as _)?;
        Ok(st)
    }
}

/// What statx(2) says of a file: the facts a walk records and a digest compares before and after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    /// Type and permission bits (st_mode).
    pub mode: u32,
    pub size: u64,
    pub ino: u64,
    /// The file system's device, as (major << 32) | minor.
    pub dev: u64,
    /// The mount the file is on, when the kernel says (5.8 and later).
    pub mnt_id: Option<u64>,
    pub nlink: u32,
    pub uid: u32,
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    /// The device a device file stands for, as (major << 32) | minor.
    pub rdev: u64,
}

impl Meta {
    pub fn kind(&self) -> u32 {
        self.mode & libc::S_IFMT
    }
}

fn statx_raw(dir: RawFd, name: &std::ffi::CStr, flags: i32) -> io::Result<Meta> {
    // SAFETY: a zeroed plain-data struct the kernel fills; a valid C string.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    let flags = flags | libc::AT_SYMLINK_NOFOLLOW | libc::AT_NO_AUTOMOUNT | libc::AT_STATX_SYNC_AS_STAT;
    let mask = libc::STATX_BASIC_STATS | libc::STATX_MNT_ID;
    // SAFETY: as above; the raw syscall needs nothing from the C library's version.
    check(unsafe { libc::syscall(libc::SYS_statx, dir, name.as_ptr(), flags, mask, &mut sx) })?;
    let dev2 = |major: u32, minor: u32| ((major as u64) << 32) | minor as u64;
    Ok(Meta {
        mode: sx.stx_mode as u32,
        size: sx.stx_size,
        ino: sx.stx_ino,
        dev: dev2(sx.stx_dev_major, sx.stx_dev_minor),
        mnt_id: (sx.stx_mask & libc::STATX_MNT_ID != 0).then_some(sx.stx_mnt_id),
        nlink: sx.stx_nlink,
        uid: sx.stx_uid,
        mtime: (sx.stx_mtime.tv_sec, sx.stx_mtime.tv_nsec),
        ctime: (sx.stx_ctime.tv_sec, sx.stx_ctime.tv_nsec),
        rdev: dev2(sx.stx_rdev_major, sx.stx_rdev_minor),
    })
}

/// statx(2) of `name` in `dir`, following no link and triggering no automount.
pub fn statx_at(dir: &OwnedFd, name: &std::ffi::CStr) -> io::Result<Meta> {
    statx_raw(dir.as_raw_fd(), name, 0)
}

/// statx(2) of a path, following no link at its last component.
pub fn statx_path(path: &std::path::Path) -> io::Result<Meta> {
    use std::os::unix::ffi::OsStrExt;
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::other("path with NUL"))?;
    statx_raw(libc::AT_FDCWD, &c, 0)
}

/// statx(2) of what an open descriptor refers to.
pub fn statx_fd(fd: &OwnedFd) -> io::Result<Meta> {
    statx_raw(fd.as_raw_fd(), c"", libc::AT_EMPTY_PATH)
}

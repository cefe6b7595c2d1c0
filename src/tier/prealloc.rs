//! Reserving a slot file's space honestly: what a file takes is its allocated blocks
//! (`st_blocks * 512`), not its apparent size (a sparse file takes nothing); preallocation
//! happens only when the filesystem keeps at least a floor free afterwards; and a preallocation
//! that fails gives back what it took (filesystems such as ext4 keep the blocks a failed
//! `fallocate` allocated, which would leave the filesystem full).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Bytes a file takes on its filesystem (allocated blocks; 0 when it does not exist).
pub fn allocated_bytes(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.blocks().saturating_mul(512))
}

/// Bytes of the filesystem holding `path` that an unprivileged writer can still take.
pub fn fs_free_bytes(path: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))?;
    // SAFETY: statvfs only writes into `st`.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `p` is a valid C string and `st` a valid out-pointer.
    if unsafe { libc::statvfs(p.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// Most holes remembered to give back; a file more fragmented than this is not preallocated.
const MAX_HOLES: usize = 4096;

/// The holes of the first `len` bytes of the file (ranges with no allocated blocks).
fn holes(fd: &OwnedFd, len: u64) -> Option<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    let mut at = 0u64;
    while at < len {
        // SAFETY: a valid descriptor; lseek does not touch memory.
        let hole = unsafe { libc::lseek(fd.as_raw_fd(), at as libc::off_t, libc::SEEK_HOLE) };
        if hole < 0 {
            return None;
        }
        let hole = (hole as u64).min(len);
        if hole >= len {
            break;
        }
        // SAFETY: as above.
        let data = unsafe { libc::lseek(fd.as_raw_fd(), hole as libc::off_t, libc::SEEK_DATA) };
        // ENXIO: no data after the hole (it runs to the end of the file).
        let end = if data < 0 {
            len
        } else {
            (data as u64).min(len)
        };
        out.push((hole, end - hole));
        if out.len() > MAX_HOLES {
            return None;
        }
        at = end;
    }
    Some(out)
}

/// Reserves the first `len` bytes of the file at `path` (open as `fd`, of apparent size
/// `len`), unless that would leave the filesystem with fewer than `keep_free` bytes free (then
/// the file stays sparse). Returns whether the space is reserved. When `fallocate` fails, the
/// holes it was filling are punched again, so the file takes what it took before.
pub fn preallocate(fd: &OwnedFd, path: &Path, len: u64, keep_free: Option<u64>) -> bool {
    let Some(before) = holes(fd, len) else {
        return false;
    };
    let growth: u64 = before.iter().map(|h| h.1).sum();
    if growth == 0 {
        return true;
    }
    if let Some(floor) = keep_free {
        let free = fs_free_bytes(path).unwrap_or(0);
        if free < floor.saturating_add(growth) {
            return false;
        }
    }
    // SAFETY: a valid descriptor.
    if unsafe { libc::fallocate(fd.as_raw_fd(), 0, 0, len as libc::off_t) } == 0 {
        return true;
    }
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    for (off, n) in before {
        // SAFETY: a valid descriptor; the range is inside the file.
        unsafe { libc::fallocate(fd.as_raw_fd(), mode, off as libc::off_t, n as libc::off_t) };
    }
    false
}

//! The seam between the asynchronous tier machinery and where the bytes go: a `TierStore` puts
//! and gets sealed blocks by key, one result per key. The disk tier's store is `FileSlots` (one
//! preallocated file, one fixed aligned slot per block, addressed by slot); a remote store
//! addresses the same sealed bytes by their prefix digest.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use super::sealed::{PrefixDigest, IO_ALIGN};

/// Where a sealed block lives: its prefix digest (a remote store's key) and its slot (the
/// disk's address).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TierKey {
    pub digest: PrefixDigest,
    pub slot: u64,
}

/// Puts and gets sealed blocks. Called from I/O worker threads, never from a C call.
pub trait TierStore: Send + Sync {
    /// Writes `data` (a whole sealed slot) under `key`.
    fn put(&self, key: &TierKey, data: &[u8]) -> io::Result<()>;
    /// Reads the sealed slot of `key` into `out` (all of it).
    fn get(&self, key: &TierKey, out: &mut [u8]) -> io::Result<()>;
    /// `put` of several keys, one result per key.
    fn put_batch(&self, items: &[(TierKey, &[u8])]) -> Vec<io::Result<()>> {
        items.iter().map(|(k, d)| self.put(k, d)).collect()
    }
    /// `get` of several keys, one result per key.
    fn get_batch(&self, keys: &[TierKey], out: &mut [&mut [u8]]) -> Vec<io::Result<()>> {
        keys.iter()
            .zip(out.iter_mut())
            .map(|(k, o)| self.get(k, o))
            .collect()
    }
}

/// Faults injected into a store (tests and benchmarks): each counter is the number of the
/// next operations that fail that way.
#[derive(Debug, Default)]
pub struct FaultPlan {
    /// Writes that stop half-way (the first half reaches the file) and report an error.
    pub short_writes: AtomicU32,
    /// Writes that fail with ENOSPC before writing anything.
    pub enospc_writes: AtomicU32,
    /// Writes that fail with EIO.
    pub eio_writes: AtomicU32,
    /// Reads that fail with EIO.
    pub eio_reads: AtomicU32,
    /// After this many more successful writes every write fails with ENOSPC (the directory is
    /// full); `u64::MAX` = never (the default is set by `FaultPlan::new`).
    pub writes_until_full: AtomicU64,
    /// Microseconds every read sleeps before it starts (a slow device).
    pub read_latency_us: AtomicU64,
    /// Microseconds every write sleeps before it starts (a device that falls behind).
    pub write_latency_us: AtomicU64,
}

impl FaultPlan {
    pub fn new() -> Self {
        FaultPlan {
            writes_until_full: AtomicU64::new(u64::MAX),
            ..FaultPlan::default()
        }
    }

    fn take(counter: &AtomicU32) -> bool {
        counter
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }

    /// The fault of the next write, if any (`Some(true)` = a short write).
    fn next_write(&self) -> Result<bool, io::Error> {
        let us = self.write_latency_us.load(Ordering::Relaxed);
        if us > 0 {
            std::thread::sleep(std::time::Duration::from_micros(us));
        }
        let full = self
            .writes_until_full
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n != u64::MAX && n > 0).then(|| n - 1)
            });
        if full.is_err() && self.writes_until_full.load(Ordering::Relaxed) == 0 {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        if Self::take(&self.enospc_writes) {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        if Self::take(&self.eio_writes) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(Self::take(&self.short_writes))
    }

    fn next_read(&self) -> io::Result<()> {
        let us = self.read_latency_us.load(Ordering::Relaxed);
        if us > 0 {
            std::thread::sleep(std::time::Duration::from_micros(us));
        }
        if Self::take(&self.eio_reads) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }
}

/// A zeroed byte buffer aligned for O_DIRECT.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer owns its allocation; it is moved between threads, never shared.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// `None` when the allocator refuses.
    pub fn new(len: usize) -> Option<Self> {
        let layout = std::alloc::Layout::from_size_align(len.max(IO_ALIGN), IO_ALIGN).ok()?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })?;
        Some(AlignedBuf { ptr, len })
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` initialised bytes owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed mutably through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len.max(IO_ALIGN), IO_ALIGN)
            .expect("valid at allocation");
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

fn open_raw(path: &Path, flags: libc::c_int) -> io::Result<OwnedFd> {
    let p = c_path(path)?;
    // SAFETY: `p` is a valid C string; the returned descriptor is owned below.
    let fd = unsafe { libc::open(p.as_ptr(), flags | libc::O_CLOEXEC, 0o600) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn pwrite_all(fd: &OwnedFd, data: &[u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < data.len() {
        // SAFETY: the range is inside `data`.
        let n = unsafe {
            libc::pwrite(
                fd.as_raw_fd(),
                data[done..].as_ptr().cast(),
                data.len() - done,
                (offset + done as u64) as libc::off_t,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "short write"));
        }
        done += n as usize;
    }
    Ok(())
}

fn pread_all(fd: &OwnedFd, out: &mut [u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < out.len() {
        // SAFETY: the range is inside `out`.
        let n = unsafe {
            libc::pread(
                fd.as_raw_fd(),
                out[done..].as_mut_ptr().cast(),
                out.len() - done,
                (offset + done as u64) as libc::off_t,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            // Past the end of a sparse or truncated file: what is missing reads as zeros.
            out[done..].fill(0);
            return Ok(());
        }
        done += n as usize;
    }
    Ok(())
}

/// Whether files in `dir` accept O_DIRECT I/O: a small aligned write and read on a probe file.
pub fn probe_direct_io(dir: &Path) -> bool {
    let probe = dir.join(format!(".kvblock-direct-probe-{}", std::process::id()));
    let ok = (|| -> io::Result<()> {
        let fd = open_raw(
            &probe,
            libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC | libc::O_DIRECT,
        )?;
        let mut buf = AlignedBuf::new(IO_ALIGN).ok_or_else(|| io::Error::other("no memory"))?;
        buf.as_mut_slice()[0] = 0x5a;
        pwrite_all(&fd, buf.as_slice(), 0)?;
        buf.as_mut_slice()[0] = 0;
        pread_all(&fd, buf.as_mut_slice(), 0)?;
        if buf.as_slice()[0] != 0x5a {
            return Err(io::Error::other("probe read back other bytes"));
        }
        Ok(())
    })()
    .is_ok();
    let _ = std::fs::remove_file(&probe);
    ok
}

/// How a slot file was opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileMode {
    /// O_DIRECT (the page cache is bypassed); buffered I/O otherwise.
    pub direct: bool,
    /// The file's space is reserved (`fallocate`); a sparse file otherwise (the filesystem
    /// refused, or was full: writes may then fail with ENOSPC, which is counted).
    pub preallocated: bool,
    /// The file existed with this manager's size: its slots are scanned for a warm restart.
    pub existed: bool,
}

/// One preallocated file of fixed, aligned slots: the disk tier's store for one window pool.
pub struct FileSlots {
    fd: OwnedFd,
    path: PathBuf,
    slot_bytes: usize,
    num_slots: u64,
    mode: FileMode,
    faults: Arc<FaultPlan>,
}

impl std::fmt::Debug for FileSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileSlots")
            .field("path", &self.path)
            .field("num_slots", &self.num_slots)
            .field("mode", &self.mode)
            .finish()
    }
}

impl FileSlots {
    /// Opens (or creates) `path` for `num_slots` slots of `slot_bytes`, locked against other
    /// managers. A file of another size is reset. `direct` asks for O_DIRECT (see
    /// `probe_direct_io`). The space is reserved as far as the filesystem gives it
    /// (`open_within` with no floor).
    pub fn open(path: &Path, slot_bytes: usize, num_slots: u64, direct: bool) -> io::Result<Self> {
        Self::open_within(path, slot_bytes, num_slots, direct, None)
    }

    /// `open`, reserving the file's space only when the filesystem keeps at least `keep_free`
    /// bytes free afterwards (`None`: no floor); a reservation that fails gives back what it
    /// took (`prealloc::preallocate`). Without one the file is sparse.
    pub fn open_within(
        path: &Path,
        slot_bytes: usize,
        num_slots: u64,
        direct: bool,
        keep_free: Option<u64>,
    ) -> io::Result<Self> {
        let flags = libc::O_RDWR | libc::O_CREAT | if direct { libc::O_DIRECT } else { 0 };
        let fd = open_raw(path, flags)?;
        // SAFETY: a valid descriptor.
        if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("{} is in use by another manager", path.display()),
            ));
        }
        let len = (slot_bytes as u64)
            .checked_mul(num_slots)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "file size overflows"))?;
        let current = std::fs::metadata(path)?.len();
        let existed = current == len;
        if !existed {
            // Reset to an empty sparse file of the new size: nothing of the old one is kept.
            // SAFETY: a valid descriptor.
            if unsafe { libc::ftruncate(fd.as_raw_fd(), 0) } != 0
                || unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        let preallocated = super::prealloc::preallocate(&fd, path, len, keep_free);
        Ok(FileSlots {
            fd,
            path: path.to_path_buf(),
            slot_bytes,
            num_slots,
            mode: FileMode {
                direct,
                preallocated,
                existed,
            },
            faults: Arc::new(FaultPlan::new()),
        })
    }

    pub fn mode(&self) -> FileMode {
        self.mode
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn num_slots(&self) -> u64 {
        self.num_slots
    }

    pub fn faults(&self) -> &Arc<FaultPlan> {
        &self.faults
    }

    fn offset(&self, key: &TierKey) -> io::Result<u64> {
        if key.slot >= self.num_slots {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "slot out of range",
            ));
        }
        Ok(key.slot * self.slot_bytes as u64)
    }

    /// Reads the first `out.len()` bytes of a slot (headers at a warm restart), with no fault
    /// injected.
    pub fn read_prefix(&self, slot: u64, out: &mut [u8]) -> io::Result<()> {
        let offset = self.offset(&TierKey {
            digest: [0; 32],
            slot,
        })?;
        pread_all(&self.fd, out, offset)
    }
}

impl TierStore for FileSlots {
    fn put(&self, key: &TierKey, data: &[u8]) -> io::Result<()> {
        let offset = self.offset(key)?;
        if self.faults.next_write()? {
            let half = (data.len() / 2 / IO_ALIGN) * IO_ALIGN;
            pwrite_all(&self.fd, &data[..half], offset)?;
            return Err(io::Error::new(io::ErrorKind::WriteZero, "short write"));
        }
        pwrite_all(&self.fd, data, offset)
    }

    fn get(&self, key: &TierKey, out: &mut [u8]) -> io::Result<()> {
        let offset = self.offset(key)?;
        self.faults.next_read()?;
        pread_all(&self.fd, out, offset)
    }
}

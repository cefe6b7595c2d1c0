//! A small pool of I/O worker threads shared by the tiers of one manager. Jobs are whole sealed
//! slots moved with positional reads and writes through a `TierStore`; reads go before writes
//! (a read is a request waiting, a write only saves future work). Reads are verified on the
//! worker. Completions are collected by the tier that queued them, in a later call: nothing in a
//! C call waits for I/O.

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::sealed::{verify_slot, SealError, SlotHeader, SlotLayout};
use super::store::{AlignedBuf, TierKey, TierStore};

/// What a job does.
#[derive(Clone, Copy, Debug)]
pub enum IoKind {
    /// Write the slot in the buffer; with a layout, checksum it first (`seal_checksums`).
    Write { seal: Option<SlotLayout> },
    /// Read the slot into the buffer and verify it against the key's digest.
    Read { layout: SlotLayout },
}

/// How a job ended.
#[derive(Debug)]
pub enum IoOutcome {
    Written,
    /// The OS error number of a failed write (`EIO` when none).
    WriteFailed(i32),
    /// Read and verified.
    Read(Box<SlotHeader>),
    ReadFailed(i32),
    /// Read, but the bytes do not verify.
    Refused(SealError),
}

/// A finished job: its buffer comes back for reuse.
#[derive(Debug)]
pub struct IoDone {
    pub key: TierKey,
    pub buf: AlignedBuf,
    pub outcome: IoOutcome,
}

/// Where a tier collects its finished jobs.
pub type Completions = Arc<Mutex<Vec<IoDone>>>;

/// One queued job.
pub struct IoJob {
    pub store: Arc<dyn TierStore>,
    pub key: TierKey,
    pub buf: AlignedBuf,
    pub kind: IoKind,
    pub done: Completions,
}

#[derive(Default)]
struct Queue {
    reads: VecDeque<IoJob>,
    writes: VecDeque<IoJob>,
    shutdown: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
}

/// The worker threads.
pub struct IoPool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for IoPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IoPool({} threads)", self.threads.len())
    }
}

/// Locks, ignoring poisoning (a worker never panics holding a lock; the data stays valid).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// Checksums a slot (when asked) and writes it.
fn seal_and_put(
    store: &dyn TierStore,
    key: &TierKey,
    buf: &mut AlignedBuf,
    seal: Option<SlotLayout>,
) -> io::Result<()> {
    if let Some(layout) = seal {
        super::sealed::seal_checksums(&layout, buf.as_mut_slice());
    }
    store.put(key, buf.as_slice())
}

fn run(job: IoJob) {
    let IoJob {
        store,
        key,
        mut buf,
        kind,
        done,
    } = job;
    let outcome = match kind {
        IoKind::Write { seal } => match seal_and_put(store.as_ref(), &key, &mut buf, seal) {
            Ok(()) => IoOutcome::Written,
            Err(e) => IoOutcome::WriteFailed(errno(&e)),
        },
        IoKind::Read { layout } => match store.get(&key, buf.as_mut_slice()) {
            Err(e) => IoOutcome::ReadFailed(errno(&e)),
            Ok(()) => match verify_slot(&layout, buf.as_slice(), &key.digest) {
                Ok(h) => IoOutcome::Read(Box::new(h)),
                Err(e) => IoOutcome::Refused(e),
            },
        },
    };
    lock(&done).push(IoDone { key, buf, outcome });
}

impl IoPool {
    /// Starts `threads` workers (at least one).
    pub fn new(threads: usize) -> io::Result<Self> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
        });
        let mut pool = IoPool {
            shared,
            threads: Vec::new(),
        };
        for i in 0..threads.max(1) {
            let shared = pool.shared.clone();
            let handle = std::thread::Builder::new()
                .name(format!("kvblock-io-{i}"))
                .spawn(move || loop {
                    let job = {
                        let mut q = lock(&shared.queue);
                        loop {
                            if let Some(j) = q.reads.pop_front().or_else(|| q.writes.pop_front()) {
                                break j;
                            }
                            if q.shutdown {
                                return;
                            }
                            q = shared.wake.wait(q).unwrap_or_else(|e| e.into_inner());
                        }
                    };
                    run(job);
                })?;
            pool.threads.push(handle);
        }
        Ok(pool)
    }

    /// Queues a job (the tier bounds how many it has queued).
    pub fn submit(&self, job: IoJob) {
        self.submit_all(std::iter::once(job));
    }

    /// Queues jobs under one lock, waking as many workers as needed.
    pub fn submit_all(&self, jobs: impl IntoIterator<Item = IoJob>) {
        let mut q = lock(&self.shared.queue);
        let mut n = 0;
        for job in jobs {
            match job.kind {
                IoKind::Read { .. } => q.reads.push_back(job),
                IoKind::Write { .. } => q.writes.push_back(job),
            }
            n += 1;
        }
        drop(q);
        if n == 1 {
            self.shared.wake.notify_one();
        } else if n > 1 {
            self.shared.wake.notify_all();
        }
    }

    pub fn num_threads(&self) -> usize {
        self.threads.len()
    }
}

impl Drop for IoPool {
    /// Finishes the queued jobs, then stops the workers.
    fn drop(&mut self) {
        lock(&self.shared.queue).shutdown = true;
        self.shared.wake.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

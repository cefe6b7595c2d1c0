//! The remote tier's worker threads: batches of store operations run here, never in a C call.
//! Lookups and fetches (a request is waiting) go before stores (they only save future work),
//! as on the disk tier's I/O pool (which runs single-slot jobs; these are whole pipelined
//! batches). Dropping the pool drops the batches still queued (writes behind are lost, as when
//! their queue is full) and does not wait for the running ones: each ends within its store's
//! timeouts and its thread then exits, so destroying a manager never waits on the network.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::tier::io::lock;

/// One batch of work.
pub type Task = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct Queue {
    urgent: VecDeque<Task>,
    background: VecDeque<Task>,
    shutdown: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
}

/// The worker threads of one manager's remote tier.
pub struct RemoteWorkers {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for RemoteWorkers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RemoteWorkers({} threads)", self.threads.len())
    }
}

impl RemoteWorkers {
    /// Starts `threads` workers (at least one).
    pub fn new(threads: usize) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
        });
        let mut pool = RemoteWorkers {
            shared,
            threads: Vec::new(),
        };
        for i in 0..threads.max(1) {
            let shared = pool.shared.clone();
            let handle = std::thread::Builder::new()
                .name(format!("kvblock-remote-{i}"))
                .spawn(move || loop {
                    let task = {
                        let mut q = lock(&shared.queue);
                        loop {
                            if let Some(t) =
                                q.urgent.pop_front().or_else(|| q.background.pop_front())
                            {
                                break t;
                            }
                            if q.shutdown {
                                return;
                            }
                            q = shared.wake.wait(q).unwrap_or_else(|e| e.into_inner());
                        }
                    };
                    task();
                })?;
            pool.threads.push(handle);
        }
        Ok(pool)
    }

    /// Queues a task; `urgent` ones (lookups, fetches) run first.
    pub fn submit(&self, urgent: bool, task: Task) {
        let mut q = lock(&self.shared.queue);
        if urgent {
            q.urgent.push_back(task);
        } else {
            q.background.push_back(task);
        }
        drop(q);
        self.shared.wake.notify_one();
    }

    pub fn num_threads(&self) -> usize {
        self.threads.len()
    }
}

impl Drop for RemoteWorkers {
    fn drop(&mut self) {
        let mut q = lock(&self.shared.queue);
        q.shutdown = true;
        q.urgent.clear();
        q.background.clear();
        drop(q);
        self.shared.wake.notify_all();
        // Detached: a running batch ends within its timeouts.
        self.threads.clear();
    }
}

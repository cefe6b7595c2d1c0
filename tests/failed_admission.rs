//! An admission that does not fit changes nothing, copies no tokens and allocates nothing.
//!
//! A counting global allocator (this test binary only) counts the allocations made on the
//! calling thread while the failing call runs.

mod common;

use common::window;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use kvblock::error::KvError;
use kvblock::manager::{KvCacheManager, ManagerConfig, Request};
use kvblock::pool::Level;

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards every call to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

fn manager(primary: usize) -> KvCacheManager {
    KvCacheManager::new(ManagerConfig {
        windows: vec![window(4096, primary, 0)],
        tokens_per_block: 4,
        max_sequence_length: 4096,
        manual_clock: true,
        ..ManagerConfig::default()
    })
    .unwrap()
}

#[test]
fn a_failed_admission_allocates_nothing_and_changes_nothing() {
    let mut m = manager(16);
    // A cached prefix the failing request walks through (12 blocks, stored and released).
    let prompt: Vec<i32> = (0..49).collect();
    m.add_sequence(&Request::new(1, prompt.clone())).unwrap();
    m.store_context_blocks(1, 48).unwrap();
    m.add_sequence(&Request::new(2, (1000..1009).collect()))
        .unwrap();
    // Request 3 shares the cached prefix but needs far more blocks than are free.
    let mut big = prompt.clone();
    big.extend(5000..5400);
    let req = Request::new(3, big);
    let view = req.as_ref();
    // The first failure grows the planning buffers; from then on nothing is allocated.
    assert!(matches!(
        m.add_sequence_ref(&view),
        Err(KvError::OutOfBlocks { .. })
    ));
    let free = m.window(4096).unwrap().num_free(Level::Primary);
    let in_tree = m.window(4096).unwrap().num_in_tree();
    let stats = m.stats();
    let before = allocations();
    for _ in 0..10 {
        assert!(matches!(
            m.add_sequence_ref(&view),
            Err(KvError::OutOfBlocks { .. })
        ));
    }
    assert_eq!(allocations() - before, 0, "failed admissions allocated");
    let w = m.window(4096).unwrap();
    assert_eq!(w.num_free(Level::Primary), free);
    assert_eq!(w.num_in_tree(), in_tree);
    assert_eq!(m.stats(), stats);
    assert!(!m.has_sequence(3));
    assert_eq!(m.num_sequences(), 2);
    m.check_invariants().unwrap();
}

//! The router model: a consumer that applies the event stream to its own map (window → block
//! hash → parent hash, cache level, priority) must hold exactly the manager's reuse trees at every
//! flush, for random workloads with partial reuse, priorities, sliding/variable windows and host
//! offload.

mod common;

use common::window;

use common::Rng;
use std::collections::HashMap;

use kvblock::events::{EventData, KvCacheEvent};
use kvblock::manager::{KvCacheManager, ManagerConfig, Request, WindowSpec};
use kvblock::pool::Level;
use kvblock::retention::{RetentionConfig, TokenRangeRetention};

type View = HashMap<usize, HashMap<u64, (Option<u64>, Level, u8)>>;

/// Applies events the way a KV-aware router would, asserting they are self-consistent.
fn apply(view: &mut View, events: &[KvCacheEvent], last_id: &mut Option<u64>) {
    for e in events {
        if let Some(prev) = *last_id {
            assert!(
                e.event_id > prev,
                "event ids must increase: {prev} then {}",
                e.event_id
            );
        }
        *last_id = Some(e.event_id);
        let window = view.entry(e.window_size).or_default();
        match &e.data {
            EventData::Created { .. } => {}
            EventData::Stored {
                parent_hash,
                blocks,
            } => {
                if let Some(p) = parent_hash {
                    assert!(window.contains_key(p), "stored under unknown parent {p:x}");
                }
                let mut parent = *parent_hash;
                for b in blocks {
                    let old = window.insert(b.hash, (parent, b.cache_level, b.priority));
                    assert!(old.is_none(), "block {:x} stored twice", b.hash);
                    parent = Some(b.hash);
                }
            }
            EventData::Removed { block_hashes } => {
                for h in block_hashes {
                    assert!(window.remove(h).is_some(), "removed unknown block {h:x}");
                }
            }
            EventData::Updated {
                block_hash,
                cache_level,
                priority,
            } => {
                let entry = window
                    .get_mut(block_hash)
                    .unwrap_or_else(|| panic!("update of unknown block {block_hash:x}"));
                if let Some((old, new)) = cache_level {
                    assert_eq!(
                        entry.1, *old,
                        "cache level diff starts from the known level"
                    );
                    entry.1 = *new;
                }
                if let Some((old, new)) = priority {
                    assert_eq!(
                        entry.2, *old,
                        "priority diff starts from the known priority"
                    );
                    entry.2 = *new;
                }
            }
            // The disk tier is not the tree this view models.
            EventData::DiskStored { .. } | EventData::DiskRemoved { .. } => {}
        }
    }
}

fn assert_view_matches(m: &KvCacheManager, view: &View, step: usize, seed: u64) {
    for w in m.window_sizes() {
        let actual: HashMap<u64, (Option<u64>, Level, u8)> = m
            .reuse_tree_snapshot(w)
            .unwrap()
            .into_iter()
            .map(|(h, p, l, pr)| (h, (p, l, pr)))
            .collect();
        let empty = HashMap::new();
        let seen = view.get(&w).unwrap_or(&empty);
        assert_eq!(
            seen, &actual,
            "window {w}: router view differs at step {step} (seed {seed})"
        );
    }
}

struct Workload {
    windows: Vec<WindowSpec>,
    partial: bool,
    copy_on_partial: bool,
}

fn run(workload: &Workload, seed: u64, steps: usize) {
    let tpb = 4;
    let cfg = ManagerConfig {
        windows: workload.windows.clone(),
        tokens_per_block: tpb,
        max_sequence_length: 64,
        enable_partial_reuse: workload.partial,
        copy_on_partial_reuse: workload.copy_on_partial,
        manual_clock: true,
        max_kv_event_entries: 1 << 20,
        ..ManagerConfig::default()
    };
    let mut m = KvCacheManager::new(cfg).unwrap();
    let mut rng = Rng(seed);
    let prefixes: Vec<Vec<i32>> = (0..4)
        .map(|p| (0..24).map(|i| p * 100 + i).collect())
        .collect();
    let mut live: Vec<u64> = Vec::new();
    let mut next_id = 0u64;
    let mut view = View::new();
    let mut last_id = None;
    for step in 0..steps {
        match rng.below_u(10) {
            0..=3 => {
                let prefix = &prefixes[rng.below_u(4) as usize];
                let shared = rng.below_u(prefix.len() as u64 + 1) as usize;
                let mut tokens: Vec<i32> = prefix[..shared].to_vec();
                for _ in 0..1 + rng.below_u(12) {
                    tokens.push(1000 + rng.below_u(6) as i32);
                }
                let mut req = Request::new(next_id, tokens);
                if rng.percent(20) {
                    req.lora_task_id = Some(rng.below_u(2));
                }
                if rng.percent(30) {
                    let priority = [10, 50, 80, 90][rng.below_u(4) as usize];
                    let duration = rng.percent(50).then(|| 1 + rng.below_u(20));
                    req.retention = RetentionConfig::new(
                        vec![TokenRangeRetention {
                            token_start: 0,
                            token_end: None,
                            priority,
                            duration_ms: duration,
                        }],
                        [20, 35, 60][rng.below_u(3) as usize],
                        None,
                    )
                    .unwrap();
                }
                if m.add_sequence(&req).is_ok() {
                    let input = req.input_length;
                    if rng.percent(50) {
                        m.store_context_blocks(next_id, input).unwrap();
                    }
                    live.push(next_id);
                }
                next_id += 1;
            }
            4..=5 if !live.is_empty() => {
                let id = live[rng.below_u(live.len() as u64) as usize];
                if m.add_token(id, 2000 + rng.below_u(4) as i32).is_ok() {
                    m.store_new_block(id).unwrap();
                }
            }
            6..=7 if !live.is_empty() => {
                let i = rng.below_u(live.len() as u64) as usize;
                let id = live.swap_remove(i);
                m.remove_sequence(id, rng.percent(85)).unwrap();
            }
            8 => {
                m.advance_time(rng.below_u(10)).unwrap();
                m.refresh_blocks();
            }
            _ => {
                let events = m.take_flushed_events();
                apply(&mut view, &events, &mut last_id);
                assert_view_matches(&m, &view, step, seed);
            }
        }
        m.check_invariants()
            .unwrap_or_else(|e| panic!("step {step} seed {seed}: {e}"));
    }
    let events = m.take_flushed_events();
    apply(&mut view, &events, &mut last_id);
    assert_view_matches(&m, &view, steps, seed);
    let stats = m.stats();
    assert!(stats.reused_blocks > 0, "the workload must exercise reuse");
    assert!(
        last_id.unwrap_or(0) > steps as u64 / 10,
        "the workload must produce events"
    );
    if workload.windows.iter().any(|w| w.secondary_blocks > 0) {
        assert!(
            stats.offloaded_blocks > 0 && stats.onboarded_blocks > 0,
            "host tier exercised"
        );
    }
}

#[test]
fn router_view_equals_trees_single_window_with_host_tier() {
    let w = Workload {
        windows: vec![window(64, 24, 16)],
        partial: true,
        copy_on_partial: true,
    };
    for seed in 1..=4 {
        run(&w, seed, 3000);
    }
}

#[test]
fn router_view_equals_trees_without_copy_on_partial() {
    let w = Workload {
        windows: vec![window(64, 20, 8)],
        partial: true,
        copy_on_partial: false,
    };
    for seed in 10..=12 {
        run(&w, seed, 3000);
    }
}

#[test]
fn router_view_equals_trees_with_variable_windows() {
    let w = Workload {
        windows: vec![window(16, 30, 10), window(64, 24, 12)],
        partial: true,
        copy_on_partial: true,
    };
    for seed in 20..=23 {
        run(&w, seed, 3000);
    }
}

#[test]
fn router_view_equals_trees_without_partial_reuse() {
    let w = Workload {
        windows: vec![window(64, 16, 0)],
        partial: false,
        copy_on_partial: false,
    };
    for seed in 30..=32 {
        run(&w, seed, 3000);
    }
}

//! Events of the disk tier: a block the host tier evicts to disk leaves the tree (Removed) and
//! is announced on disk (DiskStored) with the hash, parent hash and tokens of its tree Stored
//! event once its write completes; an evicted disk slot is a DiskRemoved; a block read back is
//! Stored in the tree at the host level, as before.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kvblock::events::{EventData, KvCacheEvent};
use kvblock::manager::WindowSpec;
use kvblock::manager::{CopyBackend, DiskTierConfig, KvCacheManager, ManagerConfig, Request};
use kvblock::pool::Level;

const TPB: usize = 4;
const WINDOW: usize = 64;

fn scratch_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("disk-events-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn manager(dir: &Path, slots: u64) -> KvCacheManager {
    KvCacheManager::new(ManagerConfig {
        windows: vec![WindowSpec {
            window_size: WINDOW,
            primary_blocks: 8,
            secondary_blocks: 4,
            num_layers: 1,
            num_kv_heads: 1,
            size_per_head: 2,
            ..WindowSpec::default()
        }],
        tokens_per_block: TPB,
        max_sequence_length: WINDOW,
        bytes_per_element: 1,
        copy_backend: CopyBackend::HostMemory,
        manual_clock: true,
        max_kv_event_entries: 1 << 20,
        disk: DiskTierConfig {
            directory: Some(dir.to_path_buf()),
            bytes_per_window: slots * 4096,
            max_writes_queued: 8,
            max_reads_in_flight: 8,
            ..DiskTierConfig::default()
        },
        ..ManagerConfig::default()
    })
    .expect("manager")
}

fn tokens(seed: i32, n: usize) -> Vec<i32> {
    (0..n as i32).map(|i| seed * 1000 + i).collect()
}

/// Serves a request, lets its disk writes finish, and appends the events.
fn serve(m: &mut KvCacheManager, id: u64, toks: &[i32], log: &mut Vec<KvCacheEvent>) {
    m.add_sequence(&Request::new(id, toks.to_vec())).unwrap();
    m.store_context_blocks(id, toks.len()).unwrap();
    m.remove_sequence(id, true).unwrap();
    settle(m, log);
}

fn settle(m: &mut KvCacheManager, log: &mut Vec<KvCacheEvent>) {
    let start = Instant::now();
    loop {
        m.disk_poll();
        let s = m.disk_stats();
        if s.writes_queued == 0 && s.reads_in_flight == 0 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "disk I/O hangs");
        std::thread::sleep(Duration::from_millis(1));
    }
    log.extend(m.take_flushed_events());
}

/// Each block of the tree's Stored events: (parent hash, tokens), by hash.
fn tree_stored(log: &[KvCacheEvent]) -> HashMap<u64, (Option<u64>, Vec<i32>)> {
    let mut out = HashMap::new();
    for e in log {
        if let EventData::Stored {
            parent_hash,
            blocks,
        } = &e.data
        {
            let mut parent = *parent_hash;
            for b in blocks {
                out.insert(b.hash, (parent, b.token_ids.clone()));
                parent = Some(b.hash);
            }
        }
    }
    out
}

#[test]
fn a_block_evicted_to_disk_is_announced_with_its_tree_hash_after_leaving_the_tree() {
    let dir = scratch_dir("announce");
    let mut m = manager(&dir, 64);
    let mut log = Vec::new();
    let a = tokens(1, 17);
    serve(&mut m, 1, &a, &mut log);
    for i in 0..6 {
        serve(&mut m, 100 + i, &tokens(500 + i as i32, 17), &mut log);
    }
    let stored = tree_stored(&log);
    let a_hashes: Vec<u64> = log
        .iter()
        .find_map(|e| match &e.data {
            EventData::Stored { blocks, .. } => Some(blocks.iter().map(|b| b.hash).collect()),
            _ => None,
        })
        .expect("A was stored");
    let mut removed = HashSet::new();
    let mut on_disk = Vec::new();
    for e in &log {
        match &e.data {
            EventData::Removed { block_hashes } => removed.extend(block_hashes.iter().copied()),
            EventData::DiskStored {
                parent_hash,
                blocks,
            } => {
                assert_eq!(blocks.len(), 1);
                let b = &blocks[0];
                // Same hash, parent and tokens as when it entered the tree.
                let (tree_parent, tree_tokens) = stored.get(&b.hash).expect("stored before");
                assert_eq!(parent_hash, tree_parent);
                assert_eq!(&b.token_ids, tree_tokens);
                assert_eq!(b.cache_level, Level::Secondary);
                assert!(removed.contains(&b.hash), "left the tree before disk");
                on_disk.push(b.hash);
            }
            _ => {}
        }
    }
    let s = m.disk_stats();
    assert_eq!(on_disk.len() as u64, s.writes, "one announcement per write");
    for h in &a_hashes[..4] {
        assert!(
            on_disk.contains(h),
            "A's full block {h:#x} announced on disk"
        );
    }

    // Read back: Stored in the tree at the host level, under the same hash; no disk removal.
    let req = Request::new(2, a.clone());
    assert_eq!(m.disk_prefetch(&[req.as_ref()]).unwrap()[0].started, 4);
    let before = log.len();
    settle(&mut m, &mut log);
    let back: Vec<(u64, Level)> = log[before..]
        .iter()
        .flat_map(|e| match &e.data {
            EventData::Stored { blocks, .. } => {
                blocks.iter().map(|b| (b.hash, b.cache_level)).collect()
            }
            EventData::DiskRemoved { .. } => panic!("a read does not remove the slot"),
            _ => Vec::new(),
        })
        .collect();
    for h in &a_hashes[..4] {
        assert!(
            back.contains(&(*h, Level::Secondary)),
            "{h:#x} back at host level"
        );
    }
}

#[test]
fn an_evicted_disk_slot_is_a_disk_removed_of_an_announced_block() {
    let dir = scratch_dir("evict");
    // 6 slots: the churn overwrites older slots.
    let mut m = manager(&dir, 6);
    let mut log = Vec::new();
    for i in 0..10 {
        serve(&mut m, 100 + i, &tokens(500 + i as i32, 17), &mut log);
    }
    let s = m.disk_stats();
    assert!(s.evictions > 0, "the disk tier evicted: {s:?}");
    let mut held = HashSet::new();
    let mut removed = 0u64;
    for e in &log {
        match &e.data {
            EventData::DiskStored { blocks, .. } => {
                assert!(held.insert(blocks[0].hash), "announced once while held");
            }
            EventData::DiskRemoved { block_hashes } => {
                for h in block_hashes {
                    assert!(held.remove(h), "{h:#x} removed from disk was announced");
                    removed += 1;
                }
            }
            _ => {}
        }
    }
    assert_eq!(removed, s.evictions, "one removal per evicted slot");
    // A consumer applying the events holds exactly the slots the tier holds.
    assert_eq!(held.len() as u64, s.writes - s.evictions);
    assert!(held.len() <= 6);
}

//! Property test: random operation sequences on `KvCacheManager`, checked after every step.
//!
//! Each run drives a manager with a seeded generator through admissions, single and in batches
//! (prompts drawn from a few shared prefixes and from earlier stored sequences, with random
//! suffixes, LoRA ids, cache salts, beam width 2 and retention configs), generated tokens, the
//! store entry points, releases with and without store, rewinds, pins and unpins, refreshes,
//! clock steps and explicit offloads, with primary pools small enough that eviction, host offload
//! and out-of-blocks failures are common. After every step:
//! * `check_invariants()` holds (queues, reference counts, trees, window bounds);
//! * the reference model agrees: every live sequence's token count; after an admission the
//!   prepopulated length is below the input length, the reused prompt prefix is a prefix that an
//!   earlier store recorded (same LoRA / salt), and reused + missed = context blocks per window;
//! * the scheduler's figures are what happens: `estimate_batch` (reuse, allocations, reused and
//!   missed blocks, free blocks consumed, what fits), `needed_blocks_one_step` for a generation
//!   step, `scheduling_remove_sequence` for a release, `count_reusable_blocks` (one window);
//! * a failed call changed nothing (stats and free counts), and only expected failures happen
//!   (out of blocks, sequence too long, unsupported rewinds);
//! * with the host copy backend, every live sequence's rows hold the bytes written for its tokens:
//!   rows are filled with a pattern derived from (prefix of tokens up to the position, LoRA, salt,
//!   layer, K|V, head, byte) when a position is computed, and reused positions must already hold
//!   that pattern after any sharing, takeover, partial copy, offload and onboard.
//!
//! A failure names the configuration, seed and step; `KVB_PROPERTY_TRACE=1` prints every
//! operation, `KVB_PROPERTY_SEEDS=n` runs n other seeds (longer fuzzing).

#[path = "../common/mod.rs"]
mod common;
mod harness;
mod model;
mod regressions;

use harness::Harness;
use model::{mix, Coverage, Pools, Scenario, MAX_SEQ};

const STEPS: usize = 4000;
const SEEDS: [u64; 5] = [
    0x5eed_0001,
    0xdead_beef_0002,
    0x0123_4567_89ab_cdef,
    0x6f9b_deae_c44f_e258,
    0x4e89_619d_bf41_e9c7,
];

/// The seeds to run: the fixed ones, or with `KVB_PROPERTY_SEEDS=n` n derived ones (for longer
/// fuzzing runs; `KVB_PROPERTY_STEPS` sets the steps per run).
fn seeds() -> Vec<u64> {
    match std::env::var("KVB_PROPERTY_SEEDS") {
        Ok(n) => {
            let n: u64 = n.parse().expect("KVB_PROPERTY_SEEDS is a number");
            (0..n).map(|i| mix(0x5eed, i)).collect()
        }
        Err(_) => SEEDS.to_vec(),
    }
}

fn steps() -> usize {
    std::env::var("KVB_PROPERTY_STEPS").map_or(STEPS, |s| s.parse().expect("a number"))
}

fn run_scenario(sc: Scenario) {
    let mut total = Coverage::default();
    for seed in seeds() {
        let c = Harness::new(sc.clone(), seed).run(steps());
        total.admitted += c.admitted;
        total.batch_admitted += c.batch_admitted;
        total.reuse_hits += c.reuse_hits;
        total.partial_hits += c.partial_hits;
        total.beam_admitted += c.beam_admitted;
        total.opted_out_admitted += c.opted_out_admitted;
        total.oob_admissions += c.oob_admissions;
        total.oob_tokens += c.oob_tokens;
        total.rewinds += c.rewinds;
        total.unsupported_rewinds += c.unsupported_rewinds;
        total.pinned += c.pinned;
        total.unpinned += c.unpinned;
        total.explicit_offloads += c.explicit_offloads;
        total.held_round_trips += c.held_round_trips;
        total.offloaded += c.offloaded;
        total.onboarded += c.onboarded;
        total.verified_reused_positions += c.verified_reused_positions;
        total.resets += c.resets;
        total.truncations += c.truncations;
        total.pinned_lookups += c.pinned_lookups;
    }
    // The generator must keep reaching the paths this test is about.
    let name = sc.name;
    eprintln!("{name}: {total:?}");
    assert!(total.admitted > 300, "{name}: {total:?}");
    assert!(total.batch_admitted > 50, "{name}: {total:?}");
    assert!(total.reuse_hits > 50, "{name}: too little reuse {total:?}");
    if sc.partial {
        assert!(
            total.partial_hits > 10,
            "{name}: too little partial reuse {total:?}"
        );
    }
    assert!(total.beam_admitted > 20, "{name}: {total:?}");
    assert!(total.opted_out_admitted > 10, "{name}: {total:?}");
    assert!(
        total.oob_admissions + total.oob_tokens > 20,
        "{name}: no capacity pressure {total:?}"
    );
    assert!(total.rewinds > 10, "{name}: {total:?}");
    assert!(total.pinned > 0 && total.unpinned > 0, "{name}: {total:?}");
    assert!(total.explicit_offloads > 10, "{name}: {total:?}");
    assert!(total.held_round_trips > 10, "{name}: {total:?}");
    assert!(
        total.resets > 0 && total.truncations > 10 && total.pinned_lookups > 10,
        "{name}: {total:?}"
    );
    assert!(
        total.offloaded > 100 && total.onboarded > 20,
        "{name}: no host traffic {total:?}"
    );
    if sc.pools != Pools::None {
        assert!(total.verified_reused_positions > 500, "{name}: {total:?}");
    }
}

fn single(name: &'static str) -> Scenario {
    Scenario {
        name,
        windows: vec![MAX_SEQ],
        primary: 28,
        secondary: 10,
        partial: true,
        copy_on_partial: true,
        pools: Pools::Host,
    }
}

#[test]
fn random_operations_single_window() {
    run_scenario(single(
        "single window, partial reuse with copies, host data",
    ));
}

#[test]
fn random_operations_without_partial_reuse() {
    run_scenario(Scenario {
        partial: false,
        ..single("single window, no partial reuse, host data")
    });
}

#[test]
fn random_operations_without_copy_on_partial_reuse() {
    run_scenario(Scenario {
        copy_on_partial: false,
        ..single("single window, partial reuse without copies, host data")
    });
}

#[test]
fn random_operations_variable_sliding_window() {
    run_scenario(Scenario {
        windows: vec![16, MAX_SEQ],
        ..single("VSWA 16 + 64, partial reuse with copies, host data")
    });
}

#[test]
fn random_operations_bookkeeping_only() {
    run_scenario(Scenario {
        windows: vec![16, MAX_SEQ],
        copy_on_partial: false,
        pools: Pools::None,
        ..single("VSWA 16 + 64, partial reuse without copies, no pool memory")
    });
}

/// The same random workload with the CUDA backend: every reuse, partial copy, offload and onboard
/// moves bytes through the batched copy kernel between GPU and pinned host pools. Skips where no
/// GPU is usable.
#[test]
fn random_operations_cuda_pools() {
    if !common::cuda_context_current() {
        eprintln!("skipped: no usable CUDA GPU (driver library, device) on this machine");
        return;
    }
    run_scenario(Scenario {
        windows: vec![16, MAX_SEQ],
        pools: Pools::Cuda,
        ..single("VSWA 16 + 64, partial reuse with copies, CUDA pools")
    });
}

//! The pool model does not touch what routers see: the same requests on a uniform model and on
//! a model configured with its layers (MLA's K-only latent, an FP8 indexer, NVFP4 with scale
//! pools) publish the same events, block hashes and parents included; only the bytes per block
//! differ.

use kvblock::events::KvCacheEvent;
use kvblock::manager::{CopyBackend, KvCacheManager, ManagerConfig, Request, WindowSpec};
use kvblock::pool_model::{CacheType, KvDataType, LayerSpec};

const TPB: usize = 4;
const WINDOW: usize = 64;

fn manager(layers: Vec<LayerSpec>) -> KvCacheManager {
    KvCacheManager::new(ManagerConfig {
        windows: vec![WindowSpec {
            window_size: WINDOW,
            primary_blocks: 8,
            secondary_blocks: 4,
            num_layers: 2,
            num_kv_heads: 2,
            size_per_head: 8,
            ..WindowSpec::default()
        }],
        tokens_per_block: TPB,
        max_sequence_length: WINDOW,
        bytes_per_element: 2,
        copy_backend: CopyBackend::HostMemory,
        manual_clock: true,
        max_kv_event_entries: 1 << 16,
        layers,
        ..ManagerConfig::default()
    })
    .expect("manager")
}

fn layer(cache_type: CacheType, heads: usize, size: usize, data_type: KvDataType) -> LayerSpec {
    LayerSpec {
        window_size: WINDOW,
        cache_type,
        num_kv_heads: heads,
        size_per_head: size,
        data_type,
    }
}

/// Stores, reuses, evicts to the host tier and onboards: every kind of tree event.
fn workload(m: &mut KvCacheManager) -> Vec<KvCacheEvent> {
    let prompts: Vec<Vec<i32>> = (0..6)
        .map(|p| (0..(9 + 3 * p)).map(|t| (p % 3) * 100 + t).collect())
        .collect();
    for (id, toks) in prompts.iter().enumerate() {
        let id = id as u64 + 1;
        let a = m.add_sequence(&Request::new(id, toks.clone())).unwrap();
        assert!(a.prepopulated_prompt_len <= toks.len());
        m.store_context_blocks(id, toks.len()).unwrap();
        m.remove_sequence(id, true).unwrap();
        m.flush_iteration_events();
    }
    m.take_flushed_events()
}

#[test]
fn events_and_hashes_are_the_same_whatever_the_pools() {
    let uniform = workload(&mut manager(Vec::new()));
    assert!(uniform.len() > 6, "the workload stores, evicts and reuses");
    let models = [
        vec![
            layer(CacheType::SelfKOnly, 1, 576, KvDataType::Bf16),
            layer(CacheType::SelfKOnly, 1, 132, KvDataType::Fp8),
        ],
        vec![
            layer(CacheType::SelfKv, 2, 16, KvDataType::Nvfp4),
            layer(CacheType::SelfKv, 4, 8, KvDataType::Fp16),
        ],
    ];
    for layers in models {
        let events = workload(&mut manager(layers.clone()));
        assert_eq!(events, uniform, "layers {layers:?}");
    }
}

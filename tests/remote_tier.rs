//! The shared remote tier in the manager, against a real Redis started by the test (and a
//! three-node Redis Cluster): a second manager (in this process, and in another process)
//! reuses the prefix the first computed and its bytes are verified; estimates equal admission;
//! bad values are refused and recomputed; a killed cluster node and a restarted server cost
//! misses, never a failure; a wrong password fails creation; every pool of a multi-pool block
//! goes and comes back. Fails, saying so, when redis-server is not installed.

#[path = "common/multi_pool.rs"]
mod multi_pool;
#[path = "common/redis_server.rs"]
mod redis_server;

use std::time::{Duration, Instant};

use kvblock::manager::{
    CopyBackend, KvCacheManager, ManagerConfig, RemoteTierConfig, Request, WindowSpec,
};
use kvblock::pool::Level;
use kvblock::remote::{Namespace, RedisConfig, RemoteLimits, RemoteStats};
use kvblock::window::RemoteWritePolicy;
use redis_server::{RedisCluster, RedisServer, PASSWORD};

const TPB: usize = 4;
const WINDOW: usize = 64;
/// 1 layer x K|V x 1 head x 4 tokens x 2 elements x 1 byte.
const ROW: usize = 16;
const MODEL: &str = "test-model-r1";

fn redis(urls: Vec<String>, cluster: bool) -> RedisConfig {
    RedisConfig {
        urls,
        cluster,
        password: Some(PASSWORD.into()),
        backoff_min: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        ..RedisConfig::default()
    }
}

fn config(r: RedisConfig, policy: RemoteWritePolicy) -> ManagerConfig {
    ManagerConfig {
        windows: vec![WindowSpec {
            window_size: WINDOW,
            primary_blocks: 8,
            secondary_blocks: 8,
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
        remote: RemoteTierConfig {
            redis: Some(r),
            model_id: MODEL.into(),
            write_policy: policy,
            limits: RemoteLimits {
                absent_ttl_ms: 0,
                ..RemoteLimits::default()
            },
            ..RemoteTierConfig::default()
        },
        ..ManagerConfig::default()
    }
}

fn manager(r: RedisConfig) -> KvCacheManager {
    KvCacheManager::new(config(r, RemoteWritePolicy::OnStore)).expect("manager")
}

fn kv_of(token: i32, field: usize) -> u8 {
    ((token.rem_euclid(97) as usize * 4 + field) % 251 + 1) as u8
}

fn row_of(m: &mut KvCacheManager, block: u32) -> *mut u8 {
    let w = m.window_mut(WINDOW).unwrap();
    let row = w.arena().row(block);
    assert_eq!(row.level, Level::Primary);
    let base = w.engine_mut().pool_base(Level::Primary, 0).unwrap();
    // SAFETY: the host backend's primary pool holds `primary` rows of ROW bytes.
    unsafe { base.add(row.index as usize * ROW) }
}

/// "Computes" a sequence's KV: each token's pattern into its primary rows
/// ([K|V][head][token][element]).
fn compute(m: &mut KvCacheManager, id: u64, tokens: &[i32], from: usize) {
    let blocks = m.cache_block_ids(id, WINDOW, 0).unwrap();
    for pos in from..tokens.len() {
        let row = row_of(m, blocks[pos / TPB]);
        let t = pos % TPB;
        for kv in 0..2 {
            for e in 0..2 {
                // SAFETY: inside the row.
                unsafe { *row.add(kv * TPB * 2 + t * 2 + e) = kv_of(tokens[pos], kv * 2 + e) };
            }
        }
    }
}

/// Checks that the first `n` tokens of a sequence hold their pattern.
fn check(m: &mut KvCacheManager, id: u64, tokens: &[i32], n: usize) {
    let blocks = m.cache_block_ids(id, WINDOW, 0).unwrap();
    for (pos, &tok) in tokens.iter().enumerate().take(n) {
        let row = row_of(m, blocks[pos / TPB]);
        let t = pos % TPB;
        for kv in 0..2 {
            for e in 0..2 {
                // SAFETY: inside the row.
                let got = unsafe { *row.add(kv * TPB * 2 + t * 2 + e) };
                assert_eq!(got, kv_of(tok, kv * 2 + e), "token {pos}");
            }
        }
    }
}

fn tokens(seed: i32, n: usize) -> Vec<i32> {
    (0..n as i32).map(|i| seed * 1000 + i).collect()
}

/// Admits, computes what was not reused, stores for reuse, releases. Returns the tokens reused.
fn serve(m: &mut KvCacheManager, id: u64, toks: &[i32]) -> usize {
    let a = m.add_sequence(&Request::new(id, toks.to_vec())).unwrap();
    let reused = a.prepopulated_prompt_len;
    check(m, id, toks, reused);
    compute(m, id, toks, reused);
    m.store_context_blocks(id, toks.len()).unwrap();
    m.remove_sequence(id, true).unwrap();
    reused
}

/// Polls until nothing is in flight (bounded: a hang fails the test).
fn settle(m: &mut KvCacheManager) -> RemoteStats {
    let start = Instant::now();
    loop {
        m.remote_poll();
        let s = m.remote_stats();
        if s.writes_queued == 0 && s.lookups_in_flight == 0 && s.fetches_in_flight == 0 {
            return s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "remote I/O hangs: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Prefetches a request until nothing of its prefix is pending; returns the fetches started.
fn prefetch_until_ready(m: &mut KvCacheManager, req: &Request) -> usize {
    let start = Instant::now();
    let mut started = 0;
    loop {
        let p = m.remote_prefetch(&[req.as_ref()]).unwrap()[0];
        started += p.started;
        if p.pending == 0 {
            return started;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "remote prefetch hangs"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The second manager's side: fetch `toks`' prefix, admit, check the bytes.
fn reuse_from_store(m: &mut KvCacheManager, id: u64, toks: &[i32]) -> usize {
    let req = Request::new(id, toks.to_vec());
    assert_eq!(
        m.estimate_batch(std::slice::from_ref(&req)).unwrap()[0].reused_blocks,
        0
    );
    prefetch_until_ready(m, &req);
    let est = m.estimate_batch(std::slice::from_ref(&req)).unwrap()[0];
    let adm = m.add_sequence(&req).unwrap();
    assert_eq!(est.reusable_tokens, adm.prepopulated_prompt_len);
    check(m, id, toks, adm.prepopulated_prompt_len);
    m.check_invariants().unwrap();
    adm.prepopulated_prompt_len
}

#[test]
fn a_second_manager_reuses_the_prefix_the_first_computed() {
    redis_server::require();
    let server = RedisServer::start();
    let mut a = manager(redis(vec![server.url()], false));
    let p = tokens(1, 17);
    assert_eq!(serve(&mut a, 1, &p), 0);
    let s = settle(&mut a);
    assert_eq!(s.writes, 4, "{s:?}");
    // Stored again (another request, same prefix): not sent twice.
    serve(&mut a, 2, &p);
    assert_eq!(settle(&mut a).writes, 4);

    let mut b = manager(redis(vec![server.url()], false));
    assert_eq!(reuse_from_store(&mut b, 10, &p), 16);
    let s = b.remote_stats();
    assert_eq!(
        (s.hits, s.verify_failures(), s.errors()),
        (4, 0, 0),
        "{s:?}"
    );
    // Its own store of those blocks finds them there (deduplicated against the store).
    b.store_context_blocks(10, 17).unwrap();
    b.remove_sequence(10, true).unwrap();
    let s = settle(&mut b);
    assert_eq!(s.writes, 0, "{s:?}");
}

#[test]
fn every_pool_of_a_block_goes_and_comes_back() {
    redis_server::require();
    let server = RedisServer::start();
    let layered = || {
        let mut c = config(redis(vec![server.url()], false), RemoteWritePolicy::OnStore);
        c.remote.model_id = "test-model-layers".into();
        c.layers = multi_pool::layers(WINDOW);
        KvCacheManager::new(c).expect("manager")
    };
    let p = tokens(7, 17);
    let mut a = layered();
    a.add_sequence(&Request::new(1, p.clone())).unwrap();
    multi_pool::write_pattern(&mut a, 1, WINDOW, &p, TPB);
    a.store_context_blocks(1, p.len()).unwrap();
    a.remove_sequence(1, true).unwrap();
    assert_eq!(settle(&mut a).writes, 4);
    let mut b = layered();
    let req = Request::new(2, p.clone());
    prefetch_until_ready(&mut b, &req);
    assert_eq!(b.add_sequence(&req).unwrap().prepopulated_prompt_len, 16);
    multi_pool::check_pattern(&mut b, 2, WINDOW, &p, TPB, 4);
    assert_eq!(b.remote_stats().verify_failures(), 0);
    b.check_invariants().unwrap();
}

/// Runs in a child process (see the test below): computes and stores a prompt.
#[test]
fn child_writer() {
    let Ok(urls) = std::env::var("KVBLOCK_REMOTE_CHILD_URL") else {
        return;
    };
    let cluster = std::env::var("KVBLOCK_REMOTE_CHILD_CLUSTER").is_ok();
    let urls = urls.split(',').map(str::to_owned).collect();
    let mut a = manager(redis(urls, cluster));
    serve(&mut a, 1, &tokens(7, 25));
    let s = settle(&mut a);
    assert_eq!(s.writes, 6, "{s:?}");
}

#[test]
fn two_processes_share_a_prefix_through_redis() {
    redis_server::require();
    let server = RedisServer::start();
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_writer", "--test-threads", "1"])
        .env("KVBLOCK_REMOTE_CHILD_URL", server.url())
        .status()
        .unwrap();
    assert!(status.success());
    let mut b = manager(redis(vec![server.url()], false));
    assert_eq!(reuse_from_store(&mut b, 1, &tokens(7, 25)), 24);
    assert_eq!(b.remote_stats().hits, 6);
}

#[test]
fn two_processes_share_a_prefix_through_a_redis_cluster() {
    redis_server::require();
    let cluster = RedisCluster::start();
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_writer", "--test-threads", "1"])
        .env("KVBLOCK_REMOTE_CHILD_URL", cluster.urls().join(","))
        .env("KVBLOCK_REMOTE_CHILD_CLUSTER", "1")
        .status()
        .unwrap();
    assert!(status.success());
    let mut b = manager(redis(cluster.urls(), true));
    assert_eq!(reuse_from_store(&mut b, 1, &tokens(7, 25)), 24);
    assert_eq!(b.remote_stats().hits, 6);
}

#[test]
fn the_on_host_evict_policy_writes_only_what_the_host_tier_evicts() {
    redis_server::require();
    let server = RedisServer::start();
    let mut a = KvCacheManager::new(config(
        redis(vec![server.url()], false),
        RemoteWritePolicy::OnHostEvict,
    ))
    .unwrap();
    let p = tokens(8, 17);
    serve(&mut a, 1, &p);
    // Stored for reuse, still on GPU: nothing written.
    assert_eq!(settle(&mut a).writes, 0);
    // Unrelated prompts push p's blocks through the host tier and out of it.
    for i in 0..8u64 {
        serve(&mut a, 10 + i, &tokens(80 + i as i32, 17));
    }
    let s = settle(&mut a);
    assert!(s.writes >= 4, "{s:?}");
    let mut b = manager(redis(vec![server.url()], false));
    assert_eq!(reuse_from_store(&mut b, 100, &p), 16);
}

#[test]
fn bad_values_in_the_store_are_refused_and_recomputed() {
    redis_server::require();
    let server = RedisServer::start();
    let mut a = manager(redis(vec![server.url()], false));
    let p = tokens(3, 17);
    serve(&mut a, 1, &p);
    settle(&mut a);
    // Overwrite the third block's value with garbage of the right length.
    let layout = a.window(WINDOW).unwrap().config().layout.clone();
    let ns = Namespace::new(MODEL, &kvblock::manager::slot_layout(WINDOW, &layout));
    let mut parent = kvblock::tier::ROOT_DIGEST;
    let mut third = parent;
    for b in 0..3 {
        let key = kvblock::key::BlockKeyRef::plain(&p[b * TPB..(b + 1) * TPB]);
        third = kvblock::tier::prefix_digest(&parent, &key);
        parent = third;
    }
    let key = String::from_utf8(ns.key(&third)).unwrap();
    let garbage = "x".repeat(ns.value_len());
    assert!(server.cli(&["SET", &key, &garbage]).is_some());

    let mut b = manager(redis(vec![server.url()], false));
    // Two blocks verify; the third is refused (counted), so the fourth cannot hang under it.
    assert_eq!(reuse_from_store(&mut b, 10, &p), 8);
    let s = b.remote_stats();
    assert_eq!(
        (s.hits, s.refused_garbage, s.fetches_discarded),
        (2, 1, 1),
        "{s:?}"
    );
    compute(&mut b, 10, &p, 8);
    b.remove_sequence(10, true).unwrap();
    b.check_invariants().unwrap();
}

#[test]
fn a_wrong_password_fails_creation_with_a_clear_error() {
    redis_server::require();
    let server = RedisServer::start();
    let mut r = redis(vec![server.url()], false);
    r.password = Some("wrong".into());
    let e = KvCacheManager::new(config(r, RemoteWritePolicy::OnStore)).unwrap_err();
    assert!(e.to_string().contains("refused the credentials"), "{e}");
    // An unreachable server is not an error at creation: its operations are counted misses.
    server.cli(&["SHUTDOWN", "NOSAVE"]);
    let mut m = manager(redis(vec![server.url()], false));
    serve(&mut m, 1, &tokens(4, 17));
    let req = Request::new(2, tokens(5, 17));
    prefetch_until_ready(&mut m, &req);
    let s = settle(&mut m);
    assert!(s.errors_unavailable > 0 && s.writes == 0, "{s:?}");
    m.check_invariants().unwrap();
}

#[test]
fn a_restarted_server_and_a_killed_cluster_node_cost_misses_not_failures() {
    redis_server::require();
    let mut cluster = RedisCluster::start();
    let mut a = manager(redis(cluster.urls()[..1].to_vec(), true));
    let prompts: Vec<Vec<i32>> = (0..6).map(|i| tokens(20 + i, 17)).collect();
    for (i, p) in prompts.iter().enumerate() {
        serve(&mut a, i as u64, p);
    }
    assert_eq!(settle(&mut a).writes, 24);
    cluster.nodes[1].kill();
    // The engine goes on: other prompts are served and stored (some writes fail, counted),
    // the first prompts are fetched as far as their blocks live on the remaining nodes.
    let mut b = manager(redis(cluster.urls()[2..].to_vec(), true));
    for i in 0..6u64 {
        serve(&mut b, 100 + i, &tokens(40 + i as i32, 17));
    }
    let mut reused = 0;
    for (i, p) in prompts.iter().enumerate() {
        reused += reuse_from_store(&mut b, 200 + i as u64, p);
        b.remove_sequence(200 + i as u64, false).unwrap();
    }
    let s = settle(&mut b);
    assert!(s.errors() > 0, "{s:?}");
    assert!(reused < 6 * 16, "some blocks lived on the killed node");
    assert_eq!(s.verify_failures(), 0);
    b.check_invariants().unwrap();

    // A standalone server restarted: misses while it is down, then reconnection.
    let mut server = RedisServer::start();
    let mut m = manager(redis(vec![server.url()], false));
    serve(&mut m, 1, &tokens(60, 17));
    assert_eq!(settle(&mut m).writes, 4);
    server.node.restart();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut id = 10;
    while m.remote_stats().writes < 8 {
        assert!(
            Instant::now() < deadline,
            "no reconnection: {:?}",
            m.remote_stats()
        );
        id += 1;
        serve(&mut m, id, &tokens(60 + id as i32, 17));
        settle(&mut m);
    }
    m.check_invariants().unwrap();
}

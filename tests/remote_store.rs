//! The remote tier's store layer against a real Redis (standalone and a three-node Redis
//! Cluster on loopback, started by the test): round trips between two tiers, deduplication,
//! every kind of bad value refused and counted, a wrong password, a server restarted, a
//! cluster node killed. Skips with a message when redis-server is not installed.

#[path = "common/redis_server.rs"]
mod redis_server;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvblock::key::BlockKeyRef;
use kvblock::remote::{
    FetchDone, Fetched, Namespace, RedisConfig, RedisStore, RemoteLimits, RemoteStore, RemoteTier,
    RemoteWorkers, StoreError, StoreItem,
};
use kvblock::tier::sealed::{prefix_digest, OwnedKey, PrefixDigest, SlotLayout, ROOT_DIGEST};
use redis_server::{RedisCluster, RedisServer, PASSWORD};

fn layout() -> SlotLayout {
    // 2 layers x K,V x 2 heads x 8 dims x 4 tokens x 2 bytes = 512-byte rows.
    SlotLayout::new(1024, 4, &[2, 2, 2, 8, 4, 2])
}

fn config(urls: Vec<String>, cluster: bool) -> RedisConfig {
    RedisConfig {
        urls,
        cluster,
        password: Some(PASSWORD.into()),
        backoff_min: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        ..RedisConfig::default()
    }
}

fn tier(store: &Arc<RedisStore>, model: &str) -> RemoteTier {
    RemoteTier::new(
        Namespace::new(model, &layout()),
        store.clone() as Arc<dyn RemoteStore>,
        Arc::new(RemoteWorkers::new(2).unwrap()),
        RemoteLimits {
            absent_ttl_ms: 0,
            ..RemoteLimits::default()
        },
    )
}

/// A chain of `n` blocks of a prompt: (digest, parent, tokens), rows derived from the tokens.
fn chain(seed: i32, n: usize) -> Vec<(PrefixDigest, PrefixDigest, Vec<i32>)> {
    let mut parent = ROOT_DIGEST;
    (0..n)
        .map(|b| {
            let toks: Vec<i32> = (0..4).map(|t| seed * 1000 + b as i32 * 4 + t).collect();
            let d = prefix_digest(&parent, &BlockKeyRef::plain(&toks));
            let out = (d, parent, toks);
            parent = d;
            out
        })
        .collect()
}

fn row_of(toks: &[i32]) -> Vec<u8> {
    (0..layout().row_bytes)
        .map(|i| (toks[i % 4] as usize * 31 + i) as u8)
        .collect()
}

fn items(c: &[(PrefixDigest, PrefixDigest, Vec<i32>)]) -> Vec<StoreItem> {
    let ns = Namespace::new("any", &layout());
    c.iter()
        .map(|(d, p, toks)| {
            let mut value = ns.new_value();
            ns.row_mut(&mut value).copy_from_slice(&row_of(toks));
            StoreItem {
                digest: *d,
                parent: *p,
                key: OwnedKey {
                    token_ids: toks.clone(),
                    ..OwnedKey::default()
                },
                value,
            }
        })
        .collect()
}

/// Harvests until nothing is in flight (a generous deadline: a hang fails the test).
fn settle(t: &mut RemoteTier) -> Vec<FetchDone> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut out = Vec::new();
    loop {
        out.extend(t.harvest());
        if !t.busy() {
            return out;
        }
        assert!(Instant::now() < deadline, "remote tier still busy: {t:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn fetch_all(t: &mut RemoteTier, c: &[(PrefixDigest, PrefixDigest, Vec<i32>)]) -> Vec<FetchDone> {
    let ds: Vec<PrefixDigest> = c.iter().map(|x| x.0).collect();
    assert!(t.fetch(&ds));
    settle(t)
}

fn check_blocks(
    t: &RemoteTier,
    got: &[FetchDone],
    c: &[(PrefixDigest, PrefixDigest, Vec<i32>)],
) -> usize {
    let mut hits = 0;
    for f in got {
        let (_, parent, toks) = c.iter().find(|x| x.0 == f.digest).expect("asked");
        if let Fetched::Block(h, v) = &f.fetched {
            assert_eq!(h.key.token_ids, *toks);
            assert_eq!(h.parent, *parent);
            assert_eq!(t.namespace().row(v), &row_of(toks)[..], "bytes differ");
            hits += 1;
        }
    }
    hits
}

#[test]
fn two_tiers_share_blocks_through_redis_and_stores_are_deduplicated() {
    redis_server::require();
    let server = RedisServer::start();
    let store = Arc::new(RedisStore::connect(config(vec![server.url()], false)).unwrap());
    let c = chain(1, 12);
    let mut writer = tier(&store, "model-a");
    for it in items(&c) {
        assert!(writer.wants(&it.digest) && writer.has_write_room());
        writer.store(vec![it]);
    }
    settle(&mut writer);
    assert_eq!(writer.stats().writes, 12);
    // Known present here: not queued again.
    assert!(!writer.wants(&c[0].0));

    // Another tier (another instance) looks the prefix up, then fetches it.
    let mut reader = tier(&store, "model-a");
    let ds: Vec<PrefixDigest> = c.iter().map(|x| x.0).collect();
    assert_eq!(reader.lookup(&ds), 12);
    settle(&mut reader);
    assert_eq!(reader.stats().lookup_hits, 12);
    let got = fetch_all(&mut reader, &c);
    assert_eq!(check_blocks(&reader, &got, &c), 12);
    let s = reader.stats();
    assert_eq!((s.fetched, s.verify_failures(), s.errors()), (12, 0, 0));
    assert!(s.fetch_p50_us > 0 && s.lookup_p99_us >= s.lookup_p50_us);

    // A third instance stores the same blocks: the store already has them, nothing is sent.
    let mut again = tier(&store, "model-a");
    again.store(items(&c));
    settle(&mut again);
    let s = again.stats();
    assert_eq!((s.writes, s.write_dedup_remote), (0, 12));

    // Another model's namespace does not see them.
    let mut other = tier(&store, "model-b");
    other.lookup(&ds);
    settle(&mut other);
    assert_eq!(other.stats().lookup_hits, 0);
}

#[test]
fn bad_values_are_refused_and_counted_never_returned() {
    redis_server::require();
    let server = RedisServer::start();
    let store = Arc::new(RedisStore::connect(config(vec![server.url()], false)).unwrap());
    let ns = Namespace::new("model-a", &layout());
    let c = chain(2, 6);
    let good: Vec<Vec<u8>> = c
        .iter()
        .map(|(_, p, toks)| ns.encode(p, &BlockKeyRef::plain(toks), &row_of(toks)).1)
        .collect();
    let other_geometry = Namespace::new("model-a", &SlotLayout::new(1024, 4, &[2, 2, 2, 8, 4, 4]));
    let (_, foreign) =
        other_geometry.encode(&c[2].1, &BlockKeyRef::plain(&c[2].2), &vec![1u8; 1024]);
    let mut same_len_foreign_ns = good[3].clone();
    let (_, other_model) = Namespace::new("model-z", &layout()).encode(
        &c[3].1,
        &BlockKeyRef::plain(&c[3].2),
        &row_of(&c[3].2),
    );
    same_len_foreign_ns.copy_from_slice(&other_model);
    let mut flipped = good[4].clone();
    *flipped.last_mut().unwrap() ^= 0x40;
    let values: Vec<Vec<u8>> = vec![
        good[0][..good[0].len() / 2].to_vec(), // truncated
        vec![0xAB; ns.value_len()],            // garbage of the right length
        foreign,                               // another geometry
        same_len_foreign_ns,                   // another model
        flipped,                               // a bit flipped in the row
        good[0].clone(),                       // another block's value under this key
    ];
    let keys: Vec<Vec<u8>> = c.iter().map(|x| ns.key(&x.0)).collect();
    let batch: Vec<(&[u8], &[u8])> = keys
        .iter()
        .zip(&values)
        .map(|(k, v)| (k.as_slice(), v.as_slice()))
        .collect();
    assert!(store.put(&batch).iter().all(Result::is_ok));
    let mut t = tier(&store, "model-a");
    // The value of another geometry is longer than any of this namespace: refused at its
    // length (oversized), before its bytes are read, and its connection dropped (the keys
    // behind it in its pipeline would fail with it), so it is fetched on its own.
    let rest: Vec<_> = [0, 1, 3, 4, 5].iter().map(|&i| c[i].clone()).collect();
    let mut got = fetch_all(&mut t, &rest);
    got.extend(fetch_all(&mut t, &c[2..3]));
    assert_eq!(got.len(), 6);
    assert!(got.iter().all(|f| matches!(f.fetched, Fetched::Miss)));
    let s = t.stats();
    assert_eq!(s.refused_length, 1, "truncated: {s:?}");
    assert_eq!(s.errors_oversized, 1, "other geometry: {s:?}");
    assert_eq!(s.refused_garbage, 1);
    assert_eq!(s.refused_namespace, 1);
    assert_eq!(s.refused_corrupt, 1);
    assert_eq!(s.refused_key, 1);
    assert_eq!(s.verify_failures(), 5);
    // A refused block is not fetched again before a new lookup finds it.
    assert_ne!(t.known(&c[0].0), kvblock::remote::Known::Present);
}

#[test]
fn a_wrong_password_is_an_error_at_creation() {
    redis_server::require();
    let server = RedisServer::start();
    let mut cfg = config(vec![server.url()], false);
    cfg.password = Some("not-the-password".into());
    let e = RedisStore::connect(cfg.clone()).unwrap_err();
    assert!(matches!(e, StoreError::Auth(_)), "{e}");
    cfg.password = None;
    let e = RedisStore::connect(cfg.clone()).unwrap_err();
    assert!(matches!(e, StoreError::Auth(_)), "{e}");
    cfg.urls = vec![format!("rediss://127.0.0.1:{}", server.node.port)];
    let e = RedisStore::connect(cfg).unwrap_err();
    assert!(e.to_string().contains("TLS"), "{e}");
    // The password in the URL works too.
    let cfg = RedisConfig {
        urls: vec![format!(
            "redis://:{PASSWORD}@127.0.0.1:{}",
            server.node.port
        )],
        ..RedisConfig::default()
    };
    let s = RedisStore::connect(cfg).unwrap();
    assert_eq!(s.exists(&[b"x".as_slice()]), vec![Ok(false)]);
    assert!(!s.describe().contains(PASSWORD));
    // An ACL user limited to the tier's keys: allowed there, refused elsewhere (counted as an
    // authorization error per key).
    assert!(server
        .cli(&["ACL", "SETUSER", "kvb", "on", ">kvb-pw", "~kvb:*", "+@all"])
        .is_some());
    let acl = |password: &str| RedisConfig {
        urls: vec![server.url()],
        username: Some("kvb".into()),
        password: Some(password.into()),
        ..RedisConfig::default()
    };
    let s = RedisStore::connect(acl("kvb-pw")).unwrap();
    assert_eq!(s.exists(&[b"kvb:v1:x".as_slice()]), vec![Ok(false)]);
    let denied = s.exists(&[b"other".as_slice()]);
    assert!(matches!(denied[0], Err(StoreError::Auth(_))), "{denied:?}");
    let e = RedisStore::connect(acl("wrong")).unwrap_err();
    assert!(matches!(e, StoreError::Auth(_)), "{e}");
}

#[test]
fn a_restarted_server_costs_misses_then_the_client_reconnects() {
    redis_server::require();
    let mut server = RedisServer::start();
    let store = Arc::new(RedisStore::connect(config(vec![server.url()], false)).unwrap());
    let mut t = tier(&store, "m");
    let c = chain(3, 4);
    t.store(items(&c));
    settle(&mut t);
    assert_eq!(t.stats().writes, 4);

    server.node.kill();
    let got = fetch_all(&mut t, &c);
    assert!(got.iter().all(|f| matches!(f.fetched, Fetched::Miss)));
    assert!(t.stats().errors_unavailable >= 4);
    // Down: stores fail (counted), nothing hangs.
    let c2 = chain(4, 4);
    t.store(items(&c2));
    settle(&mut t);
    assert_eq!(t.stats().writes, 4);

    server.node.restart();
    // The restarted server is empty: write again until the client is back (bounded backoff).
    let deadline = Instant::now() + Duration::from_secs(20);
    while t.stats().writes < 8 {
        assert!(
            Instant::now() < deadline,
            "no reconnection: {:?}",
            t.stats()
        );
        t.store(items(&c2));
        settle(&mut t);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(store.connection_stats().connects >= 2);
    let got = fetch_all(&mut t, &c2);
    assert_eq!(check_blocks(&t, &got, &c2), 4);
}

#[test]
fn a_three_node_cluster_serves_blocks_and_a_killed_node_costs_only_its_keys() {
    redis_server::require();
    let mut cluster = RedisCluster::start();
    let store = Arc::new(RedisStore::connect(config(cluster.urls()[..1].to_vec(), true)).unwrap());
    let mut t = tier(&store, "m");
    let c = chain(5, 30);
    t.store(items(&c));
    settle(&mut t);
    assert_eq!(t.stats().writes, 30, "{:?}", t.stats());
    // Another instance, through another seed node.
    let store2 =
        Arc::new(RedisStore::connect(config(cluster.urls()[1..2].to_vec(), true)).unwrap());
    let mut reader = tier(&store2, "m");
    let got = fetch_all(&mut reader, &c);
    assert_eq!(check_blocks(&reader, &got, &c), 30);
    // The keys spread over the three masters.
    for n in &cluster.nodes {
        let keys = std::process::Command::new("redis-cli")
            .args([
                "-p",
                &n.port.to_string(),
                "-a",
                PASSWORD,
                "--no-auth-warning",
                "DBSIZE",
            ])
            .output()
            .unwrap();
        let count: u64 = String::from_utf8_lossy(&keys.stdout)
            .trim()
            .parse()
            .unwrap();
        assert!(count > 0, "a master holds no block");
    }

    cluster.nodes[2].kill();
    let mut reader = tier(&store2, "m");
    let got = fetch_all(&mut reader, &c);
    let hits = check_blocks(&reader, &got, &c);
    let s = reader.stats();
    assert!(hits > 0 && hits < 30, "hits {hits}: {s:?}");
    assert_eq!(s.fetched as usize, hits);
    assert!(s.errors() > 0, "{s:?}");
    assert_eq!(s.verify_failures(), 0);
}

#[test]
fn the_write_queue_is_bounded_and_drops_are_counted() {
    redis_server::require();
    let server = RedisServer::start();
    let store = Arc::new(RedisStore::connect(config(vec![server.url()], false)).unwrap());
    let mut t = RemoteTier::new(
        Namespace::new("m", &layout()),
        store as Arc<dyn RemoteStore>,
        Arc::new(RemoteWorkers::new(1).unwrap()),
        RemoteLimits {
            max_writes_queued: 4,
            ..RemoteLimits::default()
        },
    );
    let c = chain(9, 10);
    let mut queued = 0;
    // Nothing is harvested in between: the queue only empties in a later call. Stores staged
    // for one batch take room before they are sent.
    for it in items(&c) {
        if t.wants(&it.digest) && t.has_write_room() {
            t.stage(it);
            queued += 1;
        }
    }
    t.store_staged();
    assert_eq!((queued, t.stats().write_drops), (4, 6));
    settle(&mut t);
    assert_eq!(t.stats().writes, 4);
    assert!(t.has_write_room());
}

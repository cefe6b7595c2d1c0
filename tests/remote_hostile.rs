//! The remote tier against a broken or hostile RESP server (`common/hostile_resp.rs`, on
//! 127.0.0.1, bounded in time and bytes): huge and endless bulk replies, a reply a byte at a
//! time, silence, malformed EXISTS integers, endless simple strings, a close mid-reply. Stated
//! bounds, asserted here: a connection holds at most one value of the namespace (its header
//! and row) and a 16 KiB buffer, so the bytes the reader accepts per failed reply stay within
//! that (and the process's peak memory does not grow by what the server sends); every batch a
//! worker runs resolves (hit, miss, error or timeout, counted) within `connect_timeout +
//! io_timeout` (a store batch: twice that) whatever the server does; no manager call
//! waits on the server; errors are counted by kind; and the tier serves again once the server
//! behaves. The same through the cluster client (the server answers CLUSTER SLOTS as a one-node
//! cluster). Needs no redis-server.

#[path = "common/hostile_resp.rs"]
mod hostile_resp;

use std::sync::Arc;
use std::time::{Duration, Instant};

use hostile_resp::{HostileServer, Mode};
use kvblock::key::BlockKeyRef;
use kvblock::manager::{
    CopyBackend, KvCacheManager, ManagerConfig, RemoteTierConfig, Request, WindowSpec,
};
use kvblock::remote::{
    FetchDone, Fetched, Known, Namespace, RedisConfig, RedisStore, RemoteLimits, RemoteStats,
    RemoteStore, RemoteTier, RemoteWorkers, StoreItem,
};
use kvblock::tier::sealed::{prefix_digest, OwnedKey, PrefixDigest, SlotLayout, ROOT_DIGEST};

/// The deadline of one batch in these tests.
const IO: Duration = Duration::from_millis(300);
const CONNECT: Duration = Duration::from_millis(300);
/// Generous: the bug this guards against took minutes (or never ended).
const RESOLVED_WITHIN: Duration = Duration::from_secs(5);

fn layout() -> SlotLayout {
    // 2 layers x K,V x 2 heads x 8 dims x 4 tokens x 2 bytes = 512-byte rows.
    SlotLayout::new(1024, 4, &[2, 2, 2, 8, 4, 2])
}

fn ns() -> Namespace {
    Namespace::new("hostile-model", &layout())
}

fn store(server: &HostileServer) -> Arc<RedisStore> {
    store_as(server, false)
}

/// A store speaking to `server` as a standalone server or as a (one-node) cluster.
fn store_as(server: &HostileServer, cluster: bool) -> Arc<RedisStore> {
    Arc::new(
        RedisStore::connect(RedisConfig {
            urls: vec![server.url()],
            cluster,
            connect_timeout: CONNECT,
            io_timeout: IO,
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_millis(40),
            ..RedisConfig::default()
        })
        .expect("store"),
    )
}

fn tier(store: &Arc<RedisStore>) -> RemoteTier {
    RemoteTier::new(
        ns(),
        store.clone() as Arc<dyn RemoteStore>,
        Arc::new(RemoteWorkers::new(2).unwrap()),
        RemoteLimits {
            absent_ttl_ms: 0,
            failed_ttl_ms: 0,
            refused_ttl_ms: 0,
            ..RemoteLimits::default()
        },
    )
}

/// `n` blocks of a chain, their values put in the server's store. Returns the digests.
fn blocks(server: &HostileServer, seed: i32, n: usize) -> Vec<PrefixDigest> {
    let ns = ns();
    let mut parent = ROOT_DIGEST;
    (0..n)
        .map(|b| {
            let toks: Vec<i32> = (0..4).map(|t| seed * 1000 + b as i32 * 4 + t).collect();
            let row: Vec<u8> = (0..layout().row_bytes).map(|i| (i + b) as u8).collect();
            let (d, v) = ns.encode(&parent, &BlockKeyRef::plain(&toks), &row);
            server.insert(&ns.key(&d), &v);
            parent = d;
            d
        })
        .collect()
}

/// `n` digests of blocks the server does not hold.
fn unknown(seed: i32, n: usize) -> Vec<PrefixDigest> {
    (0..n)
        .map(|b| prefix_digest(&ROOT_DIGEST, &BlockKeyRef::plain(&[seed, b as i32, 0, 0])))
        .collect()
}

/// Blocks to store under `digests` (their keys need not match: the server does not check).
fn store_items(digests: &[PrefixDigest]) -> Vec<StoreItem> {
    let ns = ns();
    digests
        .iter()
        .map(|d| StoreItem {
            digest: *d,
            parent: ROOT_DIGEST,
            key: OwnedKey {
                token_ids: vec![1, 2, 3, 4],
                ..OwnedKey::default()
            },
            value: ns.new_value(),
        })
        .collect()
}

/// Harvests until nothing is in flight; fails past `RESOLVED_WITHIN`. Returns the fetches
/// and how long they took.
fn settle(t: &mut RemoteTier) -> (Vec<FetchDone>, Duration) {
    let start = Instant::now();
    let mut out = Vec::new();
    loop {
        out.extend(t.harvest());
        if !t.busy() {
            return (out, start.elapsed());
        }
        assert!(
            start.elapsed() < RESOLVED_WITHIN,
            "not resolved within {RESOLVED_WITHIN:?}: {:?}",
            t.stats()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn hits(done: &[FetchDone]) -> usize {
    done.iter()
        .filter(|f| matches!(f.fetched, Fetched::Block(..)))
        .count()
}

/// Fetches `ds` until all come back verified (the client may be backing off at first).
fn recovers(t: &mut RemoteTier, ds: &[PrefixDigest]) {
    let start = Instant::now();
    loop {
        assert!(t.fetch(ds));
        if hits(&settle(t).0) == ds.len() {
            return;
        }
        assert!(start.elapsed() < RESOLVED_WITHIN, "no recovery");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Peak resident memory of this process, bytes.
fn peak_rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

#[test]
fn huge_and_endless_bulk_replies_are_refused_at_their_first_bytes() {
    let server = HostileServer::start(Mode::Good);
    let ds = blocks(&server, 1, 16);
    let st = store(&server);
    let mut t = tier(&st);
    let value = t.namespace().value_len() as u64;
    let peak = peak_rss();
    let modes = [
        Mode::HugeBulk,
        Mode::EndlessLength,
        Mode::EndlessBulk(value as usize),
    ];
    let mut before = t.stats();
    for mode in modes {
        server.set_mode(mode);
        let read_before = st.connection_stats().reply_bytes;
        // Each batch starts on a fresh connection: wait out the backoff of the last failure.
        std::thread::sleep(Duration::from_millis(60));
        assert!(t.fetch(&ds));
        let (done, took) = settle(&mut t);
        let s = t.stats();
        assert_eq!(hits(&done), 0, "{mode:?}");
        assert!(took < RESOLVED_WITHIN);
        // Every key failed, counted: the first reply is the bad one.
        assert_eq!(
            s.errors() - before.errors(),
            ds.len() as u64,
            "{mode:?} {s:?}"
        );
        let (oversized, protocol) = (
            s.errors_oversized - before.errors_oversized,
            s.errors_protocol - before.errors_protocol,
        );
        match mode {
            Mode::HugeBulk => assert_eq!((oversized, protocol), (ds.len() as u64, 0)),
            _ => assert_eq!((oversized, protocol), (0, ds.len() as u64), "{mode:?}"),
        }
        // The reader accepted at most one value and a buffer of what the server streamed.
        let read = st.connection_stats().reply_bytes - read_before;
        assert!(read <= value + 32 * 1024, "{mode:?}: read {read} bytes");
        before = s;
    }
    // The server offered up to a gigabyte per connection; the process kept what it accepted.
    let grew = peak_rss().saturating_sub(peak);
    assert!(grew < 64 << 20, "peak memory grew by {grew} bytes");
    assert!(st.connection_stats().drops >= modes.len() as u64);
    server.set_mode(Mode::Good);
    recovers(&mut t, &ds);
}

#[test]
fn a_reply_a_byte_at_a_time_and_silence_end_by_the_deadline() {
    let server = HostileServer::start(Mode::Good);
    let ds = blocks(&server, 2, 128);
    let st = store(&server);
    let mut t = tier(&st);
    // A byte every 200 ms: not one reply (4 bytes or more) completes within the deadline.
    for (i, mode) in [Mode::ByteByByte(200), Mode::Silent]
        .into_iter()
        .enumerate()
    {
        server.set_mode(mode);
        std::thread::sleep(Duration::from_millis(60));
        let before = t.stats();
        // One batch of 64 reads, and four more behind it on two workers.
        let start = Instant::now();
        assert!(t.fetch(&ds[..64]));
        for chunk in ds[64..].chunks(16) {
            assert!(t.fetch(chunk));
        }
        let (done, _) = settle(&mut t);
        let took = start.elapsed();
        let s = t.stats();
        assert_eq!(hits(&done), 0, "{mode:?}");
        // The bug: a reply trickling a byte per read timeout never timed out.
        assert!(took < RESOLVED_WITHIN, "{mode:?}: {took:?}");
        assert!(s.errors_timeout - before.errors_timeout >= 64, "{s:?}");
        assert_eq!(s.errors() - before.errors(), ds.len() as u64, "{s:?}");
        // Lookups and stores end by their deadlines too.
        std::thread::sleep(Duration::from_millis(60));
        let before = t.stats();
        let fresh = unknown(3 + i as i32, 8);
        t.lookup(&fresh);
        let (_, took) = settle(&mut t);
        assert!(took < CONNECT + IO + Duration::from_secs(2), "{took:?}");
        assert!(fresh.iter().all(|d| t.known(d) != Known::Present));
        assert_eq!(t.stats().errors_timeout - before.errors_timeout, 8);
        // A store batch (EXISTS, then SET): within twice the deadline, each write failed and
        // counted, none taken as written.
        std::thread::sleep(Duration::from_millis(60));
        let before = t.stats();
        t.store(store_items(&unknown(10 + i as i32, 4)));
        let (_, took) = settle(&mut t);
        assert!(
            took < 2 * (CONNECT + IO) + Duration::from_secs(2),
            "{took:?}"
        );
        let s = t.stats();
        assert_eq!((s.writes, s.errors() - before.errors()), (before.writes, 4));
    }
    server.set_mode(Mode::Good);
    recovers(&mut t, &ds);
    // And writes go through again.
    let fresh = unknown(20, 4);
    t.store(store_items(&fresh));
    settle(&mut t);
    assert_eq!(t.stats().writes, 4);
}

#[test]
fn exists_answers_other_than_0_or_1_are_errors_not_present() {
    let server = HostileServer::start(Mode::Good);
    let ds = blocks(&server, 4, 1);
    let st = store(&server);
    let mut t = tier(&st);
    let bad: [&'static [u8]; 7] = [
        b":2\r\n",
        b":-1\r\n",
        b":abc\r\n",
        b":1 \r\n",
        b"$1\r\n1\r\n",
        b"+OK\r\n",
        b"*1\r\n:1\r\n",
    ];
    for reply in bad {
        server.set_mode(Mode::BadExists(reply));
        std::thread::sleep(Duration::from_millis(60));
        let before = t.stats();
        assert_eq!(t.lookup(&ds), 1);
        settle(&mut t);
        let s = t.stats();
        assert_ne!(
            t.known(&ds[0]),
            Known::Present,
            "{reply:?} taken as present"
        );
        assert_eq!(s.lookup_hits, before.lookup_hits, "{reply:?}");
        assert_eq!(
            s.errors_protocol - before.errors_protocol,
            1,
            "{reply:?} {s:?}"
        );
    }
    // An error reply is that key's error (not present), and the connection stays usable.
    server.set_mode(Mode::BadExists(b"-ERR no\r\n"));
    std::thread::sleep(Duration::from_millis(60));
    let drops = st.connection_stats().drops;
    t.lookup(&ds);
    settle(&mut t);
    assert_ne!(t.known(&ds[0]), Known::Present);
    assert_eq!(t.stats().errors_other, 1);
    assert_eq!(st.connection_stats().drops, drops);
    server.set_mode(Mode::Good);
    let start = Instant::now();
    while t.known(&ds[0]) != Known::Present {
        assert!(start.elapsed() < RESOLVED_WITHIN, "no recovery");
        t.lookup(&ds);
        settle(&mut t);
    }
}

#[test]
fn endless_simple_strings_and_a_close_mid_reply_are_errors() {
    let server = HostileServer::start(Mode::Good);
    let ds = blocks(&server, 5, 4);
    let st = store(&server);
    let mut t = tier(&st);
    let value = t.namespace().value_len() as u64;
    server.set_mode(Mode::EndlessSimple);
    let read_before = st.connection_stats().reply_bytes;
    t.lookup(&ds);
    settle(&mut t);
    std::thread::sleep(Duration::from_millis(60));
    assert!(t.fetch(&ds));
    settle(&mut t);
    let s = t.stats();
    assert_eq!(s.errors_protocol, 2 * ds.len() as u64, "{s:?}");
    let read = st.connection_stats().reply_bytes - read_before;
    assert!(read <= 2 * 32 * 1024, "read {read} bytes of endless lines");

    server.set_mode(Mode::CloseMidReply);
    std::thread::sleep(Duration::from_millis(60));
    assert!(t.fetch(&ds));
    let (done, _) = settle(&mut t);
    assert_eq!(hits(&done), 0);
    let s2 = t.stats();
    assert_eq!(
        s2.errors_unavailable - s.errors_unavailable,
        ds.len() as u64
    );
    assert!(st.connection_stats().reply_bytes - read_before < 2 * 32 * 1024 + value);
    server.set_mode(Mode::Good);
    recovers(&mut t, &ds);
}

#[test]
fn a_cluster_is_bounded_the_same_way() {
    let server = HostileServer::start(Mode::Good);
    let ds = blocks(&server, 6, 32);
    let st = store_as(&server, true);
    let mut t = tier(&st);
    recovers(&mut t, &ds);
    let value = t.namespace().value_len() as u64;
    let peak = peak_rss();
    let modes = [
        Mode::HugeBulk,
        Mode::ByteByByte(200),
        Mode::Silent,
        Mode::EndlessSimple,
    ];
    for mode in modes {
        server.set_mode(mode);
        std::thread::sleep(Duration::from_millis(60));
        let (before, read_before) = (t.stats(), st.connection_stats().reply_bytes);
        assert!(t.fetch(&ds));
        let (done, took) = settle(&mut t);
        let s = t.stats();
        assert_eq!(hits(&done), 0, "{mode:?}");
        // One deadline for the whole batch: connecting, the slot map, every node.
        assert!(
            took < CONNECT + IO + Duration::from_secs(2),
            "{mode:?}: {took:?}"
        );
        assert_eq!(
            s.errors() - before.errors(),
            ds.len() as u64,
            "{mode:?} {s:?}"
        );
        let kind = match mode {
            Mode::HugeBulk => s.errors_oversized - before.errors_oversized,
            Mode::EndlessSimple => s.errors_protocol - before.errors_protocol,
            _ => s.errors_timeout - before.errors_timeout,
        };
        assert_eq!(kind, ds.len() as u64, "{mode:?} {s:?}");
        let read = st.connection_stats().reply_bytes - read_before;
        assert!(read <= value + 32 * 1024, "{mode:?}: read {read} bytes");
    }
    let grew = peak_rss().saturating_sub(peak);
    assert!(grew < 64 << 20, "peak memory grew by {grew} bytes");
    server.set_mode(Mode::Good);
    recovers(&mut t, &ds);
}

// The manager's side: with a silent store no call waits, the timeouts are counted, and the
// prefix is reused once the store answers.

const TPB: usize = 4;
const WINDOW: usize = 64;

fn manager(url: String, io: Duration) -> KvCacheManager {
    KvCacheManager::new(ManagerConfig {
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
            redis: Some(RedisConfig {
                urls: vec![url],
                connect_timeout: CONNECT,
                io_timeout: io,
                backoff_min: Duration::from_millis(10),
                backoff_max: Duration::from_millis(40),
                ..RedisConfig::default()
            }),
            model_id: "hostile-model".into(),
            limits: RemoteLimits {
                absent_ttl_ms: 0,
                failed_ttl_ms: 0,
                ..RemoteLimits::default()
            },
            ..RemoteTierConfig::default()
        },
        ..ManagerConfig::default()
    })
    .expect("manager")
}

fn settle_manager(m: &mut KvCacheManager) -> RemoteStats {
    let start = Instant::now();
    loop {
        m.remote_poll();
        let s = m.remote_stats();
        if s.writes_queued == 0 && s.lookups_in_flight == 0 && s.fetches_in_flight == 0 {
            return s;
        }
        assert!(start.elapsed() < RESOLVED_WITHIN, "{s:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_silent_store_blocks_no_manager_call_and_the_prefix_comes_back_later() {
    let server = HostileServer::start(Mode::Good);
    let toks: Vec<i32> = (0..17).collect();
    let mut a = manager(server.url(), IO);
    a.add_sequence(&Request::new(1, toks.clone())).unwrap();
    a.store_context_blocks(1, toks.len()).unwrap();
    a.remove_sequence(1, true).unwrap();
    assert_eq!(settle_manager(&mut a).writes, 4);

    // A deadline long enough that a call waiting on the server would show.
    let io = Duration::from_millis(1500);
    let mut b = manager(server.url(), io);
    server.set_mode(Mode::Silent);
    let req = Request::new(2, toks.clone());
    let start = Instant::now();
    let mut slowest = Duration::ZERO;
    while b.remote_stats().errors_timeout == 0 {
        assert!(start.elapsed() < RESOLVED_WITHIN, "{:?}", b.remote_stats());
        let t = Instant::now();
        b.remote_prefetch(&[req.as_ref()]).unwrap();
        b.remote_blocks_pending(&req.as_ref()).unwrap();
        b.remote_poll();
        slowest = slowest.max(t.elapsed());
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(slowest < io / 3, "a manager call took {slowest:?}");
    assert_eq!(b.remote_stats().hits, 0);

    server.set_mode(Mode::Good);
    let start = Instant::now();
    loop {
        let p = b.remote_prefetch(&[req.as_ref()]).unwrap()[0];
        if p.pending == 0 && b.remote_stats().hits == 4 {
            break;
        }
        assert!(start.elapsed() < RESOLVED_WITHIN, "{:?}", b.remote_stats());
        std::thread::sleep(Duration::from_millis(5));
    }
    let adm = b.add_sequence(&req).unwrap();
    assert_eq!(adm.prepopulated_prompt_len, 16);
}

// Through the C ABI: no call waits on a silent server, the timeouts reach
// `kvb_remote_stats_t`, and a caller built before the new counters still gets its fields.

mod c_abi {
    use super::*;
    use kvblock::ffi::handle::kvb_manager_t;
    use kvblock::ffi::manager::*;
    use kvblock::ffi::remote::*;
    use kvblock::ffi::status::kvb_status_t::{self, *};
    use kvblock::ffi::types::*;
    use std::ffi::CString;

    fn stats(h: *mut kvb_manager_t, size: usize) -> (kvb_status_t, kvb_remote_stats_t) {
        // A sentinel in every byte: what the call does not write keeps it.
        // SAFETY: a C struct of integers, 304 bytes (checked by the transmute).
        let mut s: kvb_remote_stats_t = unsafe { std::mem::transmute([0xEEu8; 304]) };
        s.struct_size = size as u32;
        let st = kvb_manager_get_remote_stats(h, &mut s);
        (st, s)
    }

    #[test]
    fn no_c_call_waits_on_a_silent_server_and_the_timeouts_are_counted() {
        assert_eq!(std::mem::size_of::<kvb_remote_stats_t>(), 304);
        let server = HostileServer::start(Mode::Silent);
        let url = CString::new(server.url()).unwrap();
        let model = CString::new("hostile-model").unwrap();
        // SAFETY: plain C structs, filled by their init functions.
        let mut r = unsafe { std::mem::zeroed::<kvb_remote_tier_config_t>() };
        assert_eq!(kvb_remote_tier_config_init(&mut r), KVB_OK);
        r.urls = url.as_ptr();
        r.model_id = model.as_ptr();
        r.io_timeout_ms = 1500;
        r.connect_timeout_ms = 300;
        r.backoff_min_ms = 10;
        r.backoff_max_ms = 40;
        let windows = [kvb_window_config_t {
            window_size: 64,
            primary_blocks: 8,
            secondary_blocks: 8,
            num_layers: 1,
            num_kv_heads: 1,
            size_per_head: 4,
            auto_host_tier: false,
        }];
        // SAFETY: plain C structs, filled by their init functions.
        let mut c = unsafe { std::mem::zeroed::<kvb_manager_config_t>() };
        assert_eq!(kvb_manager_config_init(&mut c), KVB_OK);
        c.windows = windows.as_ptr();
        c.num_windows = 1;
        c.max_sequence_length = 64;
        c.tokens_per_block = 4;
        c.remote = &r;
        let mut h = std::ptr::null_mut();
        assert_eq!(kvb_manager_create(&c, &mut h), KVB_OK);
        let toks: Vec<i32> = (0..17).collect();
        // SAFETY: as above.
        let mut req = unsafe { std::mem::zeroed::<kvb_request_t>() };
        assert_eq!(kvb_request_init(&mut req), KVB_OK);
        req.request_id = 1;
        req.tokens = toks.as_ptr();
        req.num_tokens = toks.len();
        req.input_length = toks.len() as i32;

        let full = std::mem::size_of::<kvb_remote_stats_t>();
        let start = Instant::now();
        let mut slowest = Duration::ZERO;
        loop {
            let t = Instant::now();
            let mut p = kvb_remote_prefetch_t::default();
            assert_eq!(kvb_manager_remote_prefetch(h, &req, 1, &mut p), KVB_OK);
            let mut pending = 0i64;
            assert_eq!(
                kvb_manager_remote_blocks_pending(h, &req, &mut pending),
                KVB_OK
            );
            assert_eq!(kvb_manager_remote_poll(h, std::ptr::null_mut()), KVB_OK);
            slowest = slowest.max(t.elapsed());
            let (st, s) = stats(h, full);
            assert_eq!(st, KVB_OK);
            if s.errors_timeout > 0 {
                assert_eq!(s.lookup_hits, 0);
                break;
            }
            assert!(start.elapsed() < RESOLVED_WITHIN, "{s:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            slowest < Duration::from_millis(500),
            "a C call took {slowest:?}"
        );

        // The size from before errors_protocol: its fields written, nothing past them.
        let v1 = std::mem::offset_of!(kvb_remote_stats_t, errors_protocol);
        let (st, s) = stats(h, v1);
        assert_eq!(st, KVB_OK);
        assert_eq!(s.struct_size as usize, v1);
        assert!(s.errors_timeout > 0 && s.errors_timeout != 0xEEEE_EEEE_EEEE_EEEE);
        assert_eq!(s.errors_protocol, 0xEEEE_EEEE_EEEE_EEEE);
        assert_eq!(stats(h, v1 - 8).0, KVB_STATUS_STRUCT_SIZE);
        assert_eq!(kvb_manager_destroy(h), KVB_OK);
    }
}

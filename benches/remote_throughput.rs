//! Throughput of the remote tier against the Redis it uses, on one redis-server started here
//! (loopback, password): whole blocks of 64 KiB to 4 MiB stored and fetched through kvblock's
//! remote tier (worker threads, pipelined batches, values sealed with BLAKE3 on store and
//! verified on fetch), through a plain pipelined client (the same `redis` crate, raw SET/GET,
//! no sealing or verification) and through `redis-benchmark` (SET/GET, same value size,
//! pipelining and clients). A benchmark, not a test: `cargo bench --bench remote_throughput`.
//! Fails, saying so, when redis-server is not installed (scripts/setup.sh installs it).

#[path = "../tests/common/redis_server.rs"]
mod redis_server;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvblock::key::BlockKeyRef;
use kvblock::remote::{
    Namespace, RedisConfig, RedisStore, RemoteLimits, RemoteStore, RemoteTier, RemoteWorkers,
    StoreItem,
};
use kvblock::tier::sealed::{prefix_digest, OwnedKey, PrefixDigest, SlotLayout, ROOT_DIGEST};
use redis_server::{RedisServer, PASSWORD};

const BATCH: usize = 8;
const THREADS: usize = 2;
const TOTAL_BYTES: usize = 128 << 20;
const REPEATS: usize = 3;

fn mib_s(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / d.as_secs_f64()
}

fn settle(t: &mut RemoteTier) {
    while t.busy() {
        t.harvest();
        std::thread::sleep(Duration::from_micros(200));
    }
    t.harvest();
}

/// kvblock's tier: stores then fetches `n` blocks of `row` bytes.
fn tier_run(url: &str, row: usize, n: usize) -> (f64, f64) {
    let store = Arc::new(
        RedisStore::connect(RedisConfig {
            urls: vec![url.into()],
            password: Some(PASSWORD.into()),
            io_timeout: Duration::from_secs(30),
            ..RedisConfig::default()
        })
        .unwrap(),
    );
    // One layer, K|V, one head, `row / 64` elements x 32 tokens (1 byte each).
    let layout = SlotLayout::new(1 << 20, 32, &[1, 2, 1, row / 64, 32, 1]);
    assert_eq!(layout.row_bytes, row);
    let ns = Namespace::new(&format!("bench-{row}-{}", std::process::id()), &layout);
    let mut t = RemoteTier::new(
        ns.clone(),
        store as Arc<dyn RemoteStore>,
        Arc::new(RemoteWorkers::new(THREADS).unwrap()),
        RemoteLimits {
            max_writes_queued: 4 * BATCH * THREADS,
            max_reads_in_flight: 4 * BATCH * THREADS,
            ..RemoteLimits::default()
        },
    );
    let tokens = |i: usize| vec![i as i32; 32];
    let digests: Vec<PrefixDigest> = (0..n)
        .map(|i| prefix_digest(&ROOT_DIGEST, &BlockKeyRef::plain(&tokens(i))))
        .collect();
    let data: Vec<u8> = (0..row).map(|i| (i * 7) as u8).collect();
    let start = Instant::now();
    for (ci, chunk) in digests.chunks(BATCH).enumerate() {
        while t.stats().writes_queued as usize + chunk.len() > 4 * BATCH * THREADS {
            t.harvest();
            std::thread::sleep(Duration::from_micros(50));
        }
        let items = chunk
            .iter()
            .enumerate()
            .map(|(j, d)| StoreItem {
                digest: *d,
                parent: ROOT_DIGEST,
                key: OwnedKey {
                    token_ids: tokens(ci * BATCH + j),
                    ..OwnedKey::default()
                },
                value: {
                    // What the window does: the row copied out into the value buffer.
                    let mut v = ns.new_value();
                    ns.row_mut(&mut v).copy_from_slice(&data);
                    v
                },
            })
            .collect();
        t.store(items);
        t.harvest();
    }
    settle(&mut t);
    let store_time = start.elapsed();
    let s = t.stats();
    assert_eq!(s.writes as usize, n, "{s:?}");
    let start = Instant::now();
    for chunk in digests.chunks(BATCH) {
        while !t.fetch(chunk) {
            t.harvest();
            std::thread::sleep(Duration::from_micros(50));
        }
        t.harvest();
    }
    settle(&mut t);
    let fetch_time = start.elapsed();
    let s = t.stats();
    assert_eq!(s.fetched as usize, n, "{s:?}");
    (mib_s(n * row, store_time), mib_s(n * row, fetch_time))
}

/// A plain pipelined client: `THREADS` threads, raw SET then GET pipelines of `BATCH` values.
fn plain_run(url: &str, row: usize, n: usize) -> (f64, f64) {
    let client = redis::Client::open(format!("redis://:{PASSWORD}@{}", &url[8..])).unwrap();
    let value: Vec<u8> = (0..row).map(|i| (i * 13) as u8).collect();
    let per = n / THREADS;
    let run = |get: bool| {
        let start = Instant::now();
        std::thread::scope(|s| {
            for th in 0..THREADS {
                let (client, value) = (&client, &value);
                s.spawn(move || {
                    let mut con = client.get_connection().unwrap();
                    for b in (0..per).step_by(BATCH) {
                        let mut p = redis::pipe();
                        for i in b..(b + BATCH).min(per) {
                            let key = format!("plain:{row}:{th}:{i}");
                            if get {
                                p.cmd("GET").arg(key);
                            } else {
                                p.cmd("SET").arg(key).arg(value.as_slice()).ignore();
                            }
                        }
                        if get {
                            let v: Vec<Vec<u8>> = p.query(&mut con).unwrap();
                            assert!(v.iter().all(|x| x.len() == row));
                        } else {
                            p.query::<()>(&mut con).unwrap();
                        }
                    }
                });
            }
        });
        start.elapsed()
    };
    let set = run(false);
    let get = run(true);
    (
        mib_s(per * THREADS * row, set),
        mib_s(per * THREADS * row, get),
    )
}

/// redis-benchmark SET and GET with the same value size, pipeline depth and clients.
fn redis_benchmark(port: u16, row: usize, n: usize) -> Option<(f64, f64)> {
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-a", PASSWORD])
        .args(["-t", "set,get", "-q", "--csv"])
        .args(["-d", &row.to_string(), "-n", &n.to_string()])
        .args(["-P", &BATCH.to_string(), "-c", &THREADS.to_string()])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let rps = |name: &str| -> Option<f64> {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("\"{name}\"")))?;
        line.split(',').nth(1)?.trim_matches('"').parse().ok()
    };
    let to_mib = |r: f64| r * row as f64 / (1 << 20) as f64;
    Some((to_mib(rps("SET")?), to_mib(rps("GET")?)))
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    redis_server::require();
    let server = RedisServer::start();
    server.cli(&["CONFIG", "SET", "maxmemory", "2gb"]);
    println!(
        "remote tier throughput, MiB/s ({THREADS} connections, pipelines of {BATCH} blocks, \
         {} MiB per size, best of {REPEATS})",
        TOTAL_BYTES >> 20
    );
    println!(
        "{:>9} | {:>11} {:>11} | {:>9} {:>9} | {:>11} {:>11} | {:>15} | {:>15}",
        "block",
        "kvblock put",
        "kvblock get",
        "plain SET",
        "plain GET",
        "r-bench SET",
        "r-bench GET",
        "% of plain p/g",
        "% of r-bench p/g"
    );
    for row in [64 << 10, 256 << 10, 1 << 20, 4 << 20] {
        let n = TOTAL_BYTES / row;
        // Best of REPEATS runs each, interleaved: the machine may be shared.
        let best = |a: (f64, f64), b: (f64, f64)| (a.0.max(b.0), a.1.max(b.1));
        let (mut kp, mut kg, mut pp, mut pg, mut bp, mut bg) = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
        for _ in 0..REPEATS {
            server.cli(&["FLUSHALL"]);
            (kp, kg) = best((kp, kg), tier_run(&server.url(), row, n));
            server.cli(&["FLUSHALL"]);
            (pp, pg) = best((pp, pg), plain_run(&server.url(), row, n));
            server.cli(&["FLUSHALL"]);
            let b = redis_benchmark(server.node.port, row, n).unwrap_or((0.0, 0.0));
            (bp, bg) = best((bp, bg), b);
        }
        let pct = |a: f64, b: f64| 100.0 * a / b;
        println!(
            "{:>5} KiB | {kp:>11.0} {kg:>11.0} | {pp:>9.0} {pg:>9.0} | {bp:>11.0} {bg:>11.0} | \
             {:>6.0}% {:>6.0}% | {:>6.0}% {:>6.0}%",
            row >> 10,
            pct(kp, pp),
            pct(kg, pg),
            pct(kp, bp),
            pct(kg, bg)
        );
    }
}

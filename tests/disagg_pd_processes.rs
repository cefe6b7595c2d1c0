//! Disaggregated prefill/decode between two OS processes over NIXL (UCX on 127.0.0.1): a decode
//! engine (this process) and a prefill engine (this test binary re-executed, `prefill_role`),
//! each a `KvCacheManager` over host-memory pools with a NIXL backend attached. The engines
//! exchange metadata, layouts, receive tickets and results through files in a folder the test
//! creates and removes; the KV moves only over NIXL.
//!
//! The "model" is deterministic: the KV of a position is a function of the tokens up to it, and
//! the next token a function of the KV the decode engine reads back from its own pools, so the
//! generated tokens equal the uncached model's only if every byte landed where the block table
//! points. The decode engine already caches part of the prompt (it is not sent again); a second
//! request is aborted in doubt before its bytes land, and a request admitted after it must not
//! receive those rows (the late write lands in quarantined rows only). A killed peer leaves the
//! lease quarantined or released, never reused while a transfer may still read it.
//!
//! Needs NIXL (`scripts/setup.sh`, then `source scripts/nixl_env.sh`): without it these tests
//! FAIL, unless `KVBLOCK_NIXL_OPTIONAL=1`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kvblock::disagg::nixl::{NixlBackend, NixlConfig};
use kvblock::disagg::{Layout, ReceiveTicket};
use kvblock::manager::{
    CopyBackend, KvCacheManager, ManagerConfig, Request, TransferOutcome, WindowSpec,
};
use kvblock::pool::Level;

const ROLE: &str = "KVBLOCK_PD_ROLE";
const DIR: &str = "KVBLOCK_PD_DIR";
const BOUND: Duration = Duration::from_secs(20);
const TPB: usize = 8;
const HEADS: usize = 2;
const LAYERS: usize = 2;
const HEAD_BYTES: usize = 32;
const TIMEOUT_MS: u64 = 5_000;

fn manager(blocks: usize) -> KvCacheManager {
    KvCacheManager::new(ManagerConfig {
        windows: vec![WindowSpec {
            window_size: 256,
            primary_blocks: blocks,
            secondary_blocks: 0,
            num_layers: LAYERS,
            num_kv_heads: HEADS,
            size_per_head: HEAD_BYTES,
            auto_host_tier: false,
        }],
        tokens_per_block: TPB,
        max_sequence_length: 256,
        manual_clock: true,
        copy_backend: CopyBackend::HostMemory,
        bytes_per_element: 1,
        ..ManagerConfig::default()
    })
    .expect("manager")
}

/// A manager with a NIXL agent attached, or None (skipped) when NIXL is missing and
/// KVBLOCK_NIXL_OPTIONAL=1.
fn engine(name: &str, blocks: usize) -> Option<KvCacheManager> {
    let backend = match NixlBackend::new(&NixlConfig::new(name)) {
        Ok(b) => b,
        Err(e) if std::env::var("KVBLOCK_NIXL_OPTIONAL").as_deref() == Ok("1") => {
            eprintln!("SKIPPED (KVBLOCK_NIXL_OPTIONAL=1): {e}");
            return None;
        }
        Err(e) => panic!(
            "NIXL is missing: {e}\nRun scripts/setup.sh, then `source scripts/nixl_env.sh` (or \
             set KVBLOCK_NIXL_OPTIONAL=1 to skip these tests)"
        ),
    };
    let mut m = manager(blocks);
    m.attach_transfer_backend(Box::new(backend), 0, 1, TIMEOUT_MS)
        .expect("attach");
    Some(m)
}

// ---- the model ---------------------------------------------------------------------------

/// The hash of tokens `0..=p` (what a position's KV depends on).
fn prefix_hash(tokens: &[i32], p: usize) -> u64 {
    tokens[..=p].iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &t| {
        (h ^ t as u32 as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Writes the KV of position `p` into its slot of the block row (`[layer][K|V][head][token]
/// [bytes]`).
fn write_position(row: &mut [u8], tokens: &[i32], p: usize) {
    let h = prefix_hash(tokens, p);
    let t = p % TPB;
    for slab in 0..LAYERS * 2 * HEADS {
        let at = (slab * TPB + t) * HEAD_BYTES;
        for (e, b) in row[at..at + HEAD_BYTES].iter_mut().enumerate() {
            *b = h.rotate_left((slab * 5 + e) as u32) as u8;
        }
    }
}

/// The next token from the KV of positions `0..n` as `read` returns each position's bytes.
fn next_token(n: usize, mut read: impl FnMut(usize) -> Vec<u8>) -> i32 {
    let mut acc = 0u64;
    for p in 0..n {
        for (i, &b) in read(p).iter().enumerate() {
            acc = acc.wrapping_mul(31).wrapping_add(b as u64 ^ i as u64);
        }
    }
    (acc % 1000) as i32
}

/// The row of block index `i` of sequence `id`.
fn row(m: &mut KvCacheManager, id: u64, i: usize) -> &'static mut [u8] {
    let b = m.cache_block_ids(id, 256, 0).unwrap()[i];
    let r = m.window(256).unwrap().arena().row(b);
    assert_eq!(r.level, Level::Primary);
    let (base, rb) = m.model_pool_pointer(0, Level::Primary).unwrap();
    // SAFETY: the row lies inside the manager's host pool, alive for the whole test.
    unsafe { std::slice::from_raw_parts_mut(base.add(r.index as usize * rb), rb) }
}

/// An engine computing positions `from..tokens.len()` of sequence `id` into its pools.
fn compute(m: &mut KvCacheManager, id: u64, tokens: &[i32], from: usize) {
    for p in from..tokens.len() {
        write_position(row(m, id, p / TPB), tokens, p);
    }
}

/// The bytes of position `p` of sequence `id` as attention reads them.
fn read_position(m: &mut KvCacheManager, id: u64, p: usize) -> Vec<u8> {
    let r = row(m, id, p / TPB);
    let t = p % TPB;
    (0..LAYERS * 2 * HEADS)
        .flat_map(|slab| {
            let at = (slab * TPB + t) * HEAD_BYTES;
            r[at..at + HEAD_BYTES].to_vec()
        })
        .collect()
}

/// The uncached model: `steps` greedy tokens after `prompt`.
fn oracle(prompt: &[i32], steps: usize) -> Vec<i32> {
    let mut tokens = prompt.to_vec();
    let mut out = Vec::new();
    for _ in 0..steps {
        let n = tokens.len();
        let t = next_token(n, |p| {
            let mut row = vec![0u8; LAYERS * 2 * HEADS * TPB * HEAD_BYTES];
            write_position(&mut row, &tokens, p);
            let t = p % TPB;
            (0..LAYERS * 2 * HEADS)
                .flat_map(|slab| {
                    let at = (slab * TPB + t) * HEAD_BYTES;
                    row[at..at + HEAD_BYTES].to_vec()
                })
                .collect()
        });
        out.push(t);
        tokens.push(t);
    }
    out
}

/// The decode engine's loop after the receive: `steps` tokens, each computed from the KV it
/// reads back, the new token's KV written before the next step.
fn decode(m: &mut KvCacheManager, id: u64, prompt: &[i32], steps: usize) -> Vec<i32> {
    let mut tokens = prompt.to_vec();
    let mut out = Vec::new();
    for _ in 0..steps {
        let n = tokens.len();
        let t = next_token(n, |p| read_position(m, id, p));
        out.push(t);
        tokens.push(t);
        m.add_token(id, t).unwrap();
        compute(m, id, &tokens, n);
    }
    out
}

fn prompt(seed: i32, len: usize) -> Vec<i32> {
    (0..len as i32)
        .map(|i| (seed * 7919 + i * 31) % 1000)
        .collect()
}

// ---- the control channel (files) --------------------------------------------------------

fn put(dir: &Path, name: &str, data: &[u8]) {
    let tmp = dir.join(format!("{name}.tmp"));
    std::fs::write(&tmp, data).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

fn get(dir: &Path, name: &str, mut alive: impl FnMut() -> Result<(), String>) -> Vec<u8> {
    let t = Instant::now();
    loop {
        if let Ok(d) = std::fs::read(dir.join(name)) {
            return d;
        }
        alive().unwrap_or_else(|e| panic!("waiting for {name}: {e}"));
        assert!(t.elapsed() < BOUND, "no {name} after {BOUND:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The notification `msg` from the prefill engine, bounded.
fn wait_notification(m: &mut KvCacheManager, msg: &[u8], child: &mut Child) {
    let t = Instant::now();
    loop {
        let notes = m.take_transfer_notifications().unwrap();
        if notes.iter().any(|(p, n)| p == "prefill" && n == msg) {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the prefill process ended ({status}) before notifying {msg:?}");
        }
        assert!(
            t.elapsed() < BOUND,
            "no notification {msg:?} after {BOUND:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The prefill engine's lease posted and polled to its end (bounded): its outcome.
fn send_to_end(
    m: &mut KvCacheManager,
    tokens: &[i32],
    ticket: &ReceiveTicket,
    layout: &Layout,
) -> TransferOutcome {
    let id = ticket.request_id;
    m.add_sequence(&Request::new(id, tokens.to_vec())).unwrap();
    compute(m, id, tokens, 0);
    let lease = m
        .begin_send(id, ticket.skip_tokens as usize, tokens.len())
        .unwrap();
    // The prefill engine is done with the request: the lease alone keeps its rows.
    m.remove_sequence(id, false).unwrap();
    m.post_send(lease, "decode", layout, ticket, &id.to_le_bytes())
        .unwrap();
    let t = Instant::now();
    loop {
        if let Some(&(_, outcome)) = m.poll_transfers().iter().find(|(h, _)| *h == lease) {
            return outcome;
        }
        assert!(
            t.elapsed() < BOUND,
            "lease of {id} still in flight after {BOUND:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp_dir(tag: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!("kvblock-pd-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}

fn spawn_prefill(dir: &Path, case: &str) -> Kill {
    let exe = std::env::current_exe().unwrap();
    Kill(
        Command::new(exe)
            .args(["prefill_role", "--exact", "--nocapture", "--test-threads=1"])
            .env(ROLE, case)
            .env(DIR, dir)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn the prefill process"),
    )
}

/// The prefill engine: serves the tickets the decode engine writes (`ticket1`, `ticket2`, ...
/// until `bye`), each with the prompt in `prompt<N>`; writes `sent<N>` with the outcome.
#[test]
fn prefill_role() {
    let Ok(case) = std::env::var(ROLE) else {
        return; // only as a child of the cases below
    };
    let dir = PathBuf::from(std::env::var(DIR).unwrap());
    let parent = unsafe { libc::getppid() };
    let alive = || match unsafe { libc::getppid() } == parent {
        true => Ok(()),
        false => Err("the decode process is gone".to_string()),
    };
    let mut m = engine("prefill", 64).expect("prefill: NIXL");
    put(&dir, "prefill.md", &m.transfer_metadata().unwrap());
    put(&dir, "prefill.layout", &m.export_layout().unwrap().encode());
    let peer = m.add_transfer_peer(&get(&dir, "decode.md", alive)).unwrap();
    assert_eq!(peer, "decode");
    let layout = Layout::decode(&get(&dir, "decode.layout", alive)).unwrap();
    for n in 1.. {
        let ticket = get(&dir, &format!("ticket{n}"), alive);
        if ticket == b"bye" {
            break;
        }
        let tokens: Vec<i32> = get(&dir, &format!("prompt{n}"), alive)
            .chunks(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let ticket = match ReceiveTicket::decode(&ticket) {
            Ok(t) => t,
            Err(e) => {
                put(
                    &dir,
                    &format!("sent{n}"),
                    format!("refused: {e}").as_bytes(),
                );
                continue;
            }
        };
        let outcome = send_to_end(&mut m, &tokens, &ticket, &layout);
        let s = m.transfer_stats();
        put(
            &dir,
            &format!("sent{n}"),
            format!(
                "{outcome:?} unmerged={} posted={}",
                s.descriptors_unmerged, s.descriptors_posted
            )
            .as_bytes(),
        );
        if case == "die-after-first" {
            std::process::exit(0);
        }
    }
    m.check_invariants().unwrap();
}

/// Hands a ticket and its prompt to the prefill process; waits for its report.
fn request_send(dir: &Path, n: usize, ticket: &[u8], tokens: &[i32], child: &mut Child) -> String {
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    put(dir, &format!("prompt{n}"), &bytes);
    put(dir, &format!("ticket{n}"), ticket);
    let sent = get(dir, &format!("sent{n}"), || match child.try_wait() {
        Ok(Some(s)) => Err(format!("the prefill process ended: {s}")),
        _ => Ok(()),
    });
    String::from_utf8(sent).unwrap()
}

#[test]
fn a_prefill_process_and_a_decode_process_generate_the_uncached_model_tokens() {
    let Some(mut d) = engine("decode", 64) else {
        return;
    };
    let dir = temp_dir("happy");
    let dir = &dir.0;
    put(dir, "decode.md", &d.transfer_metadata().unwrap());
    put(dir, "decode.layout", &d.export_layout().unwrap().encode());
    let mut child = spawn_prefill(dir, "serve");
    let pm = get(dir, "prefill.md", || Ok(()));
    assert_eq!(d.add_transfer_peer(&pm).unwrap(), "prefill");
    let prefill_layout = Layout::decode(&get(dir, "prefill.layout", || Ok(()))).unwrap();
    assert_eq!(
        kvblock::disagg::layout::plan(&d.export_layout().unwrap(), &prefill_layout),
        kvblock::disagg::LayoutPlan::Identical
    );

    // The decode engine already served a request sharing the prompt's first 3 blocks.
    let tokens = prompt(1, 45);
    let cached = tokens[..25].to_vec();
    d.add_sequence(&Request::new(100, cached.clone())).unwrap();
    compute(&mut d, 100, &cached, 0);
    d.store_context_blocks(100, 25).unwrap();
    d.remove_sequence(100, false).unwrap();

    // Request 1: received, then decoded.
    let admission = d
        .add_sequence_receiving(&Request::new(1, tokens.clone()))
        .unwrap();
    assert_eq!(admission.prepopulated_prompt_len, 24);
    let ticket = d.receive_ticket(1).unwrap();
    assert_eq!((ticket.skip_tokens, ticket.windows[0].rows.len()), (24, 3));
    let sent = request_send(dir, 1, &ticket.encode(), &tokens, &mut child.0);
    assert!(sent.starts_with("Done unmerged=3 "), "{sent}");
    wait_notification(&mut d, &1u64.to_le_bytes(), &mut child.0);
    d.complete_receive(1).unwrap();
    let generated = decode(&mut d, 1, &tokens, 6);
    assert_eq!(
        generated,
        oracle(&tokens, 6),
        "tokens equal to the uncached model's"
    );

    // Request 2 is aborted in doubt before its bytes land; request 3 is admitted after the
    // abort and computes its own KV; then request 2's late write lands: only in quarantine.
    let tokens2 = prompt(2, 40);
    d.add_sequence_receiving(&Request::new(2, tokens2.clone()))
        .unwrap();
    let ticket2 = d.receive_ticket(2).unwrap().encode();
    let quarantined = d.receiving_rows(2).unwrap()[0].blocks.clone();
    let hold = d
        .abort_receive(2, TransferOutcome::InDoubt)
        .unwrap()
        .expect("in doubt: quarantined");
    let tokens3 = prompt(3, 60);
    d.add_sequence(&Request::new(3, tokens3.clone())).unwrap();
    for b in d.cache_block_ids(3, 256, 0).unwrap() {
        assert!(
            !quarantined.contains(&b),
            "block {b} given out while quarantined"
        );
    }
    compute(&mut d, 3, &tokens3, 0);
    let sent = request_send(dir, 2, &ticket2, &tokens2, &mut child.0);
    assert!(sent.starts_with("Done"), "{sent}");
    wait_notification(&mut d, &2u64.to_le_bytes(), &mut child.0);
    let generated3 = decode(&mut d, 3, &tokens3, 3);
    assert_eq!(
        generated3,
        oracle(&tokens3, 3),
        "request 3's KV untouched by the late write"
    );
    d.release_quarantine(hold).unwrap();

    // Garbage instead of a ticket: refused by the prefill engine with the reason.
    let sent = request_send(dir, 3, b"KVBT\x01\0\0\0garbage", &tokens, &mut child.0);
    assert!(
        sent.starts_with("refused: invalid argument: receive ticket"),
        "{sent}"
    );

    put(dir, "ticket4", b"bye");
    let status = child.0.wait().unwrap();
    assert!(status.success(), "prefill process: {status}");
    let s = d.transfer_stats();
    assert_eq!((s.receives_completed, s.receives_aborted), (1, 1));
    assert_eq!((s.quarantined_holds, s.receiving_requests), (0, 0));
    d.check_invariants().unwrap();
}

#[test]
fn a_lease_to_a_killed_decode_process_is_never_reused_while_in_doubt() {
    // Here this process is the prefill engine and the child plays decode, killed mid-way.
    let Some(mut p) = engine("prefill", 64) else {
        return;
    };
    let dir = temp_dir("killed");
    let dir = &dir.0;
    put(dir, "prefill.md", &p.transfer_metadata().unwrap());
    let exe = std::env::current_exe().unwrap();
    let mut child = Kill(
        Command::new(exe)
            .args(["decode_role", "--exact", "--nocapture", "--test-threads=1"])
            .env(ROLE, "decode")
            .env(DIR, dir)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn the decode process"),
    );
    assert_eq!(
        p.add_transfer_peer(&get(dir, "decode.md", || Ok(())))
            .unwrap(),
        "decode"
    );
    let layout = Layout::decode(&get(dir, "decode.layout", || Ok(()))).unwrap();
    let ticket = ReceiveTicket::decode(&get(dir, "ticket1", || Ok(()))).unwrap();
    child.0.kill().unwrap();
    child.0.wait().unwrap();

    let tokens = prompt(9, 248);
    p.add_sequence(&Request::new(1, tokens.clone())).unwrap();
    let lease = p.begin_send(1, 0, tokens.len()).unwrap();
    p.remove_sequence(1, false).unwrap();
    let leased = p.hold_rows(lease).unwrap()[0].blocks.clone();
    let outcome = match p.post_send(lease, "decode", &layout, &ticket, b"1") {
        // The backend refused at once: nothing was submitted.
        Err(_) => {
            assert!(!p.settle_hold(lease, TransferOutcome::NotSubmitted).unwrap());
            TransferOutcome::NotSubmitted
        }
        Ok(_) => {
            let t = Instant::now();
            loop {
                if let Some(&(_, o)) = p.poll_transfers().iter().find(|(h, _)| *h == lease) {
                    break o;
                }
                if t.elapsed() > Duration::from_millis(200) {
                    p.advance_time(TIMEOUT_MS).unwrap();
                }
                assert!(t.elapsed() < BOUND, "no outcome after {BOUND:?}");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    };
    eprintln!("outcome of a lease to a killed peer: {outcome:?}");
    if !outcome.is_quiescent() {
        // In doubt: every other block can be handed out, never the leased ones.
        let mut id = 10;
        while p.num_free_blocks() > 0 {
            p.add_sequence(&Request::new(id, prompt(id as i32, 5)))
                .unwrap();
            for b in p.cache_block_ids(id, 256, 0).unwrap() {
                assert!(!leased.contains(&b), "block {b} reused while in doubt");
            }
            id += 1;
        }
        let (state, _) = p.hold_state(lease).unwrap();
        assert_eq!(state, kvblock::manager::HoldState::Quarantined);
    }
    p.check_invariants().unwrap();
}

/// The decode side of the killed-peer case: publishes its metadata, layout and a ticket, then
/// waits to be killed.
#[test]
fn decode_role() {
    if std::env::var(ROLE).as_deref() != Ok("decode") {
        return;
    }
    let dir = PathBuf::from(std::env::var(DIR).unwrap());
    let mut d = engine("decode", 64).expect("decode: NIXL");
    let tokens = prompt(9, 248);
    d.add_sequence_receiving(&Request::new(1, tokens)).unwrap();
    put(&dir, "decode.md", &d.transfer_metadata().unwrap());
    put(&dir, "decode.layout", &d.export_layout().unwrap().encode());
    d.add_transfer_peer(&get(&dir, "prefill.md", || Ok(())))
        .unwrap();
    put(&dir, "ticket1", &d.receive_ticket(1).unwrap().encode());
    std::thread::sleep(BOUND);
}

//! Disaggregated prefill/decode in one process: two managers (a prefill engine and a decode
//! engine) over host-memory pools, moving a request's KV through the in-process loopback
//! transfer backend. Bytes are checked where the decode side's block table points, and the
//! block lifecycle is checked where the anchors' users found it broken: blocks freed while a
//! transfer still reads them, received blocks reused before their bytes land, a failed or
//! timed-out transfer whose rows are handed to another request, a prefix received twice.

use kvblock::disagg::{Layout, LoopbackHub, ReceiveTicket};
use kvblock::error::KvError;
use kvblock::manager::{
    CopyBackend, HoldState, KvCacheManager, ManagerConfig, Request, TransferOutcome, WindowSpec,
};
use kvblock::pool::Level;

const TPB: usize = 4;
const WINDOW: usize = 64;
const TIMEOUT_MS: u64 = 1_000;

fn manager(blocks: usize, heads: usize) -> KvCacheManager {
    KvCacheManager::new(ManagerConfig {
        windows: vec![WindowSpec {
            window_size: WINDOW,
            primary_blocks: blocks,
            secondary_blocks: 0,
            num_layers: 2,
            num_kv_heads: heads,
            size_per_head: 4,
            auto_host_tier: false,
        }],
        tokens_per_block: TPB,
        max_sequence_length: WINDOW,
        manual_clock: true,
        copy_backend: CopyBackend::HostMemory,
        bytes_per_element: 1,
        max_kv_event_entries: 1 << 12,
        ..ManagerConfig::default()
    })
    .expect("manager")
}

/// The KV byte `j` of block index `i` of a prompt starting with `first` (what any engine
/// computes for those tokens: the same on both sides).
fn kv_byte(first: i32, i: usize, j: usize) -> u8 {
    (first as usize * 31 + i * 7 + j % 251) as u8 | 1
}

fn row_bytes(m: &mut KvCacheManager) -> usize {
    m.model_pool_pointer(0, Level::Primary).unwrap().1
}

/// The bytes of block index `i` of sequence `id`.
fn block_bytes(m: &mut KvCacheManager, id: u64, i: usize) -> &'static mut [u8] {
    let b = m.cache_block_ids(id, WINDOW, 0).unwrap()[i];
    let row = m.window(WINDOW).unwrap().arena().row(b);
    assert_eq!(row.level, Level::Primary);
    let (base, rb) = m.model_pool_pointer(0, Level::Primary).unwrap();
    // SAFETY: the row lies inside the manager's host pool, which outlives the test's use.
    unsafe { std::slice::from_raw_parts_mut(base.add(row.index as usize * rb), rb) }
}

/// The engine computing the prompt's KV from token `from` on.
fn compute(m: &mut KvCacheManager, id: u64, prompt: &[i32], from_block: usize) {
    for i in from_block..prompt.len().div_ceil(TPB) {
        for (j, byte) in block_bytes(m, id, i).iter_mut().enumerate() {
            *byte = kv_byte(prompt[0], i, j);
        }
    }
}

fn assert_kv(m: &mut KvCacheManager, id: u64, prompt: &[i32]) {
    for i in 0..prompt.len().div_ceil(TPB) {
        let bytes = block_bytes(m, id, i);
        for (j, &byte) in bytes.iter().enumerate() {
            assert_eq!(byte, kv_byte(prompt[0], i, j), "block {i} byte {j}");
        }
    }
}

fn prompt(first: i32, len: usize) -> Vec<i32> {
    (first..first + len as i32).collect()
}

/// A prefill engine and a decode engine on one hub, each knowing the other.
struct Pair {
    hub: LoopbackHub,
    prefill: KvCacheManager,
    decode: KvCacheManager,
    decode_layout: Layout,
}

fn pair(prefill_blocks: usize, decode_blocks: usize) -> Pair {
    pair_with(
        manager(prefill_blocks, 2),
        manager(decode_blocks, 2),
        (0, 1),
        (0, 1),
    )
}

fn pair_with(
    mut prefill: KvCacheManager,
    mut decode: KvCacheManager,
    prefill_tp: (u32, u32),
    decode_tp: (u32, u32),
) -> Pair {
    let hub = LoopbackHub::new();
    let p = Box::new(hub.agent("prefill").unwrap());
    let d = Box::new(hub.agent("decode").unwrap());
    prefill
        .attach_transfer_backend(p, prefill_tp.0, prefill_tp.1, TIMEOUT_MS)
        .unwrap();
    decode
        .attach_transfer_backend(d, decode_tp.0, decode_tp.1, TIMEOUT_MS)
        .unwrap();
    let pm = prefill.transfer_metadata().unwrap();
    let dm = decode.transfer_metadata().unwrap();
    assert_eq!(prefill.add_transfer_peer(&dm).unwrap(), "decode");
    assert_eq!(decode.add_transfer_peer(&pm).unwrap(), "prefill");
    // The layout travels as bytes, as between processes.
    let decode_layout = Layout::decode(&decode.export_layout().unwrap().encode()).unwrap();
    Pair {
        hub,
        prefill,
        decode,
        decode_layout,
    }
}

impl Pair {
    /// The prefill side runs the prompt, leases it, posts it to the decode side's ticket and
    /// removes its sequence at once. Returns the lease.
    fn send(&mut self, id: u64, prompt: &[i32]) -> kvblock::manager::HoldId {
        let ticket_bytes = self.decode.receive_ticket(id).unwrap().encode();
        let ticket = ReceiveTicket::decode(&ticket_bytes).unwrap();
        let p = &mut self.prefill;
        p.add_sequence(&Request::new(id, prompt.to_vec())).unwrap();
        compute(p, id, prompt, 0);
        let lease = p
            .begin_send(id, ticket.skip_tokens as usize, prompt.len())
            .unwrap();
        p.remove_sequence(id, true).unwrap();
        p.post_send(
            lease,
            "decode",
            &self.decode_layout,
            &ticket,
            &id.to_le_bytes(),
        )
        .unwrap();
        lease
    }
}

#[test]
fn a_prompt_computed_by_the_prefill_engine_lands_in_the_decode_engine_rows() {
    let mut s = pair(32, 32);
    let tokens = prompt(100, 22);
    let free_before = s.decode.num_free_blocks();
    s.decode
        .add_sequence_receiving(&Request::new(7, tokens.clone()))
        .unwrap();
    assert!(s.decode.is_receiving(7));
    let stats = s.decode.transfer_stats();
    assert_eq!((stats.receiving_requests, stats.receiving_blocks), (1, 6));
    assert_eq!(
        s.decode.num_free_blocks(),
        free_before - 6,
        "receiving blocks are used"
    );

    let lease = s.send(7, &tokens);
    // The sequence is gone on the prefill side; the lease still pins its six blocks.
    assert_eq!(s.prefill.transfer_stats().leased_blocks, 6);
    assert_eq!(
        s.prefill.poll_transfers(),
        vec![(lease, TransferOutcome::Done)]
    );
    let ps = s.prefill.transfer_stats();
    assert_eq!((ps.active_leases, ps.transfers_done), (0, 1));
    assert_eq!(ps.descriptors_unmerged, 6);
    assert!(ps.descriptors_posted <= ps.descriptors_unmerged);
    assert_eq!(ps.bytes_posted, 6 * row_bytes(&mut s.prefill) as u64);

    let notes = s.decode.take_transfer_notifications().unwrap();
    assert_eq!(
        notes,
        vec![("prefill".to_string(), 7u64.to_le_bytes().to_vec())]
    );
    s.decode.take_flushed_events();
    s.decode.complete_receive(7).unwrap();
    assert!(!s.decode.is_receiving(7));
    assert_kv(&mut s.decode, 7, &tokens);
    // Stored for reuse only now: another request with the prompt reuses the received blocks.
    s.decode.flush_iteration_events();
    assert!(
        !s.decode.take_flushed_events().is_empty(),
        "stored events after completion"
    );
    s.decode.add_token(7, 999).unwrap();
    let again = s
        .decode
        .add_sequence(&Request::new(8, tokens.clone()))
        .unwrap();
    assert_eq!(again.prepopulated_prompt_len, 20);
    s.decode.check_invariants().unwrap();
    s.prefill.check_invariants().unwrap();
}

#[test]
fn the_prefix_the_decode_engine_caches_is_not_sent_again() {
    let mut s = pair(32, 32);
    let tokens = prompt(300, 26);
    // The decode engine already served a request sharing the first 3 blocks (12 tokens).
    let cached = tokens[..13].to_vec();
    s.decode
        .add_sequence(&Request::new(1, cached.clone()))
        .unwrap();
    compute(&mut s.decode, 1, &cached, 0);
    s.decode.store_context_blocks(1, 13).unwrap();
    s.decode.remove_sequence(1, false).unwrap();

    let admission = s
        .decode
        .add_sequence_receiving(&Request::new(2, tokens.clone()))
        .unwrap();
    assert_eq!(admission.prepopulated_prompt_len, 12);
    let ticket = s.decode.receive_ticket(2).unwrap();
    assert_eq!(ticket.skip_tokens, 12);
    assert_eq!(ticket.windows[0].first_block_index, 3);
    assert_eq!(ticket.windows[0].rows.len(), 4, "blocks 3..7 only");
    s.send(2, &tokens);
    s.prefill.poll_transfers();
    assert_eq!(s.prefill.transfer_stats().descriptors_unmerged, 4);
    s.decode.complete_receive(2).unwrap();
    assert_kv(&mut s.decode, 2, &tokens);
}

#[test]
fn a_receiving_sequence_is_neither_published_grown_moved_nor_removed() {
    let mut s = pair(32, 32);
    let tokens = prompt(500, 10);
    s.decode
        .add_sequence_receiving(&Request::new(3, tokens.clone()))
        .unwrap();
    let refused = |r: Result<(), KvError>| assert_eq!(r, Err(KvError::SequenceReceiving(3)));
    refused(s.decode.add_token(3, 1));
    refused(s.decode.store_context_blocks(3, 8));
    refused(s.decode.remove_sequence(3, true));
    refused(s.decode.suspend(3));
    refused(s.decode.advance_history(3, 8));
    assert_eq!(s.decode.cache_block_ids(3, WINDOW, 0).unwrap().len(), 3);
    // Nothing of it is reusable while it receives.
    let other = s
        .decode
        .add_sequence(&Request::new(4, tokens.clone()))
        .unwrap();
    assert_eq!(other.prepopulated_prompt_len, 0);
    assert!(s.decode.complete_receive(4).is_err(), "4 is not receiving");
    s.decode.check_invariants().unwrap();
}

/// Every block the pool can still hand out, taken by filler requests: none of them may be one
/// of `held`.
fn fill_and_check_untouched(m: &mut KvCacheManager, held: &[u32], first_id: u64) -> Vec<u64> {
    let mut ids = Vec::new();
    let mut id = first_id;
    while m.num_free_blocks() > 0 {
        m.add_sequence(&Request::new(id, prompt(id as i32 * 1000, TPB - 1)))
            .unwrap();
        for b in m.cache_block_ids(id, WINDOW, 0).unwrap() {
            assert!(!held.contains(&b), "block {b} was handed out while held");
        }
        ids.push(id);
        id += 1;
    }
    ids
}

#[test]
fn a_timed_out_transfer_keeps_its_rows_until_it_completes() {
    let mut s = pair(16, 32);
    let tokens = prompt(700, 16);
    s.decode
        .add_sequence_receiving(&Request::new(9, tokens.clone()))
        .unwrap();
    s.hub.hold_next();
    let lease = s.send(9, &tokens);
    let leased = s.prefill.hold_rows(lease).unwrap()[0].blocks.clone();
    assert_eq!(s.prefill.poll_transfers(), vec![]);
    s.prefill.advance_time(TIMEOUT_MS).unwrap();
    assert_eq!(
        s.prefill.poll_transfers(),
        vec![(lease, TransferOutcome::TimedOut)]
    );
    assert_eq!(
        s.prefill.hold_state(lease).unwrap().0,
        HoldState::Quarantined
    );
    let st = s.prefill.transfer_stats();
    assert_eq!(
        (
            st.quarantined_holds,
            st.quarantined_blocks,
            st.transfers_timed_out
        ),
        (1, 4, 1)
    );
    // The pool is reused around the quarantined rows, never through them.
    let fillers = fill_and_check_untouched(&mut s.prefill, &leased, 100);
    for id in fillers {
        s.prefill.remove_sequence(id, false).unwrap();
    }
    // The transfer finally completes: that proves the rows quiescent and releases them.
    let xfer = s.hub.held()[0];
    s.hub.finish(xfer).unwrap();
    assert_eq!(
        s.prefill.poll_transfers(),
        vec![(lease, TransferOutcome::Done)]
    );
    let st = s.prefill.transfer_stats();
    assert_eq!((st.quarantined_holds, st.quarantines_released), (0, 1));
    assert!(s.prefill.hold_state(lease).is_err());
    s.prefill.check_invariants().unwrap();
}

#[test]
fn a_failed_transfer_is_quarantined_until_released() {
    let mut s = pair(16, 32);
    let tokens = prompt(800, 12);
    s.decode
        .add_sequence_receiving(&Request::new(5, tokens.clone()))
        .unwrap();
    s.hub.fail_next("peer went away");
    let lease = s.send(5, &tokens);
    assert_eq!(
        s.prefill.poll_transfers(),
        vec![(lease, TransferOutcome::Failed)]
    );
    let leased = s.prefill.hold_rows(lease).unwrap()[0].blocks.clone();
    let fillers = fill_and_check_untouched(&mut s.prefill, &leased, 100);
    assert_eq!(fillers.len(), 16 - 3);
    s.prefill.release_quarantine(lease).unwrap();
    assert_eq!(s.prefill.num_free_blocks(), 3);
    assert!(
        s.prefill.release_quarantine(lease).is_err(),
        "released once"
    );
    // The decode side gives the receive up in doubt: its rows are quarantined too.
    let receiving = s.decode.receiving_rows(5).unwrap()[0].blocks.clone();
    let hold = s
        .decode
        .abort_receive(5, TransferOutcome::InDoubt)
        .unwrap()
        .expect("quarantined");
    assert!(!s.decode.has_sequence(5));
    let fillers = fill_and_check_untouched(&mut s.decode, &receiving, 100);
    assert_eq!(fillers.len(), 32 - 3);
    s.decode.release_quarantine(hold).unwrap();
    assert_eq!(s.decode.num_free_blocks(), 3);
    s.decode.check_invariants().unwrap();
}

#[test]
fn an_abort_before_anything_was_posted_frees_at_once() {
    let mut s = pair(16, 16);
    let tokens = prompt(900, 9);
    s.decode
        .add_sequence_receiving(&Request::new(6, tokens.clone()))
        .unwrap();
    assert_eq!(
        s.decode
            .abort_receive(6, TransferOutcome::NotSubmitted)
            .unwrap(),
        None
    );
    assert_eq!(s.decode.num_free_blocks(), 16);
    // A lease never posted is settled as not submitted.
    s.prefill
        .add_sequence(&Request::new(6, tokens.clone()))
        .unwrap();
    let lease = s.prefill.begin_send(6, 0, 9).unwrap();
    s.prefill.remove_sequence(6, false).unwrap();
    assert_eq!(s.prefill.num_free_blocks(), 13);
    assert!(!s
        .prefill
        .settle_hold(lease, TransferOutcome::NotSubmitted)
        .unwrap());
    assert_eq!(s.prefill.num_free_blocks(), 16);
}

#[test]
fn a_layout_mismatch_is_refused_with_the_reason_and_posts_nothing() {
    // The decode engine's model has 3 heads: not the prefill engine's 2 at any TP split.
    let mut s = pair_with(manager(16, 2), manager(16, 3), (0, 1), (0, 1));
    let tokens = prompt(50, 8);
    s.decode
        .add_sequence_receiving(&Request::new(1, tokens.clone()))
        .unwrap();
    let ticket = s.decode.receive_ticket(1).unwrap();
    s.prefill
        .add_sequence(&Request::new(1, tokens.clone()))
        .unwrap();
    let lease = s.prefill.begin_send(1, 0, 8).unwrap();
    let err = s
        .prefill
        .post_send(lease, "decode", &s.decode_layout, &ticket, b"")
        .unwrap_err()
        .to_string();
    assert!(err.contains("not the same model"), "{err}");
    assert_eq!(s.prefill.transfer_stats().transfers_posted, 0);
    assert_eq!(s.prefill.hold_state(lease).unwrap().0, HoldState::Leased);
    // Garbage from the peer is refused before it is used.
    assert!(Layout::decode(b"KVBL garbage").is_err());
    assert!(ReceiveTicket::decode(&[0u8; 64]).is_err());
}

#[test]
fn a_decode_rank_of_another_tensor_parallel_size_receives_its_heads() {
    // Prefill: all 4 heads (TP 1). Decode: rank 1 of 2, heads 2 and 3.
    let mut s = pair_with(manager(16, 4), manager(16, 2), (0, 1), (1, 2));
    let tokens = prompt(60, 8);
    s.decode
        .add_sequence_receiving(&Request::new(1, tokens.clone()))
        .unwrap();
    s.send(1, &tokens);
    s.prefill.poll_transfers();
    // One descriptor per (block, layer, K|V): 2 blocks × 2 layers × 2.
    assert_eq!(s.prefill.transfer_stats().descriptors_unmerged, 8);
    s.decode.complete_receive(1).unwrap();
    // Decode row = [layer][K|V][2 heads][4 tokens][4 bytes]; prefill's has 4 heads.
    let slab = TPB * 4;
    for i in 0..2 {
        let got = block_bytes(&mut s.decode, 1, i);
        for outer in 0..4 {
            for h in 0..2 {
                for k in 0..slab {
                    let j_prefill = (outer * 4 + 2 + h) * slab + k;
                    assert_eq!(
                        got[(outer * 2 + h) * slab + k],
                        kv_byte(60, i, j_prefill),
                        "block {i} slab {outer} head {h}"
                    );
                }
            }
        }
    }
}

#[test]
fn contiguous_runs_give_a_fragmented_pool_fewer_descriptors() {
    let mut runs = Vec::new();
    for contiguous in [false, true] {
        let mut m = manager(32, 2);
        m.set_contiguous_runs(contiguous);
        // Fragment the free queue: 32 one-block requests, released even ids first.
        for id in 0..32 {
            m.add_sequence(&Request::new(id, prompt(id as i32 * 100, 3)))
                .unwrap();
        }
        for id in (0..32).step_by(2).chain((1..32).step_by(2)) {
            m.remove_sequence(id, false).unwrap();
        }
        m.add_sequence(&Request::new(99, prompt(9000, 40))).unwrap();
        let r = m.row_runs(99).unwrap()[0];
        assert_eq!(r.blocks, 10);
        runs.push(r.runs);
        m.check_invariants().unwrap();
    }
    assert!(
        runs[0] >= 5 && runs[1] <= 2,
        "runs without / with the policy: {runs:?}"
    );
}

//! The interpreter's disaggregation calls between the run's two managers: both attached to one
//! loopback hub (as a prefill and a decode engine), then receiving admissions, tickets, leases,
//! posts of valid or corrupted blobs, polls, settles, aborts, completions, quarantine releases,
//! notifications, statistics and row runs, with fuzzed ids, outcomes and capacities.

use kvblock::ffi::disagg_receive::*;
use kvblock::ffi::disagg_send::*;
use kvblock::ffi::disagg_transport::*;

use super::*;

/// The hub of one run and whether the pair is attached.
pub(super) struct Disagg {
    hub: *mut kvb_loopback_hub_t,
    attached: bool,
}

impl Default for Disagg {
    fn default() -> Self {
        let mut hub = null_mut();
        check_ok(kvb_loopback_hub_create(&mut hub));
        Disagg {
            hub,
            attached: false,
        }
    }
}

impl Drop for Disagg {
    fn drop(&mut self) {
        check_ok(kvb_loopback_hub_destroy(self.hub));
    }
}

/// A blob read with the buffer-too-small protocol (empty when the call fails).
fn blob(f: impl Fn(*mut u8, usize, *mut usize) -> kvb_status_t, what: &'static str) -> Vec<u8> {
    let mut len = 0usize;
    let st = f(null_mut(), 0, &mut len);
    check_status(st, what);
    if st != kvb_status_t::KVB_STATUS_BUFFER_TOO_SMALL {
        return Vec::new();
    }
    let mut buf = vec![0u8; len];
    let st = f(buf.as_mut_ptr(), buf.len(), &mut len);
    check_status(st, what);
    if st == kvb_status_t::KVB_OK {
        buf.truncate(len);
        buf
    } else {
        Vec::new()
    }
}

/// Flips or cuts bytes of a blob now and then (a peer sending garbage).
fn corrupt(inp: &mut Input, mut b: Vec<u8>) -> Vec<u8> {
    match inp.u8() % 8 {
        0 if !b.is_empty() => {
            let i = usize::from(inp.u8()) % b.len();
            b[i] ^= inp.u8() | 1;
        }
        1 => b.truncate(usize::from(inp.u8()) % (b.len() + 1)),
        _ => {}
    }
    b
}

/// Attaches both managers to the hub and introduces them to each other; the last call's
/// status (the first failure stops it: a manager without pool bytes cannot attach).
fn attach(d: &mut Disagg, pair: &[Managed]) -> (kvb_status_t, &'static str, usize) {
    let names: [&CStr; 2] = [c"prefill", c"decode"];
    for (i, (m, name)) in pair.iter().zip(names).enumerate() {
        let st = kvb_manager_attach_loopback(m.handle, d.hub, name.as_ptr(), 0, 1, 50);
        if st != kvb_status_t::KVB_OK {
            return (st, "attach_loopback", i);
        }
    }
    let mut last = (kvb_status_t::KVB_OK, "add_transfer_peer", 0);
    for (a, b) in [(0, 1), (1, 0)] {
        let md = blob(
            |p, c, l| kvb_manager_get_transfer_metadata(pair[b].handle, p, c, l),
            "get_transfer_metadata",
        );
        let mut name = [0 as std::ffi::c_char; 16];
        let mut len = 0usize;
        let st = kvb_manager_add_transfer_peer(
            pair[a].handle,
            md.as_ptr(),
            md.len(),
            name.as_mut_ptr(),
            name.len(),
            &mut len,
        );
        last = (st, "add_transfer_peer", a);
        if st != kvb_status_t::KVB_OK {
            return last;
        }
    }
    d.attached = true;
    last
}

/// One disaggregation call on the pair (index 0 sends, index 1 receives); the status, what
/// was called, and which manager it acted on.
pub(super) fn call(
    inp: &mut Input,
    d: &mut Disagg,
    pair: &[Managed],
) -> (kvb_status_t, &'static str, usize) {
    if !d.attached {
        return attach(d, pair);
    }
    let (p, r) = (pair[0].handle, pair[1].handle);
    let id = inp.request_id();
    let outcome = match inp.u8() % 8 {
        7 => inp.i32(),
        o => i32::from(o % 5),
    };
    let mut hold = 0u64;
    let mut flag = false;
    match inp.u8() % 12 {
        0 | 1 => {
            let req = request(inp, pair[1].tpb);
            let mut out = unsafe { std::mem::zeroed::<kvb_admission_t>() };
            (
                kvb_manager_add_sequence_receiving(r, &req.raw, &mut out),
                "add_sequence_receiving",
                1,
            )
        }
        2 => {
            let req = request(inp, pair[0].tpb);
            let st = kvb_manager_add_sequence(p, &req.raw, null_mut());
            (st, "add_sequence (sender)", 0)
        }
        3 => {
            let st = kvb_manager_begin_send(p, id, inp.i32(), inp.i32(), &mut hold);
            (st, "begin_send", 0)
        }
        4 => {
            let ticket = blob(
                |b, c, l| kvb_manager_get_receive_ticket(r, id, b, c, l),
                "ticket",
            );
            let layout = blob(
                |b, c, l| kvb_manager_export_layout(r, b, c, l),
                "export_layout",
            );
            let (ticket, layout) = (corrupt(inp, ticket), corrupt(inp, layout));
            let st = kvb_manager_post_send(
                p,
                inp.u64() % 8,
                c"decode".as_ptr(),
                layout.as_ptr(),
                layout.len(),
                ticket.as_ptr(),
                ticket.len(),
                ticket.as_ptr(),
                ticket.len().min(8),
            );
            (st, "post_send", 0)
        }
        5 => {
            let mut events = vec![unsafe { std::mem::zeroed::<kvb_transfer_event_t>() }; 4];
            let cap = usize::from(inp.u8() % 5);
            let mut n = 0usize;
            let st = kvb_manager_poll_transfers(p, events.as_mut_ptr(), cap, &mut n);
            (st, "poll_transfers", 0)
        }
        6 => {
            let m = [p, r][usize::from(inp.u8() % 2)];
            let st = kvb_manager_settle_hold(m, inp.u64() % 8, outcome, &mut flag);
            (st, "settle_hold", usize::from(m == r))
        }
        7 => {
            let m = [p, r][usize::from(inp.u8() % 2)];
            (
                kvb_manager_release_quarantine(m, inp.u64() % 8),
                "release_quarantine",
                usize::from(m == r),
            )
        }
        8 => (kvb_manager_complete_receive(r, id), "complete_receive", 1),
        9 => (
            kvb_manager_abort_receive(r, id, outcome, &mut hold),
            "abort_receive",
            1,
        ),
        10 => {
            let mut s = unsafe { std::mem::zeroed::<kvb_transfer_stats_t>() };
            s.struct_size = std::mem::size_of::<kvb_transfer_stats_t>() as u32;
            let st = kvb_manager_get_transfer_stats(p, &mut s);
            (st, "get_transfer_stats", 0)
        }
        _ => {
            let mut peer = [0 as std::ffi::c_char; 16];
            let mut msg = [0u8; 16];
            let (mut pl, mut ml) = (0usize, 0usize);
            let cap = usize::from(inp.u8() % 17);
            let st = kvb_manager_take_transfer_notification(
                r,
                peer.as_mut_ptr(),
                cap,
                &mut pl,
                msg.as_mut_ptr(),
                cap,
                &mut ml,
                &mut flag,
            );
            (st, "take_transfer_notification", 1)
        }
    }
}

//! The interpreter's event-publisher calls: publishers on loopback with fuzzed configs,
//! their statistics, and calls after destroy.

use super::*;

/// A live publisher under test and the manager it drains.
pub(super) struct Published {
    pub(super) handle: *mut kvb_event_publisher_t,
    manager: *mut kvb_manager_t,
    start_sequence: u64,
}

/// What the interpreter tracks of publishers.
#[derive(Default)]
pub(super) struct Publishers {
    pub(super) live: Vec<Published>,
    destroyed: Vec<*mut kvb_event_publisher_t>,
    creates: usize,
}

/// Loopback and refused endpoints only: nothing leaves the machine.
const ENDPOINTS: [&CStr; 9] = [
    c"tcp://127.0.0.1:*",
    c"tcp://127.0.0.1:*",
    c"tcp://127.0.0.1:70000",
    c"tcp://127.0.0.1:abc",
    c"tcp://127.0.0.1:0",
    c"tcp://127.0.0.1:-1",
    c"inproc://kvb-fuzz",
    c"udp://127.0.0.1:5557",
    c"not-an-endpoint",
];

fn endpoint_is_good(e: &CStr) -> bool {
    e == c"tcp://127.0.0.1:*"
}

/// Publisher lifecycle calls: create with a fuzzed config (bad endpoints and start sequences,
/// limits, struct sizes), stats, endpoints, destroy, a second destroy and calls after destroy.
pub(super) fn publisher_call(
    inp: &mut Input,
    managers: &[Managed],
    destroyed_managers: &[*mut kvb_manager_t],
    pubs: &mut Publishers,
) {
    let destroyed_status = kvb_status_t::KVB_STATUS_DESTROYED;
    match inp.u8() % 6 {
        0 => {
            if pubs.creates >= MAX_PUBLISHER_CREATES || pubs.live.len() >= 2 {
                return;
            }
            pubs.creates += 1;
            let target = match inp.u8() % 8 {
                0 => destroyed_managers.last().copied().unwrap_or(null_mut()),
                1 => null_mut(),
                b => managers
                    .get(usize::from(b) % managers.len().max(1))
                    .map_or(null_mut(), |m| m.handle),
            };
            let mut c = unsafe { std::mem::zeroed::<kvb_event_publisher_config_t>() };
            check_ok(kvb_event_publisher_config_init(&mut c));
            let ep = ENDPOINTS[usize::from(inp.u8()) % ENDPOINTS.len()];
            c.endpoint = if inp.u8().is_multiple_of(16) {
                null()
            } else {
                ep.as_ptr()
            };
            let replay = match inp.u8() % 4 {
                0 => Some(ENDPOINTS[usize::from(inp.u8()) % ENDPOINTS.len()]),
                1 => Some(c"tcp://127.0.0.1:*"),
                _ => None,
            };
            c.replay_endpoint = replay.map_or(null(), |r| r.as_ptr());
            c.start_sequence = match inp.u8() % 8 {
                0 => u64::MAX,
                1 => u64::MAX - 1,
                2 => 1 << 63,
                3 => (1 << 63) - 1,
                4 => inp.u64(),
                b => u64::from(b),
            };
            c.linger_ms = 0;
            let flags = inp.u8();
            if flags & 1 != 0 {
                c.window_size = inp.i32();
            }
            if flags & 2 != 0 {
                c.send_hwm = inp.i32();
            }
            if flags & 4 != 0 {
                c.replay_buffer_steps = inp.i32() % 4096;
            }
            if flags & 8 != 0 {
                c.max_queued_bytes = inp.u64();
                c.replay_peer_max_bytes = inp.u64();
            }
            if flags & 16 != 0 {
                c.replay_requests_per_second_per_peer = inp.i32();
                c.replay_requests_per_second = inp.i32();
                c.max_replay_peers = inp.i32();
            }
            if flags & 32 != 0 {
                c.max_incoming_message_bytes = inp.i32();
                c.slow_peer_timeout_ms = inp.i32();
            }
            if flags & 64 != 0 {
                c.struct_size = match inp.u8() % 3 {
                    0 => {
                        std::mem::offset_of!(kvb_event_publisher_config_t, max_queued_bytes) as u32
                    }
                    1 => 3,
                    _ => c.struct_size + 8,
                };
            }
            let mut out = null_mut();
            let st = kvb_event_publisher_create(target, &c, &mut out);
            check_status(st, "event_publisher_create");
            if st != kvb_status_t::KVB_OK {
                assert!(out.is_null(), "a failed create left a handle");
                return;
            }
            assert!(!out.is_null());
            assert!(
                c.start_sequence < 1 << 63,
                "start_sequence {:#x} was accepted",
                c.start_sequence
            );
            assert!(
                endpoint_is_good(ep) && replay.is_none_or(endpoint_is_good),
                "a bad endpoint was accepted"
            );
            assert!(
                !pubs.live.iter().any(|p| p.manager == target),
                "a second publisher on one manager was accepted"
            );
            pubs.live.push(Published {
                handle: out,
                manager: target,
                start_sequence: c.start_sequence,
            });
        }
        1 => {
            let Some(p) = pubs.live.last() else { return };
            let mut s = kvb_event_publisher_stats_t::default();
            check_ok(kvb_event_publisher_get_stats(p.handle, &mut s));
            assert!(s.next_sequence >= p.start_sequence, "{s:?}");
            assert!(s.gaps <= s.next_sequence - p.start_sequence, "{s:?}");
            let mut v = kvb_event_publisher_service_stats_t {
                struct_size: std::mem::size_of::<kvb_event_publisher_service_stats_t>() as u32,
                ..Default::default()
            };
            if inp.u8().is_multiple_of(4) {
                v.struct_size = inp.u32();
            }
            let st = kvb_event_publisher_get_service_stats(p.handle, &mut v);
            check_status(st, "event_publisher_get_service_stats");
            if st == kvb_status_t::KVB_OK {
                assert!(v.queued_bytes <= v.queued_bytes_peak || v.queued_bytes_peak == 0);
            }
        }
        2 => {
            if pubs.live.is_empty() {
                return;
            }
            let i = usize::from(inp.u8()) % pubs.live.len();
            let p = pubs.live.remove(i);
            check_ok(kvb_event_publisher_destroy(p.handle));
            pubs.destroyed.push(p.handle);
        }
        3 => {
            // A second destroy and every call after destroy: DESTROYED, never freed memory.
            let Some(&h) = pubs.destroyed.last() else {
                return;
            };
            assert_eq!(kvb_event_publisher_destroy(h), destroyed_status);
            let mut s = kvb_event_publisher_stats_t::default();
            assert_eq!(kvb_event_publisher_get_stats(h, &mut s), destroyed_status);
            let mut n = 0u64;
            assert_eq!(
                kvb_event_publisher_wait_for_subscribers(h, 1, 0, &mut n),
                destroyed_status
            );
            let mut buf = [0 as std::ffi::c_char; 16];
            let mut len = 0usize;
            assert_eq!(
                kvb_event_publisher_get_endpoint(h, inp.bool(), buf.as_mut_ptr(), 16, &mut len),
                destroyed_status
            );
            check_status(destroyed_status, "calls after publisher destroy");
        }
        4 => {
            let Some(p) = pubs.live.last() else { return };
            let cap = usize::from(inp.u8() % 64);
            let mut buf = vec![0 as std::ffi::c_char; cap];
            let mut len = 0usize;
            let ptr = if cap == 0 {
                null_mut()
            } else {
                buf.as_mut_ptr()
            };
            let st = kvb_event_publisher_get_endpoint(p.handle, inp.bool(), ptr, cap, &mut len);
            check_status(st, "event_publisher_get_endpoint");
            let mut n = 0u64;
            let timeout = match inp.u8() % 4 {
                0 => -2,
                1 => i64::MIN,
                _ => 0,
            };
            let st = kvb_event_publisher_wait_for_subscribers(p.handle, 1, timeout, &mut n);
            check_status(st, "event_publisher_wait_for_subscribers");
            assert_eq!(st == kvb_status_t::KVB_OK, timeout == 0);
        }
        _ => {
            let mut s = kvb_event_publisher_stats_t::default();
            assert_eq!(
                kvb_event_publisher_get_stats(null(), &mut s),
                kvb_status_t::KVB_STATUS_NULL_POINTER
            );
            check_ok(kvb_event_publisher_destroy(null_mut()));
            let mut out = null_mut();
            assert_eq!(
                kvb_event_publisher_create(null_mut(), null(), &mut out),
                kvb_status_t::KVB_STATUS_NULL_POINTER
            );
        }
    }
}

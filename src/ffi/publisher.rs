//! C entry points of the wire publisher (`crate::publisher`): KV events over ZeroMQ in the vLLM /
//! Dynamo format, from a thread of the library.

use std::ffi::{c_char, CStr};
use std::time::Duration;

use super::handle::{
    guard, invalid, kvb_manager_t, live_delivery, null_error, require_out, with_manager, write_out,
    FfiError, FfiResult,
};
use super::status::kvb_status_t;
use super::types::check_struct_size;
use crate::publisher::{PublishError, Publisher, PublisherConfig, PublisherStats};

/// Publisher settings. Initialise with `kvb_event_publisher_config_init`, then set `endpoint`
/// and whatever else differs from the defaults. Strings are copied by create.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvb_event_publisher_config_t {
    /// `sizeof(kvb_event_publisher_config_t)`, set by `kvb_event_publisher_config_init`.
    pub struct_size: u32,
    /// ZeroMQ endpoint the PUB socket binds, e.g. "tcp://0.0.0.0:5557" (required). A "*" port picks a
    /// free one: read it back with `kvb_event_publisher_get_endpoint`.
    pub endpoint: *const c_char,
    /// First frame of every message; null = "" (vLLM's default).
    pub topic: *const c_char,
    /// Data-parallel rank carried by every batch (nil when `has_dp_rank` is false).
    pub has_dp_rank: bool,
    /// The data-parallel rank, read when `has_dp_rank` is true (default 0).
    pub dp_rank: i32,
    /// Send high-water mark in messages per subscriber (default 100000, 0 = unlimited).
    pub send_hwm: i32,
    /// Endpoint of the replay ROUTER socket; null = no replay (default).
    pub replay_endpoint: *const c_char,
    /// Batches kept for replay (default 10000).
    pub replay_buffer_steps: i32,
    /// Sequence number of the first batch (default 0). Routers ignore batches at or below the
    /// last sequence number they applied: a restarted publisher should start above it, or set
    /// `all_blocks_cleared_first`.
    pub start_sequence: u64,
    /// Publish a lone AllBlocksCleared as the first batch (default false).
    pub all_blocks_cleared_first: bool,
    /// The window published; 0 (default) = the largest (full attention) window.
    pub window_size: i32,
    /// How long destroy lets queued messages leave, in ms (default 1000).
    pub linger_ms: i32,
}

/// Counters of a publisher (`kvb_event_publisher_get_stats`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kvb_event_publisher_stats_t {
    /// Batches published.
    pub batches: u64,
    /// Events in those batches (BlockStored, BlockRemoved, AllBlocksCleared).
    pub events: u64,
    /// Events the manager's buffer dropped before the publisher took them.
    pub dropped_events: u64,
    /// Sequence numbers skipped to show those drops to routers.
    pub gaps: u64,
    /// Subscriptions received (each joining subscriber sends at least one).
    pub subscriptions: u64,
    /// Replay requests answered.
    pub replay_requests: u64,
    /// Sequence number of the next batch.
    pub next_sequence: u64,
}

impl From<PublisherStats> for kvb_event_publisher_stats_t {
    fn from(s: PublisherStats) -> Self {
        kvb_event_publisher_stats_t {
            batches: s.batches,
            events: s.events,
            dropped_events: s.dropped_events,
            gaps: s.gaps,
            subscriptions: s.subscriptions,
            replay_requests: s.replay_requests,
            next_sequence: s.next_sequence,
        }
    }
}

/// Opaque publisher handle. Create with `kvb_event_publisher_create`, free with
/// `kvb_event_publisher_destroy`.
pub struct kvb_event_publisher_t {
    inner: Publisher,
}

impl From<PublishError> for FfiError {
    fn from(e: PublishError) -> Self {
        match e {
            PublishError::Config(m) => invalid(m),
            PublishError::Transport(m) => FfiError(kvb_status_t::KVB_STATUS_TRANSPORT, m),
        }
    }
}

fn config_default() -> kvb_event_publisher_config_t {
    kvb_event_publisher_config_t {
        struct_size: std::mem::size_of::<kvb_event_publisher_config_t>() as u32,
        endpoint: std::ptr::null(),
        topic: std::ptr::null(),
        has_dp_rank: false,
        dp_rank: 0,
        send_hwm: 100_000,
        replay_endpoint: std::ptr::null(),
        replay_buffer_steps: 10_000,
        start_sequence: 0,
        all_blocks_cleared_first: false,
        window_size: 0,
        linger_ms: 1000,
    }
}

fn str_arg(p: *const c_char, what: &str) -> FfiResult<Option<String>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: a NUL-terminated string supplied by the caller for the call's duration.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map(|s| Some(s.to_string()))
        .map_err(|_| invalid(format!("{what} is not UTF-8")))
}

fn publisher_ref<'a>(p: *const kvb_event_publisher_t) -> FfiResult<&'a Publisher> {
    // SAFETY: a handle from kvb_event_publisher_create, not yet destroyed (caller contract).
    unsafe { p.as_ref() }
        .map(|p| &p.inner)
        .ok_or_else(|| null_error("publisher"))
}

/// Fills `config` with the defaults (vLLM's: empty topic, HWM 100000, no replay, 10000 replay
/// steps, sequence from 0, largest window, linger 1 s) and sets `struct_size`.
#[no_mangle]
pub extern "C" fn kvb_event_publisher_config_init(
    config: *mut kvb_event_publisher_config_t,
) -> kvb_status_t {
    guard(|| write_out(config, config_default(), "config"))
}

/// Starts publishing a manager's KV events over ZeroMQ (vLLM / Dynamo wire format): binds the
/// sockets (a bind error is returned here, `KVB_STATUS_TRANSPORT`) and starts a thread that
/// drains the manager's flushed events and sends one batch per flushed iteration. The engine
/// thread never waits on the network. The manager must have events on
/// (`max_kv_event_entries` > 0); while the publisher runs it is the only consumer of the
/// manager's events (do not call `kvb_manager_get_latest_events` too). Only the chosen window's
/// full blocks are published; a trailing partial block is withheld, with its removal. When the
/// manager's buffer drops events, one sequence number is skipped so that routers see a gap.
/// `*out` receives a handle to free with `kvb_event_publisher_destroy` (null on failure). The
/// publisher may outlive the manager (it then publishes nothing more).
#[no_mangle]
pub extern "C" fn kvb_event_publisher_create(
    manager: *mut kvb_manager_t,
    config: *const kvb_event_publisher_config_t,
    out: *mut *mut kvb_event_publisher_t,
) -> kvb_status_t {
    guard(|| {
        require_out(out, "out")?;
        write_out(out, std::ptr::null_mut(), "out")?;
        // SAFETY: a config from the caller, checked for null.
        let c = unsafe { config.as_ref() }.ok_or_else(|| null_error("config"))?;
        check_struct_size(
            c.struct_size,
            std::mem::size_of::<kvb_event_publisher_config_t>(),
            "kvb_event_publisher_config_t",
        )?;
        let endpoint =
            str_arg(c.endpoint, "endpoint")?.ok_or_else(|| null_error("config.endpoint"))?;
        let topic = str_arg(c.topic, "topic")?.unwrap_or_default();
        let replay_endpoint = str_arg(c.replay_endpoint, "replay_endpoint")?;
        let replay_buffer_steps = usize::try_from(c.replay_buffer_steps).map_err(|_| {
            invalid(format!(
                "replay_buffer_steps is negative ({})",
                c.replay_buffer_steps
            ))
        })?;
        let window = usize::try_from(c.window_size)
            .map_err(|_| invalid(format!("window_size is negative ({})", c.window_size)))?;
        let mut shape = (0, 0);
        let st = with_manager(manager, |m| {
            if m.config().max_kv_event_entries == 0 {
                return Err(invalid(
                    "the manager has events off (max_kv_event_entries is 0)".into(),
                ));
            }
            let windows = m.window_sizes();
            let w = match window {
                0 => windows.iter().copied().max().unwrap_or(0),
                w if windows.contains(&w) => w,
                w => {
                    return Err(invalid(format!(
                        "window_size {w} is not a window of the manager ({windows:?})"
                    )))
                }
            };
            shape = (w, m.tokens_per_block());
            Ok(())
        });
        if st != kvb_status_t::KVB_OK {
            let message = super::status::last_error_string();
            return Err(FfiError(st, message));
        }
        let delivery = live_delivery(manager)?;
        let cfg = PublisherConfig {
            endpoint,
            topic: topic.into_bytes(),
            dp_rank: c.has_dp_rank.then_some(c.dp_rank),
            send_hwm: c.send_hwm,
            replay_endpoint,
            replay_buffer_steps,
            start_sequence: c.start_sequence,
            all_blocks_cleared_first: c.all_blocks_cleared_first,
            window_size: shape.0,
            tokens_per_block: shape.1,
            linger_ms: c.linger_ms,
        };
        let inner = Publisher::start(delivery, cfg)?;
        let handle = Box::into_raw(Box::new(kvb_event_publisher_t { inner }));
        write_out(out, handle, "out")
    })
}

/// Waits until at least `min_subscriptions` subscriptions have reached the publisher since it
/// was created, or `timeout_ms` passed (-1 = no limit); writes the number received to
/// `*out_subscriptions`. Returns `KVB_OK` either way: compare the count. Use it before the first
/// iteration so that a subscriber that joins slowly does not miss the first batches.
#[no_mangle]
pub extern "C" fn kvb_event_publisher_wait_for_subscribers(
    publisher: *const kvb_event_publisher_t,
    min_subscriptions: u64,
    timeout_ms: i64,
    out_subscriptions: *mut u64,
) -> kvb_status_t {
    guard(|| {
        require_out(out_subscriptions, "out_subscriptions")?;
        let timeout = match timeout_ms {
            -1 => Duration::MAX,
            t => Duration::from_millis(
                u64::try_from(t)
                    .map_err(|_| invalid(format!("timeout_ms must be -1 or non-negative ({t})")))?,
            ),
        };
        let n = publisher_ref(publisher)?.wait_for_subscribers(min_subscriptions, timeout);
        write_out(out_subscriptions, n, "out_subscriptions")
    })
}

/// The publisher's counters.
#[no_mangle]
pub extern "C" fn kvb_event_publisher_get_stats(
    publisher: *const kvb_event_publisher_t,
    out: *mut kvb_event_publisher_stats_t,
) -> kvb_status_t {
    guard(|| {
        require_out(out, "out")?;
        let stats = publisher_ref(publisher)?.stats();
        write_out(out, stats.into(), "out")
    })
}

/// Copies the bound endpoint of the PUB socket (`replay` false) or of the replay socket
/// (`replay` true), NUL-terminated, into `buf` of `buf_size` bytes; `*out_len` receives its
/// length without the NUL. `KVB_STATUS_BUFFER_TOO_SMALL` when it does not fit;
/// `KVB_STATUS_INVALID_ARGUMENT` for the replay endpoint of a publisher without replay.
#[no_mangle]
pub extern "C" fn kvb_event_publisher_get_endpoint(
    publisher: *const kvb_event_publisher_t,
    replay: bool,
    buf: *mut c_char,
    buf_size: usize,
    out_len: *mut usize,
) -> kvb_status_t {
    guard(|| {
        require_out(out_len, "out_len")?;
        let p = publisher_ref(publisher)?;
        let ep = if replay {
            p.replay_endpoint()
                .ok_or_else(|| invalid("the publisher has no replay endpoint".into()))?
        } else {
            p.endpoint()
        };
        write_out(out_len, ep.len(), "out_len")?;
        if ep.len() >= buf_size {
            return Err(crate::error::KvError::BufferTooSmall {
                needed: ep.len() + 1,
                given: buf_size,
            }
            .into());
        }
        let dst = super::handle::slice_arg_mut(buf.cast::<u8>(), ep.len() + 1, "buf")?;
        dst[..ep.len()].copy_from_slice(ep.as_bytes());
        dst[ep.len()] = 0;
        Ok(())
    })
}

/// Publishes what the manager flushed before this call, stops the thread and joins it (waiting
/// up to `linger_ms` for queued messages to leave), then frees the handle. Null is accepted.
#[no_mangle]
pub extern "C" fn kvb_event_publisher_destroy(
    publisher: *mut kvb_event_publisher_t,
) -> kvb_status_t {
    guard(|| {
        if !publisher.is_null() {
            // SAFETY: a handle from kvb_event_publisher_create, destroyed once (caller contract).
            drop(unsafe { Box::from_raw(publisher) });
        }
        Ok(())
    })
}

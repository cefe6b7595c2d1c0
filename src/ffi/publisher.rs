//! C entry points of the wire publisher (`crate::publisher`): KV events over ZeroMQ in the vLLM /
//! Dynamo format, from a thread of the library.

use std::ffi::{c_char, CStr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::handle::{
    guard, invalid, kvb_manager_t, live_delivery, null_error, require_out, with_manager, write_out,
    FfiError, FfiResult,
};
use super::status::kvb_status_t;
use super::types::{check_struct_size, init_sized};
use crate::publisher::{defaults, PublishError, Publisher, PublisherConfig, PublisherStats};

/// Publisher settings. Initialise with `kvb_event_publisher_config_init`, then set `endpoint`
/// and whatever else differs from the defaults. Strings are copied by create.
///
/// Endpoints: `tcp://HOST:PORT` (PORT a decimal 1-65535, or `*` for a free port) or
/// `ipc://PATH`. Other transports, `inproc://` (the publisher's ZeroMQ context is private) and
/// a malformed, non-numeric or out-of-range port are refused with `KVB_STATUS_TRANSPORT` before
/// anything binds.
///
/// The publisher is a network service and bounds what a peer can make it hold: the fields from
/// `max_queued_bytes` on. A caller built against the older, shorter struct (its `struct_size`
/// ends before `max_queued_bytes`) gets their defaults.
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
    /// `all_blocks_cleared_first`. Must be below 2^63 (`KVB_STATUS_INVALID_ARGUMENT`
    /// otherwise), so that sequence numbers never reach the replay end marker
    /// (0xffffffffffffffff) nor wrap.
    pub start_sequence: u64,
    /// Publish a lone AllBlocksCleared as the first batch (default false).
    pub all_blocks_cleared_first: bool,
    /// The window published; 0 (default) = the largest (full attention) window.
    pub window_size: i32,
    /// How long destroy lets queued messages leave, in ms (default 1000).
    pub linger_ms: i32,
    /// Payload bytes queued in ZeroMQ on both sockets together (default 64 MiB, > 0). A live
    /// batch that does not fit is not sent (subscribers see a gap and can replay it; counted in
    /// `live_batches_unsent`); replays may use at most half. A lone batch larger than a limit is
    /// still sent, alone.
    pub max_queued_bytes: u64,
    /// Replay payload bytes queued for one peer (default 4 MiB, > 0): its replay goes on as
    /// ZeroMQ sends what is queued. ZeroMQ also queues at most 1000 replay messages per peer.
    pub replay_peer_max_bytes: u64,
    /// Replay requests accepted per second from one peer, burst one second's worth (default
    /// 10, > 0). Refused requests get no answer.
    pub replay_requests_per_second_per_peer: i32,
    /// Replay requests accepted per second from all peers (default 100, > 0).
    pub replay_requests_per_second: i32,
    /// Replay peers tracked at once (default 64, > 0); one replay per peer at a time.
    pub max_replay_peers: i32,
    /// Largest incoming frame on either socket, in bytes (`ZMQ_MAXMSGSIZE`; default 256, at
    /// least 16 and the topic's length + 16): a larger frame disconnects its peer.
    pub max_incoming_message_bytes: i32,
    /// A replay that can queue nothing for this long is dropped, and a peer that answers no
    /// ZMTP heartbeat (sent every second) for this long is disconnected, in ms (default 10000,
    /// > 0).
    pub slow_peer_timeout_ms: i32,
    /// Also publish the disk tier's events (default false): a block written to disk as a
    /// BlockStored, a disk slot evicted or dropped as a BlockRemoved, both with `medium`
    /// "DISK" (the name Dynamo's indexer gives its disk tier; the reuse tree's events carry
    /// "GPU"). Off by default because a router that ignores `medium` would take them for GPU
    /// blocks, and a disk removal for the removal of the GPU copy. It sits in what was the
    /// struct's tail padding, so the size did not change: a caller built against the previous
    /// header gets the false `kvb_event_publisher_config_init` wrote there.
    pub publish_disk_events: bool,
}

/// `struct_size` of the first version of `kvb_event_publisher_config_t` (up to `linger_ms`).
const CONFIG_V1_SIZE: usize = std::mem::offset_of!(kvb_event_publisher_config_t, max_queued_bytes);

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
    /// Subscribers connected now: open connections on the PUB socket, never more than the
    /// subscribe messages received (a peer that repeats subscriptions counts once).
    pub subscriptions: u64,
    /// Replay requests accepted.
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
            subscriptions: s.subscribers,
            replay_requests: s.replay_requests,
            next_sequence: s.next_sequence,
        }
    }
}

/// What a publisher holds and refuses as a network service (`kvb_event_publisher_get_service_stats`).
/// Set `struct_size` to `sizeof(kvb_event_publisher_service_stats_t)` before the call.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kvb_event_publisher_service_stats_t {
    /// `sizeof(kvb_event_publisher_service_stats_t)`, set by the caller.
    pub struct_size: u32,
    /// Payload bytes queued in ZeroMQ now, both sockets (at most `max_queued_bytes`, or one
    /// larger batch).
    pub queued_bytes: u64,
    /// The most payload bytes queued at once since create.
    pub queued_bytes_peak: u64,
    /// Of `queued_bytes`, those of replays.
    pub replay_queued_bytes: u64,
    /// Live batches not sent because `max_queued_bytes` was reached (kept for replay).
    pub live_batches_unsent: u64,
    /// Subscription messages received on the PUB socket (repeats included).
    pub subscription_messages: u64,
    /// Replay requests refused: over a rate limit, from a peer whose replay runs, or from a new
    /// peer beyond `max_replay_peers`.
    pub replay_requests_refused: u64,
    /// Replay requests that were not `[empty, 8-byte start]` or `[8-byte start]`.
    pub malformed_requests: u64,
    /// Replays sent up to their end marker.
    pub replays_completed: u64,
    /// Replays in progress.
    pub active_replays: u64,
    /// Replays dropped because their peer took nothing for `slow_peer_timeout_ms`.
    pub slow_peers_dropped: u64,
    /// Replays ended because their peer disconnected.
    pub replay_peers_gone: u64,
}

impl From<PublisherStats> for kvb_event_publisher_service_stats_t {
    fn from(s: PublisherStats) -> Self {
        kvb_event_publisher_service_stats_t {
            struct_size: std::mem::size_of::<Self>() as u32,
            queued_bytes: s.queued_bytes,
            queued_bytes_peak: s.queued_bytes_peak,
            replay_queued_bytes: s.replay_queued_bytes,
            live_batches_unsent: s.live_batches_unsent,
            subscription_messages: s.subscription_messages,
            replay_requests_refused: s.replay_requests_refused,
            malformed_requests: s.malformed_requests,
            replays_completed: s.replays_completed,
            active_replays: s.active_replays,
            slow_peers_dropped: s.slow_peers_dropped,
            replay_peers_gone: s.replay_peers_gone,
        }
    }
}

/// Opaque publisher handle. Create with `kvb_event_publisher_create`, free with
/// `kvb_event_publisher_destroy`. Like a manager handle, a destroyed handle keeps a small shell,
/// so that a second destroy or any later call returns `KVB_STATUS_DESTROYED`.
pub struct kvb_event_publisher_t {
    /// `None` once destroyed. Calls take a reference and release the lock before they work, so
    /// that a waiting call does not hold up destroy (which wakes it).
    state: Mutex<Option<Arc<Publisher>>>,
}

/// Destroyed publisher handles keep their shell here, still reachable (as `handle::GRAVEYARD`
/// does for managers).
static GRAVEYARD: Mutex<Vec<usize>> = Mutex::new(Vec::new());

impl From<PublishError> for FfiError {
    fn from(e: PublishError) -> Self {
        match e {
            PublishError::Config(m) => invalid(m),
            PublishError::Transport(m) => FfiError(kvb_status_t::KVB_STATUS_TRANSPORT, m),
            PublishError::Busy(m) => FfiError(kvb_status_t::KVB_STATUS_UNSUPPORTED, m),
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
        max_queued_bytes: defaults::MAX_QUEUED_BYTES as u64,
        replay_peer_max_bytes: defaults::REPLAY_PEER_MAX_BYTES as u64,
        replay_requests_per_second_per_peer: defaults::REPLAY_REQUESTS_PER_SECOND_PER_PEER as i32,
        replay_requests_per_second: defaults::REPLAY_REQUESTS_PER_SECOND as i32,
        max_replay_peers: defaults::MAX_REPLAY_PEERS as i32,
        max_incoming_message_bytes: defaults::MAX_INCOMING_MESSAGE_BYTES as i32,
        slow_peer_timeout_ms: defaults::SLOW_PEER_TIMEOUT_MS,
        publish_disk_events: false,
    }
}

/// Reads the caller's config: the whole struct, or the first version's prefix (then the later
/// fields keep their defaults).
fn read_config(
    config: *const kvb_event_publisher_config_t,
) -> FfiResult<kvb_event_publisher_config_t> {
    if config.is_null() {
        return Err(null_error("config"));
    }
    // SAFETY: every version of the struct starts with `struct_size`.
    let size = unsafe { config.cast::<u32>().read_unaligned() } as usize;
    let full = std::mem::size_of::<kvb_event_publisher_config_t>();
    if size == CONFIG_V1_SIZE {
        let mut c = config_default();
        // SAFETY: the caller's struct has `size` readable bytes, a prefix of this layout;
        // every field of that prefix is plain data or a pointer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                config.cast::<u8>(),
                (&mut c as *mut kvb_event_publisher_config_t).cast::<u8>(),
                size,
            )
        };
        c.struct_size = full as u32;
        return Ok(c);
    }
    check_struct_size(size as u32, full, "kvb_event_publisher_config_t")?;
    // SAFETY: a full-size config from the caller.
    Ok(unsafe { config.read() })
}

fn positive_i32(v: i32, what: &str) -> FfiResult<u32> {
    u32::try_from(v)
        .ok()
        .filter(|&v| v > 0)
        .ok_or_else(|| invalid(format!("{what} must be positive (got {v})")))
}

fn positive_u64(v: u64, what: &str) -> FfiResult<usize> {
    usize::try_from(v).ok().filter(|&v| v > 0).ok_or_else(|| {
        invalid(format!(
            "{what} must be positive and fit in size_t (got {v})"
        ))
    })
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

/// The live publisher behind a handle (a reference: the handle's lock is released on return).
fn publisher_ref(p: *const kvb_event_publisher_t) -> FfiResult<Arc<Publisher>> {
    // SAFETY: a handle from kvb_event_publisher_create (or null, checked here); destroyed
    // handles stay allocated (GRAVEYARD).
    let handle = unsafe { p.as_ref() }.ok_or_else(|| null_error("publisher"))?;
    let state = handle.state.lock().unwrap_or_else(|p| p.into_inner());
    state.clone().ok_or_else(|| {
        FfiError(
            kvb_status_t::KVB_STATUS_DESTROYED,
            "the publisher was destroyed".into(),
        )
    })
}

/// Fills `config` with the defaults (vLLM's: empty topic, HWM 100000, no replay, 10000 replay
/// steps, sequence from 0, largest window, linger 1 s; the service limits: 64 MiB queued in
/// total, 4 MiB per replay peer, 10 replay requests/s per peer and 100/s in total, 64 replay
/// peers, 256-byte incoming frames, 10 s slow-peer timeout) and sets `struct_size`.
#[no_mangle]
pub extern "C" fn kvb_event_publisher_config_init(
    config: *mut kvb_event_publisher_config_t,
) -> kvb_status_t {
    guard(|| write_out(config, config_default(), "config"))
}

/// `kvb_event_publisher_config_init` of a struct of the caller's `size` (its `sizeof`, which the
/// header's `kvb_event_publisher_config_init` macro passes): writes nothing past it, so a program
/// built against the first, shorter layout is served too. `KVB_STATUS_STRUCT_SIZE` for a size
/// that is no layout of this struct.
#[no_mangle]
pub extern "C" fn kvb_event_publisher_config_init_sized(
    config: *mut kvb_event_publisher_config_t,
    size: usize,
) -> kvb_status_t {
    guard(|| {
        init_sized(
            config,
            size,
            &[
                CONFIG_V1_SIZE,
                std::mem::size_of::<kvb_event_publisher_config_t>(),
            ],
            "config",
            config_default(),
        )
    })
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
///
/// Fails with `KVB_STATUS_UNSUPPORTED` when the manager already has a publisher (two would
/// split one event stream, each gap-free, so routers could not see the loss; destroy the first
/// one), `KVB_STATUS_INVALID_ARGUMENT` for a setting out of range (`start_sequence` at or above
/// 2^63, a non-positive limit, an unknown window), `KVB_STATUS_TRANSPORT` for a refused endpoint
/// or a failed bind, `KVB_STATUS_STRUCT_SIZE`, `KVB_STATUS_NULL_POINTER`, and
/// `KVB_STATUS_DESTROYED` / `KVB_STATUS_POISONED` for such a manager. Nothing changes on
/// failure.
#[no_mangle]
pub extern "C" fn kvb_event_publisher_create(
    manager: *mut kvb_manager_t,
    config: *const kvb_event_publisher_config_t,
    out: *mut *mut kvb_event_publisher_t,
) -> kvb_status_t {
    guard(|| {
        require_out(out, "out")?;
        write_out(out, std::ptr::null_mut(), "out")?;
        let c = &read_config(config)?;
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
            max_queued_bytes: positive_u64(c.max_queued_bytes, "max_queued_bytes")?,
            replay_peer_max_bytes: positive_u64(c.replay_peer_max_bytes, "replay_peer_max_bytes")?,
            replay_requests_per_second_per_peer: positive_i32(
                c.replay_requests_per_second_per_peer,
                "replay_requests_per_second_per_peer",
            )?,
            replay_requests_per_second: positive_i32(
                c.replay_requests_per_second,
                "replay_requests_per_second",
            )?,
            max_replay_peers: positive_i32(c.max_replay_peers, "max_replay_peers")? as usize,
            max_incoming_message_bytes: i64::from(c.max_incoming_message_bytes),
            slow_peer_timeout_ms: c.slow_peer_timeout_ms,
            publish_disk_events: c.publish_disk_events,
        };
        let inner = Arc::new(Publisher::start(delivery, cfg)?);
        let handle = Box::into_raw(Box::new(kvb_event_publisher_t {
            state: Mutex::new(Some(inner)),
        }));
        write_out(out, handle, "out")
    })
}

/// Waits until at least `min_subscriptions` subscribers are connected (`subscriptions` of the
/// stats: connections that subscribed, each counted once however many subscription messages it
/// sends), or `timeout_ms` passed (-1 = no limit), or the publisher is destroyed by another
/// thread; writes the number connected to `*out_subscriptions`. Returns `KVB_OK` either way:
/// compare the count. Use it before the first iteration so that a subscriber that joins slowly
/// does not miss the first batches. `KVB_STATUS_DESTROYED` after destroy.
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

/// The publisher's counters. `KVB_STATUS_DESTROYED` after destroy.
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
/// `KVB_STATUS_INVALID_ARGUMENT` for the replay endpoint of a publisher without replay;
/// `KVB_STATUS_DESTROYED` after destroy.
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

/// What the publisher holds and refuses as a network service: queued bytes, refused and
/// malformed replay requests, dropped slow peers. Set `out->struct_size` to
/// `sizeof(kvb_event_publisher_service_stats_t)` first (`KVB_STATUS_STRUCT_SIZE` otherwise).
/// `KVB_STATUS_DESTROYED` after destroy.
#[no_mangle]
pub extern "C" fn kvb_event_publisher_get_service_stats(
    publisher: *const kvb_event_publisher_t,
    out: *mut kvb_event_publisher_service_stats_t,
) -> kvb_status_t {
    guard(|| {
        require_out(out, "out")?;
        // SAFETY: a non-null out-pointer from the caller; struct_size comes first.
        let size = unsafe { out.cast::<u32>().read_unaligned() };
        check_struct_size(
            size,
            std::mem::size_of::<kvb_event_publisher_service_stats_t>(),
            "kvb_event_publisher_service_stats_t",
        )?;
        let stats = publisher_ref(publisher)?.stats();
        write_out(out, stats.into(), "out")
    })
}

/// Publishes what the manager flushed before this call, stops the threads and joins them
/// (waiting up to `linger_ms` for queued messages to leave), and frees the publisher; the
/// manager may then get a new one. Null is accepted. The handle keeps a small shell: a second
/// destroy, or any call after it, returns `KVB_STATUS_DESTROYED` (never a double free).
#[no_mangle]
pub extern "C" fn kvb_event_publisher_destroy(
    publisher: *mut kvb_event_publisher_t,
) -> kvb_status_t {
    guard(|| {
        // SAFETY: a handle from kvb_event_publisher_create; shells are never freed.
        let Some(handle) = (unsafe { publisher.as_ref() }) else {
            return Ok(());
        };
        let taken = handle
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let Some(p) = taken else {
            return Err(FfiError(
                kvb_status_t::KVB_STATUS_DESTROYED,
                "the publisher was already destroyed".into(),
            ));
        };
        // Waiting calls hold references: stop and join now, free when the last one returns.
        p.shutdown();
        drop(p);
        GRAVEYARD
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(publisher as usize);
        Ok(())
    })
}

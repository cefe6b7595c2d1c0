//! The opaque manager handle, the panic guard and argument helpers shared by all entry points.

use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, Once};

use super::status::{clear_last_error, fail, kvb_status_t, status_of};
use crate::error::KvError;
use crate::events::EventDelivery;
use crate::manager::KvCacheManager;

enum HandleState {
    Live(Box<KvCacheManager>),
    /// A call panicked; the manager is kept only so `destroy` can free it.
    Poisoned(#[allow(dead_code)] Box<KvCacheManager>),
    Destroyed,
}

/// Opaque handle to a KV-cache manager. Create with `kvb_manager_create`, free with
/// `kvb_manager_destroy`. Calls on one handle are serialized by an internal lock.
pub struct kvb_manager_t {
    state: Mutex<HandleState>,
    /// Shared with the manager; drained without taking the manager's lock.
    delivery: Arc<EventDelivery>,
}

/// Destroyed handles keep their (small) shell here, still reachable, so that a call through a
/// destroyed handle returns `KVB_STATUS_DESTROYED` instead of touching freed memory.
static GRAVEYARD: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// Error of an FFI call: a status and its message.
pub(crate) struct FfiError(pub kvb_status_t, pub String);

impl From<KvError> for FfiError {
    fn from(e: KvError) -> Self {
        FfiError(status_of(&e), e.to_string())
    }
}

pub(crate) type FfiResult<T = ()> = Result<T, FfiError>;

pub(crate) fn null_error(what: &str) -> FfiError {
    FfiError(
        kvb_status_t::KVB_STATUS_NULL_POINTER,
        format!("{what} is null"),
    )
}

pub(crate) fn invalid(message: String) -> FfiError {
    FfiError(kvb_status_t::KVB_STATUS_INVALID_ARGUMENT, message)
}

thread_local! {
    /// Depth of kvblock entry points on this thread: a panic inside one is caught and reported
    /// through the status, so the panic hook stays quiet for it.
    static CALL_DEPTH: Cell<u32> = const { Cell::new(0) };
    /// What the last caught panic said (message and location), for the last-error message.
    static PANIC_MESSAGE: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Installs, once per process, a panic hook that keeps panics inside kvblock calls off the
/// host's stderr (they become `KVB_STATUS_INTERNAL` with the message and location in
/// `kvb_last_error_message`) and hands every other panic to the hook that was there before.
fn install_quiet_panic_hook() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if CALL_DEPTH.with(Cell::get) > 0 {
                let payload = info
                    .payload()
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| info.payload().downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                let location = info
                    .location()
                    .map(|l| format!(" at {}:{}", l.file(), l.line()))
                    .unwrap_or_default();
                PANIC_MESSAGE.with(|m| *m.borrow_mut() = format!("{payload}{location}"));
            } else {
                previous(info);
            }
        }));
    });
}

/// The message of the panic just caught on this thread.
fn caught_panic_message() -> String {
    PANIC_MESSAGE.with(|m| std::mem::take(&mut *m.borrow_mut()))
}

/// Marks the thread as inside a kvblock entry point while alive.
struct InCall;

impl InCall {
    fn enter() -> Self {
        CALL_DEPTH.with(|d| d.set(d.get() + 1));
        InCall
    }
}

impl Drop for InCall {
    fn drop(&mut self) {
        CALL_DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// Runs `f`, turning errors and panics into a status (and the thread's last-error message).
/// A panic prints nothing on the host's stderr.
pub(crate) fn guard(f: impl FnOnce() -> FfiResult) -> kvb_status_t {
    clear_last_error();
    install_quiet_panic_hook();
    let _in_call = InCall::enter();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => kvb_status_t::KVB_OK,
        Ok(Err(FfiError(status, message))) => fail(status, &message),
        Err(_) => fail(
            kvb_status_t::KVB_STATUS_INTERNAL,
            &format!("internal error (panic caught: {})", caught_panic_message()),
        ),
    }
}

/// Runs `f` on the live manager behind `mgr` under its lock. A panic inside poisons the handle.
pub(crate) fn with_manager(
    mgr: *const kvb_manager_t,
    f: impl FnOnce(&mut KvCacheManager) -> FfiResult,
) -> kvb_status_t {
    guard(|| {
        // SAFETY: the caller passes a handle from kvb_manager_create (or null, checked here);
        // destroyed handles stay allocated (GRAVEYARD).
        let handle = unsafe { mgr.as_ref() }.ok_or_else(|| null_error("manager"))?;
        let mut state = handle.state.lock().unwrap_or_else(|p| p.into_inner());
        match &mut *state {
            HandleState::Live(m) => match catch_unwind(AssertUnwindSafe(|| f(m))) {
                Ok(result) => match m
                    .copy_failure()
                    .or_else(|| m.take_untransacted_copy_error().map(|e| e.to_string()))
                {
                    None => result,
                    // Bookkeeping moved on but the bytes did not: nothing can be trusted.
                    Some(message) => {
                        let message = format!(
                            "a copy could not be launched ({message}); the manager is poisoned"
                        );
                        poison(&mut state);
                        Err(FfiError(kvb_status_t::KVB_STATUS_CUDA, message))
                    }
                },
                Err(_) => {
                    poison(&mut state);
                    Err(FfiError(
                        kvb_status_t::KVB_STATUS_INTERNAL,
                        format!(
                            "internal error (panic caught: {}); the manager is poisoned",
                            caught_panic_message()
                        ),
                    ))
                }
            },
            HandleState::Poisoned(_) => Err(FfiError(
                kvb_status_t::KVB_STATUS_POISONED,
                "the manager is poisoned by an earlier internal error; destroy it".into(),
            )),
            HandleState::Destroyed => Err(FfiError(
                kvb_status_t::KVB_STATUS_DESTROYED,
                "the manager was destroyed".into(),
            )),
        }
    })
}

/// `with_manager` for the calls that may submit copies: transactional (see
/// `KvCacheManager::transact`), so a copy backend's failure rolls the call back and returns its
/// status instead of poisoning the handle.
pub(crate) fn with_manager_tx(
    mgr: *const kvb_manager_t,
    f: impl FnOnce(&mut KvCacheManager) -> FfiResult,
) -> kvb_status_t {
    with_manager(mgr, |m| m.transact(f))
}

/// Wraps a manager made by the Rust API (e.g. with a test copy backend) in a C handle, to
/// drive it through the C ABI. Free it with `kvb_manager_destroy`.
#[doc(hidden)]
pub fn handle_from_manager(m: KvCacheManager) -> *mut kvb_manager_t {
    new_handle(m)
}

fn poison(state: &mut HandleState) {
    let old = std::mem::replace(state, HandleState::Destroyed);
    if let HandleState::Live(m) = old {
        *state = HandleState::Poisoned(m);
    }
}

pub(crate) fn new_handle(m: KvCacheManager) -> *mut kvb_manager_t {
    Box::into_raw(Box::new(kvb_manager_t {
        delivery: m.event_delivery(),
        state: Mutex::new(HandleState::Live(Box::new(m))),
    }))
}

/// The event delivery buffer of a live handle, checked without holding the lock afterwards.
pub(crate) fn live_delivery(mgr: *const kvb_manager_t) -> FfiResult<Arc<EventDelivery>> {
    // SAFETY: as in `with_manager`.
    let handle = unsafe { mgr.as_ref() }.ok_or_else(|| null_error("manager"))?;
    let state = handle.state.lock().unwrap_or_else(|p| p.into_inner());
    match &*state {
        HandleState::Live(_) => Ok(handle.delivery.clone()),
        HandleState::Poisoned(_) => Err(FfiError(
            kvb_status_t::KVB_STATUS_POISONED,
            "the manager is poisoned by an earlier internal error; destroy it".into(),
        )),
        HandleState::Destroyed => Err(FfiError(
            kvb_status_t::KVB_STATUS_DESTROYED,
            "the manager was destroyed".into(),
        )),
    }
}

/// Drops the manager and keeps the shell in the graveyard. Returns false if already destroyed.
pub(crate) fn destroy_handle(mgr: *mut kvb_manager_t) -> bool {
    // SAFETY: non-null handle from kvb_manager_create; shells are never freed.
    let Some(handle) = (unsafe { mgr.as_ref() }) else {
        return true;
    };
    let old = {
        let mut state = handle.state.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::replace(&mut *state, HandleState::Destroyed)
    };
    if matches!(old, HandleState::Destroyed) {
        return false;
    }
    handle.delivery.shutdown();
    drop(old);
    GRAVEYARD
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(mgr as usize);
    true
}

/// Block ids from a (pointer, length) pair, each checked as `block_id_arg` checks one.
pub(crate) fn block_ids_arg(ptr: *const i32, len: usize, what: &str) -> FfiResult<Vec<u32>> {
    slice_arg(ptr, len, what)?
        .iter()
        .map(|&b| block_id_arg(b))
        .collect()
}

/// A slice from a (pointer, length) pair; null is allowed only for length 0.
pub(crate) fn slice_arg<'a, T>(ptr: *const T, len: usize, what: &str) -> FfiResult<&'a [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(null_error(what));
    }
    // SAFETY: the caller guarantees `len` readable elements at `ptr` for the call's duration.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

pub(crate) fn slice_arg_mut<'a, T>(ptr: *mut T, len: usize, what: &str) -> FfiResult<&'a mut [T]> {
    if len == 0 {
        return Ok(&mut []);
    }
    if ptr.is_null() {
        return Err(null_error(what));
    }
    // SAFETY: the caller guarantees `len` writable elements at `ptr` for the call's duration.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
}

/// Writes `value` through an out-pointer.
pub(crate) fn write_out<T>(ptr: *mut T, value: T, what: &str) -> FfiResult {
    if ptr.is_null() {
        return Err(null_error(what));
    }
    // SAFETY: non-null out-pointer supplied by the caller.
    unsafe { ptr.write(value) };
    Ok(())
}

/// Checks an out-pointer before any work is done, so a null one fails with nothing changed.
pub(crate) fn require_out<T>(ptr: *mut T, what: &str) -> FfiResult {
    if ptr.is_null() {
        Err(null_error(what))
    } else {
        Ok(())
    }
}

/// A non-negative `i32` size/count argument as `usize`.
pub(crate) fn count_arg(v: i32, what: &str) -> FfiResult<usize> {
    usize::try_from(v).map_err(|_| invalid(format!("{what} is negative ({v})")))
}

/// A count or size result as the `int32_t` the C ABI returns: `KVB_STATUS_INVALID_ARGUMENT`
/// when it does not fit (arguments that extreme), never a wrapped or negative value.
pub(crate) fn i32_result(v: usize, what: &str) -> FfiResult<i32> {
    i32::try_from(v).map_err(|_| {
        invalid(format!(
            "{what} ({v}) does not fit in int32_t: the arguments are too large"
        ))
    })
}

/// A strictly positive `i32` argument as `usize`.
pub(crate) fn positive_arg(v: i32, what: &str) -> FfiResult<usize> {
    if v <= 0 {
        Err(invalid(format!("{what} must be positive (got {v})")))
    } else {
        Ok(v as usize)
    }
}

/// A `window_size` argument: strictly positive (whether the manager has that window is the
/// manager's check).
pub(crate) fn window_arg(v: i32) -> FfiResult<usize> {
    positive_arg(v, "window_size")
}

/// A block id argument: non-negative (whether it is in range is the manager's check).
pub(crate) fn block_id_arg(v: i32) -> FfiResult<u32> {
    u32::try_from(v).map_err(|_| invalid(format!("block id {v} is negative")))
}

/// Copies `items` into a caller buffer of `capacity` entries and writes the count; fails with
/// `KVB_STATUS_BUFFER_TOO_SMALL` (count = the needed size) when it does not fit.
pub(crate) fn copy_out<T: Copy>(
    items: &[T],
    out: *mut T,
    capacity: usize,
    out_count: *mut usize,
) -> FfiResult {
    write_out(out_count, items.len(), "out_count")?;
    if items.len() > capacity {
        return Err(KvError::BufferTooSmall {
            needed: items.len(),
            given: capacity,
        }
        .into());
    }
    let dst = slice_arg_mut(out, items.len(), "out")?;
    dst.copy_from_slice(items);
    Ok(())
}

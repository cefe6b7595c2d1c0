//! C entry points of admission: a request descriptor, single and batched admission, and the
//! scheduler's estimate of a batch.

use super::handle::guard;
use super::handle::{
    invalid, kvb_manager_t, require_out, slice_arg_mut, with_manager, with_manager_tx, write_out,
    FfiError,
};
use super::status::kvb_status_t;
use super::types::request_array;
use super::types::{
    init_request, kvb_admission_t, kvb_batch_estimate_t, kvb_request_t, request, CRequest,
    REQUEST_SIZE_BEFORE_DISABLE_REUSE,
};

/// Initialises a request descriptor of the layout before `disable_reuse` (its first
/// `offsetof(kvb_request_t, disable_reuse)` bytes; nothing past them is written): the symbol a
/// program built against that header calls. This header maps `kvb_request_init(r)` to
/// `kvb_request_init_sized(r, sizeof *r)`, so C and C++ code gets the whole struct.
#[no_mangle]
pub extern "C" fn kvb_request_init(request: *mut kvb_request_t) -> kvb_status_t {
    guard(|| init_request(request, REQUEST_SIZE_BEFORE_DISABLE_REUSE))
}

/// Initialises the first `size` bytes of a request descriptor (`size` = the caller's
/// `sizeof(kvb_request_t)`): beam width 1, no optional fields, reuse on, `struct_size = size`.
/// Writes nothing past `size`, so a program built against an earlier header may call it too.
/// `KVB_STATUS_STRUCT_SIZE` for a size that is no layout of this struct.
#[no_mangle]
pub extern "C" fn kvb_request_init_sized(request: *mut kvb_request_t, size: usize) -> kvb_status_t {
    guard(|| init_request(request, size))
}

/// Admits a request (TensorRT-LLM `addSequence`): reuses cached prefix blocks, onboards host
/// blocks, copies partial matches, allocates the rest in every window. `out` (may be null)
/// receives the prepopulated prompt length and the per-request counters. Fails with
/// `KVB_STATUS_OUT_OF_BLOCKS` when a window lacks blocks, and with `KVB_STATUS_COPY_FAILED`
/// when the copy backend fails (the call is rolled back); a failed call changes nothing. A
/// failed CUDA launch returns `KVB_STATUS_CUDA` and poisons the handle.
#[no_mangle]
pub extern "C" fn kvb_manager_add_sequence(
    manager: *mut kvb_manager_t,
    request: *const kvb_request_t,
    out: *mut kvb_admission_t,
) -> kvb_status_t {
    with_manager_tx(manager, |m| {
        let req = self::request(request)?;
        let admission = m.add_sequence_ref(&req.as_ref())?;
        if !out.is_null() {
            write_out(out, admission.into(), "out")?;
        }
        Ok(())
    })
}

/// The scheduler's estimate for a candidate batch, in order, counting the requests before each
/// one (a block one request allocates is not free for the next; a block one claims is reusable
/// by the next). Changes nothing. `out` receives `num_requests` entries; admitting the same
/// batch on the same state delivers exactly these figures.
#[no_mangle]
pub extern "C" fn kvb_manager_estimate_batch(
    manager: *mut kvb_manager_t,
    requests: *const kvb_request_t,
    num_requests: usize,
    out: *mut kvb_batch_estimate_t,
) -> kvb_status_t {
    with_manager(manager, |m| {
        let reqs = requests_arg(requests, num_requests)?;
        let out = slice_arg_mut(out, num_requests, "out")?;
        let refs: Vec<_> = reqs.iter().map(|r| r.as_ref()).collect();
        let estimates = m.estimate_batch_refs(&refs)?;
        for (slot, e) in out.iter_mut().zip(estimates) {
            *slot = e.into();
        }
        Ok(())
    })
}

/// Admits a batch of requests in order (TensorRT-LLM `addSequenceBatch`): every reusable block
/// of every request is claimed before anything is onboarded or allocated, so what
/// `kvb_manager_estimate_batch` estimated is what is delivered. `results` (may be null) receives
/// `num_requests` entries; `*out_admitted` how many requests were admitted. Without
/// `longest_prefix` the batch is all or nothing (`KVB_STATUS_OUT_OF_BLOCKS`, nothing changed);
/// with it, the longest prefix that fits is admitted (possibly none).
#[no_mangle]
pub extern "C" fn kvb_manager_add_sequence_batch(
    manager: *mut kvb_manager_t,
    requests: *const kvb_request_t,
    num_requests: usize,
    longest_prefix: bool,
    results: *mut kvb_admission_t,
    out_admitted: *mut usize,
) -> kvb_status_t {
    with_manager_tx(manager, |m| {
        require_out(out_admitted, "out_admitted")?;
        let reqs = requests_arg(requests, num_requests)?;
        let out = if results.is_null() {
            None
        } else {
            Some(slice_arg_mut(results, num_requests, "results")?)
        };
        let refs: Vec<_> = reqs.iter().map(|r| r.as_ref()).collect();
        let admitted = m.add_sequence_batch_refs(&refs, longest_prefix)?;
        if let Some(out) = out {
            for (slot, a) in out.iter_mut().zip(&admitted) {
                *slot = (*a).into();
            }
        }
        write_out(out_admitted, admitted.len(), "out_admitted")
    })
}

fn requests_arg<'a>(
    requests: *const kvb_request_t,
    n: usize,
) -> Result<Vec<CRequest<'a>>, FfiError> {
    if n == 0 {
        return Err(invalid("a batch needs at least one request".into()));
    }
    request_array(requests, n)
}

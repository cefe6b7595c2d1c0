//! C entry point of the multimodal content digest, so engines need no hashing code of their own.

use super::handle::{guard, null_error, require_out, slice_arg, slice_arg_mut};
use super::status::kvb_status_t;
use crate::key::multimodal_digest;

/// Writes the 32-byte content digest of one multimodal item (BLAKE3 of its `len` raw bytes at
/// `data`) to the 32 bytes at `out_digest`, ready for `kvb_multimodal_item_t::digest`. Two items
/// whose placeholder token ids are equal but whose bytes differ get different digests, so their
/// blocks are never reused for one another; equal bytes give equal digests in every process and
/// run.
/// `data` may be null only when `len` is 0 (the empty input); `KVB_STATUS_NULL_POINTER` for a
/// null `data` with `len > 0` or a null `out_digest`, which is then left unchanged.
#[no_mangle]
pub extern "C" fn kvb_multimodal_digest(
    data: *const u8,
    len: usize,
    out_digest: *mut u8,
) -> kvb_status_t {
    guard(|| {
        require_out(out_digest, "out_digest")?;
        if data.is_null() && len > 0 {
            return Err(null_error("data"));
        }
        let content = slice_arg(data, len, "data")?;
        let out = slice_arg_mut(out_digest, 32, "out_digest")?;
        out.copy_from_slice(&multimodal_digest(content));
        Ok(())
    })
}

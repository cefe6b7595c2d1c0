//! The receive ticket: what a decode engine sends a prefill engine so that the prefill side can
//! write a request's KV straight into the decode side's rows. It names the decode side's request,
//! the prompt tokens the decode side already holds (whole blocks; the sender skips them) and,
//! per window, the block index the receive starts at and the receiving rows.

use super::wire::{Reader, Writer};
use crate::error::KvResult;

const MAGIC: &[u8; 4] = b"KVBT";
const VERSION: u32 = 1;
const MAX_WINDOWS: usize = 64;
/// A bound on rows per window, far above any table row (blocks of one sequence).
const MAX_ROWS: usize = 1 << 24;

/// The receiving rows of one window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TicketWindow {
    pub window_size: u64,
    /// Block index (in the sequence's token order) of `rows[0]`.
    pub first_block_index: u64,
    pub rows: Vec<u32>,
}

/// A decode engine's request for one request's KV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceiveTicket {
    /// The request id on the decode side (carried back in the transfer's notification).
    pub request_id: u64,
    /// Prompt tokens the decode side already holds, a multiple of tokens per block.
    pub skip_tokens: u64,
    /// Prompt tokens whose KV must land (the prompt length).
    pub num_tokens: u64,
    pub windows: Vec<TicketWindow>,
}

impl ReceiveTicket {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new(MAGIC, VERSION);
        w.u64(self.request_id);
        w.u64(self.skip_tokens);
        w.u64(self.num_tokens);
        w.u32(self.windows.len() as u32);
        for win in &self.windows {
            w.u64(win.window_size);
            w.u64(win.first_block_index);
            w.u32(win.rows.len() as u32);
            for &r in &win.rows {
                w.u32(r);
            }
        }
        w.finish()
    }

    pub fn decode(bytes: &[u8]) -> KvResult<ReceiveTicket> {
        let mut r = Reader::new(bytes, MAGIC, VERSION, "receive ticket")?;
        let (request_id, skip_tokens, num_tokens) = (r.u64()?, r.u64()?, r.u64()?);
        let n = r.count(20, MAX_WINDOWS)?;
        let mut windows = Vec::with_capacity(n);
        for _ in 0..n {
            let (window_size, first_block_index) = (r.u64()?, r.u64()?);
            let rows_n = r.count(4, MAX_ROWS)?;
            let rows = (0..rows_n).map(|_| r.u32()).collect::<KvResult<Vec<_>>>()?;
            windows.push(TicketWindow {
                window_size,
                first_block_index,
                rows,
            });
        }
        if skip_tokens > num_tokens {
            return Err(r.error(&format!(
                "skips {skip_tokens} tokens of a {num_tokens}-token prompt"
            )));
        }
        r.end()?;
        Ok(ReceiveTicket {
            request_id,
            skip_tokens,
            num_tokens,
            windows,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_garbage_refused() {
        let t = ReceiveTicket {
            request_id: 7,
            skip_tokens: 32,
            num_tokens: 70,
            windows: vec![TicketWindow {
                window_size: 4096,
                first_block_index: 2,
                rows: vec![5, 6, 7],
            }],
        };
        let bytes = t.encode();
        assert_eq!(ReceiveTicket::decode(&bytes).unwrap(), t);
        for cut in 0..bytes.len() {
            assert!(ReceiveTicket::decode(&bytes[..cut]).is_err());
        }
        let mut lying = bytes.clone();
        // The row count of window 0 claims far more rows than follow.
        let at = bytes.len() - 3 * 4 - 4;
        lying[at..at + 4].copy_from_slice(&1_000_000u32.to_le_bytes());
        assert!(ReceiveTicket::decode(&lying).is_err());
        let mut skip = t.clone();
        skip.skip_tokens = 71;
        assert!(ReceiveTicket::decode(&skip.encode()).is_err());
    }
}

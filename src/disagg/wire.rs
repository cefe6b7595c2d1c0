//! The little-endian encoding of what two engines exchange (layouts, receive tickets): fixed
//! fields behind a magic and a version, read back strictly, since the bytes come from another
//! process and may be garbage.

use crate::error::{KvError, KvResult};

pub(super) struct Writer(Vec<u8>);

impl Writer {
    pub fn new(magic: &[u8; 4], version: u32) -> Self {
        let mut w = Writer(magic.to_vec());
        w.u32(version);
        w
    }

    pub fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    pub fn i32(&mut self, v: i32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    pub fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    pub fn finish(self) -> Vec<u8> {
        self.0
    }
}

pub(super) struct Reader<'a> {
    bytes: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// Checks the magic and the version; `what` names the message in errors.
    pub fn new(
        bytes: &'a [u8],
        magic: &[u8; 4],
        version: u32,
        what: &'static str,
    ) -> KvResult<Self> {
        let mut r = Reader { bytes, what };
        if r.take(4)? != magic {
            return Err(r.error("not a kvblock message of this kind (bad magic)"));
        }
        let v = r.u32()?;
        if v != version {
            return Err(r.error(&format!(
                "version {v}, this library reads version {version}"
            )));
        }
        Ok(r)
    }

    pub fn error(&self, why: &str) -> KvError {
        KvError::InvalidArgument(format!("{}: {why}", self.what))
    }

    fn take(&mut self, n: usize) -> KvResult<&'a [u8]> {
        if self.bytes.len() < n {
            return Err(self.error("truncated"));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    pub fn u32(&mut self) -> KvResult<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    pub fn i32(&mut self) -> KvResult<i32> {
        Ok(i32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    pub fn u64(&mut self) -> KvResult<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    /// A count of items of at least `item_bytes` each: refused when the rest cannot hold them
    /// (a hostile count never sizes an allocation).
    pub fn count(&mut self, item_bytes: usize, max: usize) -> KvResult<usize> {
        let n = self.u32()? as usize;
        if n > max || n.saturating_mul(item_bytes) > self.bytes.len() {
            return Err(self.error(&format!("count {n} exceeds what the message holds")));
        }
        Ok(n)
    }

    /// Fails unless every byte was read.
    pub fn end(self) -> KvResult<()> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(self.error(&format!("{} trailing bytes", self.bytes.len())))
        }
    }
}

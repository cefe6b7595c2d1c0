//! Retention configs: per-token-range priorities with optional durations, and the decode
//! priority applied to generated blocks (TensorRT-LLM's `KvCacheRetentionConfig`).

use crate::error::KvError;

pub const MIN_PRIORITY: u8 = 0;
pub const MAX_PRIORITY: u8 = 100;
pub const DEFAULT_PRIORITY: u8 = 35;

/// Priority and optional duration for tokens `[token_start, token_end)` (`None` = to the end).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenRangeRetention {
    pub token_start: i32,
    pub token_end: Option<i32>,
    pub priority: i32,
    pub duration_ms: Option<u64>,
}

/// A block's retention as seen by the eviction policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct BlockRetention {
    pub priority: Option<u8>,
    pub duration_ms: Option<u64>,
}

/// A validated retention config: ranges sorted by start, non-overlapping, only the last open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetentionConfig {
    ranges: Vec<TokenRangeRetention>,
    decode_priority: u8,
    decode_duration_ms: Option<u64>,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            ranges: Vec::new(),
            decode_priority: DEFAULT_PRIORITY,
            decode_duration_ms: None,
        }
    }
}

pub(crate) fn check_priority(p: i32, what: &str) -> Result<u8, KvError> {
    if (i32::from(MIN_PRIORITY)..=i32::from(MAX_PRIORITY)).contains(&p) {
        Ok(p as u8)
    } else {
        Err(KvError::InvalidRetention(format!(
            "{what} priority {p} is outside {MIN_PRIORITY}..={MAX_PRIORITY}"
        )))
    }
}

impl RetentionConfig {
    /// Validates and builds a config. Ranges are sorted by start first, as TensorRT-LLM does.
    pub fn new(
        mut ranges: Vec<TokenRangeRetention>,
        decode_priority: i32,
        decode_duration_ms: Option<u64>,
    ) -> Result<Self, KvError> {
        let decode_priority = check_priority(decode_priority, "decode")?;
        ranges.sort_by_key(|r| r.token_start);
        for (i, r) in ranges.iter().enumerate() {
            check_priority(r.priority, "token range")?;
            if r.token_start < 0 {
                return Err(KvError::InvalidRetention(format!(
                    "token range starts at negative position {}",
                    r.token_start
                )));
            }
            match r.token_end {
                Some(end) if end <= r.token_start => {
                    return Err(KvError::InvalidRetention(format!(
                        "token range [{}, {end}) is empty or reversed",
                        r.token_start
                    )));
                }
                None if i + 1 != ranges.len() => {
                    return Err(KvError::InvalidRetention(format!(
                        "open-ended token range starting at {} is not the last range",
                        r.token_start
                    )));
                }
                _ => {}
            }
            if let Some(next) = ranges.get(i + 1) {
                if let Some(end) = r.token_end {
                    if end > next.token_start {
                        return Err(KvError::InvalidRetention(format!(
                            "token ranges [{}, {end}) and [{}, ..) overlap",
                            r.token_start, next.token_start
                        )));
                    }
                }
            }
        }
        Ok(RetentionConfig {
            ranges,
            decode_priority,
            decode_duration_ms,
        })
    }

    pub fn ranges(&self) -> &[TokenRangeRetention] {
        &self.ranges
    }

    pub fn decode_retention(&self) -> BlockRetention {
        BlockRetention {
            priority: Some(self.decode_priority),
            duration_ms: self.decode_duration_ms,
        }
    }

    pub fn decode_priority(&self) -> u8 {
        self.decode_priority
    }

    pub fn decode_duration_ms(&self) -> Option<u64> {
        self.decode_duration_ms
    }

    /// The retention of block `block_index`: that of the range containing the block's first
    /// token, or none.
    pub fn block_retention(&self, block_index: usize, tokens_per_block: usize) -> BlockRetention {
        let first = (block_index * tokens_per_block) as i64;
        self.ranges
            .iter()
            .find(|r| {
                i64::from(r.token_start) <= first
                    && r.token_end.is_none_or(|end| first < i64::from(end))
            })
            .map(|r| BlockRetention {
                priority: Some(r.priority as u8),
                duration_ms: r.duration_ms,
            })
            .unwrap_or_default()
    }

    /// One retention per block for a sequence of `seq_len` tokens (`ceil(seq_len / tpb)` entries).
    pub fn per_block(&self, tokens_per_block: usize, seq_len: usize) -> Vec<BlockRetention> {
        (0..seq_len.div_ceil(tokens_per_block))
            .map(|i| self.block_retention(i, tokens_per_block))
            .collect()
    }

    /// Whether any of its retentions expires (a duration on a range or on decode blocks).
    pub fn has_duration(&self) -> bool {
        self.decode_duration_ms.is_some() || self.ranges.iter().any(|r| r.duration_ms.is_some())
    }

    pub fn is_default(&self) -> bool {
        self.ranges.is_empty()
            && self.decode_priority == DEFAULT_PRIORITY
            && self.decode_duration_ms.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(start: i32, end: Option<i32>, priority: i32) -> TokenRangeRetention {
        TokenRangeRetention {
            token_start: start,
            token_end: end,
            priority,
            duration_ms: None,
        }
    }

    #[test]
    fn ranges_are_sorted_and_looked_up_by_first_token() {
        let cfg =
            RetentionConfig::new(vec![range(8, None, 10), range(0, Some(8), 90)], 20, Some(5))
                .unwrap();
        let per_block = cfg.per_block(4, 10);
        assert_eq!(per_block.len(), 3);
        assert_eq!(per_block[0].priority, Some(90));
        assert_eq!(per_block[1].priority, Some(90));
        assert_eq!(per_block[2].priority, Some(10));
        assert_eq!(cfg.decode_retention().priority, Some(20));
        assert_eq!(cfg.decode_retention().duration_ms, Some(5));
    }

    #[test]
    fn gaps_have_no_retention() {
        let cfg = RetentionConfig::new(vec![range(4, Some(8), 70)], 35, None).unwrap();
        assert_eq!(cfg.block_retention(0, 4), BlockRetention::default());
        assert_eq!(cfg.block_retention(1, 4).priority, Some(70));
        assert_eq!(cfg.block_retention(2, 4), BlockRetention::default());
    }

    #[test]
    fn invalid_configs_are_rejected() {
        let err = |r: Vec<TokenRangeRetention>, d: i32| RetentionConfig::new(r, d, None).is_err();
        assert!(err(vec![range(0, Some(4), 101)], 35), "priority above 100");
        assert!(err(vec![range(0, Some(4), -1)], 35), "negative priority");
        assert!(err(vec![], 101), "decode priority above 100");
        assert!(
            err(vec![range(0, None, 10), range(4, Some(8), 10)], 35),
            "open range not last"
        );
        assert!(
            err(vec![range(0, Some(6), 10), range(4, Some(8), 10)], 35),
            "overlap"
        );
        assert!(err(vec![range(4, Some(4), 10)], 35), "empty range");
        assert!(err(vec![range(-1, Some(4), 10)], 35), "negative start");
        assert!(!err(vec![range(0, Some(4), 0), range(4, None, 100)], 0));
    }
}

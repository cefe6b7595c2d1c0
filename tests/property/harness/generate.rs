//! Drawing prompts, retention configs and requests from the run's generator.

use super::*;

impl Harness {
    pub(super) fn random_prompt(&mut self) -> (Vec<i32>, Option<u64>, Option<u64>) {
        let mut lora = self.rng.percent(20).then(|| self.rng.below(2) as u64);
        let mut salt = self.rng.percent(10).then(|| self.rng.below(2) as u64);
        let mut tokens: Vec<i32> = match self.rng.below(10) {
            0..=5 => {
                let p = self.prefixes[self.rng.below(self.prefixes.len())].clone();
                let cut = self.rng.range(0, p.len());
                p[..cut].to_vec()
            }
            6..=8 if !self.history.is_empty() => {
                let (t, l, s) = self.history[self.rng.below(self.history.len())].clone();
                if self.rng.percent(85) {
                    lora = l;
                    salt = s;
                }
                let cut = self.rng.range(0, t.len());
                t[..cut].to_vec()
            }
            _ => Vec::new(),
        };
        let suffix = self.rng.range(0, 10);
        for _ in 0..suffix {
            tokens.push(self.rng.below(4) as i32);
        }
        if tokens.is_empty() {
            tokens.push(self.rng.below(4) as i32);
        }
        tokens.truncate(MAX_SEQ - 4);
        (tokens, lora, salt)
    }

    pub(super) fn random_retention(&mut self, len: usize) -> RetentionConfig {
        let dur = |rng: &mut Rng| rng.percent(50).then(|| rng.range(0, 80) as u64);
        let mut ranges = Vec::new();
        let k = self.rng.range(0, len);
        if k > 0 {
            ranges.push(TokenRangeRetention {
                token_start: 0,
                token_end: Some(k as i32),
                priority: self.rng.range(0, 100) as i32,
                duration_ms: dur(&mut self.rng),
            });
        }
        if self.rng.percent(70) {
            ranges.push(TokenRangeRetention {
                token_start: k as i32,
                token_end: None,
                priority: self.rng.range(0, 100) as i32,
                duration_ms: dur(&mut self.rng),
            });
        }
        let decode = self.rng.range(0, 100) as i32;
        let decode_dur = dur(&mut self.rng);
        RetentionConfig::new(ranges, decode, decode_dur).expect("valid retention")
    }

    pub(super) fn random_request(&mut self) -> Request {
        let (tokens, lora, salt) = self.random_prompt();
        let id = self.next_id;
        self.next_id += 1;
        let mut req = Request::new(id, tokens.clone());
        req.beam_width = if self.rng.percent(15) { 2 } else { 1 };
        req.lora_task_id = lora;
        req.cache_salt = salt;
        if self.rng.percent(10) && tokens.len() > 1 {
            // Extra tokens past the input length are ignored.
            req.input_length = self.rng.range(1, tokens.len() - 1);
        }
        if self.rng.percent(25) {
            req.retention = self.random_retention(tokens.len());
        }
        // Some requests opt out of reuse (TensorRT-LLM's per-call isEnableBlockReuse = false).
        req.disable_reuse = self.rng.percent(8);
        req
    }

    /// A stored prompt with neither LoRA nor salt (truncate_blocks keys plain tokens).
    pub(super) fn plain_history_prompt(&mut self) -> Option<Vec<i32>> {
        let plain: Vec<&Vec<i32>> = self
            .history
            .iter()
            .filter(|(_, l, s)| l.is_none() && s.is_none())
            .map(|(t, _, _)| t)
            .collect();
        (!plain.is_empty()).then(|| plain[self.rng.below(plain.len())].clone())
    }
}

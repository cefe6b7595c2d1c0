//! libFuzzer target: every exported `kvb_*` function through the C ABI (see `src/interp.rs`).
#![no_main]

#[path = "../src/interp.rs"]
mod interp;

libfuzzer_sys::fuzz_target!(|data: &[u8]| interp::run(data));

//! Replays the C-ABI fuzz target's seed corpus (`fuzz/corpus/c_abi`) and every input that once
//! crashed it (`fuzz/regressions`, named after the weak spot) through the same interpreter
//! (`fuzz/src/interp.rs`), so a fixed finding cannot come back. Runs on stable, without
//! libFuzzer.

#[path = "../fuzz/src/interp.rs"]
mod interp;

use std::path::Path;

fn replay(dir: &str) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for f in &files {
        let data = std::fs::read(f).unwrap();
        println!("replaying {}", f.display());
        interp::run(&data);
    }
    files.len()
}

#[test]
fn saved_crashes_stay_fixed() {
    assert!(
        replay("fuzz/regressions") >= 2,
        "the saved crashes are missing"
    );
}

#[test]
fn seed_corpus_runs_clean() {
    assert!(
        replay("fuzz/corpus/c_abi") >= 10,
        "the seed corpus is missing"
    );
}

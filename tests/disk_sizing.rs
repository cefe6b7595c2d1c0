//! The disk tier sized as a share of free space, on a small ext4 filesystem loop-mounted by
//! the test (root only: skips with a message otherwise, or when mkfs.ext4 or the loop mount is
//! not available): a sparse file under the tier's own name is not free space, a nearly full
//! filesystem keeps what the share leaves, preallocation never takes the filesystem past a
//! floor, and a failed preallocation gives back what it took (ext4 keeps the blocks a failed
//! `fallocate` allocated: without the give-back the filesystem is left full).

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use kvblock::manager::{
    disk_file_name, CopyBackend, DiskTierConfig, KvCacheManager, ManagerConfig, WindowSpec,
};
use kvblock::tier::prealloc::{allocated_bytes, fs_free_bytes};
use kvblock::tier::store::FileSlots;

const WINDOW: usize = 64;
const MIB: u64 = 1 << 20;

/// A small ext4 filesystem mounted on a loop device for one test; unmounted and removed on
/// drop.
struct Ext4 {
    mnt: PathBuf,
    image: PathBuf,
}

impl Ext4 {
    fn mount(tag: &str, mib: u64) -> Option<Ext4> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: mounting a loop filesystem needs root");
            return None;
        }
        let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("disk-sizing-{tag}"));
        let (mnt, image) = (base.join("mnt"), base.join("fs.img"));
        let _ = Command::new("umount")
            .arg(&mnt)
            .stderr(std::process::Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&mnt).unwrap();
        std::fs::File::create(&image)
            .unwrap()
            .set_len(mib * MIB)
            .unwrap();
        let ok = |c: &mut Command| c.status().is_ok_and(|s| s.success());
        let mkfs = ["mkfs.ext4", "/sbin/mkfs.ext4", "/usr/sbin/mkfs.ext4"]
            .into_iter()
            .find(|m| ok(Command::new(m).args(["-q", "-F"]).arg(&image)));
        if mkfs.is_none() {
            eprintln!("skipped: mkfs.ext4 is not available");
            return None;
        }
        if !ok(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&mnt))
        {
            eprintln!("skipped: the loop mount failed (no loop devices here?)");
            return None;
        }
        Some(Ext4 { mnt, image })
    }

    fn free(&self) -> u64 {
        fs_free_bytes(&self.mnt).unwrap()
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.mnt)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
        let _ = std::fs::remove_file(&self.image);
    }
}

fn config(dir: &Path, share: f64) -> ManagerConfig {
    ManagerConfig {
        windows: vec![WindowSpec {
            window_size: WINDOW,
            primary_blocks: 8,
            secondary_blocks: 8,
            num_layers: 1,
            num_kv_heads: 1,
            size_per_head: 2,
            ..WindowSpec::default()
        }],
        tokens_per_block: 4,
        max_sequence_length: WINDOW,
        bytes_per_element: 1,
        copy_backend: CopyBackend::HostMemory,
        manual_clock: true,
        disk: DiskTierConfig {
            directory: Some(dir.to_path_buf()),
            bytes_per_window: 0,
            free_space_share: share,
            ..DiskTierConfig::default()
        },
        ..ManagerConfig::default()
    }
}

/// Creates a manager at share 0.5 and checks its budget and what the filesystem kept.
fn check_share(fs: &Ext4) {
    let free = fs.free();
    let m = KvCacheManager::new(config(&fs.mnt, 0.5)).expect("manager");
    let s = m.disk_stats();
    let budget = s.slots * s.slot_bytes;
    assert!(s.slots > 0);
    assert!(budget <= free / 2, "budget {budget} of {free} free");
    let file = allocated_bytes(&fs.mnt.join(disk_file_name(WINDOW)));
    assert!(file <= free / 2, "the file takes {file} bytes of {free}");
    // Preallocated: the budget is really there (not a sparse promise).
    assert!(file >= budget, "the file takes {file} bytes for {budget}");
    let left = fs.free();
    assert!(
        left + 128 * 1024 >= free - free / 2,
        "{left} bytes left of {free}: past the share"
    );
}

#[test]
fn a_sparse_file_under_the_tiers_name_is_not_free_space() {
    let Some(fs) = Ext4::mount("sparse", 32) else {
        return;
    };
    // Apparent size 8 GiB, no block allocated: it frees nothing when the tier resets it.
    let own = fs.mnt.join(disk_file_name(WINDOW));
    std::fs::File::create(&own)
        .unwrap()
        .set_len(8 << 30)
        .unwrap();
    assert_eq!(allocated_bytes(&own), 0);
    check_share(&fs);
}

#[test]
fn a_nearly_full_filesystem_keeps_what_the_share_leaves() {
    let Some(fs) = Ext4::mount("full", 32) else {
        return;
    };
    let filler = fs.mnt.join("filler");
    let f = std::fs::File::create(&filler).unwrap();
    let len = fs.free() - 4 * MIB;
    // SAFETY: a valid descriptor.
    let r = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, len as i64) };
    assert_eq!(r, 0, "filling the filesystem");
    assert!(fs.free() <= 4 * MIB + MIB);
    check_share(&fs);
}

#[test]
fn preallocation_never_takes_the_filesystem_past_the_floor() {
    let Some(fs) = Ext4::mount("floor", 32) else {
        return;
    };
    let free = fs.free();
    let path = fs.mnt.join("slots");
    // 8 MiB fits, but would leave less than the floor of free - 4 MiB.
    let f = FileSlots::open_within(&path, 4096, 2048, false, Some(free - 4 * MIB)).unwrap();
    assert!(!f.mode().preallocated);
    assert_eq!(allocated_bytes(&path), 0);
    assert!(fs.free() + 64 * 1024 >= free);
    drop(f);
    // Within the floor: reserved.
    let f = FileSlots::open_within(&path, 4096, 512, false, Some(free - 4 * MIB)).unwrap();
    assert!(f.mode().preallocated);
    assert!(allocated_bytes(&path) >= 2 * MIB);
}

#[test]
fn a_failed_preallocation_gives_back_what_it_took() {
    let Some(fs) = Ext4::mount("give-back", 32) else {
        return;
    };
    let free = fs.free();
    let path = fs.mnt.join("slots");
    // Twice the free space, no floor: fallocate fails with ENOSPC part way.
    let slots = 2 * free / 4096;
    let f = FileSlots::open(&path, 4096, slots, false).unwrap();
    assert!(!f.mode().preallocated);
    assert!(
        allocated_bytes(&path) < MIB,
        "the file kept {} bytes",
        allocated_bytes(&path)
    );
    let left = fs.free();
    assert!(left + MIB >= free, "{left} bytes left of {free}");
    drop(f);

    // An existing file of that size with data in it: the data stays, the holes are given back.
    let raw = OpenOptions::new().write(true).open(&path).unwrap();
    let pattern: Vec<u8> = (0..4096).map(|i| (i % 251) as u8).collect();
    raw.write_all_at(&pattern, 4096 * 7).unwrap();
    raw.sync_all().unwrap();
    drop(raw);
    let f = FileSlots::open(&path, 4096, slots, false).unwrap();
    assert!(f.mode().existed && !f.mode().preallocated);
    let mut back = vec![0u8; 4096];
    f.read_prefix(7, &mut back).unwrap();
    assert_eq!(back, pattern);
    assert!(allocated_bytes(&path) < MIB);
    assert!(fs.free() + MIB >= free);
}

//! Two OS processes on 127.0.0.1 move DRAM over NIXL/UCX (src/disagg/nixl).
//!
//! The test binary re-executes itself as the peer (`peer_role`, selected by
//! `KVBLOCK_DISAGG_NIXL_ROLE`); metadata goes through files in a temporary folder this test
//! creates and removes. Every child is killed on every exit path (a guard, and a watchdog that
//! ends the whole process if a case overruns). Needs NIXL (`scripts/setup.sh`, then `source
//! scripts/nixl_env.sh`): without it these tests FAIL, unless `KVBLOCK_NIXL_OPTIONAL=1`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kvblock::disagg::nixl::{NixlBackend, NixlConfig};
use kvblock::disagg::{merge_descriptors, Desc, MemKind, Region, TransferBackend, XferId};
use kvblock::disagg::{XferOp, XferState};

const ROLE: &str = "KVBLOCK_DISAGG_NIXL_ROLE";
const DIR: &str = "KVBLOCK_DISAGG_NIXL_DIR";
const BYTES: &str = "KVBLOCK_DISAGG_NIXL_BYTES";
const NAME: &str = "KVBLOCK_DISAGG_NIXL_NAME";
const FILL: &str = "KVBLOCK_DISAGG_NIXL_FILL";
const BOUND: Duration = Duration::from_secs(20);
const BACKGROUND: u8 = 0xA5;
const BLOCK: u64 = 16 << 10;
const TCP: &[(&str, &str)] = &[("UCX_TLS", "tcp,self"), ("UCX_NET_DEVICES", "lo")];

/// One case at a time: the cases set UCX variables in this process, and timings stay clean.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} unset"))
}

/// A NIXL agent, or None (test skipped) when NIXL is missing and KVBLOCK_NIXL_OPTIONAL=1.
fn agent_or_skip(name: &str) -> Option<NixlBackend> {
    match NixlBackend::new(&NixlConfig::new(name)) {
        Ok(b) => Some(b),
        Err(e) if std::env::var("KVBLOCK_NIXL_OPTIONAL").as_deref() == Ok("1") => {
            eprintln!("SKIPPED (KVBLOCK_NIXL_OPTIONAL=1): {e}");
            None
        }
        Err(e) => panic!(
            "NIXL is missing: {e}\nRun scripts/setup.sh, then `source scripts/nixl_env.sh` \
             (or set KVBLOCK_NIXL_OPTIONAL=1 to skip these tests)"
        ),
    }
}

/// The byte the pattern has at offset `o` of the source buffer.
fn pattern(o: u64) -> u8 {
    (o.wrapping_mul(131) ^ (o >> 12).wrapping_mul(7)) as u8
}

/// (local offset, remote offset, length) of every descriptor of the functional cases, over a
/// buffer of `blocks` blocks: a run adjacent on both sides (merges), every other remote block,
/// reversed blocks, then 3-block descriptors of which pairs are adjacent.
fn layout(blocks: u64) -> Vec<(u64, u64, u64)> {
    assert!(blocks >= 160);
    let mut out = Vec::new();
    for i in 0..32 {
        out.push((i * BLOCK, (64 + i) * BLOCK, BLOCK));
    }
    for i in 0..16 {
        out.push(((32 + i) * BLOCK, (2 * i) * BLOCK, BLOCK));
    }
    for i in 0..16 {
        out.push(((48 + i) * BLOCK, (127 - i) * BLOCK, BLOCK));
    }
    for k in 0..8 {
        let remote = 128 + 3 * k + (k / 2) * 2; // pairs adjacent, a 2-block gap between pairs
        out.push(((64 + 3 * k) * BLOCK, remote * BLOCK, 3 * BLOCK));
    }
    out
}

fn descs(base_local: u64, base_remote: u64, lay: &[(u64, u64, u64)]) -> (Vec<Desc>, Vec<Desc>) {
    lay.iter()
        .map(|&(l, r, len)| {
            (
                Desc {
                    addr: base_local + l,
                    len,
                },
                Desc {
                    addr: base_remote + r,
                    len,
                },
            )
        })
        .unzip()
}

/// The peer's buffer after the write of `layout`.
fn expected_remote(bytes: u64) -> Vec<u8> {
    let mut v = vec![BACKGROUND; bytes as usize];
    for (l, r, len) in layout(bytes / BLOCK) {
        for k in 0..len {
            v[(r + k) as usize] = pattern(l + k);
        }
    }
    v
}

fn dram(buf: &[u8]) -> Region {
    Region {
        addr: buf.as_ptr() as u64,
        len: buf.len() as u64,
        kind: MemKind::Dram,
    }
}

fn write_atomically(path: &Path, data: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, data).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Waits (bounded) for `path`; `alive` is asked between polls and ends the wait with its error.
fn wait_file(path: &Path, mut alive: impl FnMut() -> Result<(), String>) -> Vec<u8> {
    let t = Instant::now();
    loop {
        if let Ok(d) = std::fs::read(path) {
            return d;
        }
        alive().unwrap_or_else(|e| panic!("waiting for {}: {e}", path.display()));
        assert!(t.elapsed() < BOUND, "no {} after {BOUND:?}", path.display());
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn wait_state(be: &mut NixlBackend, x: XferId, bound: Duration) -> XferState {
    let t = Instant::now();
    loop {
        let s = be.state(x);
        if s != XferState::InProgress || t.elapsed() > bound {
            return s;
        }
        std::thread::yield_now();
    }
}

fn wait_notification(be: &mut NixlBackend, from: &str) -> Vec<u8> {
    let t = Instant::now();
    loop {
        if let Some((_, m)) = be
            .take_notifications()
            .unwrap()
            .into_iter()
            .find(|(p, _)| p == from)
        {
            return m;
        }
        assert!(
            t.elapsed() < BOUND,
            "no notification from {from} after {BOUND:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The peer: registers a DRAM buffer, publishes its metadata, answers notifications:
/// "check" (verify the buffer against the written layout, reply "ok" or "bad ..."), "bye".
#[test]
fn peer_role() {
    if std::env::var(ROLE).as_deref() != Ok("peer") {
        return; // only as a child of the cases below
    }
    let parent = unsafe { libc::getppid() };
    let dir = PathBuf::from(env(DIR));
    let bytes: u64 = env(BYTES).parse().unwrap();
    let mut be = NixlBackend::new(&NixlConfig::new(&env(NAME))).expect("peer: NIXL");
    let mut buf = vec![BACKGROUND; bytes as usize];
    if env(FILL) == "pattern" {
        buf.iter_mut()
            .enumerate()
            .for_each(|(o, b)| *b = pattern(o as u64));
    }
    be.register(&dram(&buf)).unwrap();
    write_atomically(&dir.join("peer.md"), &be.local_metadata().unwrap());
    let alive = || match unsafe { libc::getppid() } == parent {
        true => Ok(()),
        false => Err("parent gone".to_string()),
    };
    let md = wait_file(&dir.join("parent.md"), alive);
    be.add_peer(&md).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    'serve: while Instant::now() < deadline && alive().is_ok() {
        for (from, msg) in be.take_notifications().unwrap() {
            match &msg[..] {
                b"check" => {
                    let want = expected_remote(bytes);
                    let reply = match buf.iter().zip(&want).position(|(a, b)| a != b) {
                        None => "ok".to_string(),
                        Some(o) => format!("bad at offset {o}: {} != {}", buf[o], want[o]),
                    };
                    be.send_notification(&from, reply.as_bytes()).unwrap();
                }
                b"bye" => break 'serve,
                other => panic!("peer: unexpected notification {other:?}"),
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        Instant::now() < deadline && alive().is_ok(),
        "peer: no bye in time"
    );
    drop(be); // the agent goes before the memory it registered
    drop(buf);
}

/// A peer process and its folder; killed and removed on every exit path.
struct Peer {
    child: Child,
    dir: PathBuf,
    name: String,
    done: Arc<AtomicBool>,
}

impl Peer {
    /// Starts the peer (`fill`: "background" or "pattern") and a watchdog that kills it and
    /// ends this process if the case is not over within `limit`.
    fn start(case: &str, bytes: u64, fill: &str, ucx: &[(&str, &str)], limit: Duration) -> Peer {
        let dir = std::env::temp_dir().join(format!("kvb-nixl-{}-{case}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let name = format!("kvb-peer-{case}");
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", "peer_role", "--nocapture", "--test-threads=1"])
            .env(ROLE, "peer")
            .env(DIR, &dir)
            .env(BYTES, bytes.to_string())
            .env(NAME, &name)
            .env(FILL, fill)
            .stdout(Stdio::null());
        for (k, v) in ucx {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let (pid, flag, wdir) = (child.id() as i32, done.clone(), dir.clone());
        std::thread::spawn(move || {
            let t = Instant::now();
            while !flag.load(Ordering::SeqCst) {
                if t.elapsed() > limit {
                    eprintln!("watchdog: case over {limit:?}: killing peer {pid}, exiting");
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    let _ = std::fs::remove_dir_all(&wdir);
                    std::process::exit(3);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Peer {
            child,
            dir,
            name,
            done,
        }
    }

    fn alive(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(st)) => Err(format!("peer exited: {st}")),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Loads the peer's metadata into `be` and gives it ours.
    fn connect(&mut self, be: &mut NixlBackend) {
        let md = wait_file(&self.dir.join("peer.md"), || self.alive());
        assert_eq!(be.add_peer(&md).unwrap(), self.name);
        write_atomically(&self.dir.join("parent.md"), &be.local_metadata().unwrap());
    }

    /// Waits (bounded) for a clean exit.
    fn finish(mut self) {
        let t = Instant::now();
        while t.elapsed() < BOUND {
            if let Some(st) = self.child.try_wait().unwrap() {
                assert!(st.success(), "peer failed: {st}");
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("peer did not exit within {BOUND:?}");
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
        self.done.store(true, Ordering::SeqCst);
    }
}

/// UCX variables for this process while a case runs (the peer gets them through its command).
struct UcxEnv(Vec<&'static str>);

impl UcxEnv {
    fn set(vars: &[(&'static str, &str)]) -> UcxEnv {
        for (k, v) in vars {
            std::env::set_var(k, v);
        }
        UcxEnv(vars.iter().map(|(k, _)| *k).collect())
    }
}

impl Drop for UcxEnv {
    fn drop(&mut self) {
        for k in &self.0 {
            std::env::remove_var(k);
        }
    }
}

/// WRITE the layout (as given), wait for Done and the peer's check of it (after the
/// notification), then READ it back (merged descriptors) into a cleared buffer and compare.
fn write_then_read_back(case: &str, ucx: &[(&'static str, &str)]) {
    let _serial = serial();
    let _env = UcxEnv::set(ucx);
    let Some(mut be) = agent_or_skip(&format!("kvb-parent-{case}")) else {
        return;
    };
    let bytes = 192 * BLOCK;
    let mut buf: Vec<u8> = (0..bytes).map(pattern).collect();
    be.register(&dram(&buf)).unwrap();
    let mut peer = Peer::start(case, bytes, "background", ucx, Duration::from_secs(60));
    peer.connect(&mut be);
    let peer_md = std::fs::read(peer.dir.join("peer.md")).unwrap();
    let remote_base = peer_buffer_addr(&peer_md);

    let lay = layout(bytes / BLOCK);
    let (local, remote) = descs(buf.as_ptr() as u64, remote_base, &lay);
    let (ml, mr) = merge_descriptors(&local, &remote);
    eprintln!(
        "{case}: {} descriptors, {} after merging",
        local.len(),
        ml.len()
    );
    assert!(ml.len() < local.len() && ml.len() > 1);

    let x = be
        .post(XferOp::Write, &local, &peer.name, &remote, b"check")
        .unwrap();
    assert_eq!(wait_state(&mut be, x, BOUND), XferState::Done);
    be.release(x).unwrap();
    let reply = wait_notification(&mut be, &peer.name);
    assert_eq!(String::from_utf8_lossy(&reply), "ok");

    buf.iter_mut().for_each(|b| *b = 0);
    let y = be.post(XferOp::Read, &ml, &peer.name, &mr, b"").unwrap();
    assert_eq!(wait_state(&mut be, y, BOUND), XferState::Done);
    be.release(y).unwrap();
    let mut want = vec![0u8; bytes as usize];
    for &(l, _, len) in &lay {
        for o in l..l + len {
            want[o as usize] = pattern(o);
        }
    }
    assert!(buf == want, "read-back differs");

    // A descriptor outside the peer's announced regions is refused before NIXL sees it.
    let bad = Desc {
        addr: remote_base + bytes,
        len: BLOCK,
    };
    assert!(be
        .post(XferOp::Write, &local[..1], &peer.name, &[bad], b"")
        .is_err());
    // So are a local one outside registered memory, unequal lengths, an unknown peer.
    let wild = Desc {
        addr: 0x1000,
        len: BLOCK,
    };
    assert!(be
        .post(XferOp::Write, &[wild], &peer.name, &remote[..1], b"")
        .is_err());
    let short = Desc {
        len: BLOCK / 2,
        ..remote[0]
    };
    assert!(be
        .post(XferOp::Write, &local[..1], &peer.name, &[short], b"")
        .is_err());
    assert!(be
        .post(XferOp::Write, &local[..1], "nobody", &remote[..1], b"")
        .is_err());
    assert!(matches!(be.state(XferId(u64::MAX)), XferState::Failed(_)));
    assert!(be.release(x).is_err(), "released already");
    be.register(&dram(&buf)).unwrap(); // idempotent

    be.send_notification(&peer.name, b"bye").unwrap();
    peer.finish();
    be.deregister(&dram(&buf)).unwrap();
}

/// The peer's one registered region, from its metadata blob (a test of the envelope too).
fn peer_buffer_addr(md: &[u8]) -> u64 {
    let info = kvblock::disagg::regions::decode_metadata("nixl", md).unwrap();
    assert_eq!(info.regions.regions().len(), 1);
    info.regions.regions()[0].addr
}

#[test]
fn write_and_read_back_ucx_default() {
    write_then_read_back("default", &[]);
}

#[test]
fn write_and_read_back_ucx_tcp_on_loopback() {
    write_then_read_back("tcp", TCP);
}

/// The peer is killed while a large READ from it runs: the transfer ends Failed or stays
/// InProgress (bounded), and if it says Done the bytes are right.
#[test]
fn peer_killed_mid_transfer() {
    let _serial = serial();
    let _env = UcxEnv::set(TCP);
    let Some(mut be) = agent_or_skip("kvb-parent-kill") else {
        return;
    };
    let bytes: u64 = 128 << 20;
    let buf = vec![0u8; bytes as usize];
    be.register(&dram(&buf)).unwrap();
    let mut peer = Peer::start("kill", bytes, "pattern", TCP, Duration::from_secs(90));
    peer.connect(&mut be);
    let md = std::fs::read(peer.dir.join("peer.md")).unwrap();
    let remote_base = peer_buffer_addr(&md);
    let n = bytes / (64 << 10);
    let lay: Vec<(u64, u64, u64)> = (0..n).map(|i| (i << 16, i << 16, 64 << 10)).collect();
    let (local, remote) = descs(buf.as_ptr() as u64, remote_base, &lay);
    let x = be
        .post(XferOp::Read, &local, &peer.name, &remote, b"")
        .unwrap();
    let at_kill = be.state(x);
    peer.child.kill().unwrap();
    peer.child.wait().unwrap();
    let end = wait_state(&mut be, x, BOUND);
    eprintln!("kill: state when the peer was killed {at_kill:?}, then {end:?}");
    match &end {
        XferState::Done => {
            let bad = buf
                .iter()
                .enumerate()
                .position(|(o, &b)| b != pattern(o as u64));
            assert_eq!(bad, None, "Done but the bytes are wrong");
        }
        XferState::Failed(_) => be.release(x).unwrap(),
        XferState::InProgress => assert!(be.release(x).is_err()),
    }
    // A new transfer to the dead peer is refused or does not complete.
    if let Ok(y) = be.post(XferOp::Read, &local[..1], &peer.name, &remote[..1], b"") {
        let s = wait_state(&mut be, y, Duration::from_secs(5));
        assert_ne!(
            s,
            XferState::Done,
            "a READ from a dead peer cannot complete"
        );
    }
    drop(be); // must not hang: the watchdog bounds it
}

/// Without the library: a clear error naming where it looked (in a child, so this process's
/// loaded NIXL does not answer).
#[test]
fn missing_library_is_a_clear_error() {
    if std::env::var(ROLE).as_deref() == Ok("missing") {
        let e = NixlBackend::new(&NixlConfig::new("x"))
            .err()
            .expect("no library, no agent");
        println!("ERROR: {e}");
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "missing_library_is_a_clear_error", "--nocapture"])
        .env(ROLE, "missing")
        .env("KVBLOCK_NIXL_LIBRARY", "/nonexistent/libnixl_capi.so")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("KVBLOCK_NIXL_LIBRARY=/nonexistent/libnixl_capi.so")
            && text.contains("scripts/setup.sh"),
        "{text}"
    );
}

//! Real Redis servers for the remote tier's tests: a standalone `redis-server` (or a three-node
//! Redis Cluster) on random loopback ports, with a password, in a temporary directory; stopped
//! and removed when dropped. `require()` fails a test when Debian's `redis-server` / `redis-cli`
//! are missing (scripts/setup.sh installs them).
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub const PASSWORD: &str = "kvblock-test-secret";

/// Panics unless redis-server and redis-cli are on PATH: a real Redis is part of the test
/// environment (scripts/setup.sh installs Debian's), so its absence is a failure, not a skip.
pub fn require() {
    let ok = ["redis-server", "redis-cli"].iter().all(|t| {
        Command::new(t)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    assert!(
        ok,
        "redis-server / redis-cli not found: run scripts/setup.sh --tests"
    );
}

fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "kvblock-redis-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// A free loopback port whose cluster bus port (+10000) is free too.
fn free_port() -> u16 {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let p = l.local_addr().expect("addr").port();
        if p < 55000 && TcpListener::bind(("127.0.0.1", p + 10000)).is_ok() {
            return p;
        }
    }
}

fn cli(port: u16, args: &[&str]) -> Option<String> {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-a", PASSWORD])
        .arg("--no-auth-warning")
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One redis-server process.
pub struct Node {
    pub port: u16,
    dir: PathBuf,
    cluster: bool,
    child: Option<Child>,
}

impl Node {
    fn start(dir: &Path, port: u16, cluster: bool) -> Node {
        let mut n = Node {
            port,
            dir: dir.to_path_buf(),
            cluster,
            child: None,
        };
        n.spawn();
        n
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new("redis-server");
        cmd.current_dir(&self.dir)
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--requirepass", PASSWORD, "--masterauth", PASSWORD])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .args(["--maxmemory", "512mb", "--maxmemory-policy", "allkeys-lru"])
            .args(["--logfile", "redis.log"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if self.cluster {
            cmd.args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            ]);
            cmd.args(["--cluster-node-timeout", "1000"]);
        }
        self.child = Some(cmd.spawn().expect("start redis-server"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while cli(self.port, &["PING"]).as_deref().map(str::trim) != Some("PONG") {
            assert!(
                Instant::now() < deadline,
                "redis-server did not start on {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server (SIGKILL): its data is gone.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kills and starts it again on the same port (empty: no persistence).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A standalone server.
pub struct RedisServer {
    pub node: Node,
    dir: PathBuf,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        let dir = temp_dir("single");
        let node = Node::start(&dir, free_port(), false);
        RedisServer { node, dir }
    }

    pub fn url(&self) -> String {
        self.node.url()
    }

    /// A redis-cli command's output (None when it failed).
    pub fn cli(&self, args: &[&str]) -> Option<String> {
        cli(self.node.port, args)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.node.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A three-node Redis Cluster (masters only), created with `redis-cli --cluster create`.
pub struct RedisCluster {
    pub nodes: Vec<Node>,
    dir: PathBuf,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        let dir = temp_dir("cluster");
        let mut nodes = Vec::new();
        for i in 0..3 {
            let d = dir.join(format!("n{i}"));
            std::fs::create_dir_all(&d).expect("node dir");
            nodes.push(Node::start(&d, free_port(), true));
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        let status = Command::new("redis-cli")
            .args(["-a", PASSWORD, "--no-auth-warning"])
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli --cluster create");
        assert!(status.success(), "redis-cli --cluster create failed");
        let deadline = Instant::now() + Duration::from_secs(20);
        for n in &nodes {
            while !cli(n.port, &["CLUSTER", "INFO"]).is_some_and(|s| s.contains("cluster_state:ok"))
            {
                assert!(Instant::now() < deadline, "cluster did not become ok");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        RedisCluster { nodes, dir }
    }

    /// The nodes' URLs (any one is enough to discover the cluster).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Node::url).collect()
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            n.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

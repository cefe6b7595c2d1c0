//! The remote tier over TLS (`rediss://`, cargo feature `tls`) against a real redis-server that
//! the test starts on a loopback TLS port, with a certificate authority, server and client
//! certificates made here with the `openssl` command (scripts/setup.sh installs it): blocks go
//! and come back through a server whose certificate chains to the configured authority; a
//! server the trust store does not vouch for is refused at creation; a server that asks for
//! client certificates serves only a client that presents one.
#![cfg(feature = "tls")]

#[path = "common/redis_server.rs"]
mod redis_server;

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kvblock::remote::{RedisConfig, RedisStore, RemoteStore, StoreError};
use redis_server::PASSWORD;

/// A directory holding a certificate authority and certificates it signed.
struct Certificates {
    dir: PathBuf,
}

impl Certificates {
    fn make(tag: &str) -> Certificates {
        let dir = std::env::temp_dir().join(format!("kvblock-tls-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let c = Certificates { dir };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        c.run(c.openssl(&["req", "-x509"]).args(ec).args([
            "-days",
            "2",
            "-subj",
            "/CN=kvblock test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
        ]));
        std::fs::write(c.path("server.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
        std::fs::write(c.path("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
        for name in ["server", "client"] {
            let (key, csr, crt, ext) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.crt"),
                format!("{name}.ext"),
            );
            c.run(c.openssl(&["req"]).args(ec).args([
                "-subj",
                &format!("/CN=kvblock test {name}"),
                "-keyout",
                &key,
                "-out",
                &csr,
            ]));
            c.run(c.openssl(&["x509", "-req"]).args([
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &ext,
                "-out",
                &crt,
            ]));
        }
        c
    }

    fn openssl(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("openssl");
        cmd.current_dir(&self.dir)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        cmd
    }

    fn run(&self, cmd: &mut Command) {
        let out = cmd
            .output()
            .expect("openssl not found: run scripts/setup.sh");
        assert!(
            out.status.success(),
            "openssl failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Certificates {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A redis-server answering only TLS on a loopback port.
struct TlsServer {
    port: u16,
    child: Child,
}

impl TlsServer {
    fn start(certs: &Certificates, require_client_certificates: bool) -> TlsServer {
        redis_server::require();
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let path = |n: &str| certs.path(n).to_string_lossy().into_owned();
        let child = Command::new("redis-server")
            .current_dir(&certs.dir)
            .args(["--bind", "127.0.0.1", "--port", "0"])
            .args(["--tls-port", &port.to_string()])
            .args(["--tls-cert-file", &path("server.crt")])
            .args(["--tls-key-file", &path("server.key")])
            .args(["--tls-ca-cert-file", &path("ca.crt")])
            .args([
                "--tls-auth-clients",
                if require_client_certificates {
                    "yes"
                } else {
                    "no"
                },
            ])
            .args(["--requirepass", PASSWORD])
            .args(["--save", "", "--appendonly", "no", "--logfile", "redis.log"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "redis-server (TLS) did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        TlsServer { port, child }
    }

    fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn config(server: &TlsServer, ca: Option<&Path>, client: Option<&Certificates>) -> RedisConfig {
    RedisConfig {
        urls: vec![server.url()],
        password: Some(PASSWORD.into()),
        tls_ca_file: ca.map(Path::to_path_buf),
        tls_cert_file: client.map(|c| c.path("client.crt")),
        tls_key_file: client.map(|c| c.path("client.key")),
        ..RedisConfig::default()
    }
}

/// Puts two values and reads them back (and one absent key) through `store`.
fn round_trip(store: &RedisStore) {
    let (k1, k2) = (b"kvb:tls:test:1".as_slice(), b"kvb:tls:test:2".as_slice());
    let (v1, v2) = (vec![7u8; 100_000], vec![9u8; 3]);
    assert!(store
        .put(&[(k1, v1.as_slice()), (k2, v2.as_slice())])
        .iter()
        .all(Result::is_ok));
    let got = store.get(&[k1, k2, b"kvb:tls:test:absent"], 1 << 20);
    assert_eq!(got[0].as_ref().unwrap().as_deref(), Some(v1.as_slice()));
    assert_eq!(got[1].as_ref().unwrap().as_deref(), Some(v2.as_slice()));
    assert_eq!(got[2].as_ref().unwrap(), &None);
    assert!(store.connection_stats().connects >= 1);
}

#[test]
fn blocks_go_and_come_back_through_a_tls_server_with_the_configured_authority() {
    let certs = Certificates::make("ca");
    let server = TlsServer::start(&certs, false);
    let store = RedisStore::connect(config(&server, Some(&certs.path("ca.crt")), None))
        .expect("a TLS store");
    round_trip(&store);
}

#[test]
fn a_server_the_trust_store_does_not_vouch_for_is_refused_at_creation() {
    let certs = Certificates::make("untrusted");
    let server = TlsServer::start(&certs, false);
    // No authority given: the system's trust store, which does not know the test's.
    match RedisStore::connect(config(&server, None, None)) {
        Err(StoreError::Auth(m)) => assert!(m.contains("TLS"), "{m}"),
        other => panic!("expected a TLS refusal at creation, got {other:?}"),
    }
}

#[test]
fn a_server_that_asks_for_client_certificates_serves_only_a_client_with_one() {
    let certs = Certificates::make("mtls");
    let server = TlsServer::start(&certs, true);
    let ca = certs.path("ca.crt");
    // TLS 1.3 ends the client's side of the handshake before the server checks for a client
    // certificate: the refusal reaches the client as the server's alert (creation fails) or,
    // when the server's close wins that race, as a reset connection (the store is created, as
    // for a server that is down, and every call fails). Either way it is never served.
    if let Ok(store) = RedisStore::connect(config(&server, Some(&ca), None)) {
        let put = store.put(&[(b"kvb:tls:test:no-cert".as_slice(), b"x".as_slice())]);
        assert!(
            put.iter().all(Result::is_err),
            "no client certificate: never served"
        );
        assert!(store.get(&[b"kvb:tls:test:no-cert"], 1 << 10)[0].is_err());
        assert_eq!(store.connection_stats().connects, 0, "no connection opened");
    }
    let store = RedisStore::connect(config(&server, Some(&ca), Some(&certs)))
        .expect("with a client certificate");
    round_trip(&store);
}

#[test]
fn bad_tls_files_are_errors_at_creation() {
    let certs = Certificates::make("bad-files");
    let server = TlsServer::start(&certs, false);
    let missing = certs.path("missing.crt");
    let err = RedisStore::connect(config(&server, Some(&missing), None)).unwrap_err();
    assert!(err.to_string().contains("missing.crt"), "{err}");
    // A certificate without its key (and the other way round) is refused.
    let mut half = config(&server, Some(&certs.path("ca.crt")), Some(&certs));
    half.tls_key_file = None;
    assert!(RedisStore::connect(half).is_err());
    // TLS files with a plain redis:// URL are a mistake, not silently ignored.
    let mut plain = config(&server, Some(&certs.path("ca.crt")), None);
    plain.urls = vec![format!("redis://127.0.0.1:{}", server.port)];
    assert!(RedisStore::connect(plain).is_err());
}

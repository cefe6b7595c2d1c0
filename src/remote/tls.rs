//! TLS for the bounded connections of a `rediss://` store, standalone or a cluster (cargo
//! feature `tls`): rustls with the ring provider, the server's certificate checked against the
//! configured authority (or the system's trust store; only the configured one when set), a
//! client certificate presented when configured.

use std::io;
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

use super::resp::Transport;
use super::store::StoreError;

/// A TLS session over a TCP stream.
pub type TlsStream = StreamOwned<ClientConnection, TcpStream>;

impl Transport for TlsStream {
    fn set_timeouts(&mut self, t: Duration) -> io::Result<()> {
        self.sock.set_read_timeout(Some(t))?;
        self.sock.set_write_timeout(Some(t))
    }
}

fn other(m: String) -> StoreError {
    StoreError::Other(m)
}

fn read(p: &Path, what: &str) -> Result<Vec<u8>, StoreError> {
    std::fs::read(p).map_err(|e| other(format!("{what} {}: {e}", p.display())))
}

/// The client configuration of a `rediss://` store, from the configured PEM files.
pub fn client_config(
    ca_file: Option<&Path>,
    cert_file: Option<&Path>,
    key_file: Option<&Path>,
) -> Result<Arc<ClientConfig>, StoreError> {
    // rustls needs a process-wide crypto provider; keep the engine's if it installed one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = RootCertStore::empty();
    match ca_file {
        Some(p) => {
            let pem = read(p, "tls_ca_file")?;
            for c in CertificateDer::pem_slice_iter(&pem) {
                let c = c.map_err(|e| other(format!("tls_ca_file {}: {e}", p.display())))?;
                roots
                    .add(c)
                    .map_err(|e| other(format!("tls_ca_file {}: {e}", p.display())))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            // Unreadable entries of the system store are skipped; the certificates it has do.
            for c in found.certs {
                let _ = roots.add(c);
            }
        }
    }
    let builder = ClientConfig::builder().with_root_certificates(roots);
    let cfg = match (cert_file, key_file) {
        (Some(c), Some(k)) => {
            let pem = read(c, "tls_cert_file")?;
            let chain: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&pem).collect();
            let chain = chain.map_err(|e| other(format!("tls_cert_file {}: {e}", c.display())))?;
            let key = PrivateKeyDer::from_pem_slice(&read(k, "tls_key_file")?)
                .map_err(|e| other(format!("tls_key_file {}: {e}", k.display())))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| other(format!("TLS client certificate: {e}")))?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(Arc::new(cfg))
}

/// Starts a TLS session to `host` over `tcp` (the handshake runs on the first exchange, under
/// its deadline).
pub fn wrap(cfg: &Arc<ClientConfig>, host: &str, tcp: TcpStream) -> Result<TlsStream, StoreError> {
    let name = ServerName::try_from(host.to_string())
        .map_err(|e| other(format!("TLS server name {host:?}: {e}")))?;
    let conn = ClientConnection::new(cfg.clone(), name)
        .map_err(|e| StoreError::Auth(format!("TLS: {e}")))?;
    Ok(StreamOwned::new(conn, tcp))
}

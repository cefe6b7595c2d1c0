//! Endpoint checks made before a socket binds: ZeroMQ parses a TCP port leniently (a port it
//! cannot read becomes another port, or a free one), so the publisher checks endpoints itself.
//!
//! Supported transports: `tcp://HOST:PORT` (PORT a decimal number 1..=65535, or `*` for a free
//! port; HOST an address, an interface name, `*`, or a bracketed IPv6 address) and
//! `ipc://PATH` (a non-empty path; `@name` is Linux's abstract namespace). `inproc://` is refused:
//! the publisher's ZeroMQ context is private, so nothing outside it could connect. Every other
//! transport (pgm, epgm, tipc, vmci, ws, udp, ...) is refused.

use super::PublishError;

/// The transports `check` accepts, for messages.
pub const SUPPORTED: &str = "tcp://HOST:PORT (PORT 1-65535 or *) or ipc://PATH";

fn refuse(what: &str, endpoint: &str, why: &str) -> PublishError {
    PublishError::Transport(format!(
        "{what} endpoint '{endpoint}' is refused: {why} (supported: {SUPPORTED})"
    ))
}

/// Checks `endpoint` (named `what` in the message) before it is bound.
pub fn check(what: &str, endpoint: &str) -> Result<(), PublishError> {
    let Some((transport, address)) = endpoint.split_once("://") else {
        return Err(refuse(what, endpoint, "no transport:// prefix"));
    };
    match transport {
        "tcp" => check_tcp(what, endpoint, address),
        "ipc" => {
            if address.is_empty() {
                Err(refuse(what, endpoint, "the ipc path is empty"))
            } else {
                Ok(())
            }
        }
        "inproc" => Err(refuse(
            what,
            endpoint,
            "the publisher's ZeroMQ context is private, so no peer could connect to inproc",
        )),
        other => Err(refuse(
            what,
            endpoint,
            &format!("transport '{other}' is not supported"),
        )),
    }
}

fn check_tcp(what: &str, endpoint: &str, address: &str) -> Result<(), PublishError> {
    let Some((host, port)) = address.rsplit_once(':') else {
        return Err(refuse(what, endpoint, "no :PORT"));
    };
    if host.is_empty() {
        return Err(refuse(
            what,
            endpoint,
            "no host (use * for every interface)",
        ));
    }
    if host.starts_with('[') != host.ends_with(']') {
        return Err(refuse(
            what,
            endpoint,
            "unbalanced [ ] around the IPv6 address",
        ));
    }
    if port == "*" {
        return Ok(());
    }
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(refuse(
            what,
            endpoint,
            &format!("port '{port}' is not a decimal number or *"),
        ));
    }
    match port.parse::<u32>() {
        Ok(p) if (1..=65535).contains(&p) => Ok(()),
        Ok(0) => Err(refuse(what, endpoint, "port 0 (use * for a free port)")),
        _ => Err(refuse(
            what,
            endpoint,
            &format!("port {port} is out of range 1-65535"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_tcp_and_ipc() {
        for ep in [
            "tcp://127.0.0.1:5557",
            "tcp://*:1",
            "tcp://127.0.0.1:*",
            "tcp://[::1]:65535",
            "tcp://lo:80",
            "ipc:///tmp/kvb.sock",
            "ipc://@kvb",
        ] {
            assert!(check("PUB", ep).is_ok(), "{ep}");
        }
    }

    #[test]
    fn refuses_bad_ports_and_other_transports() {
        for (ep, why) in [
            ("tcp://127.0.0.1:65536", "out of range"),
            ("tcp://127.0.0.1:99999999999999999999", "out of range"),
            ("tcp://127.0.0.1:0", "port 0"),
            ("tcp://127.0.0.1:abc", "not a decimal"),
            ("tcp://127.0.0.1:-1", "not a decimal"),
            ("tcp://127.0.0.1:+80", "not a decimal"),
            ("tcp://127.0.0.1: 80", "not a decimal"),
            ("tcp://127.0.0.1:", "not a decimal"),
            ("tcp://127.0.0.1", "no :PORT"),
            ("tcp://:80", "no host"),
            ("tcp://[::1:80", "unbalanced"),
            ("inproc://x", "private"),
            ("pgm://eth0;239.1.1.1:5555", "not supported"),
            ("udp://127.0.0.1:5", "not supported"),
            ("ipc://", "empty"),
            ("not-an-endpoint", "no transport"),
        ] {
            let e = check("PUB", ep).unwrap_err().to_string();
            assert!(e.contains(why) && e.contains(ep), "{ep}: {e}");
        }
    }
}

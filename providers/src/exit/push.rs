//! Config push: how the operator changes a running exit server's ports without replacing it
//! (so the host keeps its public address).
//!
//! `skyport tunnel server` listens on [`PUSH_PORT`] (TCP) next to its control port. Only the
//! holder of the server's Noise private key can push: the key that seals a push is derived from
//! it ([`PushKey::derive`], a domain-separated SHA-256), so no new secret is stored, the raw key
//! never crosses the wire, and the in-cluster client (which knows only the server's public key)
//! cannot reconfigure the server.
//!
//! The exchange, one per connection:
//! 1. server → client: [`GREETING`] magic, [`VERSION`], the server's current generation (u64 BE);
//! 2. client → server: [`VERSION`], a new generation (u64 BE), a random 24-byte nonce, the length
//!    (u32 BE, at most [`MAX_CONFIG`] + 16) and the new `server.toml` sealed with
//!    XChaCha20-Poly1305; the version and generation are authenticated as associated data;
//! 3. server → client: one [`Answer`] byte, sent only after the new config is in place.
//!
//! The server refuses a frame that does not open, a generation not above the one it persisted
//! (a replay, even across restarts), and a config that changes its control port or Noise key.
//! The greeting's generation is not secret and not trusted: a forged one can only make a push be
//! refused, which a network attacker could do anyway.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::userdata::ExitServer;
use crate::error::HostError;

pub use super::userdata::PUSH_PORT;
/// Protocol version; a server refuses others.
pub const VERSION: u8 = 1;
/// Start of the server's greeting, so a client never mistakes another service for a server.
pub const GREETING: &[u8; 7] = b"SKYPUSH";
/// Largest `server.toml` a push may carry (a config of 1000 services is about 200 KiB).
pub const MAX_CONFIG: usize = 512 * 1024;
/// Bytes of the greeting: magic, version, generation.
pub const GREETING_LEN: usize = GREETING.len() + 1 + 8;
const NONCE_LEN: usize = 24;
const TAG_LEN: usize = 16;
/// Domain separation: this key seals pushes and nothing else.
const KEY_CONTEXT: &[u8] = b"skyport-tunnel-push-v1\0";
/// How long a client waits for the greeting, which a server sends as it accepts.
const GREETING_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a client waits for the whole exchange by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The server's one-byte answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The new config is in place.
    Applied = 0,
    /// The frame did not open with this server's key.
    Unauthenticated = 1,
    /// The generation is not above the server's.
    Stale = 2,
    /// The config is not a valid server config.
    Refused = 3,
    /// The server could not write the config.
    Failed = 4,
    /// The frame was malformed (version, length).
    Malformed = 5,
    /// The config changes the control address or the Noise key: only a new host can have those.
    Identity = 6,
}

impl Answer {
    pub fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            0 => Answer::Applied,
            1 => Answer::Unauthenticated,
            2 => Answer::Stale,
            3 => Answer::Refused,
            4 => Answer::Failed,
            5 => Answer::Malformed,
            6 => Answer::Identity,
            _ => return None,
        })
    }
}

/// Why a push failed. Never contains the config or a key.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error("the Noise private key is not 32 bytes of base64")]
    InvalidKey,
    #[error("cannot connect to the exit server's push port {0}: {1}")]
    Connect(SocketAddr, std::io::Error),
    #[error("{0} did not complete the push within {1:?}")]
    Timeout(SocketAddr, Duration),
    #[error("{0} accepted the connection but is not a skyport exit server taking pushes: {1}")]
    NoGreeting(SocketAddr, &'static str),
    #[error("{0}: {1}")]
    Protocol(SocketAddr, String),
    #[error("{0} refused the push: {1:?}")]
    Answered(SocketAddr, Answer),
    #[error("the frame does not open with this key")]
    Open,
    #[error("malformed push frame: {0}")]
    Malformed(&'static str),
}

/// The symmetric key pushes are sealed with. `Debug` does not print it.
#[derive(Clone, PartialEq, Eq)]
pub struct PushKey([u8; 32]);

impl std::fmt::Debug for PushKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PushKey(<redacted>)")
    }
}

impl PushKey {
    /// `SHA-256(KEY_CONTEXT || raw private key)`: knowing it reveals nothing of the Noise key.
    pub fn derive(noise_private_key_b64: &str) -> Result<Self, PushError> {
        use base64::Engine as _;
        let raw = base64::engine::general_purpose::STANDARD
            .decode(noise_private_key_b64.trim())
            .map_err(|_| PushError::InvalidKey)?;
        if raw.len() != 32 {
            return Err(PushError::InvalidKey);
        }
        Ok(PushKey(Sha256::new().chain_update(KEY_CONTEXT).chain_update(&raw).finalize().into()))
    }

    fn cipher(&self) -> XChaCha20Poly1305 {
        XChaCha20Poly1305::new((&self.0).into())
    }
}

/// The associated data: version and generation, so neither can be changed in flight.
fn aad(version: u8, generation: u64) -> [u8; 9] {
    let mut out = [0u8; 9];
    out[0] = version;
    out[1..].copy_from_slice(&generation.to_be_bytes());
    out
}

/// A client's frame: the header fields and the sealed config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub version: u8,
    pub generation: u64,
    pub nonce: [u8; NONCE_LEN],
    pub sealed: Vec<u8>,
}

impl Frame {
    /// Seals `config` for `generation` with a fresh random nonce.
    pub fn seal(key: &PushKey, generation: u64, config: &[u8]) -> Result<Self, PushError> {
        if config.len() > MAX_CONFIG {
            return Err(PushError::Malformed("config too large"));
        }
        let nonce: [u8; NONCE_LEN] = rand::random();
        let sealed = key
            .cipher()
            .encrypt(XNonce::from_slice(&nonce), Payload { msg: config, aad: &aad(VERSION, generation) })
            .map_err(|_| PushError::Malformed("cannot seal"))?;
        Ok(Frame { version: VERSION, generation, nonce, sealed })
    }

    /// The config, if the frame opens with `key` (the version and generation authenticated).
    pub fn open(&self, key: &PushKey) -> Result<Vec<u8>, PushError> {
        key.cipher()
            .decrypt(
                XNonce::from_slice(&self.nonce),
                Payload { msg: &self.sealed, aad: &aad(self.version, self.generation) },
            )
            .map_err(|_| PushError::Open)
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(1 + 8 + NONCE_LEN + 4 + self.sealed.len());
        out.push(self.version);
        out.extend_from_slice(&self.generation.to_be_bytes());
        out.extend_from_slice(&self.nonce);
        out.extend_from_slice(&(self.sealed.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.sealed);
        out
    }

    /// Reads one frame, refusing another version or a length above the bound before
    /// allocating for it.
    pub async fn read<R: AsyncRead + Unpin>(r: &mut R) -> Result<Self, PushError> {
        let io = |_| PushError::Malformed("truncated frame");
        let version = r.read_u8().await.map_err(io)?;
        if version != VERSION {
            return Err(PushError::Malformed("unknown version"));
        }
        let generation = r.read_u64().await.map_err(io)?;
        let mut nonce = [0u8; NONCE_LEN];
        r.read_exact(&mut nonce).await.map_err(io)?;
        let len = r.read_u32().await.map_err(io)? as usize;
        if !(TAG_LEN..=MAX_CONFIG + TAG_LEN).contains(&len) {
            return Err(PushError::Malformed("length out of bounds"));
        }
        let mut sealed = vec![0u8; len];
        r.read_exact(&mut sealed).await.map_err(io)?;
        Ok(Frame { version, generation, nonce, sealed })
    }
}

/// The server's greeting for its current generation.
pub fn greeting(generation: u64) -> [u8; GREETING_LEN] {
    let mut out = [0u8; GREETING_LEN];
    out[..GREETING.len()].copy_from_slice(GREETING);
    out[GREETING.len()] = VERSION;
    out[GREETING.len() + 1..].copy_from_slice(&generation.to_be_bytes());
    out
}

/// Pushes `config` (a rendered `server.toml`) to the exit server at `address`, sealed with
/// `key`, with the generation after the server's; returns that generation once the server
/// answered that the config is in place.
pub async fn push(address: SocketAddr, key: &PushKey, config: &str, timeout: Duration) -> Result<u64, PushError> {
    let connect = tokio::time::timeout(timeout, TcpStream::connect(address))
        .await
        .map_err(|_| PushError::Connect(address, std::io::ErrorKind::TimedOut.into()))?;
    let mut conn = connect.map_err(|e| PushError::Connect(address, e))?;
    let greeted = async {
        let mut hello = [0u8; GREETING_LEN];
        conn.read_exact(&mut hello).await.map_err(|_| PushError::NoGreeting(address, "no greeting"))?;
        if &hello[..GREETING.len()] != GREETING {
            return Err(PushError::NoGreeting(address, "another greeting"));
        }
        if hello[GREETING.len()] != VERSION {
            return Err(PushError::NoGreeting(address, "another push version"));
        }
        Ok(hello)
    };
    // Something that accepts connections but never greets is not a push receiver either.
    let hello = tokio::time::timeout(timeout.min(GREETING_TIMEOUT), greeted)
        .await
        .map_err(|_| PushError::NoGreeting(address, "no greeting"))??;
    let work = async {
        let protocol = |what: &str| PushError::Protocol(address, what.to_string());
        let current = u64::from_be_bytes(hello[GREETING.len() + 1..].try_into().unwrap_or_default());
        let generation = current.checked_add(1).ok_or_else(|| protocol("generation exhausted"))?;
        let frame = Frame::seal(key, generation, config.as_bytes())?;
        conn.write_all(&frame.to_bytes()).await.map_err(|e| protocol(&format!("sending: {e}")))?;
        let answer = conn.read_u8().await.map_err(|_| protocol("closed without an answer"))?;
        match Answer::from_byte(answer) {
            Some(Answer::Applied) => Ok(generation),
            Some(other) => Err(PushError::Answered(address, other)),
            None => Err(protocol("unknown answer")),
        }
    };
    tokio::time::timeout(timeout, work).await.map_err(|_| PushError::Timeout(address, timeout))?
}

/// Pushes `config` (the host's rendered `server.toml`, sealed with the key derived from
/// `server`'s Noise key) to the host at `ip`. `Ok(false)` when the host cannot take this push
/// and only a new one can serve `server`, so the controller replaces it instead: nothing takes
/// pushes there (a host made by a skyport without them, one that cannot be reached, or something
/// else answering on the port), the host
/// holds another Noise key (the Tunnel's Secret was re-created), or the config moves the control
/// port. A config the server finds invalid, or a failure on the way, is an error.
pub async fn reconfigure_host(
    provider: &'static str,
    ip: &str,
    server: &ExitServer,
    config: &str,
) -> Result<bool, HostError> {
    let ip: IpAddr = ip.parse().map_err(|_| HostError::Unavailable {
        provider,
        message: format!("the host's address {ip:?} is not an IP address"),
    })?;
    reconfigure_at(provider, SocketAddr::new(ip, PUSH_PORT), server, config).await
}

/// [`reconfigure_host`] to an explicit push address.
async fn reconfigure_at(
    provider: &'static str,
    address: SocketAddr,
    server: &ExitServer,
    config: &str,
) -> Result<bool, HostError> {
    let ip = address.ip();
    let key = PushKey::derive(&server.noise_private_key)
        .map_err(|e| HostError::Invalid { provider, message: e.to_string() })?;
    match push(address, &key, config, DEFAULT_TIMEOUT).await {
        Ok(generation) => {
            tracing::info!(provider, %ip, generation, "pushed the exit server's new configuration");
            Ok(true)
        }
        Err(e @ (PushError::Connect(..) | PushError::NoGreeting(..))) => {
            tracing::warn!(provider, error = %e, "the exit server takes no configuration pushes");
            Ok(false)
        }
        Err(e @ PushError::Answered(_, Answer::Unauthenticated | Answer::Identity)) => {
            tracing::warn!(provider, error = %e, "the exit server runs with other credentials or control port");
            Ok(false)
        }
        Err(e @ PushError::Answered(_, Answer::Refused)) => {
            Err(HostError::Invalid { provider, message: e.to_string() })
        }
        Err(e) => Err(HostError::Unavailable { provider, message: e.to_string() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "wCR3TomqL60P4MLphr9nSLR+tS5cgq7pccADVo2zaaQ=";
    const OTHER: &str = "ljQqivQjyn4K6qv2SSldOpHeLToaIIzXNB+C6GYVXvY=";

    #[tokio::test]
    async fn a_frame_round_trips_and_opens_only_with_its_key_untampered() {
        let key = PushKey::derive(KEY).unwrap();
        let frame = Frame::seal(&key, 7, b"[server]\n").unwrap();
        let bytes = frame.to_bytes();
        let read = Frame::read(&mut bytes.as_slice()).await.unwrap();
        assert_eq!(read, frame);
        assert_eq!(read.open(&key).unwrap(), b"[server]\n");
        assert!(!bytes.windows(9).any(|w| w == b"[server]\n"), "the config is not in the clear");

        assert!(matches!(read.open(&PushKey::derive(OTHER).unwrap()), Err(PushError::Open)));
        // Every header field and every sealed byte is authenticated.
        let mut later = read.clone();
        later.generation = 8;
        assert!(matches!(later.open(&key), Err(PushError::Open)));
        for i in 0..read.sealed.len() {
            let mut flipped = read.clone();
            flipped.sealed[i] ^= 1;
            assert!(matches!(flipped.open(&key), Err(PushError::Open)), "byte {i}");
        }
        let mut nonce = read.clone();
        nonce.nonce[0] ^= 1;
        assert!(matches!(nonce.open(&key), Err(PushError::Open)));
    }

    #[test]
    fn the_push_key_is_derived_not_the_noise_key_and_never_printed() {
        use base64::Engine as _;
        let key = PushKey::derive(KEY).unwrap();
        let raw = base64::engine::general_purpose::STANDARD.decode(KEY).unwrap();
        assert_ne!(key.0.as_slice(), raw.as_slice());
        assert_eq!(key, PushKey::derive(KEY).unwrap());
        assert_ne!(key, PushKey::derive(OTHER).unwrap());
        assert_eq!(format!("{key:?}"), "PushKey(<redacted>)");
        assert!(matches!(PushKey::derive("c2hvcnQ="), Err(PushError::InvalidKey)));
        assert!(matches!(PushKey::derive("not base64!"), Err(PushError::InvalidKey)));
    }

    #[tokio::test]
    async fn a_host_that_takes_no_push_is_left_to_be_replaced_and_a_refusal_is_an_error() {
        let server = ExitServer { control_port: 2333, noise_private_key: KEY.into(), services: vec![] };
        // Nothing listens.
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        assert!(!reconfigure_at("t", free, &server, "").await.unwrap());
        // Something else listens: it greets otherwise, or not at all.
        for greeting in [&b"SSH-2.0-OpenSSH_9.2\r\n"[..], b""] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let address = listener.local_addr().unwrap();
            tokio::spawn(async move {
                let (mut conn, _) = listener.accept().await.unwrap();
                conn.write_all(greeting).await.unwrap();
            });
            assert!(!reconfigure_at("t", address, &server, "").await.unwrap());
        }
        // A push receiver that refuses: the config is invalid (an error), or sealed under
        // another key (the host holds other credentials: replace it).
        for (answer, replace) in [(Answer::Refused, None), (Answer::Unauthenticated, Some(false))] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let address = listener.local_addr().unwrap();
            tokio::spawn(async move {
                let (mut conn, _) = listener.accept().await.unwrap();
                conn.write_all(&greeting(3)).await.unwrap();
                let frame = Frame::read(&mut conn).await.unwrap();
                assert_eq!(frame.generation, 4, "the generation after the server's");
                conn.write_all(&[answer as u8]).await.unwrap();
            });
            let got = reconfigure_at("t", address, &server, "[server]").await;
            match replace {
                Some(value) => assert_eq!(got.unwrap(), value),
                None => assert!(matches!(got, Err(HostError::Invalid { .. })), "{got:?}"),
            }
        }
    }

    #[tokio::test]
    async fn oversized_or_foreign_frames_are_refused_before_allocating() {
        let key = PushKey::derive(KEY).unwrap();
        let mut bytes = Frame::seal(&key, 1, b"x").unwrap().to_bytes();
        bytes[0] = 9;
        assert!(matches!(Frame::read(&mut bytes.as_slice()).await, Err(PushError::Malformed("unknown version"))));
        let mut huge = Frame::seal(&key, 1, b"x").unwrap().to_bytes();
        huge[33..37].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(Frame::read(&mut huge.as_slice()).await, Err(PushError::Malformed("length out of bounds"))));
        let short = Frame::seal(&key, 1, b"x").unwrap().to_bytes();
        assert!(matches!(Frame::read(&mut &short[..20]).await, Err(PushError::Malformed("truncated frame"))));
        assert!(Frame::seal(&key, 1, &vec![0u8; MAX_CONFIG + 1]).is_err());
    }
}

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
//! 3. server → client: one [`Answer`] byte and a 16-byte tag sealing it to this exchange (the
//!    client's nonce and generation) under the push key, sent only after the new config is in
//!    place, so an answer cannot be forged or replayed from another push.
//!
//! The server refuses a frame that does not open, a generation not above the one it persisted
//! (a replay, even across restarts), and a config that changes its control port or Noise key.
//! Generations are milliseconds since the epoch at least: a new server starts at its own start
//! time, and the operator pushes `max(server's + 1, now)`, so generations keep rising across
//! replacement hosts with the same keys, and a push captured before a host existed is stale
//! there. The greeting's generation is not secret and not trusted: a forged one can only make a
//! push be refused, which a network attacker could do anyway.

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
pub const VERSION: u8 = 2;
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
/// Bytes of the server's answer: the [`Answer`] byte and its tag.
pub const ANSWER_LEN: usize = 1 + TAG_LEN;
/// Domain separation of the answer's tag from the frame's.
const ANSWER_CONTEXT: &[u8] = b"skyport-tunnel-push-answer";

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
    #[error("{0} accepted the connection but sent no greeting (busy, or still starting)")]
    NoGreeting(SocketAddr),
    #[error("{0} is not a skyport exit server taking pushes of this version: {1}")]
    Foreign(SocketAddr, &'static str),
    #[error("{0}: {1}")]
    Protocol(SocketAddr, String),
    #[error("{0} refused the push: {1:?}")]
    Answered(SocketAddr, Answer),
    #[error("{0} answered {1:?} without proof of this push's key: another key, or not the exit server")]
    Unproven(SocketAddr, Answer),
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

/// Milliseconds since the epoch: the least generation a push carries, and a new server's first.
pub fn now_generation() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The answer's nonce: the frame's with its top bit flipped, so it never equals a frame nonce
/// of this key but by a 2^-192 chance (frame nonces are random).
fn answer_nonce(frame: &Frame) -> [u8; NONCE_LEN] {
    let mut nonce = frame.nonce;
    nonce[0] ^= 0x80;
    nonce
}

fn answer_aad(frame: &Frame, answer: u8) -> Vec<u8> {
    let mut out = ANSWER_CONTEXT.to_vec();
    out.extend_from_slice(&aad(frame.version, frame.generation));
    out.push(answer);
    out
}

/// The server's answer to `frame`, tagged under `key` (the server's own).
pub fn seal_answer(key: &PushKey, frame: &Frame, answer: Answer) -> [u8; ANSWER_LEN] {
    let mut out = [0u8; ANSWER_LEN];
    out[0] = answer as u8;
    let aad = answer_aad(frame, answer as u8);
    if let Ok(tag) = key.cipher().encrypt(XNonce::from_slice(&answer_nonce(frame)), Payload { msg: &[], aad: &aad }) {
        out[1..].copy_from_slice(&tag);
    }
    out
}

/// The answer, if its tag proves it was made for `frame` with `key`; else what it claims.
pub fn open_answer(key: &PushKey, frame: &Frame, bytes: &[u8; ANSWER_LEN]) -> Result<Answer, Option<Answer>> {
    let claimed = Answer::from_byte(bytes[0]);
    let aad = answer_aad(frame, bytes[0]);
    key.cipher()
        .decrypt(XNonce::from_slice(&answer_nonce(frame)), Payload { msg: &bytes[1..], aad: &aad })
        .ok()
        .and(claimed)
        .ok_or(claimed)
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
/// `key`, with a generation above the server's and at least [`now_generation`]; returns that
/// generation once the server proved that the config is in place.
pub async fn push(address: SocketAddr, key: &PushKey, config: &str, timeout: Duration) -> Result<u64, PushError> {
    let connect = tokio::time::timeout(timeout, TcpStream::connect(address))
        .await
        .map_err(|_| PushError::Connect(address, std::io::ErrorKind::TimedOut.into()))?;
    let mut conn = connect.map_err(|e| PushError::Connect(address, e))?;
    let greeted = async {
        let mut hello = [0u8; GREETING_LEN];
        conn.read_exact(&mut hello).await.map_err(|_| PushError::NoGreeting(address))?;
        if &hello[..GREETING.len()] != GREETING {
            return Err(PushError::Foreign(address, "another greeting"));
        }
        if hello[GREETING.len()] != VERSION {
            return Err(PushError::Foreign(address, "another push version"));
        }
        Ok(hello)
    };
    // A server at its connection limit closes at once; one still starting may not greet yet.
    let hello = tokio::time::timeout(timeout.min(GREETING_TIMEOUT), greeted)
        .await
        .map_err(|_| PushError::NoGreeting(address))??;
    let work = async {
        let protocol = |what: &str| PushError::Protocol(address, what.to_string());
        let current = u64::from_be_bytes(hello[GREETING.len() + 1..].try_into().unwrap_or_default());
        let generation = current.checked_add(1).ok_or_else(|| protocol("generation exhausted"))?.max(now_generation());
        let frame = Frame::seal(key, generation, config.as_bytes())?;
        conn.write_all(&frame.to_bytes()).await.map_err(|e| protocol(&format!("sending: {e}")))?;
        let mut answer = [0u8; ANSWER_LEN];
        conn.read_exact(&mut answer).await.map_err(|_| protocol("closed without an answer"))?;
        match open_answer(key, &frame, &answer) {
            Ok(Answer::Applied) => Ok(generation),
            Ok(other) => Err(PushError::Answered(address, other)),
            Err(Some(claimed)) => Err(PushError::Unproven(address, claimed)),
            Err(None) => Err(protocol("unknown answer")),
        }
    };
    tokio::time::timeout(timeout, work).await.map_err(|_| PushError::Timeout(address, timeout))?
}

/// Pushes `config` (the host's rendered `server.toml`, sealed with the key derived from
/// `server`'s Noise key) to the host at `ip`. `Ok(false)` only when the host answered that it
/// cannot take this push and only a new one can serve `server`, so the controller replaces it:
/// something else greets on the port (another service, or an exit server of another push
/// version), the host holds another Noise key (the Tunnel's Secret was re-created: its refusal
/// cannot carry our key's proof), or the config moves the control port. What a retry can still
/// fix is an error the controller retries with backoff, never a reason to buy a new host: no
/// connection, no greeting (busy or still starting), a timeout, an answer without proof.
/// A config the server finds invalid is an error too.
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
        Err(e @ PushError::Foreign(..)) => {
            tracing::warn!(provider, error = %e, "the exit server takes no configuration pushes of this version");
            Ok(false)
        }
        Err(
            e @ (PushError::Answered(_, Answer::Identity)
            | PushError::Unproven(_, Answer::Unauthenticated | Answer::Identity)),
        ) => {
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
mod tests;

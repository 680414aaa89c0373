//! The exit server's side of config pushes ([`providers::exit::push`] has the protocol and the
//! client): a running server takes a new `server.toml` from the operator, so a Service's port
//! change keeps the host and its address.
//!
//! A push is applied only if it opens with the key derived from this server's own Noise key, its
//! generation is above the one persisted beside the config (`<config>.generation`, so a replay is
//! refused even after a restart; a new server starts it at its start time in milliseconds, so a
//! push captured for an earlier host with the same keys is refused here too), rathole accepts the
//! new file, and the file keeps the control address and the Noise key (a push can change the
//! published ports, never who the server is or where clients find it). The file is replaced by a
//! rename, which rathole's watcher (and, on a VM, the firewall's path unit) sees as one change;
//! the answer, tagged for this push under the push key, is sent after that.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::options::write_private;
use anyhow::Context as _;
use providers::exit::push::{ANSWER_LEN, Answer, Frame, PushKey, greeting, now_generation, seal_answer};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, Semaphore};
use tracing::{info, warn};

/// How long a client has to send its frame after the greeting.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once; more are closed at once (pushes are rare, one per port change).
const MAX_CONNECTIONS: usize = 8;

/// What a push must keep, and where it goes.
pub struct Receiver {
    config: PathBuf,
    key: PushKey,
    bind_addr: String,
    private_key: String,
    /// One push applied at a time: the generation check and the writes are one step.
    apply: Mutex<()>,
}

impl Receiver {
    /// The receiver for the server running `config` (already parsed by rathole as `parsed`);
    /// `None` when the config has no Noise key to derive the push key from.
    pub fn new(config: &Path, parsed: &rathole::Config) -> anyhow::Result<Option<Self>> {
        let server = parsed.server.as_ref().context("not a server configuration")?;
        let Some(private_key) = server.transport.noise.as_ref().and_then(|n| n.local_private_key.as_deref()) else {
            return Ok(None);
        };
        let key = PushKey::derive(private_key).context("deriving the push key from the Noise key")?;
        let receiver = Receiver {
            config: config.to_path_buf(),
            key,
            bind_addr: server.bind_addr.clone(),
            private_key: private_key.to_string(),
            apply: Mutex::new(()),
        };
        if !receiver.generation_path().exists() {
            receiver.persist_generation(now_generation()).context("starting the push generation")?;
        }
        Ok(Some(receiver))
    }

    /// The push address: the control channel's address with `port`.
    pub fn address(&self, port: u16) -> anyhow::Result<SocketAddr> {
        let mut address: SocketAddr = self
            .bind_addr
            .parse()
            .with_context(|| format!("the control bind_addr {:?} is not ip:port", self.bind_addr))?;
        address.set_port(port);
        Ok(address)
    }

    fn generation_path(&self) -> PathBuf {
        suffixed(&self.config, ".generation")
    }

    /// Writes the generation atomically.
    fn persist_generation(&self, generation: u64) -> std::io::Result<()> {
        super::options::replace_private(&self.generation_path(), generation.to_string().as_bytes())
    }

    /// The last applied generation; the server's first start time (ms since the epoch) before
    /// the first push.
    pub fn generation(&self) -> std::io::Result<u64> {
        match std::fs::read_to_string(self.generation_path()) {
            Ok(text) => text.trim().parse().map_err(|_| std::io::Error::other("corrupt generation file")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Serves pushes on `listener` until the process ends.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        loop {
            let Ok((conn, peer)) = listener.accept().await else {
                // Out of file descriptors and the like: do not spin.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else { continue };
            let receiver = self.clone();
            tokio::spawn(async move {
                let answer = receiver.handle(conn).await;
                match answer {
                    Some(Answer::Applied) | None => {}
                    Some(refused) => warn!(%peer, answer = ?refused, "refused a configuration push"),
                }
                drop(slot);
            });
        }
    }

    /// One exchange; the answer sent, if it got that far.
    async fn handle(&self, mut conn: TcpStream) -> Option<Answer> {
        let current = self.generation().ok()?;
        conn.write_all(&greeting(current)).await.ok()?;
        let (answer, bytes) = match tokio::time::timeout(READ_TIMEOUT, Frame::read(&mut conn)).await {
            Ok(Ok(frame)) => {
                let answer = self.apply(&frame).await;
                (answer, seal_answer(&self.key, &frame, answer))
            }
            // No frame to tag the answer for: it carries no proof, and a client takes it as none.
            Ok(Err(_)) | Err(_) => (Answer::Malformed, [Answer::Malformed as u8; ANSWER_LEN]),
        };
        let _ = conn.write_all(&bytes).await;
        let _ = conn.shutdown().await;
        Some(answer)
    }

    /// Checks and applies one frame.
    pub async fn apply(&self, frame: &Frame) -> Answer {
        let Ok(config) = frame.open(&self.key) else { return Answer::Unauthenticated };
        let _one = self.apply.lock().await;
        match self.generation() {
            Ok(current) if frame.generation > current => {}
            Ok(_) => return Answer::Stale,
            Err(_) => return Answer::Failed,
        }
        let staged = suffixed(&self.config, ".push");
        if write_private(&staged, &config).is_err() {
            return Answer::Failed;
        }
        let answer = self.check(&staged).await;
        if answer != Answer::Applied {
            let _ = std::fs::remove_file(&staged);
            return answer;
        }
        // The generation first: a crash between the two writes refuses a replay of this push
        // rather than accepting it twice.
        let persisted = self.persist_generation(frame.generation).and_then(|()| std::fs::rename(&staged, &self.config));
        if persisted.is_err() {
            let _ = std::fs::remove_file(&staged);
            return Answer::Failed;
        }
        info!(generation = frame.generation, "applied a pushed tunnel configuration");
        Answer::Applied
    }

    /// Whether the staged file is a server config rathole accepts that keeps this server's
    /// control address and Noise key.
    async fn check(&self, staged: &Path) -> Answer {
        // The whole document: rathole's part and skyport's table ([`super::options`]).
        let Ok((parsed, _)) = super::options::load(staged).await else { return Answer::Refused };
        let Some(server) = parsed.server.as_ref().filter(|_| parsed.client.is_none()) else {
            return Answer::Refused;
        };
        let key = server.transport.noise.as_ref().and_then(|n| n.local_private_key.as_deref());
        if server.bind_addr != self.bind_addr || key != Some(self.private_key.as_str()) {
            return Answer::Identity;
        }
        // New ports must be free here, or the push would promise a service nobody can reach
        // ([`super::ports`]); the ones the running config has are held by this server already.
        let running = match super::options::load(&self.config).await {
            Ok((current, _)) => super::ports::bound(&current),
            Err(_) => return Answer::Failed,
        };
        let problems = super::ports::unbindable(&parsed, &running);
        if !problems.is_empty() {
            warn!(ports = %problems.join("; "), "refused a pushed configuration: cannot listen on its ports");
            return Answer::Refused;
        }
        Answer::Applied
    }
}

/// `path` with `suffix` appended to its file name (a sibling, so renames stay atomic).
fn suffixed(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(suffix);
    path.with_file_name(name)
}

/// Starts taking pushes on `port` next to the control channel of the server running `config`.
pub async fn listen(config: &Path, parsed: &rathole::Config, port: u16) -> anyhow::Result<()> {
    let Some(receiver) = Receiver::new(config, parsed)? else {
        warn!("the tunnel configuration has no Noise key: configuration pushes are off");
        return Ok(());
    };
    let address = receiver.address(port)?;
    let listener =
        TcpListener::bind(address).await.with_context(|| format!("cannot listen for pushes on {address}"))?;
    info!(%address, "taking configuration pushes");
    tokio::spawn(Arc::new(receiver).serve(listener));
    Ok(())
}

#[cfg(test)]
mod tests;

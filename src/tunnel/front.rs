//! The exit server's side of [`super::options`]: keeps the file rathole runs (`<config>.rathole`)
//! derived from `server.toml`, and skyport's own listeners ([`super::proxy`]) on the public
//! ports of the services that asked for a PROXY header, for as long as the server runs. A push
//! replaces `server.toml`; the next look at it (every [`POLL`]) derives rathole's file again,
//! which rathole's own watcher reloads, and moves the listeners.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use providers::ProxyProtocol;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::options::{Document, Front, split};
use super::ports;

/// How often `server.toml` is looked at.
const POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// What rathole listens on and which of those addresses sit behind a PROXY listener, for the
/// local provider's forward relay ([`super::forward`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layout {
    /// rathole's services, (type, bind address), as [`ports::bound`] lists them.
    pub services: ports::Ports,
    /// By rathole's loopback address: the public port and the header.
    pub fronts: BTreeMap<SocketAddr, (u16, ProxyProtocol)>,
}

/// The derived file next to `config`.
pub fn rathole_path(config: &Path) -> PathBuf {
    let mut name = config.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".rathole");
    config.with_file_name(name)
}

/// Derives rathole's file from `config` (checked already), binds the PROXY listeners, and keeps
/// both in step with `config`. Returns the file to run rathole on and the layout as it changes.
pub async fn start(config: &Path) -> anyhow::Result<(PathBuf, watch::Receiver<Layout>)> {
    let derived = rathole_path(config);
    let text = std::fs::read(config).with_context(|| format!("reading {}", config.display()))?;
    let mut server = Server { derived: derived.clone(), ..Server::default() };
    let document = split(&String::from_utf8_lossy(&text))?;
    let layout = server.apply(&document)?;
    if let Some(front) = server.missing.iter().next() {
        anyhow::bail!("cannot listen on {} for a PROXY protocol service", front.public);
    }
    let (publish, layout_rx) = watch::channel(layout);
    tokio::spawn(server.follow(config.to_path_buf(), text, publish));
    Ok((derived, layout_rx))
}

#[derive(Default)]
struct Server {
    derived: PathBuf,
    /// rathole's loopback address of each proxied service, by name.
    internal: BTreeMap<String, SocketAddr>,
    running: BTreeMap<Front, JoinHandle<()>>,
    /// Listeners not bound yet, and those of them already warned about.
    missing: BTreeSet<Front>,
    warned: BTreeSet<Front>,
}

impl Server {
    /// Writes rathole's file for `document` and moves the listeners to it.
    fn apply(&mut self, document: &Document) -> anyhow::Result<Layout> {
        let (text, fronts) = document.derive(&mut self.internal)?;
        let want: BTreeSet<Front> = fronts.into_iter().collect();
        // Listeners that go first, so rathole can take their ports once it reloads.
        self.running.retain(|front, task| {
            let keep = want.contains(front) && !task.is_finished();
            if !keep {
                task.abort();
            }
            keep
        });
        super::options::replace_private(&self.derived, text.as_bytes())
            .with_context(|| format!("writing {}", self.derived.display()))?;
        self.missing = want.iter().filter(|f| !self.running.contains_key(f)).copied().collect();
        self.bind_missing();
        let parsed: rathole::Config = toml::from_str(&text).context("reading the derived configuration")?;
        let fronts = want.iter().map(|f| (f.internal, (f.public.port(), f.proxy))).collect();
        Ok(Layout { services: ports::bound(&parsed), fronts })
    }

    /// Binds what is not bound yet; a port rathole still holds (a service that just asked for
    /// the header) is tried again at the next look.
    fn bind_missing(&mut self) {
        let missing = std::mem::take(&mut self.missing);
        for front in missing {
            let bound = std::net::TcpListener::bind(front.public)
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .and_then(TcpListener::from_std);
            match bound {
                Ok(listener) => {
                    info!(public = %front.public, proxy = front.proxy.as_str(), "sending the PROXY protocol");
                    let task = tokio::spawn(super::proxy::serve(listener, front.internal, Some(front.proxy)));
                    self.warned.remove(&front);
                    self.running.insert(front, task);
                }
                Err(e) => {
                    if self.warned.insert(front) {
                        warn!(public = %front.public, "cannot listen for a PROXY protocol service yet: {e}");
                    }
                    self.missing.insert(front);
                }
            }
        }
    }

    /// Re-derives whenever `config` changes from `seen`; a file that does not split is said
    /// once and leaves everything as it is.
    async fn follow(mut self, config: PathBuf, mut seen: Vec<u8>, publish: watch::Sender<Layout>) {
        let mut refused: Option<String> = None;
        loop {
            tokio::time::sleep(POLL).await;
            self.bind_missing();
            let Ok(now) = std::fs::read(&config) else { continue };
            if now == seen {
                continue;
            }
            match split(&String::from_utf8_lossy(&now)).and_then(|d| self.apply(&d)) {
                Ok(layout) => {
                    refused = None;
                    publish.send_replace(layout);
                }
                Err(e) => {
                    let e = format!("{e:#}");
                    if refused.as_ref() != Some(&e) {
                        warn!(file = %config.display(), "cannot follow the tunnel configuration: {e}");
                        refused = Some(e);
                    }
                }
            }
            seen = now;
        }
    }
}

//! The `local` host provider, for development, the playground and the data-path tests: an "exit
//! server" is a real `skyport tunnel server` process (the operator's own binary, running rathole)
//! on this machine, bound to its own loopback address (127.77.x.y), so several hosts can expose
//! the same port side by side. It starts the server directly instead of through cloud-init; the
//! cloud-init path is proven by tests/guest.rs, which boots a real guest with the same user data
//! a cloud VM gets.
//!
//! Another range that the machine routes locally (`ip route add local 10.204.0.0/24 dev lo`)
//! makes the servers reachable from other network namespaces too: the test node's Pods, with the
//! operator on the host's network.
//!
//! Why loopback addresses and not network namespaces: creating a namespace needs
//! `CAP_SYS_ADMIN`, which an operator process (and CI) should not have, while Linux routes all
//! of 127.0.0.0/8 to `lo` without any privilege. Traffic still crosses a real TCP/UDP hop
//! between distinct addresses, through the real tunnel binaries.
//!
//! State lives on disk, one directory per host under the state directory — `host.json` (id,
//! name, address, tags, creation time), `server.toml` (0600), `server.log`, `pid` — so hosts
//! outlive an operator restart as VMs do, and are found again by tag. The server process runs in
//! its own process group; a process that died (or was killed) reads as [`HostState::Stopped`],
//! which the Tunnel controller replaces. [`HostProvider::reconfigure`] pushes the new config to
//! the server's push port ([`crate::exit::push`]), exactly as for a cloud VM; the server replaces its
//! `server.toml`, rathole reloads it, and the host keeps its address.

mod addresses;
pub mod forward_file;
mod process;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use process::{render, signal_group};

use crate::error::HostError;
use crate::exit::userdata::ExitServer;
use crate::host_files::HostFiles;
use crate::hosts::{
    AddressBinding, Capabilities, Host, HostProvider, HostRequest, HostState, MovedAddress, PoolAddresses, Spread,
    TAG_TUNNEL_SLOT, fnv1a32,
};
use crate::limiter::Limiter;
use crate::reservations::Booked;

const PROVIDER: &str = "local";
/// What rathole (built with `hot-reload`) logs once its config watcher is in place. Until then a
/// rewritten `server.toml` would go unnoticed, so `create` waits for it.
const WATCHING: &str = "Start watching the config";

/// How long a moved address waits for its new holder to listen on it.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(5);
/// How long `delete` gives the server to exit on SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(2);

/// Settings of the local provider.
#[derive(Debug, Clone)]
pub struct LocalSettings {
    /// One folder per exit server is kept here.
    pub state_dir: PathBuf,
    /// The skyport binary whose `tunnel server` subcommand the exit servers run (the operator
    /// passes its own executable).
    pub exe: PathBuf,
    /// The first address handed out; with `last_address`, a range of addresses local to this
    /// machine: inside 127.0.0.0/8, or routed locally (`ip route add local <range> dev lo`) for
    /// clients in other network namespaces, such as Pods.
    pub first_address: Ipv4Addr,
    /// The last address handed out.
    pub last_address: Ipv4Addr,
    /// How long `create` waits for the server to listen and watch its config.
    pub start_timeout: Duration,
}

impl LocalSettings {
    /// Addresses 127.77.0.1 to 127.77.255.254, a 10 s start timeout.
    pub fn new(state_dir: impl Into<PathBuf>, exe: impl Into<PathBuf>) -> Self {
        LocalSettings {
            state_dir: state_dir.into(),
            exe: exe.into(),
            first_address: Ipv4Addr::new(127, 77, 0, 1),
            last_address: Ipv4Addr::new(127, 77, 255, 254),
            start_timeout: Duration::from_secs(10),
        }
    }
}

/// `host.json`.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    id: String,
    name: String,
    address: Ipv4Addr,
    tags: BTreeMap<String, String>,
    /// Seconds since the Unix epoch; 0 in records written before it was kept.
    #[serde(default)]
    created_unix: u64,
    /// The reserved address this host's server forwards to its own service ports, once one was
    /// moved onto it ([`HostProvider::assign_address`] on a running host); everything stays bound
    /// to `address`, where the host's client keeps dialing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    serving: Option<Ipv4Addr>,
}

/// Exit servers as local `skyport tunnel server` processes.
pub struct LocalProvider {
    settings: LocalSettings,
    limiter: Limiter,
    /// Serialises address allocation, directory creation and config rewrites.
    lock: Mutex<()>,
}

impl LocalProvider {
    /// A provider keeping its hosts under `settings.state_dir` (created if missing).
    pub fn new(settings: LocalSettings) -> Result<Self, HostError> {
        if u32::from(settings.first_address) > u32::from(settings.last_address) {
            return Err(HostError::Invalid {
                provider: PROVIDER,
                message: format!(
                    "the address range {}..{} must be ascending",
                    settings.first_address, settings.last_address
                ),
            });
        }
        std::fs::create_dir_all(&settings.state_dir)
            .map_err(|e| unavailable(format!("cannot create state directory {}: {e}", settings.state_dir.display())))?;
        // Local processes have no quota to respect; the limiter is there so calls are counted
        // like every other adapter's.
        let plenty = NonZeroU32::new(1000).unwrap_or(NonZeroU32::MIN);
        let limiter = Limiter::new(plenty, plenty);
        Ok(LocalProvider { settings, limiter, lock: Mutex::new(()) })
    }

    /// The folder of host `id` (its `pid` file, log and config), for tests and debugging.
    pub fn host_dir(&self, id: &str) -> PathBuf {
        self.settings.state_dir.join(id)
    }

    fn host(&self, record: &Record) -> Host {
        let state = if self.alive(&record.id).is_some() { HostState::Running } else { HostState::Stopped };
        Host {
            id: record.id.clone(),
            name: record.name.clone(),
            public_ipv4: Some(record.serving.unwrap_or(record.address).to_string()),
            state,
            tags: record.tags.clone(),
            placement: None,
        }
    }

    fn files(&self) -> HostFiles<Record> {
        HostFiles::new(self.settings.state_dir.clone(), PROVIDER, valid_id)
    }

    /// The next free address after the one handed out last (kept in `last-address`), so a
    /// replaced host gets a new address, as a cloud VM would (the Tunnel tests rely on it).
    /// Without a marker the search starts at a point derived from the state directory, so
    /// independent directories (parallel tests, the playground) start far apart; an address
    /// whose control port someone already listens on (another directory's host, a leftover
    /// process) is skipped.
    fn allocate(&self, taken: &[Ipv4Addr], control_port: u16) -> Result<Ipv4Addr, HostError> {
        let first = u32::from(self.settings.first_address);
        let size = u32::from(self.settings.last_address) - first + 1;
        let marker = self.settings.state_dir.join("last-address");
        let last = std::fs::read_to_string(&marker)
            .ok()
            .and_then(|s| s.trim().parse::<Ipv4Addr>().ok())
            .map(u32::from)
            .filter(|a| (first..first + size).contains(a))
            .map(|a| a - first)
            // Spreads state directories over the range, so two providers rarely start on the
            // same address.
            .unwrap_or_else(|| fnv1a32(self.settings.state_dir.to_string_lossy().as_bytes()) % size);
        for step in 1..=size {
            let address = Ipv4Addr::from(first + (last + step) % size);
            if taken.contains(&address) {
                continue;
            }
            match std::net::TcpListener::bind((address, control_port)) {
                Ok(probe) => drop(probe),
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
                Err(e) => {
                    return Err(unavailable(format!(
                        "cannot bind {address}:{control_port} ({e}); the local provider's addresses must be \
                         local to this machine: 127.0.0.0/8, or a range routed with `ip route add local <range> dev lo`"
                    )));
                }
            }
            // Best effort: a lost marker only means the next search starts elsewhere.
            let _ = std::fs::write(&marker, address.to_string());
            return Ok(address);
        }
        Err(HostError::Quota { provider: PROVIDER, message: format!("all {size} local addresses are in use") })
    }

    /// Addresses of every host and every reservation: never handed out again.
    fn taken(&self) -> Result<Vec<Ipv4Addr>, HostError> {
        let mut taken: Vec<Ipv4Addr> = self.files().all()?.iter().map(|r| r.address).collect();
        taken.extend(self.reserved()?.iter().map(|r| r.ip));
        Ok(taken)
    }
}

fn unavailable(message: String) -> HostError {
    HostError::Unavailable { provider: PROVIDER, message }
}

fn valid_id(id: &str) -> bool {
    id.starts_with("local-") && id.len() <= 40 && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

#[async_trait]
impl HostProvider for LocalProvider {
    async fn create(&self, request: &HostRequest) -> Result<Host, HostError> {
        self.limiter.acquire("CreateHost").await;
        let result = async {
            // Refuse a config rathole would reject before anything is allocated or created.
            render(&request.server, self.settings.first_address)?;
            let _guard = self.lock.lock().await;
            // The Tunnel's reserved address if it has a free one, so a replacement keeps it; a
            // server of a highly available pair gets its own, the reserved one is moved onto it.
            let reserved = match request.tags.contains_key(TAG_TUNNEL_SLOT) {
                true => None,
                false => self.free_address(request.address.as_deref())?,
            };
            let address = match reserved {
                Some(reserved) => reserved,
                None => self.allocate(&self.taken()?, request.server.control_port)?,
            };
            let id = format!("local-{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff);
            let created_unix = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
            let record = Record {
                id: id.clone(),
                name: request.name.clone(),
                address,
                tags: request.tags.clone(),
                created_unix,
                serving: None,
            };
            let dir = self.host_dir(&id);
            let mut child = None;
            match self.start(&dir, &record, &request.server, &mut child).await {
                Ok(()) => {
                    if let Some(mut child) = child {
                        // Reap it when it ends, so a killed server does not linger as a zombie.
                        tokio::spawn(async move {
                            let _ = child.wait().await;
                        });
                    }
                    Ok(self.host(&record))
                }
                Err(e) => {
                    // Leave nothing behind: no half-made host for list_by_tag, no stray process.
                    if let Some(mut child) = child {
                        let _ = child.kill().await;
                    }
                    if let Err(rm) = std::fs::remove_dir_all(&dir)
                        && rm.kind() != std::io::ErrorKind::NotFound
                    {
                        tracing::warn!(host = %id, error = %rm, "cannot remove a local host that failed to start");
                    }
                    Err(e)
                }
            }
        }
        .await;
        self.limiter.count_result("CreateHost", &result);
        result
    }

    async fn get(&self, id: &str) -> Result<Option<Host>, HostError> {
        self.limiter.acquire("GetHost").await;
        let result = self.files().read(id).map(|r| r.map(|r| self.host(&r)));
        self.limiter.count_result("GetHost", &result);
        result
    }

    async fn delete(&self, id: &str) -> Result<(), HostError> {
        self.limiter.acquire("DeleteHost").await;
        let result = async {
            if !valid_id(id) || !self.host_dir(id).exists() {
                return Ok(());
            }
            if let Some(pid) = self.alive(id) {
                signal_group(pid, Signal::SIGTERM)?;
                let deadline = tokio::time::Instant::now() + TERM_GRACE;
                while self.alive(id).is_some() && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                if self.alive(id).is_some() {
                    signal_group(pid, Signal::SIGKILL)?;
                }
            }
            match std::fs::remove_dir_all(self.host_dir(id)) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(unavailable(format!("cannot remove {}: {e}", self.host_dir(id).display()))),
            }
        }
        .await;
        self.limiter.count_result("DeleteHost", &result);
        result
    }

    async fn list_by_tag(&self, key: &str, value: &str) -> Result<Vec<Host>, HostError> {
        self.limiter.acquire("ListHosts").await;
        let result = self.files().all().map(|records| {
            records
                .iter()
                .filter(|r| r.tags.get(key).map(String::as_str) == Some(value))
                .map(|r| self.host(r))
                .collect()
        });
        self.limiter.count_result("ListHosts", &result);
        result
    }

    async fn reconfigure(&self, id: &str, server: &ExitServer) -> Result<bool, HostError> {
        self.limiter.acquire("ReconfigureHost").await;
        let result = async {
            // Two pushes to one host would race for the next generation (the loser is refused as
            // stale); one at a time.
            let _guard = self.lock.lock().await;
            let record = self
                .files()
                .read(id)?
                .ok_or_else(|| HostError::NotFound { provider: PROVIDER, message: format!("host {id}") })?;
            // Through the server's push port, as on a cloud VM, so the tests and the bench
            // exercise the mechanism cloud hosts rely on.
            let config = render(server, record.address)?;
            crate::exit::push::reconfigure_host(PROVIDER, &record.address.to_string(), server, &config).await
        }
        .await;
        self.limiter.count_result("ReconfigureHost", &result);
        result
    }

    fn booked(&self) -> Option<&dyn Booked> {
        Some(self)
    }

    /// Moves the reserved address between running hosts ([`Self::move_address`]).
    async fn assign_address(&self, id: &str, host_id: &str) -> Result<(), HostError> {
        self.limiter.acquire("AssignAddress").await;
        let result = self.move_address(id, host_id).await;
        self.limiter.count_result("AssignAddress", &result);
        result
    }

    /// Reads are of files and processes on this machine; exit servers run the operator's own
    /// executable (nothing is downloaded); addresses go onto a host at creation, except a pair's:
    /// a running server forwards the reserved address, which the machine routes locally, to its
    /// own service ports, the local analogue of a cloud re-pointing an address at another VM.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            reads_are_free: true,
            fetches_artifact: false,
            address_binding: AddressBinding::AtCreate,
            moves_addresses: true,
            moved_address: MovedAddress::Translated,
            // Local exit servers run on the operator's machine, where skyport sets up no firewall.
            host_enforces_source_ranges: false,
            // Any address of its book binds on this machine as it is.
            pool_addresses: PoolAddresses::Bound,
            spread: Spread::No("both exit servers run on the operator's machine (local provider)"),
        }
    }

    fn name(&self) -> &'static str {
        PROVIDER
    }

    fn limiter(&self) -> &Limiter {
        &self.limiter
    }
}

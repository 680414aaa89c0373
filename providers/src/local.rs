//! The `local` host provider, for development, the playground and the data-path tests: an "exit
//! server" is a real `rathole --server` process on this machine, bound to its own loopback
//! address (127.77.x.y), so several hosts can expose the same port side by side.
//!
//! Why loopback addresses and not network namespaces: creating a namespace needs
//! `CAP_SYS_ADMIN`, which an operator process (and CI) should not have, while Linux routes all
//! of 127.0.0.0/8 to `lo` without any privilege. Traffic still crosses a real TCP/UDP hop
//! between distinct addresses, through the real tunnel binaries.
//!
//! State lives on disk, one directory per host under the state directory — `host.json` (id,
//! name, address, tags), `server.toml` (0600), `rathole.log`, `pid` — so hosts outlive an
//! operator restart as VMs do, and are found again by tag. The server process runs in its own
//! process group; a process that died (or was killed) reads as [`HostState::Stopped`], which the
//! Tunnel controller replaces. rathole reloads `server.toml` when it changes, so
//! [`HostProvider::reconfigure`] rewrites the file and the host keeps its address.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::error::HostError;
use crate::hosts::{Host, HostProvider, HostRequest, HostState};
use crate::limiter::Limiter;
use crate::userdata::{ExitServer, render_server_toml_on};

const PROVIDER: &str = "local";

/// Settings of the local provider.
#[derive(Debug, Clone)]
pub struct LocalSettings {
    /// One folder per exit server is kept here.
    pub state_dir: PathBuf,
    /// The rathole binary.
    pub rathole: PathBuf,
    /// The third octet of the addresses handed out: 127.77.`x`.y (hosts of one state directory
    /// never share an address; distinct directories should use distinct blocks or accept that
    /// their hosts bind the same address).
    pub address_block: u8,
    /// How long `create` waits for the server's control port to accept connections.
    pub start_timeout: Duration,
}

impl LocalSettings {
    pub fn new(state_dir: impl Into<PathBuf>, rathole: impl Into<PathBuf>) -> Self {
        let state_dir = state_dir.into();
        // Spread independent state directories (one per test, the playground) over blocks.
        let block = state_dir.to_string_lossy().bytes().fold(0u8, |h, b| h.wrapping_mul(31).wrapping_add(b));
        LocalSettings {
            state_dir,
            rathole: rathole.into(),
            address_block: block,
            start_timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Record {
    id: String,
    name: String,
    address: Ipv4Addr,
    tags: BTreeMap<String, String>,
}

/// Exit servers as local rathole processes.
pub struct LocalProvider {
    settings: LocalSettings,
    limiter: Limiter,
    /// Serialises address allocation and directory creation.
    lock: Mutex<()>,
}

impl LocalProvider {
    pub fn new(settings: LocalSettings) -> Result<Self, HostError> {
        std::fs::create_dir_all(&settings.state_dir)
            .map_err(|e| unavailable(format!("cannot create state directory {}: {e}", settings.state_dir.display())))?;
        // Local processes: no quota to respect, the limiter only counts.
        let plenty = NonZeroU32::new(1000).unwrap_or(NonZeroU32::MIN);
        let limiter = Limiter::new(plenty, plenty);
        Ok(LocalProvider { settings, limiter, lock: Mutex::new(()) })
    }

    /// The folder of host `id` (its `pid` file, log and config), for tests and debugging.
    pub fn host_dir(&self, id: &str) -> PathBuf {
        self.settings.state_dir.join(id)
    }

    fn read_record(&self, id: &str) -> Result<Option<Record>, HostError> {
        if !valid_id(id) {
            return Ok(None);
        }
        let path = self.host_dir(id).join("host.json");
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| unavailable(format!("corrupt {}: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(unavailable(format!("cannot read {}: {e}", path.display()))),
        }
    }

    fn host(&self, record: &Record) -> Host {
        let state = if self.alive(&record.id).is_some() { HostState::Running } else { HostState::Stopped };
        Host {
            id: record.id.clone(),
            name: record.name.clone(),
            public_ipv4: Some(record.address.to_string()),
            state,
            tags: record.tags.clone(),
        }
    }

    /// The server's pid if it runs: alive, and its command line names this host's config (a
    /// recycled pid belongs to some other program).
    fn alive(&self, id: &str) -> Option<i32> {
        let dir = self.host_dir(id);
        let pid: i32 = std::fs::read_to_string(dir.join("pid")).ok()?.trim().parse().ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let config = dir.join("server.toml");
        let ours = String::from_utf8_lossy(&cmdline).contains(&*config.to_string_lossy());
        (ours && running(pid)).then_some(pid)
    }

    fn records(&self) -> Result<Vec<Record>, HostError> {
        let entries = std::fs::read_dir(&self.settings.state_dir)
            .map_err(|e| unavailable(format!("cannot list {}: {e}", self.settings.state_dir.display())))?;
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let id = entry.file_name().to_string_lossy().into_owned();
            match self.read_record(&id) {
                Ok(Some(r)) => out.push(r),
                Ok(None) => {}
                Err(e) => tracing::warn!(host = %id, error = %e, "skipping an unreadable local host"),
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// The next free address after the one handed out last (kept in `last-address`), so a
    /// replaced host gets a new address, as a cloud VM would.
    fn allocate(&self, taken: &[Record]) -> Result<Ipv4Addr, HostError> {
        let marker = self.settings.state_dir.join("last-address");
        let last: u8 = std::fs::read_to_string(&marker).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(1);
        let address = (1..=253u16)
            .map(|step| 2 + ((u16::from(last.max(2)) - 2 + step) % 253) as u8)
            .map(|octet| Ipv4Addr::new(127, 77, self.settings.address_block, octet))
            .find(|a| !taken.iter().any(|r| r.address == *a))
            .ok_or_else(|| HostError::Quota {
                provider: PROVIDER,
                message: "all 253 local addresses are in use".into(),
            })?;
        let _ = std::fs::write(&marker, address.octets()[3].to_string());
        Ok(address)
    }

    fn write_config(&self, dir: &Path, server: &ExitServer, address: Ipv4Addr) -> Result<(), HostError> {
        let text = render(server, address)?;
        let tmp = dir.join("server.toml.tmp");
        write_private(&tmp, &text).map_err(|e| unavailable(format!("cannot write {}: {e}", tmp.display())))?;
        // A rename is one event for rathole's watcher: it never reads a half-written file.
        std::fs::rename(&tmp, dir.join("server.toml"))
            .map_err(|e| unavailable(format!("cannot replace server.toml: {e}")))
    }

    fn spawn(&self, dir: &Path) -> Result<u32, HostError> {
        let log = std::fs::File::create(dir.join("rathole.log")).map_err(|e| unavailable(format!("log file: {e}")))?;
        let err_log = log.try_clone().map_err(|e| unavailable(format!("log file: {e}")))?;
        let mut child = tokio::process::Command::new(&self.settings.rathole)
            .arg("--server")
            .arg(dir.join("server.toml"))
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(err_log)
            // Its own process group: it outlives an operator restart, as a VM would.
            .process_group(0)
            .spawn()
            .map_err(|e| unavailable(format!("cannot start {}: {e}", self.settings.rathole.display())))?;
        let pid = child.id().ok_or_else(|| unavailable("the exit server exited at once".into()))?;
        // Reap it when it ends, so a killed server does not linger as a zombie.
        tokio::spawn(async move {
            let _ = child.wait().await;
        });
        Ok(pid)
    }
}

impl LocalProvider {
    fn finish<T>(&self, operation: &'static str, result: &Result<T, HostError>) {
        let outcome = match result {
            Ok(_) => crate::limiter::SUCCESS,
            Err(e) => e.label(),
        };
        self.limiter.counters.record_outcome(operation, outcome);
    }
}

fn render(server: &ExitServer, address: Ipv4Addr) -> Result<String, HostError> {
    render_server_toml_on(server, &address.to_string())
        .map_err(|e| HostError::Invalid { provider: PROVIDER, message: e.to_string() })
}

/// Whether process `pid` exists and has not exited (a zombie awaiting its reaper has).
fn running(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // The state is the field after the parenthesised command name; Z = exited, not yet reaped.
    !stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z'))
}

fn unavailable(message: String) -> HostError {
    HostError::Unavailable { provider: PROVIDER, message }
}

fn valid_id(id: &str) -> bool {
    id.starts_with("local-") && id.len() <= 40 && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    f.write_all(text.as_bytes())
}

/// Sends `signal` (`TERM`, `KILL`) to the process group led by `pid`, with kill(1): the
/// workspace forbids `unsafe`, and this is a development provider.
async fn signal_group(pid: i32, signal: &str) {
    let _ = tokio::process::Command::new("kill")
        .args(["-s", signal, "--", &format!("-{pid}")])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await;
}

#[async_trait]
impl HostProvider for LocalProvider {
    async fn create(&self, request: &HostRequest) -> Result<Host, HostError> {
        self.limiter.acquire("CreateHost").await;
        let result = async {
            let _guard = self.lock.lock().await;
            let taken = self.records()?;
            let address = self.allocate(&taken)?;
            // Refuse a config rathole would reject before anything is created.
            render(&request.server, address)?;
            let id = format!("local-{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff);
            let dir = self.host_dir(&id);
            std::fs::create_dir_all(&dir).map_err(|e| unavailable(format!("cannot create {}: {e}", dir.display())))?;
            let record = Record { id: id.clone(), name: request.name.clone(), address, tags: request.tags.clone() };
            self.write_config(&dir, &request.server, address)?;
            let json = serde_json::to_vec_pretty(&record).map_err(|e| unavailable(e.to_string()))?;
            std::fs::write(dir.join("host.json"), json).map_err(|e| unavailable(format!("host.json: {e}")))?;
            let pid = self.spawn(&dir)?;
            std::fs::write(dir.join("pid"), pid.to_string()).map_err(|e| unavailable(format!("pid file: {e}")))?;
            // Return only once the control port answers: a client dialing at once must not fail.
            let deadline = tokio::time::Instant::now() + self.settings.start_timeout;
            loop {
                if tokio::net::TcpStream::connect((address, request.server.control_port)).await.is_ok() {
                    break;
                }
                // Not `alive`: until exec, the child's command line is still ours.
                if tokio::time::Instant::now() > deadline || !running(pid as i32) {
                    let log = std::fs::read_to_string(dir.join("rathole.log")).unwrap_or_default();
                    return Err(unavailable(format!(
                        "exit server did not listen on {address}:{}: {}",
                        request.server.control_port,
                        log.lines().last().unwrap_or("no output")
                    )));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(self.host(&record))
        }
        .await;
        self.finish("CreateHost", &result);
        result
    }

    async fn get(&self, id: &str) -> Result<Option<Host>, HostError> {
        self.limiter.acquire("GetHost").await;
        let result = self.read_record(id).map(|r| r.map(|r| self.host(&r)));
        self.finish("GetHost", &result);
        result
    }

    async fn delete(&self, id: &str) -> Result<(), HostError> {
        self.limiter.acquire("DeleteHost").await;
        let result = async {
            if self.read_record(id)?.is_none() {
                return Ok(());
            }
            if let Some(pid) = self.alive(id) {
                signal_group(pid, "TERM").await;
                let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
                while self.alive(id).is_some() && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                if self.alive(id).is_some() {
                    signal_group(pid, "KILL").await;
                }
            }
            match std::fs::remove_dir_all(self.host_dir(id)) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(unavailable(format!("cannot remove {}: {e}", self.host_dir(id).display()))),
            }
        }
        .await;
        self.finish("DeleteHost", &result);
        result
    }

    async fn list_by_tag(&self, key: &str, value: &str) -> Result<Vec<Host>, HostError> {
        self.limiter.acquire("ListHosts").await;
        let result = self.records().map(|records| {
            records
                .iter()
                .filter(|r| r.tags.get(key).map(String::as_str) == Some(value))
                .map(|r| self.host(r))
                .collect()
        });
        self.finish("ListHosts", &result);
        result
    }

    async fn reconfigure(&self, id: &str, server: &ExitServer) -> Result<bool, HostError> {
        self.limiter.acquire("ReconfigureHost").await;
        let result = async {
            let record = self
                .read_record(id)?
                .ok_or_else(|| HostError::NotFound { provider: PROVIDER, message: format!("host {id}") })?;
            self.write_config(&self.host_dir(id), server, record.address)?;
            Ok(true)
        }
        .await;
        self.finish("ReconfigureHost", &result);
        result
    }

    fn name(&self) -> &'static str {
        PROVIDER
    }

    fn limiter(&self) -> &Limiter {
        &self.limiter
    }
}

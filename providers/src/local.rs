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
//! name, address, tags, creation time), `server.toml` (0600), `rathole.log`, `pid` — so hosts
//! outlive an operator restart as VMs do, and are found again by tag. The server process runs in
//! its own process group; a process that died (or was killed) reads as [`HostState::Stopped`],
//! which the Tunnel controller replaces. rathole reloads `server.toml` when it changes, so
//! [`HostProvider::reconfigure`] rewrites the file and the host keeps its address.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::error::HostError;
use crate::hosts::{Host, HostProvider, HostRequest, HostState};
use crate::limiter::Limiter;
use crate::userdata::{ExitServer, render_server_toml_on};

const PROVIDER: &str = "local";
/// What rathole (built with `hot-reload`) logs once its config watcher is in place. Until then a
/// rewritten `server.toml` would go unnoticed, so `create` waits for it.
const WATCHING: &str = "Start watching the config";
/// How long `delete` gives the server to exit on SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(2);

/// Settings of the local provider.
#[derive(Debug, Clone)]
pub struct LocalSettings {
    /// One folder per exit server is kept here.
    pub state_dir: PathBuf,
    /// The rathole binary (built with the `server`, `noise` and `hot-reload` features).
    pub rathole: PathBuf,
    /// The first address handed out; with `last_address`, a range inside 127.0.0.0/8.
    pub first_address: Ipv4Addr,
    /// The last address handed out.
    pub last_address: Ipv4Addr,
    /// How long `create` waits for the server to listen and watch its config.
    pub start_timeout: Duration,
}

impl LocalSettings {
    /// Addresses 127.77.0.1 to 127.77.255.254, a 10 s start timeout.
    pub fn new(state_dir: impl Into<PathBuf>, rathole: impl Into<PathBuf>) -> Self {
        LocalSettings {
            state_dir: state_dir.into(),
            rathole: rathole.into(),
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
}

/// Exit servers as local rathole processes.
pub struct LocalProvider {
    settings: LocalSettings,
    limiter: Limiter,
    /// Serialises address allocation, directory creation and config rewrites.
    lock: Mutex<()>,
}

impl LocalProvider {
    /// A provider keeping its hosts under `settings.state_dir` (created if missing).
    pub fn new(settings: LocalSettings) -> Result<Self, HostError> {
        if u32::from(settings.first_address) > u32::from(settings.last_address)
            || !settings.first_address.is_loopback()
            || !settings.last_address.is_loopback()
        {
            return Err(HostError::Invalid {
                provider: PROVIDER,
                message: format!(
                    "the address range {}..{} must be ascending and inside 127.0.0.0/8",
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
    /// replaced host gets a new address, as a cloud VM would (the Tunnel tests rely on it).
    /// Without a marker the search starts at a point derived from the state directory, so
    /// independent directories (parallel tests, the playground) start far apart; an address
    /// whose control port someone already listens on (another directory's host, a leftover
    /// process) is skipped.
    fn allocate(&self, taken: &[Record], control_port: u16) -> Result<Ipv4Addr, HostError> {
        let first = u32::from(self.settings.first_address);
        let size = u32::from(self.settings.last_address) - first + 1;
        let marker = self.settings.state_dir.join("last-address");
        let last = std::fs::read_to_string(&marker)
            .ok()
            .and_then(|s| s.trim().parse::<Ipv4Addr>().ok())
            .map(u32::from)
            .filter(|a| (first..first + size).contains(a))
            .map(|a| a - first)
            .unwrap_or_else(|| fnv1a32(self.settings.state_dir.to_string_lossy().as_bytes()) % size);
        for step in 1..=size {
            let address = Ipv4Addr::from(first + (last + step) % size);
            if taken.iter().any(|r| r.address == address) {
                continue;
            }
            match std::net::TcpListener::bind((address, control_port)) {
                Ok(probe) => drop(probe),
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
                Err(e) => {
                    return Err(unavailable(format!(
                        "cannot bind {address}:{control_port} ({e}); the local provider needs all of 127.0.0.0/8 \
                         on the loopback interface, as Linux has"
                    )));
                }
            }
            // Best effort: a lost marker only means the next search starts elsewhere.
            let _ = std::fs::write(&marker, address.to_string());
            return Ok(address);
        }
        Err(HostError::Quota { provider: PROVIDER, message: format!("all {size} local addresses are in use") })
    }

    fn write_config(&self, dir: &Path, server: &ExitServer, address: Ipv4Addr) -> Result<(), HostError> {
        let text = render(server, address)?;
        let tmp = dir.join("server.toml.tmp");
        write_private(&tmp, &text).map_err(|e| unavailable(format!("cannot write {}: {e}", tmp.display())))?;
        // A rename is one event for rathole's watcher: it never reads a half-written file.
        std::fs::rename(&tmp, dir.join("server.toml"))
            .map_err(|e| unavailable(format!("cannot replace server.toml: {e}")))
    }

    fn spawn(&self, dir: &Path) -> Result<tokio::process::Child, HostError> {
        let log = std::fs::File::create(dir.join("rathole.log")).map_err(|e| unavailable(format!("log file: {e}")))?;
        let err_log = log.try_clone().map_err(|e| unavailable(format!("log file: {e}")))?;
        tokio::process::Command::new(&self.settings.rathole)
            .arg("--server")
            .arg(dir.join("server.toml"))
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(err_log)
            // Its own process group: it outlives an operator restart, as a VM would.
            .process_group(0)
            .spawn()
            .map_err(|e| unavailable(format!("cannot start {}: {e}", self.settings.rathole.display())))
    }

    /// Writes the host's folder and starts its server; on failure the caller removes both.
    async fn start(
        &self,
        dir: &Path,
        record: &Record,
        server: &ExitServer,
        child: &mut Option<tokio::process::Child>,
    ) -> Result<(), HostError> {
        std::fs::create_dir_all(dir).map_err(|e| unavailable(format!("cannot create {}: {e}", dir.display())))?;
        self.write_config(dir, server, record.address)?;
        let json = serde_json::to_vec_pretty(record).map_err(|e| unavailable(e.to_string()))?;
        std::fs::write(dir.join("host.json"), json).map_err(|e| unavailable(format!("host.json: {e}")))?;
        let process = child.insert(self.spawn(dir)?);
        let pid = process.id().ok_or_else(|| unavailable("the exit server exited at once".into()))?;
        std::fs::write(dir.join("pid"), pid.to_string()).map_err(|e| unavailable(format!("pid file: {e}")))?;

        // Ready means: the control port answers (a client dialing at once must not fail) and the
        // config watcher runs (a reconfigure right after create must not be missed).
        let deadline = tokio::time::Instant::now() + self.settings.start_timeout;
        let control = (record.address, server.control_port);
        let mut listening = false;
        loop {
            listening = listening || tokio::net::TcpStream::connect(control).await.is_ok();
            let log = std::fs::read_to_string(dir.join("rathole.log")).unwrap_or_default();
            if listening && log.contains(WATCHING) {
                return Ok(());
            }
            let exited = process.try_wait().ok().flatten();
            if exited.is_some() || tokio::time::Instant::now() > deadline {
                let why = match exited {
                    Some(status) => format!("exited ({status})"),
                    None if listening => "did not start watching its config (built without hot-reload?)".to_string(),
                    None => format!("did not listen on {}:{}", control.0, control.1),
                };
                return Err(unavailable(format!("exit server {why}: {}", last_line(&log, server))));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

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

/// The log's last line for an error message, unless it quotes one of the server's secrets
/// (rathole's config errors may quote the offending TOML line).
fn last_line(log: &str, server: &ExitServer) -> String {
    let line = log.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no output");
    let secrets = server.services.iter().map(|s| s.token.as_str()).chain([server.noise_private_key.as_str()]);
    if secrets.filter(|s| !s.is_empty()).any(|s| line.contains(s)) {
        return "<log line withheld: it contains a secret>".into();
    }
    line.to_string()
}

/// Whether process `pid` exists and has not exited (a zombie awaiting its reaper has).
fn running(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // The state is the field after the parenthesised command name; Z = exited, not yet reaped.
    !stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z'))
}

/// Signals the process group led by `pid`; a group that is already gone is not an error.
fn signal_group(pid: i32, signal: Signal) -> Result<(), HostError> {
    match killpg(Pid::from_raw(pid), signal) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
        Err(e) => Err(unavailable(format!("cannot send {signal} to exit server process group {pid}: {e}"))),
    }
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

/// 32-bit FNV-1a, to spread state directories over the address range (not for security).
fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(*b)).wrapping_mul(0x0100_0193))
}

#[async_trait]
impl HostProvider for LocalProvider {
    async fn create(&self, request: &HostRequest) -> Result<Host, HostError> {
        self.limiter.acquire("CreateHost").await;
        let result = async {
            // Refuse a config rathole would reject before anything is allocated or created.
            render(&request.server, self.settings.first_address)?;
            let _guard = self.lock.lock().await;
            let address = self.allocate(&self.records()?, request.server.control_port)?;
            let id = format!("local-{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff);
            let created_unix = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
            let record = Record {
                id: id.clone(),
                name: request.name.clone(),
                address,
                tags: request.tags.clone(),
                created_unix,
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
            // Two rewrites of one host share the temporary file; one at a time.
            let _guard = self.lock.lock().await;
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

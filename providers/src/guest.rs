//! The `guest` host provider: every exit server is a booted Debian guest on this machine
//! ([`machine`]: systemd-nspawn, systemd as PID 1, real cloud-init), so the Tunnel controller
//! drives the same path as on a cloud: it renders the user data, the guest's cloud-init
//! installs the firewall, downloads the exit-server binary from `--exit-server-url`, checks its
//! digest and starts the server under systemd. Nothing is started for the guest from outside.
//!
//! Each guest boots from a throwaway overlay of a cached root file system
//! (tests/env/build-guest.sh) in a network namespace of its own, joined to the host by a veth
//! pair; its public IPv4 is its end of that pair, reachable from this machine only. A server on
//! the host (a mirror of the binary) is reachable from every guest as [`HOST_ALIAS`]; guests can
//! be made to trust a private CA for it ([`GuestSettings::ca_file`]).
//!
//! State lives on disk, one folder per guest under the state directory — `host.json` (id, name,
//! link, tags, creation time) beside the guest's overlay, console log and nspawn's pid — so
//! guests outlive an operator restart, as VMs do, and are found again by tag. A guest whose
//! nspawn has exited (powered off behind skyport's back) reads as [`HostState::Stopped`], which
//! the Tunnel controller replaces; `delete` powers it off and removes every trace of it.
//!
//! Reserved addresses ([`addresses`]): a single exit server's is a link address its replacements
//! are made with; a highly available pair's is of a range of its own, carried on both guests'
//! interfaces by their user data and routed by this machine to the one holding it, moved by
//! re-pointing that route, as a cloud moves a floating IP.
//!
//! Needs root and systemd-nspawn; [`GuestProvider::new`] says so when either is missing.

mod addresses;
pub mod machine;
pub mod processes;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

pub use machine::{HOST_ALIAS, Machine};

use crate::error::HostError;
use crate::host_files::HostFiles;
use crate::hosts::{
    AddressBinding, Capabilities, Host, HostProvider, HostRequest, HostState, MovedAddress, PoolAddresses, Spread,
    TAG_TUNNEL_SLOT,
};
use crate::limiter::Limiter;
use crate::reservations::Booked;

const PROVIDER: &str = "guest";
/// Host ids: this prefix and 8 hex digits; also the machine's and its network namespace's name.
const ID_PREFIX: &str = "skg";

/// Settings of the guest provider.
#[derive(Debug, Clone)]
pub struct GuestSettings {
    /// One folder per guest is kept here.
    pub state_dir: PathBuf,
    /// The cached root file system every guest boots an overlay of.
    pub rootfs: PathBuf,
    /// PEM CA certificates every guest trusts besides Debian's (a private mirror's CA).
    pub ca_file: Option<PathBuf>,
    /// How long `delete` waits for a guest to power off before killing it.
    pub stop_grace: Duration,
}

impl GuestSettings {
    /// No extra CA, a 20 s shutdown grace.
    pub fn new(state_dir: impl Into<PathBuf>, rootfs: impl Into<PathBuf>) -> Self {
        GuestSettings {
            state_dir: state_dir.into(),
            rootfs: rootfs.into(),
            ca_file: None,
            stop_grace: Duration::from_secs(20),
        }
    }
}

/// `host.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    id: String,
    name: String,
    machine: Machine,
    tags: BTreeMap<String, String>,
    created_unix: u64,
}

/// Exit servers as booted guests.
pub struct GuestProvider {
    settings: GuestSettings,
    ca: Option<String>,
    limiter: Limiter,
    /// Serialises address allocation and folder creation.
    lock: Mutex<()>,
}

impl GuestProvider {
    /// A provider keeping its guests under `settings.state_dir` (created if missing). Fails when
    /// guests cannot boot here (not root, no systemd-nspawn), the root file system is not one, or
    /// the CA file holds no certificate.
    pub fn new(settings: GuestSettings) -> Result<Self, HostError> {
        let invalid = |message: String| HostError::Invalid { provider: PROVIDER, message };
        machine::check_host().map_err(|e| invalid(format!("the guest provider cannot run here: {e}")))?;
        if !settings.rootfs.join("etc/cloud").is_dir() {
            return Err(invalid(format!(
                "{} is not a guest root file system with cloud-init (build one with tests/env/build-guest.sh)",
                settings.rootfs.display()
            )));
        }
        let ca = match &settings.ca_file {
            Some(path) => {
                let pem = std::fs::read_to_string(path).map_err(|e| invalid(format!("{}: {e}", path.display())))?;
                if !pem.contains("-----BEGIN CERTIFICATE-----") {
                    return Err(invalid(format!("{} holds no PEM certificate", path.display())));
                }
                Some(pem)
            }
            None => None,
        };
        std::fs::create_dir_all(&settings.state_dir)
            .map_err(|e| unavailable(format!("cannot create state directory {}: {e}", settings.state_dir.display())))?;
        // Booting costs this machine's CPU, not a cloud's quota; the limiter keeps a burst of
        // creates from starting more guests at once than it boots well, and counts every call.
        let limiter =
            Limiter::new(NonZeroU32::new(5).unwrap_or(NonZeroU32::MIN), NonZeroU32::new(10).unwrap_or(NonZeroU32::MIN));
        Ok(GuestProvider { settings, ca, limiter, lock: Mutex::new(()) })
    }

    /// The guest behind host `id` (its files, console and cloud-init logs), for tests and
    /// debugging; `None` when there is no such host.
    pub fn machine(&self, id: &str) -> Option<Machine> {
        self.files().read(id).ok().flatten().map(|r| r.machine)
    }

    /// Powers off and removes every guest of the state directory and releases (and unroutes) its
    /// reserved addresses, blocking, without the limiter: for tests and the playground to leave
    /// nothing behind whatever happened to them.
    pub fn remove_all(&self) {
        for record in self.files().all().unwrap_or_default() {
            let _ = std::fs::remove_file(self.host_dir(&record.id).join("host.json"));
            record.machine.tear_down();
        }
        self.release_all();
    }

    fn host_dir(&self, id: &str) -> PathBuf {
        self.settings.state_dir.join(id)
    }

    fn files(&self) -> HostFiles<Record> {
        HostFiles::new(self.settings.state_dir.clone(), PROVIDER, valid_id)
    }

    fn host(record: &Record) -> Host {
        let state = if record.machine.pid().is_some() { HostState::Running } else { HostState::Stopped };
        Host {
            id: record.id.clone(),
            name: record.name.clone(),
            public_ipv4: Some(record.machine.ip.to_string()),
            state,
            tags: record.tags.clone(),
            placement: None,
        }
    }

    /// Prepares, records and boots a guest; on failure removes whatever was made.
    async fn make(&self, request: &HostRequest) -> Result<Host, HostError> {
        let _guard = self.lock.lock().await;
        // The Tunnel's reserved link address if it has a free one, so a replacement keeps it; a
        // server of a highly available pair gets its own, and the pair's address is routed to it.
        let link = match request.tags.contains_key(TAG_TUNNEL_SLOT) {
            true => None,
            false => self.free_address(request.address.as_deref())?,
        };
        let mut avoid: Vec<Ipv4Addr> = self.files().all()?.iter().map(|r| r.machine.ip).collect();
        avoid.extend(self.reserved()?.iter().map(|r| r.ip));
        let id = format!("{ID_PREFIX}{:08x}", rand::random::<u32>());
        let record = Record {
            id: id.clone(),
            name: request.name.clone(),
            machine: Machine {
                name: id.clone(),
                ip: Ipv4Addr::UNSPECIFIED,
                host_ip: Ipv4Addr::UNSPECIFIED,
                dir: self.host_dir(&id),
            },
            tags: request.tags.clone(),
            created_unix: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        };
        let (rootfs, ca, user_data) =
            (self.settings.rootfs.clone(), self.ca.clone(), Arc::new(request.user_data.clone()));
        // Mounts, `ip` and file copies block: off the runtime's threads.
        tokio::task::spawn_blocking(move || boot(record, &rootfs, ca.as_deref(), &user_data, link, &avoid))
            .await
            .map_err(|e| unavailable(format!("guest start panicked: {e}")))?
    }
}

fn boot(
    mut record: Record,
    rootfs: &std::path::Path,
    ca: Option<&str>,
    user_data: &str,
    link: Option<Ipv4Addr>,
    avoid: &[Ipv4Addr],
) -> Result<Host, HostError> {
    let dir = record.machine.dir.clone();
    record.machine = Machine::prepare(&record.id, rootfs, &dir, link, avoid).map_err(unavailable)?;
    let started = (|| {
        if let Some(pem) = ca {
            record.machine.trust(pem)?;
        }
        // Recorded before it boots: a crash from here on leaves a guest that is found again.
        let json = serde_json::to_vec_pretty(&record).map_err(|e| e.to_string())?;
        std::fs::write(dir.join("host.json"), json).map_err(|e| format!("host.json: {e}"))?;
        record.machine.boot(user_data)
    })();
    match started {
        Ok(mut child) => {
            // Reaped when it ends, so a guest powered off does not linger as a zombie.
            std::thread::spawn(move || child.wait());
            Ok(GuestProvider::host(&record))
        }
        Err(e) => {
            record.machine.tear_down();
            let _ = std::fs::remove_dir_all(&dir);
            Err(unavailable(e))
        }
    }
}

fn unavailable(message: String) -> HostError {
    HostError::Unavailable { provider: PROVIDER, message }
}

fn valid_id(id: &str) -> bool {
    id.strip_prefix(ID_PREFIX).is_some_and(|hex| hex.len() == 8 && hex.chars().all(|c| c.is_ascii_hexdigit()))
}

#[async_trait]
impl HostProvider for GuestProvider {
    async fn create(&self, request: &HostRequest) -> Result<Host, HostError> {
        self.limiter.acquire("CreateHost").await;
        let result = self.make(request).await;
        self.limiter.count_result("CreateHost", &result);
        result
    }

    async fn get(&self, id: &str) -> Result<Option<Host>, HostError> {
        self.limiter.acquire("GetHost").await;
        let result = self.files().read(id).map(|r| r.as_ref().map(Self::host));
        self.limiter.count_result("GetHost", &result);
        result
    }

    async fn delete(&self, id: &str) -> Result<(), HostError> {
        self.limiter.acquire("DeleteHost").await;
        let result = async {
            let Some(record) = self.files().read(id)? else { return Ok(()) };
            // Unlisted first: a delete cut short leaves no host that looks alive.
            let json = self.host_dir(id).join("host.json");
            std::fs::remove_file(&json).map_err(|e| unavailable(format!("cannot remove {}: {e}", json.display())))?;
            let grace = self.settings.stop_grace;
            tokio::task::spawn_blocking(move || {
                record.machine.stop(grace);
                record.machine.tear_down();
            })
            .await
            .map_err(|e| unavailable(format!("guest removal panicked: {e}")))
        }
        .await;
        self.limiter.count_result("DeleteHost", &result);
        result
    }

    async fn list_by_tag(&self, key: &str, value: &str) -> Result<Vec<Host>, HostError> {
        self.limiter.acquire("ListHosts").await;
        let result = self.files().all().map(|records| {
            records.iter().filter(|r| r.tags.get(key).map(String::as_str) == Some(value)).map(Self::host).collect()
        });
        self.limiter.count_result("ListHosts", &result);
        result
    }

    /// The guest's console: nspawn's output, which is what the guest writes to `/dev/console`.
    async fn console_output(&self, id: &str) -> Result<Option<String>, HostError> {
        self.limiter.acquire("GetConsoleOutput").await;
        let result = self.files().read(id).map(|r| r.map(|r| r.machine.console()));
        self.limiter.count_result("GetConsoleOutput", &result);
        result
    }

    /// Reads are of files, processes and routes on this machine. A single guest gets its address
    /// at creation; a highly available pair's address is of a range of its own, routed to the
    /// guest holding it ([`addresses`]), while each guest keeps its link address for its own
    /// client, and a guest answers on it only once its OS has it on its interface, as a server
    /// with a Hetzner floating IP does.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            reads_are_free: true,
            address_binding: AddressBinding::AtCreate,
            moves_addresses: true,
            moved_address: MovedAddress::OnInterface,
            pool_addresses: PoolAddresses::Assigned,
            spread: Spread::No("both guests run on the operator's machine (guest provider)"),
            ..Capabilities::default()
        }
    }

    async fn assign_address(&self, id: &str, host_id: &str) -> Result<(), HostError> {
        self.limiter.acquire("AssignAddress").await;
        let result = self.move_address(id, host_id).await;
        self.limiter.count_result("AssignAddress", &result);
        result
    }

    async fn release_address(&self, id: &str) -> Result<(), HostError> {
        self.limiter.acquire("ReleaseAddress").await;
        let result = self.release(id).await;
        self.limiter.count_result("ReleaseAddress", &result);
        result
    }

    fn booked(&self) -> Option<&dyn Booked> {
        Some(self)
    }

    fn name(&self) -> &'static str {
        PROVIDER
    }

    fn limiter(&self) -> &Limiter {
        &self.limiter
    }
}

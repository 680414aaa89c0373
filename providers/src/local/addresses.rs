//! Reserved addresses of the local provider: a loopback address kept for one Tunnel, so its
//! replacement exit servers bind the same address ([`crate::reservations`]); rathole binds it
//! when it starts.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use async_trait::async_trait;

use super::process::{rebind_services, replace_config};
use super::{LocalProvider, unavailable};
use crate::error::HostError;
use crate::hosts::Address;
use crate::limiter::Limiter;
use crate::reservations::{AddressBook, Booked};

#[async_trait]
impl Booked for LocalProvider {
    fn book(&self) -> AddressBook {
        AddressBook { dir: self.settings.state_dir.clone(), provider: super::PROVIDER }
    }

    /// Every host's (address, id): first the reserved addresses moved onto running hosts, which
    /// hold them whatever host was created with them, then each host's own.
    fn hosts(&self) -> Result<Vec<(Ipv4Addr, String)>, HostError> {
        let records = self.files().all()?;
        let moved = records.iter().filter_map(|r| Some((r.serving?, r.id.clone())));
        let own = records.iter().map(|r| (r.address, r.id.clone()));
        Ok(moved.chain(own).collect())
    }

    async fn record_free(&self, tags: &BTreeMap<String, String>) -> Result<Address, HostError> {
        let _guard = self.lock.lock().await;
        // Port 0 always binds, so only addresses of hosts and other reservations are skipped.
        let ip = self.allocate(&self.taken()?, 0)?;
        self.book().record(ip, tags)
    }

    fn counted_by(&self) -> &Limiter {
        &self.limiter
    }
}

impl LocalProvider {
    /// Puts address `id` on host `host_id`: already there (it was created with it) is success;
    /// else the host must be running, and its service ports are re-bound to the address after
    /// those of the host serving it now are re-bound to that host's own address.
    pub(super) async fn move_address(&self, id: &str, host_id: &str) -> Result<(), HostError> {
        let _guard = self.lock.lock().await;
        let hosts = self.hosts()?;
        let Some(address) = self.book().find(id, &hosts)? else {
            return Err(HostError::NotFound { provider: super::PROVIDER, message: format!("address {id}") });
        };
        if address.host_id.as_deref() == Some(host_id) {
            return Ok(());
        }
        let ip: Ipv4Addr = address.ip.parse().map_err(|_| unavailable(format!("address {id} is not IPv4")))?;
        let target = self.files().read(host_id)?.filter(|_| self.alive(host_id).is_some());
        let Some(mut target) = target else {
            return Err(HostError::Invalid {
                provider: super::PROVIDER,
                message: format!("host {host_id} is not running; a reserved address moves only onto a running host"),
            });
        };
        if let Some(own) = self.files().all()?.into_iter().find(|r| r.address == ip && self.alive(&r.id).is_some()) {
            return Err(HostError::Invalid {
                provider: super::PROVIDER,
                message: format!(
                    "address {ip} is running host {}'s own address; it moves once that host is gone",
                    own.id
                ),
            });
        }
        for mut holder in self.files().all()?.into_iter().filter(|r| r.serving == Some(ip)) {
            holder.serving = None;
            self.rebind(&holder, holder.address)?;
        }
        target.serving = Some(ip);
        self.rebind(&target, ip)
    }

    /// Records `record` and re-binds its running server's service ports to `ip`.
    fn rebind(&self, record: &super::Record, ip: Ipv4Addr) -> Result<(), HostError> {
        let dir = self.host_dir(&record.id);
        let json = serde_json::to_vec_pretty(record).map_err(|e| unavailable(e.to_string()))?;
        std::fs::write(dir.join("host.json"), json).map_err(|e| unavailable(format!("host.json: {e}")))?;
        let Ok(config) = std::fs::read_to_string(dir.join("server.toml")) else { return Ok(()) };
        replace_config(&dir, &rebind_services(&config, ip))
    }
}

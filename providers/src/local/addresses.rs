//! Reserved addresses of the local provider: a loopback address kept for one Tunnel, so its
//! replacement exit servers bind the same address, as a cloud's reserved IP would. One file per
//! address, `address-<ip>.json` in the state directory (`{ip, tags}`); the host using it is the
//! one whose `host.json` has that address. Like Hetzner's primary IPs, it goes onto a host at
//! creation ([`AddressBinding::AtCreate`]): rathole binds it when it starts.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{LocalProvider, PROVIDER, unavailable};
use crate::error::HostError;
use crate::hosts::{Address, AddressRequest, TAG_TUNNEL_UID};

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Reserved {
    pub(super) ip: Ipv4Addr,
    pub(super) tags: BTreeMap<String, String>,
}

const PREFIX: &str = "address-";

impl LocalProvider {
    fn address_path(&self, ip: Ipv4Addr) -> PathBuf {
        self.settings.state_dir.join(format!("{PREFIX}{ip}.json"))
    }

    /// Every reserved address in the state directory.
    pub(super) fn reserved(&self) -> Result<Vec<Reserved>, HostError> {
        let entries = std::fs::read_dir(&self.settings.state_dir)
            .map_err(|e| unavailable(format!("cannot list {}: {e}", self.settings.state_dir.display())))?;
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with(PREFIX) || !name.ends_with(".json") {
                continue;
            }
            match std::fs::read(entry.path()).map(|b| serde_json::from_slice::<Reserved>(&b)) {
                Ok(Ok(r)) => out.push(r),
                _ => tracing::warn!(file = %name, "skipping an unreadable local address"),
            }
        }
        out.sort_by_key(|r| r.ip);
        Ok(out)
    }

    fn to_address(&self, r: &Reserved) -> Result<Address, HostError> {
        let host = self.records()?.into_iter().find(|h| h.address == r.ip).map(|h| h.id);
        Ok(Address { id: r.ip.to_string(), ip: r.ip.to_string(), host_id: host, tags: r.tags.clone() })
    }

    /// The Tunnel's reserved address no host uses, for `create`.
    pub(super) fn free_address_of(&self, tags: &BTreeMap<String, String>) -> Result<Option<Ipv4Addr>, HostError> {
        let Some(uid) = tags.get(TAG_TUNNEL_UID) else { return Ok(None) };
        let used: Vec<Ipv4Addr> = self.records()?.iter().map(|h| h.address).collect();
        Ok(self
            .reserved()?
            .into_iter()
            .find(|r| r.tags.get(TAG_TUNNEL_UID) == Some(uid) && !used.contains(&r.ip))
            .map(|r| r.ip))
    }

    pub(super) async fn reserve(&self, request: &AddressRequest) -> Result<Address, HostError> {
        if request.host_id.is_some() {
            return Err(HostError::Invalid {
                provider: PROVIDER,
                message: "local addresses go onto a host when it is created".into(),
            });
        }
        let _guard = self.lock.lock().await;
        // Port 0 always binds, so only addresses of hosts and other reservations are skipped.
        let ip = self.allocate(&self.taken()?, 0)?;
        let reserved = Reserved { ip, tags: request.tags.clone() };
        let text = serde_json::to_vec(&reserved).map_err(|e| unavailable(format!("cannot encode address: {e}")))?;
        std::fs::write(self.address_path(ip), text).map_err(|e| unavailable(format!("cannot record {ip}: {e}")))?;
        self.to_address(&reserved)
    }

    pub(super) fn find_address(&self, id: &str) -> Result<Option<Address>, HostError> {
        let Ok(ip) = id.parse::<Ipv4Addr>() else { return Ok(None) };
        match self.reserved()?.into_iter().find(|r| r.ip == ip) {
            Some(r) => self.to_address(&r).map(Some),
            None => Ok(None),
        }
    }

    pub(super) fn check_assigned(&self, id: &str, host_id: &str) -> Result<(), HostError> {
        match self.find_address(id)? {
            Some(a) if a.host_id.as_deref() == Some(host_id) => Ok(()),
            Some(_) => Err(HostError::Invalid {
                provider: PROVIDER,
                message: format!("host {host_id} was not created with address {id}; local hosts get it at creation"),
            }),
            None => Err(HostError::NotFound { provider: PROVIDER, message: format!("address {id}") }),
        }
    }

    pub(super) fn unreserve(&self, id: &str) -> Result<(), HostError> {
        let Ok(ip) = id.parse::<Ipv4Addr>() else { return Ok(()) };
        match std::fs::remove_file(self.address_path(ip)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(unavailable(format!("cannot release {ip}: {e}"))),
        }
    }

    pub(super) fn addresses_by_tag(&self, key: &str, value: &str) -> Result<Vec<Address>, HostError> {
        let matching = self.reserved()?.into_iter().filter(|r| r.tags.get(key).map(String::as_str) == Some(value));
        matching.map(|r| self.to_address(&r)).collect()
    }
}

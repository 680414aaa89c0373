//! Reserved addresses of the providers whose hosts run on this machine (`local`, `guest`): an
//! address kept for one Tunnel, so its replacement hosts come up on the same address, as a
//! cloud's reserved IP would. One file per address, `address-<ip>.json` in the provider's state
//! directory (`{ip, tags}`); the host using it is the one created with that address. Like
//! Hetzner's primary IPs, it goes onto a host at creation
//! ([`AddressBinding::AtCreate`](crate::addresses::AddressBinding::AtCreate)). A highly available
//! pair's address is moved between running hosts instead, and each provider says which host holds
//! it ([`Booked::hosts`]: the local server forwarding it, the guest it is routed to).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::addresses::{Address, AddressRequest};
use crate::error::HostError;
use crate::limiter::Limiter;

/// A provider whose reserved addresses are files of an [`AddressBook`] beside its hosts
/// (`local`, `guest`): the address operations of their `HostProvider` are these, the
/// same for both, each through the provider's limiter and counted by outcome. The provider
/// says where its book is, which hosts it has, and how it records a free address.
#[async_trait]
pub trait Booked: Send + Sync {
    fn book(&self) -> AddressBook;
    /// Every host's (address, id), moved addresses first: the host holding one is the first listed.
    fn hosts(&self) -> Result<Vec<(Ipv4Addr, String)>, HostError>;
    /// Records an address no host and no reservation has, tagged as `request` says (under the
    /// provider's lock, so two reservations never get the same one); a
    /// [`movable`](AddressRequest::movable) one where the provider keeps those apart (`guest`).
    async fn record_free(&self, request: &AddressRequest) -> Result<Address, HostError>;
    fn counted_by(&self) -> &Limiter;

    fn reserved(&self) -> Result<Vec<Reserved>, HostError> {
        self.book().reserved()
    }

    /// The Tunnel's reserved address no host uses, for `create`.
    fn free_address(&self, id: Option<&str>) -> Result<Option<Ipv4Addr>, HostError> {
        id.map(|id| self.book().free(id, &self.hosts()?)).transpose()
    }

    async fn reserve(&self, request: &AddressRequest) -> Result<Address, HostError> {
        counted(self.counted_by(), "ReserveAddress", async {
            self.book().check_request(request)?;
            self.record_free(request).await
        })
        .await
    }

    async fn find_address(&self, id: &str) -> Result<Option<Address>, HostError> {
        counted(self.counted_by(), "GetAddress", async { self.book().find(id, &self.hosts()?) }).await
    }

    async fn check_assigned(&self, id: &str, host_id: &str) -> Result<(), HostError> {
        counted(self.counted_by(), "AssignAddress", async { self.book().check_assigned(id, host_id, &self.hosts()?) })
            .await
    }

    async fn unreserve(&self, id: &str) -> Result<(), HostError> {
        counted(self.counted_by(), "ReleaseAddress", async { self.book().release(id) }).await
    }

    async fn addresses_by_tag(&self, key: &str, value: &str) -> Result<Vec<Address>, HostError> {
        counted(self.counted_by(), "ListAddresses", async { self.book().by_tag(key, value, &self.hosts()?) }).await
    }
}

/// Waits for `limiter`'s permit for `operation`, runs `call` and counts its outcome.
async fn counted<T>(
    limiter: &Limiter,
    operation: &'static str,
    call: impl std::future::Future<Output = Result<T, HostError>>,
) -> Result<T, HostError> {
    limiter.acquire(operation).await;
    let result = call.await;
    limiter.count_result(operation, &result);
    result
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Reserved {
    pub(crate) ip: Ipv4Addr,
    pub(crate) tags: BTreeMap<String, String>,
}

const PREFIX: &str = "address-";

/// The reservation files of one state directory. Methods that report assignments take the
/// provider's hosts as `(address, host id)` pairs.
pub struct AddressBook {
    pub(crate) dir: PathBuf,
    pub(crate) provider: &'static str,
}

impl AddressBook {
    fn path(&self, ip: Ipv4Addr) -> PathBuf {
        self.dir.join(format!("{PREFIX}{ip}.json"))
    }

    fn unavailable(&self, message: String) -> HostError {
        HostError::Unavailable { provider: self.provider, message }
    }

    /// Every reserved address in the state directory.
    pub(crate) fn reserved(&self) -> Result<Vec<Reserved>, HostError> {
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| self.unavailable(format!("cannot list {}: {e}", self.dir.display())))?;
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with(PREFIX) || !name.ends_with(".json") {
                continue;
            }
            match std::fs::read(entry.path()).map(|b| serde_json::from_slice::<Reserved>(&b)) {
                Ok(Ok(r)) => out.push(r),
                _ => tracing::warn!(provider = self.provider, file = %name, "skipping an unreadable reserved address"),
            }
        }
        out.sort_by_key(|r| r.ip);
        Ok(out)
    }

    fn address(r: &Reserved, hosts: &[(Ipv4Addr, String)]) -> Address {
        let host = hosts.iter().find(|(ip, _)| *ip == r.ip).map(|(_, id)| id.clone());
        Address { private_ip: None, id: r.ip.to_string(), ip: r.ip.to_string(), host_id: host, tags: r.tags.clone() }
    }

    /// Refuses a request to reserve an address already on a host: these go on at creation.
    pub(crate) fn check_request(&self, request: &AddressRequest) -> Result<(), HostError> {
        match request.host_id {
            Some(_) => Err(HostError::Invalid {
                provider: self.provider,
                message: format!("{} addresses go onto a host when it is created", self.provider),
            }),
            None => Ok(()),
        }
    }

    /// Records `ip` as reserved with `tags` (the caller picked it free, under its lock).
    pub(crate) fn record(&self, ip: Ipv4Addr, tags: &BTreeMap<String, String>) -> Result<Address, HostError> {
        let reserved = Reserved { ip, tags: tags.clone() };
        let text =
            serde_json::to_vec(&reserved).map_err(|e| self.unavailable(format!("cannot encode address: {e}")))?;
        std::fs::write(self.path(ip), text).map_err(|e| self.unavailable(format!("cannot record {ip}: {e}")))?;
        Ok(Self::address(&reserved, &[]))
    }

    /// Reserved address `id`, for `create`: an error, not a host without it, when it is gone or
    /// another host holds it (a host created without it would only be replaced to get it).
    pub(crate) fn free(&self, id: &str, hosts: &[(Ipv4Addr, String)]) -> Result<Ipv4Addr, HostError> {
        let Some(address) = self.find(id, hosts)? else {
            return Err(HostError::NotFound { provider: self.provider, message: format!("reserved address {id}") });
        };
        match address.host_id {
            Some(host) => Err(self.unavailable(format!("reserved address {id} is held by host {host}"))),
            None => address.ip.parse().map_err(|_| self.unavailable(format!("reserved address {id} is not IPv4"))),
        }
    }

    pub(crate) fn find(&self, id: &str, hosts: &[(Ipv4Addr, String)]) -> Result<Option<Address>, HostError> {
        let Ok(ip) = id.parse::<Ipv4Addr>() else { return Ok(None) };
        Ok(self.reserved()?.into_iter().find(|r| r.ip == ip).map(|r| Self::address(&r, hosts)))
    }

    /// Assigning is only confirming: the host must have been created with the address.
    pub(crate) fn check_assigned(
        &self,
        id: &str,
        host_id: &str,
        hosts: &[(Ipv4Addr, String)],
    ) -> Result<(), HostError> {
        match self.find(id, hosts)? {
            Some(a) if a.host_id.as_deref() == Some(host_id) => Ok(()),
            Some(_) => Err(HostError::Invalid {
                provider: self.provider,
                message: format!(
                    "host {host_id} was not created with address {id}; {} hosts get it at creation",
                    self.provider
                ),
            }),
            None => Err(HostError::NotFound { provider: self.provider, message: format!("address {id}") }),
        }
    }

    /// Releases the address; one already released counts as released.
    pub(crate) fn release(&self, id: &str) -> Result<(), HostError> {
        let Ok(ip) = id.parse::<Ipv4Addr>() else { return Ok(()) };
        match std::fs::remove_file(self.path(ip)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.unavailable(format!("cannot release {ip}: {e}"))),
        }
    }

    pub(crate) fn by_tag(
        &self,
        key: &str,
        value: &str,
        hosts: &[(Ipv4Addr, String)],
    ) -> Result<Vec<Address>, HostError> {
        let matching = self.reserved()?.into_iter().filter(|r| r.tags.get(key).map(String::as_str) == Some(value));
        Ok(matching.map(|r| Self::address(&r, hosts)).collect())
    }
}

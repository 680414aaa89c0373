//! Reserved addresses of the local provider: a loopback address kept for one Tunnel, so its
//! replacement exit servers bind the same address ([`crate::reservations`]); rathole binds it
//! when it starts.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use super::LocalProvider;
use crate::error::HostError;
use crate::hosts::{Address, AddressRequest};
use crate::reservations::{AddressBook, Reserved};

impl LocalProvider {
    fn book(&self) -> AddressBook {
        AddressBook { dir: self.settings.state_dir.clone(), provider: super::PROVIDER }
    }

    /// Every host's (address, id).
    fn hosts(&self) -> Result<Vec<(Ipv4Addr, String)>, HostError> {
        Ok(self.records()?.into_iter().map(|r| (r.address, r.id)).collect())
    }

    pub(super) fn reserved(&self) -> Result<Vec<Reserved>, HostError> {
        self.book().reserved()
    }

    /// The Tunnel's reserved address no host uses, for `create`.
    pub(super) fn free_address_of(&self, tags: &BTreeMap<String, String>) -> Result<Option<Ipv4Addr>, HostError> {
        self.book().free_of(tags, &self.hosts()?)
    }

    pub(super) async fn reserve(&self, request: &AddressRequest) -> Result<Address, HostError> {
        self.book().check_request(request)?;
        let _guard = self.lock.lock().await;
        // Port 0 always binds, so only addresses of hosts and other reservations are skipped.
        let ip = self.allocate(&self.taken()?, 0)?;
        self.book().record(ip, &request.tags)
    }

    pub(super) fn find_address(&self, id: &str) -> Result<Option<Address>, HostError> {
        self.book().find(id, &self.hosts()?)
    }

    pub(super) fn check_assigned(&self, id: &str, host_id: &str) -> Result<(), HostError> {
        self.book().check_assigned(id, host_id, &self.hosts()?)
    }

    pub(super) fn unreserve(&self, id: &str) -> Result<(), HostError> {
        self.book().release(id)
    }

    pub(super) fn addresses_by_tag(&self, key: &str, value: &str) -> Result<Vec<Address>, HostError> {
        self.book().by_tag(key, value, &self.hosts()?)
    }
}

//! Reserved addresses of the guest provider: a guest link address kept for one Tunnel, so its
//! replacement guests come up on the same address ([`crate::reservations`]); the link of a new
//! guest is made with it.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use super::{GuestProvider, PROVIDER, machine, unavailable};
use crate::error::HostError;
use crate::hosts::{Address, AddressRequest};
use crate::reservations::{AddressBook, Reserved};

impl GuestProvider {
    fn book(&self) -> AddressBook {
        AddressBook { dir: self.settings.state_dir.clone(), provider: PROVIDER }
    }

    /// Every guest's (address, id).
    fn hosts(&self) -> Result<Vec<(Ipv4Addr, String)>, HostError> {
        Ok(self.records()?.into_iter().map(|r| (r.machine.ip, r.id)).collect())
    }

    pub(super) fn reserved(&self) -> Result<Vec<Reserved>, HostError> {
        self.book().reserved()
    }

    /// The Tunnel's reserved address no guest uses, for `create`.
    pub(super) fn free_address_of(&self, tags: &BTreeMap<String, String>) -> Result<Option<Ipv4Addr>, HostError> {
        self.book().free_of(tags, &self.hosts()?)
    }

    pub(super) async fn reserve(&self, request: &AddressRequest) -> Result<Address, HostError> {
        self.book().check_request(request)?;
        let _guard = self.lock.lock().await;
        let mut avoid: Vec<Ipv4Addr> = self.hosts()?.into_iter().map(|(ip, _)| ip).collect();
        avoid.extend(self.reserved()?.iter().map(|r| r.ip));
        let (_, ip) = machine::free_link(&avoid).map_err(unavailable)?;
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

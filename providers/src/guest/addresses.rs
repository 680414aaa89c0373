//! Reserved addresses of the guest provider: a guest link address kept for one Tunnel, so its
//! replacement guests come up on the same address ([`crate::reservations`]); the link of a new
//! guest is made with it.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use async_trait::async_trait;

use super::{GuestProvider, PROVIDER, machine, unavailable};
use crate::error::HostError;
use crate::hosts::Address;
use crate::limiter::Limiter;
use crate::reservations::{AddressBook, Booked};

#[async_trait]
impl Booked for GuestProvider {
    fn book(&self) -> AddressBook {
        AddressBook { dir: self.settings.state_dir.clone(), provider: PROVIDER }
    }

    fn hosts(&self) -> Result<Vec<(Ipv4Addr, String)>, HostError> {
        Ok(self.files().all()?.into_iter().map(|r| (r.machine.ip, r.id)).collect())
    }

    async fn record_free(&self, tags: &BTreeMap<String, String>) -> Result<Address, HostError> {
        let _guard = self.lock.lock().await;
        let mut avoid: Vec<Ipv4Addr> = self.hosts()?.into_iter().map(|(ip, _)| ip).collect();
        avoid.extend(self.reserved()?.iter().map(|r| r.ip));
        let (_, ip) = machine::free_link(&avoid).map_err(unavailable)?;
        self.book().record(ip, tags)
    }

    fn counted_by(&self) -> &Limiter {
        &self.limiter
    }
}

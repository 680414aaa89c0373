//! Reserved addresses of the local provider: a loopback address kept for one Tunnel, so its
//! replacement exit servers bind the same address ([`crate::reservations`]); rathole binds it
//! when it starts.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use async_trait::async_trait;

use super::LocalProvider;
use crate::error::HostError;
use crate::hosts::Address;
use crate::limiter::Limiter;
use crate::reservations::{AddressBook, Booked};

#[async_trait]
impl Booked for LocalProvider {
    fn book(&self) -> AddressBook {
        AddressBook { dir: self.settings.state_dir.clone(), provider: super::PROVIDER }
    }

    fn hosts(&self) -> Result<Vec<(Ipv4Addr, String)>, HostError> {
        Ok(self.files().all()?.into_iter().map(|r| (r.address, r.id)).collect())
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

//! Reserving an address where reserved addresses carry no tags of their own (DigitalOcean): the
//! intent goes into status before the call, with the addresses the account had, so an address
//! made by a call whose answer was lost (the operator stopped, the connection dropped) is found
//! again by the next pass, or by the finalizer, instead of being billed for ever. Only one that
//! is provably this reservation's is adopted ([`reserved_meanwhile`]); otherwise the addresses
//! are named in a Warning Event and left alone.

use std::collections::HashSet;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use providers::{Address, HostProvider};
use tracing::{info, warn};

use super::super::act;
use super::super::plan::address::{Meanwhile, reserved_meanwhile};
use super::{Desired, Pass};
use crate::crd::tunnel::AddressReservation;
use crate::error::{Error, Result};
use crate::reasons::Reason;

impl Pass<'_> {
    /// Reserves the Tunnel's address (onto host `onto` if set) and records it at once; the one
    /// an earlier reservation made is taken instead when it can be proven.
    pub(super) async fn reserve(&mut self, want: &Desired, onto: Option<String>) -> Result<Address> {
        let provider = want.provider.as_ref();
        if let Some(address) = self.settle_reservation(provider).await? {
            return match onto {
                Some(host) => {
                    act::address::assign(self.tunnel, provider, &address, &host, self.ctx).await?;
                    Ok(Address { host_id: Some(host), ..address })
                }
                None => Ok(address),
            };
        }
        if let Some(listed) = provider.list_untagged_addresses().await? {
            let reservation = AddressReservation {
                since: Timestamp::now().to_string(),
                before: listed.into_iter().map(|a| a.id).collect(),
            };
            self.record(|s| s.address_reservation = Some(reservation)).await?;
        }
        let reserved = act::address::reserve(self.tunnel, provider, onto, self.ctx).await;
        let address = match reserved {
            Ok(address) => address,
            // Refused: nothing was made, so nothing is looked for.
            Err(e) if refused(&e) && self.status().address_reservation.is_some() => {
                self.record(|s| s.address_reservation = None).await?;
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        self.record_address(want.provider.name(), &address).await?;
        Ok(address)
    }

    /// Settles a reservation recorded in status whose answer was lost: the address it made is
    /// recorded as the Tunnel's (and returned) when provable, else named in a Warning Event; the
    /// record goes either way.
    pub(in super::super) async fn settle_reservation(
        &mut self,
        provider: &dyn HostProvider,
    ) -> Result<Option<Address>> {
        let Some(reservation) = self.status().address_reservation.clone() else { return Ok(None) };
        let (tunnel, ctx) = (self.tunnel, self.ctx);
        let outcome = match provider.list_untagged_addresses().await? {
            Some(listed) => {
                let me = tunnel.uid();
                let tunnels = ctx.tunnels.state();
                let others = tunnels.iter().filter(|t| t.uid() != me).filter_map(|t| t.status.as_ref());
                let recorded: HashSet<String> = others.clone().filter_map(|s| s.address_id.clone()).collect();
                let reserving = others.clone().any(|s| s.address_reservation.is_some());
                let started = reservation.since.parse::<Timestamp>().unwrap_or_else(|_| Timestamp::now());
                let elapsed =
                    std::time::Duration::try_from(Timestamp::now().duration_since(started)).unwrap_or_default();
                reserved_meanwhile(&reservation.before, listed, &recorded, reserving, elapsed)
            }
            None => Meanwhile::Nothing,
        };
        match outcome {
            Meanwhile::Nothing => {
                self.record(|s| s.address_reservation = None).await?;
                Ok(None)
            }
            Meanwhile::Adopt(address) => {
                self.record_address(provider.name(), &address).await?;
                info!(address = %address.id, ip = %address.ip, "adopted the reserved address an unanswered reservation made");
                let note = format!(
                    "reserved address {} ({}) at {}, made by a reservation started at {} whose answer was lost, is this Tunnel's",
                    address.ip,
                    address.id,
                    provider.name(),
                    reservation.since
                );
                ctx.publish(tunnel, Reason::AddressAdopted, note).await;
                Ok(Some(address))
            }
            Meanwhile::Unproven(addresses) => {
                self.record(|s| s.address_reservation = None).await?;
                // The addresses go to the operator's log only: they may be another tenant's, and
                // the Event is read in this Tunnel's namespace.
                let names = addresses.iter().map(|a| format!("{} ({})", a.ip, a.id)).collect::<Vec<_>>().join(", ");
                warn!(addresses = %names, "a reservation's answer was lost; its address cannot be proven");
                let note = format!(
                    "a reservation of an address at {} started at {} got no answer; {} unassigned reserved addresses appeared since and none can be proven skyport's. The operator's log names them (\"its address cannot be proven\"); skyport leaves them alone",
                    provider.name(),
                    reservation.since,
                    addresses.len()
                );
                ctx.publish(tunnel, Reason::AddressUnproven, note).await;
                Ok(None)
            }
        }
    }
}

/// Whether the provider answered the call with a refusal: then it made nothing.
fn refused(e: &Error) -> bool {
    matches!(e, Error::Host(h) if h.class() != providers::ErrorClass::Transient)
}

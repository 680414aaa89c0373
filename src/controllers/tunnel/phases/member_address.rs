//! The shared server's phase for a pool with `addressing: PerService`: an address of its own for
//! each member it carries, which the member's services bind on the server. Each address is
//! recorded in status (`memberAddresses`) the moment it is reserved, and released only once the
//! server runs a configuration without it (or no server runs), so an address is never lost, never
//! reserved twice, and never handed to anyone while the server still listens on it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use providers::Address;
use tracing::warn;

use super::super::act::member_address;
use super::{Desired, Failure, Keys, Pass};
use crate::controllers::pool::admit::Admission;
use crate::crd::tunnel::MemberAddress;
use crate::error::Result;

/// The members carried without an address yet, by UID.
fn missing(members: &BTreeMap<String, Admission>, recorded: &[MemberAddress]) -> Vec<String> {
    let has: BTreeSet<&str> = recorded.iter().map(|a| a.uid.as_str()).collect();
    carried(members).filter(|uid| !has.contains(uid)).map(str::to_string).collect()
}

/// The recorded addresses of members no longer carried.
fn departed(members: &BTreeMap<String, Admission>, recorded: &[MemberAddress]) -> Vec<MemberAddress> {
    let carried: BTreeSet<&str> = carried(members).collect();
    recorded.iter().filter(|a| !carried.contains(a.uid.as_str())).cloned().collect()
}

/// Where each carried member's services bind: its recorded address, or, where the provider
/// translates it (`translated`: the server's host and the proven addresses), the private IPv4 it
/// reaches that host at, once it is assigned there. A private IPv4 two members would bind binds
/// neither: each would take the other's traffic.
fn binds(
    members: &BTreeMap<String, Admission>,
    recorded: &[MemberAddress],
    translated: Option<(Option<&str>, &[Address])>,
) -> BTreeMap<String, Ipv4Addr> {
    let carried: BTreeSet<&str> = carried(members).collect();
    let entries = recorded.iter().filter(|a| carried.contains(a.uid.as_str()));
    let bind = |entry: &MemberAddress| -> Option<Ipv4Addr> {
        let Some((host, proven)) = translated else { return entry.ip.parse().ok() };
        let address = proven.iter().find(|a| a.id == entry.id && host.is_some() && a.host_id.as_deref() == host)?;
        address.private_ip.as_deref()?.parse().ok()
    };
    let binds: BTreeMap<String, Ipv4Addr> = entries.filter_map(|e| Some((e.uid.clone(), bind(e)?))).collect();
    let shared = |ip: &Ipv4Addr| binds.values().filter(|other| *other == ip).count() > 1;
    binds.iter().filter(|(_, ip)| !shared(ip)).map(|(uid, ip)| (uid.clone(), *ip)).collect()
}

/// The proven addresses recorded for carried members: those the server must hold.
fn assigned<'a>(
    members: &BTreeMap<String, Admission>,
    recorded: &[MemberAddress],
    proven: &'a [Address],
) -> Vec<&'a Address> {
    let carried: BTreeSet<&str> = carried(members).collect();
    let ids: BTreeSet<&str> =
        recorded.iter().filter(|a| carried.contains(a.uid.as_str())).map(|a| a.id.as_str()).collect();
    proven.iter().filter(|a| ids.contains(a.id.as_str())).collect()
}

fn carried(members: &BTreeMap<String, Admission>) -> impl Iterator<Item = &str> {
    members.iter().filter(|(_, a)| matches!(a, Admission::Carried { .. })).map(|(uid, _)| uid.as_str())
}

/// Where each carried member's services bind, and the member addresses the provider's tags
/// prove (read once per pass).
pub(super) type MemberAddresses = (BTreeMap<String, Ipv4Addr>, Vec<Address>);

impl Pass<'_> {
    /// An address for every carried member that has none (found again by its tags, or reserved),
    /// each recorded at once. A recorded entry the provider's tags do not prove is dropped first:
    /// one released out of band is then reserved anew, and a forged one binds nothing.
    pub(super) async fn member_addresses(&mut self, want: &Desired) -> Result<MemberAddresses, Failure> {
        let (provider, ctx) = (want.provider.as_ref(), self.ctx);
        let mut listed = member_address::listed(self.tunnel, provider, ctx).await?;
        let proven = |e: &&MemberAddress| member_address::proves(&listed, self.tunnel, (&e.uid, &e.id, &e.ip), ctx);
        let unproven: Vec<MemberAddress> =
            self.status().member_addresses.iter().filter(|e| !proven(e)).cloned().collect();
        for gone in unproven {
            warn!(address = %gone.id, member = %gone.uid, "dropping a recorded member address its tags do not prove (gone, or not this member's)");
            self.record(|s| s.member_addresses.retain(|a| a.id != gone.id)).await?;
        }
        for uid in missing(&want.pool.members, &self.status().member_addresses) {
            let address = member_address::reserve_for_member(self.tunnel, &uid, &listed, provider, ctx).await?;
            let entry = MemberAddress { uid, id: address.id.clone(), ip: address.ip.clone() };
            self.record(|s| s.member_addresses.push(entry)).await?;
            if !listed.iter().any(|a| a.id == address.id) {
                listed.push(address);
            }
        }
        let host = self.status().host_id.as_deref();
        let translated = provider.capabilities().pool_addresses.translated().then_some((host, listed.as_slice()));
        Ok((binds(&want.pool.members, &self.status().member_addresses, translated), listed))
    }

    /// Where the provider assigns member addresses to the server
    /// ([`providers::hosts::PoolAddresses::Assigned`]), each carried member's proven address onto
    /// the host now serving; again onto a replacement host. Whether any was moved.
    pub(super) async fn assign_member_addresses(
        &mut self,
        want: &Desired,
        proven: &[Address],
    ) -> Result<bool, Failure> {
        let provider = want.provider.as_ref();
        let host = self.status().host_id.clone().filter(|_| provider.capabilities().pool_addresses.assigned());
        let Some(host) = host else { return Ok(false) };
        let mut moved = false;
        for address in assigned(&want.pool.members, &self.status().member_addresses, proven) {
            moved |= member_address::assign_to(address, (&host, &want.uid), provider).await?;
        }
        Ok(moved)
    }

    /// Releases the addresses of members that left, once the server runs the configuration
    /// without them (`keys.digest` is what it runs), or no server runs at all; only those
    /// `proven` (this pass's read of the provider's tags) shows, with no second read.
    pub(super) async fn release_departed(
        &mut self,
        want: &Desired,
        keys: &Keys,
        proven: &[Address],
    ) -> Result<(), Failure> {
        let status = self.status();
        let unbound = status.host_id.is_none() || status.credentials_digest.as_deref() == Some(keys.digest.as_str());
        if !unbound {
            return Ok(());
        }
        for gone in departed(&want.pool.members, &status.member_addresses.clone()) {
            // Every entry left was proven by `proven`'s tags this pass ([`Self::member_addresses`]).
            if proven.iter().any(|a| a.id == gone.id) {
                member_address::release(want.provider.as_ref(), &gone.id).await?;
            }
            self.record(|s| s.member_addresses.retain(|a| a.id != gone.id)).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::tunnel::TunnelPort;

    fn members() -> BTreeMap<String, Admission> {
        let carried = |port| Admission::Carried {
            ports: vec![TunnelPort { port, protocol: "TCP".into(), proxy_protocol: None }],
            health_port: 40000,
            refused: None,
        };
        let refused = Admission::Refused(crate::controllers::pool::admit::Refusal::NamespaceNotAllowed);
        BTreeMap::from([("u1".into(), carried(80)), ("u2".into(), carried(80)), ("u3".into(), refused)])
    }

    fn address(uid: &str, ip: &str) -> MemberAddress {
        MemberAddress { uid: uid.into(), id: format!("id-{uid}"), ip: ip.into() }
    }

    #[test]
    fn each_carried_member_gets_one_address_and_a_departed_ones_is_released() {
        let recorded = [address("u1", "10.204.0.9"), address("gone", "10.204.0.8"), address("u3", "10.204.0.7")];
        assert_eq!(missing(&members(), &recorded), ["u2"], "u1 has one; u3 is not carried");
        let released: Vec<String> = departed(&members(), &recorded).into_iter().map(|a| a.uid).collect();
        assert_eq!(released, ["gone", "u3"], "refused now: its address goes too");
        assert_eq!(binds(&members(), &recorded, None), BTreeMap::from([("u1".into(), "10.204.0.9".parse().unwrap())]));
        let proven = |id: &str| Address {
            private_ip: None,
            id: id.into(),
            ip: String::new(),
            host_id: None,
            tags: Default::default(),
        };
        let on_provider = [proven("id-u1"), proven("id-gone"), proven("id-stranger")];
        let held: Vec<&str> = assigned(&members(), &recorded, &on_provider).iter().map(|a| a.id.as_str()).collect();
        assert_eq!(held, ["id-u1"], "only a carried member's recorded address goes onto the server");
        // A recorded address that is not IPv4 binds nothing: the member stays off the server.
        assert!(binds(&members(), &[address("u1", "garbage")], None).is_empty());
    }

    /// Where the provider translates member addresses (EC2), a member binds the private IPv4 its
    /// address reaches the server's host at, and only once it is on that host; a private IPv4
    /// two members would bind binds neither.
    #[test]
    fn a_translated_member_binds_its_private_ip_on_the_current_host_only() {
        let on = |id: &str, host: Option<&str>, private_ip: Option<&str>| Address {
            id: id.into(),
            ip: "198.51.100.9".into(),
            host_id: host.map(str::to_string),
            private_ip: private_ip.map(str::to_string),
            tags: Default::default(),
        };
        let recorded = [address("u1", "198.51.100.9"), address("u2", "198.51.100.8")];
        let proven = [on("id-u1", Some("h-1"), Some("172.31.5.77")), on("id-u2", Some("h-old"), Some("172.31.5.78"))];
        let bound = binds(&members(), &recorded, Some((Some("h-1"), &proven)));
        assert_eq!(bound, BTreeMap::from([("u1".into(), "172.31.5.77".parse().unwrap())]), "u2's is on another host");
        assert!(binds(&members(), &recorded, Some((None, &proven))).is_empty(), "no host: nothing bound");
        let clash = [on("id-u1", Some("h-1"), Some("172.31.5.77")), on("id-u2", Some("h-1"), Some("172.31.5.77"))];
        assert!(binds(&members(), &recorded, Some((Some("h-1"), &clash))).is_empty(), "shared: neither");
        let unassociated = [on("id-u1", Some("h-1"), None)];
        assert!(binds(&members(), &recorded, Some((Some("h-1"), &unassociated))).is_empty());
    }
}

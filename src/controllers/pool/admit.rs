//! Which Services a pool's shared exit server carries, and on which ports: a pure plan over the
//! pool's member Tunnels.
//!
//! Two rules keep one namespace from disturbing another through the shared address:
//! - what a member already carries (its `status.pool.ports`) is never taken from it by another
//!   member, however old the other is; a change to a member's ports is taken whole or not at all,
//!   so a refused edit leaves the member serving what it served before;
//! - new claims are taken oldest Tunnel first, and a refusal names the port, never the member
//!   or namespace that holds it.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeInclusive;

use crate::crd::tunnel::{PoolMember, Tunnel, TunnelPort};

/// A port on the shared address: (number, protocol). The PROXY header is the member's own
/// business and does not make a port another one.
type Key = (i32, String);

fn key(port: &TunnelPort) -> Key {
    (port.port, port.protocol.clone())
}

/// One member Tunnel, as the plan reads it.
#[derive(Debug, Clone)]
pub struct Claim {
    pub uid: String,
    pub namespace: String,
    /// When the Tunnel was created (RFC 3339 sorts as time): older claims are taken first.
    pub created: String,
    /// The ports its Service asks for.
    pub wants: Vec<TunnelPort>,
    /// The ports the shared server carries for it now (`status.pool.ports`).
    pub holds: Vec<TunnelPort>,
    /// Its health port now (`status.pool.healthPort`), kept while it stays in the range.
    pub health_port: Option<u16>,
}

/// What the pool's spec and the operator reserve.
#[derive(Debug, Clone)]
pub struct Rules {
    /// `spec.allowedNamespaces`.
    pub allowed_namespaces: BTreeSet<String>,
    /// `spec.healthPorts`: one per member, so the operator's probe of one member's tunnel never
    /// passes through another member's client.
    pub health_ports: RangeInclusive<u16>,
    /// `spec.addressing: PerService`: each member has an address of its own, so a port is taken
    /// only on the member's own address, never by another member.
    pub per_service: bool,
}

/// Why a member is not carried, or not as its Service asks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the exit server pool does not allow this namespace (spec.allowedNamespaces)")]
    NamespaceNotAllowed,
    #[error("{} already served on the pool's shared address; choose other ports", list(.0))]
    Taken(Vec<TunnelPort>),
    #[error(
        "{} in the pool's health-check range {}-{} (spec.healthPorts); choose other ports",
        list(.0), .1.start(), .1.end()
    )]
    InHealthRange(Vec<TunnelPort>, RangeInclusive<u16>),
    #[error(
        "the pool carries as many Services as it has health ports (spec.healthPorts); ask the platform team for a larger range"
    )]
    Full,
    #[error(
        "the pool's exit server holds at most {0} Services with an address of their own (the provider's limit for its size); ask the platform team for a larger spec.size, or addressing Shared"
    )]
    NoAddress(usize),
}

fn list(ports: &[TunnelPort]) -> String {
    let each: Vec<String> = ports.iter().map(|p| format!("{}/{}", p.port, p.protocol)).collect();
    let verb = if each.len() == 1 { "is" } else { "are" };
    format!("port {} {verb}", each.join(", "))
}

/// What the shared server does for one member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Carried on `ports` with its health check on `health_port`; `refused` says why that is not
    /// (yet) what its Service asks for.
    Carried { ports: Vec<TunnelPort>, health_port: u16, refused: Option<Refusal> },
    /// Not carried at all.
    Refused(Refusal),
}

impl Admission {
    /// The ports the shared server carries for the member.
    pub fn ports(&self) -> &[TunnelPort] {
        match self {
            Admission::Carried { ports, .. } => ports,
            Admission::Refused(_) => &[],
        }
    }
}

/// The admission of every claim, by UID.
pub fn admit(rules: &Rules, claims: &[Claim]) -> BTreeMap<String, Admission> {
    let mut out = BTreeMap::new();
    let mut order: Vec<&Claim> = Vec::new();
    for claim in claims {
        if rules.allowed_namespaces.contains(&claim.namespace) {
            order.push(claim);
        } else {
            out.insert(claim.uid.clone(), Admission::Refused(Refusal::NamespaceNotAllowed));
        }
    }
    order.sort_by(|a, b| (&a.created, &a.uid).cmp(&(&b.created, &b.uid)));

    // What each member keeps: what it holds and still wants. Held sets never overlap (only this
    // plan writes them), but a stale status is no reason to hand one port out twice.
    let mut taken: BTreeSet<(String, Key)> = BTreeSet::new();
    let kept: Vec<Vec<TunnelPort>> = order
        .iter()
        .map(|c| {
            let wanted: BTreeMap<Key, &TunnelPort> = c.wants.iter().map(|p| (key(p), p)).collect();
            let held = c.holds.iter().filter_map(|p| wanted.get(&key(p)).copied());
            held.filter(|p| taken.insert((rules.address_of(c), key(p)))).cloned().collect()
        })
        .collect();

    let mut health = HealthPorts::new(rules.health_ports.clone(), &order);
    for (claim, kept) in order.iter().zip(kept) {
        // A member left with nothing it still wants is new again.
        let carried = !kept.is_empty();
        let Some(health_port) = health.assign(claim) else {
            out.insert(claim.uid.clone(), Admission::Refused(Refusal::Full));
            continue;
        };
        let admission = match take(claim, &kept, &mut taken, rules) {
            Ok(ports) => Admission::Carried { ports, health_port, refused: None },
            Err(why) if carried => Admission::Carried { ports: kept, health_port, refused: Some(why) },
            Err(why) => {
                health.release(health_port);
                Admission::Refused(why)
            }
        };
        out.insert(claim.uid.clone(), admission);
    }
    out
}

impl Rules {
    /// Whose address a claim's ports are on: its own under `per_service`, else everybody's.
    fn address_of(&self, claim: &Claim) -> String {
        if self.per_service { claim.uid.clone() } else { String::new() }
    }
}

/// Takes the claim's new ports, all or none; returns every port it then carries.
fn take(
    claim: &Claim,
    kept: &[TunnelPort],
    taken: &mut BTreeSet<(String, Key)>,
    rules: &Rules,
) -> Result<Vec<TunnelPort>, Refusal> {
    let (range, address) = (&rules.health_ports, rules.address_of(claim));
    let kept_keys: BTreeSet<Key> = kept.iter().map(key).collect();
    let new: Vec<&TunnelPort> = claim.wants.iter().filter(|p| !kept_keys.contains(&key(p))).collect();
    let in_range: Vec<TunnelPort> =
        new.iter().filter(|p| u16::try_from(p.port).is_ok_and(|n| range.contains(&n))).map(|p| (*p).clone()).collect();
    if !in_range.is_empty() {
        return Err(Refusal::InHealthRange(in_range, range.clone()));
    }
    let on_address = |p: &&TunnelPort| (address.clone(), key(p));
    let clashing: Vec<TunnelPort> =
        new.iter().filter(|p| taken.contains(&on_address(p))).map(|p| (*p).clone()).collect();
    if !clashing.is_empty() {
        return Err(Refusal::Taken(clashing));
    }
    taken.extend(new.iter().map(on_address));
    let mut ports = claim.wants.clone();
    ports.sort();
    Ok(ports)
}

/// Health ports in use, handed out lowest first; a member keeps the one it has.
struct HealthPorts {
    range: RangeInclusive<u16>,
    used: BTreeSet<u16>,
    /// Ports members hold now, reserved for them until their turn.
    held: BTreeMap<u16, String>,
}

impl HealthPorts {
    fn new(range: RangeInclusive<u16>, order: &[&Claim]) -> Self {
        let mut held = BTreeMap::new();
        for c in order {
            if let Some(port) = c.health_port.filter(|p| range.contains(p)) {
                held.entry(port).or_insert_with(|| c.uid.clone());
            }
        }
        HealthPorts { range, used: BTreeSet::new(), held }
    }

    fn assign(&mut self, claim: &Claim) -> Option<u16> {
        let own = claim.health_port.filter(|p| self.held.get(p) == Some(&claim.uid));
        let free = || self.range.clone().find(|p| !self.used.contains(p) && !self.held.contains_key(p));
        let port = own.or_else(free)?;
        self.used.insert(port);
        Some(port)
    }

    fn release(&mut self, port: u16) {
        self.used.remove(&port);
        self.held.remove(&port);
    }
}

/// Refuses the carried members past the `limit` addresses of their own one server holds
/// ([`Refusal::NoAddress`]): members holding one (`holding`) are kept first, then the oldest
/// (`created`, RFC 3339 by UID), so a new Service never takes the address of one that has it.
pub fn cap_addresses(
    admissions: &mut BTreeMap<String, Admission>,
    limit: usize,
    holding: &BTreeSet<String>,
    created: &BTreeMap<String, String>,
) {
    let mut carried: Vec<&String> =
        admissions.iter().filter(|(_, a)| matches!(a, Admission::Carried { .. })).map(|(uid, _)| uid).collect();
    carried.sort_by_key(|uid| (!holding.contains(*uid), created.get(*uid), *uid));
    let over: Vec<String> = carried.into_iter().skip(limit).cloned().collect();
    for uid in over {
        admissions.insert(uid, Admission::Refused(Refusal::NoAddress(limit)));
    }
}

/// A member Tunnel as the plan reads it: its Service's ports, and what the shared server's
/// status (`recorded`) says it carries.
pub fn claim_of(member: &Tunnel, wants: Vec<TunnelPort>, recorded: &[PoolMember]) -> Option<Claim> {
    let uid = member.metadata.uid.clone()?;
    let held = recorded.iter().find(|m| m.uid == uid);
    Some(Claim {
        namespace: member.metadata.namespace.clone()?,
        created: member.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()).unwrap_or_default(),
        wants,
        holds: held.map(|m| m.ports.clone()).unwrap_or_default(),
        health_port: held.and_then(|m| m.health_port),
        uid,
    })
}

/// The admissions as the shared server's status records them.
pub fn recorded(admissions: &BTreeMap<String, Admission>) -> Vec<PoolMember> {
    let member = |(uid, admission): (&String, &Admission)| match admission {
        Admission::Carried { ports, health_port, refused } => PoolMember {
            uid: uid.clone(),
            ports: ports.clone(),
            health_port: Some(*health_port),
            refused: refused.as_ref().map(ToString::to_string),
        },
        Admission::Refused(why) => {
            PoolMember { uid: uid.clone(), refused: Some(why.to_string()), ..PoolMember::default() }
        }
    };
    admissions.iter().map(member).collect()
}

#[cfg(test)]
#[path = "admit_tests.rs"]
mod tests;

//! How a Tunnel uses its exit servers: one shape for one server and for a pair. A Tunnel has
//! slots, each holding at most one exit server at a time, and a policy over them: which slots it
//! fills and which address the Service publishes from them.

use std::time::Duration;

use super::super::placement::SLOTS;
use super::failover::{PROBE_TIMEOUT, probe_timeout};
use crate::crd::tunnel::{HighAvailabilityMode, TunnelSpec};

/// The policy over a Tunnel's slots, from its spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// One slot: the server's own address, or the reserved one, on the Service. The slot has no
    /// name: status records its server as `hostId`/`hostIp`, and its hosts carry no slot tag.
    Single,
    /// Two slots: the reserved address on the server whose tunnel works, moved when it fails.
    ActiveStandby,
    /// Two slots: both servers' own addresses on the Service, each withdrawn while it fails.
    BothAddresses,
}

/// The one unnamed slot of [`Policy::Single`].
const SINGLE: [Option<&str>; 1] = [None];
/// The named slots of a pair.
const PAIR: [Option<&str>; 2] = [Some(SLOTS[0]), Some(SLOTS[1])];

impl Policy {
    pub fn of(spec: &TunnelSpec) -> Policy {
        match spec.high_availability.as_ref().map(|h| h.mode) {
            None => Policy::Single,
            Some(HighAvailabilityMode::ActiveStandby) => Policy::ActiveStandby,
            Some(HighAvailabilityMode::BothAddresses) => Policy::BothAddresses,
        }
    }

    /// The slots it fills, in order; a named slot tags its hosts and draws on its own budget.
    pub fn slots(self) -> &'static [Option<&'static str>] {
        match self {
            Policy::Single => &SINGLE,
            Policy::ActiveStandby | Policy::BothAddresses => &PAIR,
        }
    }

    /// Whether its servers are kept apart (a spread placement group, zones), which then goes
    /// after them.
    pub fn spreads(self) -> bool {
        self.slots().len() > 1
    }

    /// How long one end-to-end check of a slot's server may take, where a pair's checks come
    /// every `interval`: a single server has nothing to move to, so a slow answer only ever
    /// withdraws or replaces; a pair's hung server must fail in time for the failover.
    pub fn probe_timeout(self, interval: Duration) -> Duration {
        match self {
            Policy::Single => PROBE_TIMEOUT,
            Policy::ActiveStandby | Policy::BothAddresses => probe_timeout(interval),
        }
    }

    /// Whether its reserved address moves between running servers (Hetzner: a floating IP, not
    /// a primary IP).
    pub fn moves_address(self) -> bool {
        self == Policy::ActiveStandby
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::tunnel::HighAvailability;

    fn spec(mode: Option<HighAvailabilityMode>) -> TunnelSpec {
        let high_availability = mode.map(|mode| HighAvailability { mode });
        TunnelSpec { high_availability, ..Default::default() }
    }

    #[test]
    fn one_unnamed_slot_for_a_single_server_and_two_named_ones_for_a_pair() {
        let single = Policy::of(&spec(None));
        assert_eq!(
            (single, single.slots(), single.spreads(), single.moves_address()),
            (Policy::Single, &[None][..], false, false)
        );
        let pair = Policy::of(&spec(Some(HighAvailabilityMode::ActiveStandby)));
        assert_eq!(
            (pair, pair.slots(), pair.spreads(), pair.moves_address()),
            (Policy::ActiveStandby, &PAIR[..], true, true)
        );
        let both = Policy::of(&spec(Some(HighAvailabilityMode::BothAddresses)));
        assert_eq!((both, both.spreads(), both.moves_address()), (Policy::BothAddresses, true, false));
        assert_eq!(PAIR, [Some("a"), Some("b")]);
        let fast = Duration::from_millis(500);
        assert_eq!(single.probe_timeout(fast), PROBE_TIMEOUT, "a single server is given the whole timeout");
        assert_eq!(pair.probe_timeout(fast), probe_timeout(fast));
        assert_eq!(both.probe_timeout(fast), probe_timeout(fast));
    }
}

//! Reserved addresses of the guest provider, of two kinds:
//! - a Tunnel's address with one exit server: a guest link address kept for the Tunnel, so its
//!   replacement guests come up on the same address ([`crate::reservations`]); the link of a new
//!   guest is made with it;
//! - a highly available pair's address ([`AddressRequest::movable`]): one of [`MOVED_RANGE`],
//!   never a link's, moved between running guests the way a Hetzner floating IP moves between
//!   servers. Each server of the pair puts it on its interface at every boot (its user data's
//!   `skyport-addresses.service`, since the provider
//!   [`MovedAddress::OnInterface`](crate::MovedAddress::OnInterface)), and this machine routes
//!   it to one of them: `ip route replace <ip>/32 via <guest ip> dev <guest>h`, a host route
//!   through that guest's link. The route is the record of who holds the address: it is read
//!   back from the routing table, so it cannot drift from where packets go, and it goes with the
//!   link when the guest is deleted.
//!
//! Like a guest's link, a moved address exists only on this machine: reachable from here, from
//! nowhere else.

use std::net::Ipv4Addr;
use std::process::Command;

use async_trait::async_trait;

use super::{GuestProvider, PROVIDER, machine, unavailable, valid_id};
use crate::error::HostError;
use crate::hosts::{Address, AddressRequest};
use crate::limiter::Limiter;
use crate::reservations::{AddressBook, Booked};

/// Where movable reservations come from: no guest link is in it, and no interface here has its
/// addresses; each exists only as a host route to the guest holding it.
pub const MOVED_RANGE: &str = "10.214.0.0/16";
const MOVED_BASE: u32 = 0x0ad6_0000;

/// Whether `ip` is of [`MOVED_RANGE`].
fn is_moved(ip: Ipv4Addr) -> bool {
    u32::from(ip) & 0xffff_0000 == MOVED_BASE
}

/// A route of [`MOVED_RANGE`] in the main table.
#[derive(Debug, PartialEq, Eq)]
struct Route {
    net: Ipv4Addr,
    len: u8,
    dev: String,
}

impl Route {
    /// One line of `ip -4 -o route show` (`10.214.3.7 via 10.213.5.2 dev skg0badcafeh`).
    fn parse(line: &str) -> Option<Route> {
        let mut words = line.split_whitespace();
        let (net, len) = match words.next()?.split_once('/') {
            Some((net, len)) => (net.parse().ok()?, len.parse().ok()?),
            None => (line.split_whitespace().next()?.parse().ok()?, 32),
        };
        let dev = words.skip_while(|w| *w != "dev").nth(1)?.to_string();
        Some(Route { net, len, dev })
    }

    fn covers(&self, ip: Ipv4Addr) -> bool {
        let mask = u32::MAX.checked_shl(32 - u32::from(self.len.min(32))).unwrap_or(0);
        u32::from(ip) & mask == u32::from(self.net) & mask
    }

    /// The guest whose link the route goes through, if it is a host route to one.
    fn guest(&self) -> Option<&str> {
        self.dev.strip_suffix('h').filter(|id| self.len == 32 && valid_id(id))
    }
}

fn ip_command(args: &[&str]) -> Result<String, HostError> {
    let out = Command::new("ip").args(args).output().map_err(|e| unavailable(format!("ip: {e}")))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(unavailable(format!("ip {}: {}", args.join(" "), stderr.trim())));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn moved_routes() -> Result<Vec<Route>, HostError> {
    Ok(ip_command(&["-4", "-o", "route", "show", "root", MOVED_RANGE])?.lines().filter_map(Route::parse).collect())
}

/// An address of [`MOVED_RANGE`] (not a `.0` or `.255`) that no route or interface here has and
/// that is not in `avoid`.
fn free_moved(avoid: &[Ipv4Addr]) -> Result<Ipv4Addr, HostError> {
    let on_interfaces = machine::addresses_in_use().map_err(unavailable)?;
    let routes = moved_routes()?;
    (0..1000)
        .map(|_| Ipv4Addr::from(MOVED_BASE + u32::from(rand::random::<u16>())))
        .find(|ip| {
            !matches!(ip.octets()[3], 0 | 255)
                && !avoid.contains(ip)
                && !on_interfaces.contains(&format!(" {ip}/"))
                && !routes.iter().any(|r| r.covers(*ip))
        })
        .ok_or_else(|| unavailable(format!("no free address left in {MOVED_RANGE}")))
}

/// Removes the host route of `ip` if one of this provider's kind of guests holds it.
fn unroute(ip: Ipv4Addr) -> Result<(), HostError> {
    let held = moved_routes()?.into_iter().any(|r| r.net == ip && r.guest().is_some());
    if held {
        ip_command(&["route", "del", &format!("{ip}/32")])?;
    }
    Ok(())
}

#[async_trait]
impl Booked for GuestProvider {
    fn book(&self) -> AddressBook {
        AddressBook { dir: self.settings.state_dir.clone(), provider: PROVIDER }
    }

    /// Every host's (address, id): first the moved addresses, each held by the guest its route
    /// goes through, then each guest's own.
    fn hosts(&self) -> Result<Vec<(Ipv4Addr, String)>, HostError> {
        let records = self.files().all()?;
        let mut out: Vec<(Ipv4Addr, String)> = moved_routes()?
            .iter()
            .filter_map(|r| Some((r.net, records.iter().find(|rec| Some(rec.id.as_str()) == r.guest())?.id.clone())))
            .collect();
        out.extend(records.into_iter().map(|r| (r.machine.ip, r.id)));
        Ok(out)
    }

    async fn record_free(&self, request: &AddressRequest) -> Result<Address, HostError> {
        let _guard = self.lock.lock().await;
        let mut avoid: Vec<Ipv4Addr> = self.hosts()?.into_iter().map(|(ip, _)| ip).collect();
        avoid.extend(self.reserved()?.iter().map(|r| r.ip));
        let ip = match request.movable {
            true => free_moved(&avoid)?,
            false => machine::free_link(&avoid).map_err(unavailable)?.1,
        };
        self.book().record(ip, &request.tags)
    }

    fn counted_by(&self) -> &Limiter {
        &self.limiter
    }
}

impl GuestProvider {
    /// Routes movable address `id` to running guest `host_id` (from wherever it was routed,
    /// a guest powered off included); routing it there again is success. A link address cannot
    /// move: assigning it only confirms that the guest was made with it.
    pub(super) async fn move_address(&self, id: &str, host_id: &str) -> Result<(), HostError> {
        let _guard = self.lock.lock().await;
        let hosts = self.hosts()?;
        let Some(address) = self.book().find(id, &hosts)? else {
            return Err(HostError::NotFound { provider: PROVIDER, message: format!("address {id}") });
        };
        let ip: Ipv4Addr = address.ip.parse().map_err(|_| unavailable(format!("address {id} is not IPv4")))?;
        if !is_moved(ip) {
            return self.book().check_assigned(id, host_id, &hosts);
        }
        let Some(target) = self.files().read(host_id)?.filter(|r| r.machine.pid().is_some()) else {
            return Err(HostError::Invalid {
                provider: PROVIDER,
                message: format!("guest {host_id} is not running; a reserved address moves only onto a running guest"),
            });
        };
        let (via, dev) = (target.machine.ip.to_string(), format!("{}h", target.machine.name));
        ip_command(&["route", "replace", &format!("{ip}/32"), "via", &via, "dev", &dev]).map(drop)
    }

    /// Unroutes (if movable) and releases address `id`; one already released counts as released.
    pub(super) async fn release(&self, id: &str) -> Result<(), HostError> {
        let _guard = self.lock.lock().await;
        if let Ok(ip) = id.parse::<Ipv4Addr>()
            && is_moved(ip)
        {
            unroute(ip)?;
        }
        self.book().release(id)
    }

    /// [`Self::release`] of every reserved address, blocking and best effort (for `remove_all`).
    pub(super) fn release_all(&self) {
        for address in self.reserved().unwrap_or_default() {
            if is_moved(address.ip) {
                let _ = unroute(address.ip);
            }
            let _ = self.book().release(&address.ip.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_of_the_moved_range_name_the_guest_holding_them() {
        let held = Route::parse("10.214.3.7 via 10.213.5.2 dev skg0badcafeh ").unwrap();
        assert_eq!((held.net, held.len, held.guest()), ("10.214.3.7".parse().unwrap(), 32, Some("skg0badcafe")));
        assert!(held.covers("10.214.3.7".parse().unwrap()) && !held.covers("10.214.3.8".parse().unwrap()));
        let wide = Route::parse("10.214.0.0/24 dev eth0 proto kernel scope link src 10.214.0.1").unwrap();
        assert_eq!(wide.guest(), None, "not a guest's link");
        assert!(wide.covers("10.214.0.99".parse().unwrap()) && !wide.covers("10.214.1.0".parse().unwrap()));
        let other = Route::parse("10.214.3.9 dev vethx").unwrap();
        assert_eq!(other.guest(), None, "a device that is no guest's");
        assert_eq!(Route::parse("garbage"), None);
    }

    #[test]
    fn moved_addresses_are_never_guest_links() {
        assert!(is_moved("10.214.0.1".parse().unwrap()) && is_moved("10.214.255.254".parse().unwrap()));
        assert!(!is_moved("10.213.0.2".parse().unwrap()) && !is_moved("10.215.0.1".parse().unwrap()));
    }
}

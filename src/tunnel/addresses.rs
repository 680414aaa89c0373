//! `skyport tunnel addresses`: the addresses the exit server's services are bound to (a pool
//! member's own, `addressing: PerService`) on the server's public interface. The cloud routes
//! such an address (a Hetzner floating IP, the guest provider's routed address) to the VM
//! unchanged, and the OS answers only on addresses an interface carries. Pushes change the set,
//! so the VM's root oneshot that follows the server config runs this after the firewall
//! (docs/exit-server.md, *Config push*).
//!
//! What it added is recorded in a state file on a tmpfs ([`STATE_PATH`]), gone at reboot exactly
//! when the addresses are. Only addresses listed there are ever removed: the interface's own
//! address, a highly available pair's moved address (put there by `skyport-addresses.service`)
//! and any address already on the host when it became bound are someone else's, and stay.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::Path;

use anyhow::{Context as _, bail};
use tracing::{info, warn};

/// Where the addresses this command put on an interface are recorded, one `<address>
/// <interface>` a line: root's, on a tmpfs.
pub const STATE_PATH: &str = "/run/skyport/bound-addresses";

/// The addresses recorded as put there by this command, each with its interface.
type Added = BTreeMap<Ipv4Addr, String>;

/// `skyport tunnel addresses`: puts the IPv4 addresses the services of the server config at
/// `config` are bound to on the interface of the default route, and removes those it put there
/// before that no service is bound to any more; `state` records what it put there. Runs as root.
/// A config that does not parse changes nothing.
pub fn addresses(config: &Path, state: &Path) -> anyhow::Result<()> {
    follow(config, state, "ip")
}

/// [`addresses`], running `ip` (iproute2) as the program `ip`.
fn follow(config: &Path, state: &Path, ip: &str) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(config).with_context(|| format!("reading {}", config.display()))?;
    let wanted = bound(&text).with_context(|| format!("reading the tunnel configuration {}", config.display()))?;
    let wanted: BTreeSet<Ipv4Addr> = wanted.into_iter().filter(|a| acceptable(*a)).collect();
    let added = read_state(state)?;
    if wanted.is_empty() && added.is_empty() {
        info!("no service is bound to an address of its own");
        return Ok(());
    }
    let ip = Ip(ip);
    let (mut kept, mut failed) = remove_unbound(&ip, &added, &wanted);
    let missing = claim(&ip, &added, &wanted, &mut kept)?;
    if !missing.is_empty() {
        let dev = ip.interface()?;
        for address in missing {
            match ip.run(&["addr", "replace", &format!("{address}/32"), "dev", &dev]) {
                Ok(_) => {
                    info!(%address, dev, "put a bound address on the interface");
                    kept.insert(address, dev.clone());
                }
                Err(e) => failed.push(format!("adding {address}: {e:#}")),
            }
        }
    }
    write_state(state, &kept)?;
    if !failed.is_empty() {
        bail!("{}", failed.join("; "));
    }
    info!(bound = ?wanted, "the bound addresses are on the interface");
    Ok(())
}

/// The IPv4 addresses the services of the server config `text` are bound to.
fn bound(text: &str) -> anyhow::Result<BTreeSet<Ipv4Addr>> {
    let parsed = super::options::split(text)?.parsed()?;
    let server = parsed.server.as_ref().context("not a tunnel server configuration")?;
    let mut bound = BTreeSet::new();
    for service in server.services.values() {
        bound.extend(super::firewall::destination(&service.bind_addr)?.0);
    }
    Ok(bound)
}

/// Whether `address` may be put on the public interface: never one that is the host's own by
/// definition or not a unicast address of the network (a pushed config could name anything).
fn acceptable(address: Ipv4Addr) -> bool {
    let refused = address.is_loopback()
        || address.is_unspecified()
        || address.is_multicast()
        || address.is_broadcast()
        || address.is_link_local();
    if refused {
        warn!(%address, "a service is bound to an address that is not put on an interface");
    }
    !refused
}

/// Removes each address of `added` not in `wanted`; what stays recorded (the wanted ones, and
/// those whose removal failed, so a later run tries again) and why removals failed.
fn remove_unbound(ip: &Ip, added: &Added, wanted: &BTreeSet<Ipv4Addr>) -> (Added, Vec<String>) {
    let (mut kept, mut failed) = (Added::new(), Vec::new());
    for (address, dev) in added {
        if wanted.contains(address) {
            kept.insert(*address, dev.clone());
            continue;
        }
        match ip.run(&["addr", "del", &format!("{address}/32"), "dev", dev]) {
            Ok(_) => info!(%address, dev, "removed an address no service is bound to any more"),
            Err(e) => {
                failed.push(format!("removing {address}: {e:#}"));
                kept.insert(*address, dev.clone());
            }
        }
    }
    (kept, failed)
}

/// The wanted addresses not on the host yet, or recorded but gone (someone removed them); those
/// on the host that are not recorded are someone else's and are left as they are, unrecorded.
fn claim(ip: &Ip, added: &Added, wanted: &BTreeSet<Ipv4Addr>, kept: &mut Added) -> anyhow::Result<Vec<Ipv4Addr>> {
    let present = ip.present()?;
    let mut missing = Vec::new();
    for address in wanted {
        if !present.contains(address) {
            kept.remove(address);
            missing.push(*address);
        } else if !added.contains_key(address) {
            info!(%address, "a bound address is on the host already: left to whoever put it there");
        }
    }
    Ok(missing)
}

/// The addresses recorded at `path`; none when it does not exist (a fresh boot).
fn read_state(path: &Path) -> anyhow::Result<Added> {
    let text = match std::fs::read_to_string(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Added::new()),
        read => read.with_context(|| format!("reading {}", path.display()))?,
    };
    let mut added = Added::new();
    for line in text.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')) {
        let parsed = line.split_once(' ').and_then(|(a, dev)| Some((a.parse().ok()?, dev.trim().to_string())));
        match parsed {
            Some((address, dev)) if !dev.is_empty() => {
                added.insert(address, dev);
            }
            _ => warn!(line, path = %path.display(), "skipped a line that names no address and interface"),
        }
    }
    Ok(added)
}

/// Records `added` at `path` through a rename, readable by root only.
fn write_state(path: &Path, added: &Added) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut text = String::from("# Addresses `skyport tunnel addresses` put on an interface: <address> <interface>\n");
    added.iter().for_each(|(address, dev)| text.push_str(&format!("{address} {dev}\n")));
    super::options::replace_private(path, text.as_bytes()).with_context(|| format!("writing {}", path.display()))
}

/// iproute2's `ip`, by program name.
struct Ip<'a>(&'a str);

impl Ip<'_> {
    /// `ip <args>`'s output; an error with its stderr when it fails.
    fn run(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = std::process::Command::new(self.0)
            .args(args)
            .output()
            .with_context(|| format!("running {} {}", self.0, args.join(" ")))?;
        if !out.status.success() {
            bail!("{} {}: {}", self.0, args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Every IPv4 address on any interface of the host.
    fn present(&self) -> anyhow::Result<BTreeSet<Ipv4Addr>> {
        Ok(inet_addresses(&self.run(&["-4", "-o", "addr", "show"])?))
    }

    /// The interface of the default IPv4 route; without one, the first interface that is up and
    /// not loopback (a guest on a point-to-point link), as `skyport-addresses` picks it.
    fn interface(&self) -> anyhow::Result<String> {
        if let Some(dev) = route_dev(&self.run(&["-4", "route", "show", "default"])?) {
            return Ok(dev);
        }
        first_up(&self.run(&["-o", "link", "show", "up"])?).context("no default route and no interface up")
    }
}

/// The addresses of `ip -4 -o addr show`'s lines (`2: eth0    inet 192.0.2.10/24 brd ...`).
fn inet_addresses(text: &str) -> BTreeSet<Ipv4Addr> {
    let words = text.lines().filter_map(|l| l.split_whitespace().skip_while(|w| *w != "inet").nth(1));
    words.filter_map(|w| w.split('/').next()?.parse().ok()).collect()
}

/// The word after `dev` in `ip -4 route show default`'s first line that has one.
fn route_dev(text: &str) -> Option<String> {
    text.lines().find_map(|l| l.split_whitespace().skip_while(|w| *w != "dev").nth(1).map(str::to_string))
}

/// The first interface of `ip -o link show up` (`2: eth0@if7: <...> ...`) that is not `lo`.
fn first_up(text: &str) -> Option<String> {
    let names = text.lines().filter_map(|l| l.split(": ").nth(1));
    names.map(|n| n.split('@').next().unwrap_or(n)).find(|n| *n != "lo" && !n.is_empty()).map(str::to_string)
}

#[cfg(test)]
mod tests;

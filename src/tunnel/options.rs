//! The exit server's `server.toml` is one document: rathole's configuration plus a `[skyport]`
//! table with what skyport's own code does per service (the PROXY protocol header, the source
//! ranges its firewall admits). rathole refuses keys it does not know, so the server splits the
//! table off and runs rathole on a file derived from the rest ([`derive`]), in which each service with a header has its listener moved
//! to loopback, behind skyport's own listener on the public port ([`super::front`]). Operator
//! pushes, the firewall and the first file from cloud-init all carry the whole document, so a
//! push stays one atomic file and every check reads the same thing the server runs.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;

use anyhow::{Context as _, bail};
use providers::ProxyProtocol;
use providers::cidr::Cidr;
use providers::exit::userdata::SKYPORT_TABLE;
use serde::Deserialize;
use toml::value::{Table, Value};

/// The `[skyport]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Skyport {
    #[serde(default)]
    services: BTreeMap<String, ServiceOptions>,
}

/// `[skyport.services."<name>"]`: options of the rathole service of that name.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceOptions {
    /// `v1` or `v2`.
    proxy_protocol: Option<String>,
    /// Canonical CIDRs the firewall admits to the service's port; absent: anyone.
    source_ranges: Option<Vec<String>>,
}

/// A `server.toml` split in two.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    /// Everything but the `[skyport]` table: what rathole would read.
    pub rathole: Table,
    /// The services whose connections start with a PROXY header, by name.
    pub proxied: BTreeMap<String, ProxyProtocol>,
    /// The services reachable from these networks only, by name (read by the firewall).
    pub ranges: BTreeMap<String, Vec<Cidr>>,
}

/// A service published by skyport's listener on `public`, relayed to rathole's on `internal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Front {
    pub public: SocketAddr,
    pub internal: SocketAddr,
    pub proxy: ProxyProtocol,
}

/// Splits `text`; refuses a `[skyport]` table naming a service the file does not have, a UDP
/// service with a header, an unknown option or version, or source ranges that are not canonical
/// CIDRs (or none at all).
pub fn split(text: &str) -> anyhow::Result<Document> {
    let mut rathole: Table = toml::from_str(text).context("not a TOML document")?;
    let table = match rathole.remove(SKYPORT_TABLE) {
        Some(value) => value.try_into::<Skyport>().context("the [skyport] table")?,
        None => Skyport::default(),
    };
    let (mut proxied, mut ranges) = (BTreeMap::new(), BTreeMap::new());
    for (name, options) in table.services {
        let service = service(&rathole, &name).with_context(|| format!("[skyport.services.{name:?}]"))?;
        if let Some(list) = options.source_ranges {
            ranges.insert(name.clone(), source_ranges(&name, &list)?);
        }
        let Some(value) = options.proxy_protocol else { continue };
        let Some(version) = ProxyProtocol::parse(&value) else {
            bail!("[skyport.services.{name:?}] proxy_protocol = {value:?} is not \"v1\" or \"v2\"");
        };
        if service.get("type").and_then(Value::as_str).is_some_and(|t| t != "tcp") {
            bail!("[skyport.services.{name:?}]: a PROXY header is written ahead of TCP connections only");
        }
        proxied.insert(name, version);
    }
    Ok(Document { rathole, proxied, ranges })
}

/// Service `name`'s `source_ranges`, each a canonical CIDR as the operator writes them. An
/// empty list is refused: it would read as "anyone" to some and "no one" to others.
fn source_ranges(name: &str, list: &[String]) -> anyhow::Result<Vec<Cidr>> {
    if list.is_empty() {
        bail!("[skyport.services.{name:?}] source_ranges is empty: leave it out to admit anyone");
    }
    let parsed: Result<Vec<Cidr>, String> = list.iter().map(|r| Cidr::parse_canonical(r)).collect();
    parsed.map_err(|e| anyhow::anyhow!("[skyport.services.{name:?}] source_ranges: {e}"))
}

/// rathole's `[server.services."<name>"]` table.
fn service<'a>(rathole: &'a Table, name: &str) -> anyhow::Result<&'a Table> {
    let services = rathole.get("server").and_then(|s| s.get("services"));
    services.and_then(|s| s.get(name)).and_then(Value::as_table).context("no such service in [server.services]")
}

impl Document {
    /// rathole's part as TOML.
    pub fn rathole_text(&self) -> anyhow::Result<String> {
        toml::to_string(&self.rathole).context("writing the tunnel configuration")
    }

    /// rathole's part as rathole parses it, without rathole's own checks (token, transport):
    /// enough to read addresses and types.
    pub fn parsed(&self) -> anyhow::Result<rathole::Config> {
        Value::Table(self.rathole.clone()).try_into().context("not a rathole configuration")
    }

    /// The file rathole runs and the listeners skyport holds in front of it. `internal` keeps
    /// each proxied service's loopback address across calls (rathole keeps serving a service
    /// whose section did not change); a new one gets a loopback port the kernel has free now,
    /// which rathole binds once a client connects.
    pub fn derive(&self, internal: &mut BTreeMap<String, SocketAddr>) -> anyhow::Result<(String, Vec<Front>)> {
        internal.retain(|name, _| self.proxied.contains_key(name));
        let mut rathole = self.rathole.clone();
        let mut fronts = Vec::new();
        // Each new port stays held until all are chosen, so two services never get the same one.
        let mut held = Vec::new();
        for (name, &proxy) in &self.proxied {
            let section = rathole
                .get_mut("server")
                .and_then(|s| s.get_mut("services"))
                .and_then(|s| s.get_mut(name))
                .and_then(Value::as_table_mut)
                .with_context(|| format!("no service {name:?}"))?;
            let public = section.get("bind_addr").and_then(Value::as_str).unwrap_or_default();
            let public: SocketAddr =
                public.parse().with_context(|| format!("service {name:?}: bind_addr {public:?} is not ip:port"))?;
            let at = match internal.get(name) {
                Some(at) => *at,
                None => {
                    let probe = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                        .and_then(|l| l.local_addr().map(|at| (l, at)))
                        .with_context(|| format!("service {name:?}: no free loopback port"))?;
                    held.push(probe.0);
                    probe.1
                }
            };
            internal.insert(name.clone(), at);
            section.insert("bind_addr".into(), Value::String(at.to_string()));
            fronts.push(Front { public, internal: at, proxy });
        }
        drop(held);
        let text = toml::to_string(&rathole).context("writing the derived tunnel configuration")?;
        Ok((text, fronts))
    }
}

/// Reads and splits `path`, and has rathole check its part (through a private sibling file,
/// removed after: rathole parses files only).
pub async fn load(path: &Path) -> anyhow::Result<(rathole::Config, Document)> {
    let text = tokio::fs::read_to_string(path).await.with_context(|| format!("reading {}", path.display()))?;
    let document = split(&text).with_context(|| format!("reading {}", path.display()))?;
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(format!(".check-{}-{}", std::process::id(), rand::random::<u32>()));
    let check = path.with_file_name(name);
    write_private(&check, document.rathole_text()?.as_bytes())
        .with_context(|| format!("writing {}", check.display()))?;
    let parsed = rathole::Config::from_file(&check).await;
    let _ = std::fs::remove_file(&check);
    Ok((parsed.with_context(|| format!("reading {}", path.display()))?, document))
}

/// Writes a file only its owner can read, flushed to disk: the configuration carries the Noise key.
pub(super) fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Replaces `path` with `bytes` as [`write_private`] writes them, staged beside it and renamed
/// over it: a reader (nft, systemd, the server) sees the old file or the new one, never half.
pub(super) fn replace_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut staged = path.as_os_str().to_owned();
    staged.push(".skyport-tmp");
    let staged = Path::new(&staged);
    write_private(staged, bytes).and_then(|()| std::fs::rename(staged, path))
}

#[cfg(test)]
mod tests;

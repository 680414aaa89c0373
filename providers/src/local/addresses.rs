//! Reserved addresses of the local provider: a loopback address kept for one Tunnel, so its
//! replacement exit servers bind the same address ([`crate::reservations`]); rathole binds it
//! when it starts. A highly available pair's servers have their own addresses instead, and the
//! reserved one is forwarded by whichever server holds it.

use std::net::Ipv4Addr;
use std::path::Path;

use async_trait::async_trait;

use super::forward_file::{FORWARD_FILE, FORWARD_REFUSED, Forward, bound_file};
use super::{LocalProvider, unavailable};
use crate::error::HostError;
use crate::hosts::{Address, AddressRequest};
use crate::limiter::Limiter;
use crate::reservations::{AddressBook, Booked};

#[async_trait]
impl Booked for LocalProvider {
    fn book(&self) -> AddressBook {
        AddressBook { dir: self.settings.state_dir.clone(), provider: super::PROVIDER }
    }

    /// Every host's (address, id): first the reserved addresses moved onto running hosts, which
    /// hold them whatever host was created with them, then each host's own.
    fn hosts(&self) -> Result<Vec<(Ipv4Addr, String)>, HostError> {
        let records = self.files().all()?;
        let moved = records.iter().filter_map(|r| Some((r.serving?, r.id.clone())));
        let own = records.iter().map(|r| (r.address, r.id.clone()));
        Ok(moved.chain(own).collect())
    }

    /// Movable or not, the same kind: any loopback address can be forwarded by any server.
    async fn record_free(&self, request: &AddressRequest) -> Result<Address, HostError> {
        let _guard = self.lock.lock().await;
        // Skips this book's hosts and reservations, and an address whose control port listens:
        // another state directory's server (a leaked one, say) whose own address it is, which
        // binds its service ports there without sharing them, so a server forwarding this
        // address could never listen on them. Only the default control port is known here.
        let ip = self.allocate(&self.taken()?, crate::exit::userdata::DEFAULT_CONTROL_PORT)?;
        self.book().record(ip, &request.tags)
    }

    fn counted_by(&self) -> &Limiter {
        &self.limiter
    }
}

impl LocalProvider {
    /// Puts address `id` on host `host_id`: already there (it was created with it) is success;
    /// else the host must be running. Its server starts forwarding the address and acknowledges
    /// before the host forwarding it now stops, so the address never goes unanswered during a
    /// move between running hosts ([`super::forward_file`]).
    pub(super) async fn move_address(&self, id: &str, host_id: &str) -> Result<(), HostError> {
        let _guard = self.lock.lock().await;
        let hosts = self.hosts()?;
        let Some(address) = self.book().find(id, &hosts)? else {
            return Err(HostError::NotFound { provider: super::PROVIDER, message: format!("address {id}") });
        };
        if address.host_id.as_deref() == Some(host_id) {
            return Ok(());
        }
        let ip: Ipv4Addr = address.ip.parse().map_err(|_| unavailable(format!("address {id} is not IPv4")))?;
        let target = self.files().read(host_id)?.filter(|_| self.alive(host_id).is_some());
        let Some(mut target) = target else {
            return Err(HostError::Invalid {
                provider: super::PROVIDER,
                message: format!("host {host_id} is not running; a reserved address moves only onto a running host"),
            });
        };
        if let Some(own) = self.files().all()?.into_iter().find(|r| r.address == ip && self.alive(&r.id).is_some()) {
            return Err(HostError::Invalid {
                provider: super::PROVIDER,
                message: format!(
                    "address {ip} is running host {}'s own address; it moves once that host is gone",
                    own.id
                ),
            });
        }
        self.forward(&target.id, Some(ip)).await?;
        target.serving = Some(ip);
        self.write_record(&target)?;
        for mut holder in self.files().all()?.into_iter().filter(|r| r.serving == Some(ip) && r.id != target.id) {
            holder.serving = None;
            self.write_record(&holder)?;
            self.forward(&holder.id, None).await?;
        }
        Ok(())
    }

    /// Names `ip` (or nothing) in host `id`'s forward file; for an address, waits until its
    /// server acknowledges this very request (an acknowledgement of an earlier one may still be
    /// on disk), and takes the address back from the file if it does not in time.
    async fn forward(&self, id: &str, ip: Option<Ipv4Addr>) -> Result<(), HostError> {
        let file = self.host_dir(id).join(FORWARD_FILE);
        let request = Forward::next(&file, ip).map_err(unavailable)?;
        write_replacing(&file, &request.render())?;
        let Some(ip) = ip else { return Ok(()) };
        let bound = bound_file(&file);
        let deadline = tokio::time::Instant::now() + super::FORWARD_TIMEOUT;
        let mut malformed = None;
        while tokio::time::Instant::now() < deadline {
            match Forward::read(&bound) {
                Ok(ack) if ack == Some(request) => return Ok(()),
                Ok(_) => malformed = None,
                Err(e) => malformed = Some(e),
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        write_replacing(&file, &Forward::next(&file, None).map_err(unavailable)?.render())?;
        let why = match malformed {
            Some(e) => format!("last read: {e}"),
            None => refusal(&self.host_dir(id)).unwrap_or_else(|| "its server.log says why".to_string()),
        };
        Err(unavailable(format!(
            "exit server {id} did not listen on {ip} within {}s ({why})",
            super::FORWARD_TIMEOUT.as_secs()
        )))
    }

    fn write_record(&self, record: &super::Record) -> Result<(), HostError> {
        let json = serde_json::to_vec_pretty(record).map_err(|e| unavailable(e.to_string()))?;
        write_replacing(&self.host_dir(&record.id).join("host.json"), &String::from_utf8_lossy(&json))
    }
}

/// The server's last word on why it cannot listen on a forwarded address (a port someone else
/// holds, say), from its log: the provider's error then names the cause where the Tunnel's
/// condition shows it. Those lines name an address, a port and an OS error, never a secret.
fn refusal(host_dir: &Path) -> Option<String> {
    let log = std::fs::read_to_string(host_dir.join("server.log")).ok()?;
    let line = log.lines().rev().find(|l| l.contains(FORWARD_REFUSED))?;
    Some(line[line.find(FORWARD_REFUSED)?..].trim().to_string())
}

/// Replaces `path` through a rename: its reader never sees half a file.
fn write_replacing(path: &Path, text: &str) -> Result<(), HostError> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(|e| unavailable(format!("cannot write {}: {e}", tmp.display())))?;
    std::fs::rename(&tmp, path).map_err(|e| unavailable(format!("cannot replace {}: {e}", path.display())))
}

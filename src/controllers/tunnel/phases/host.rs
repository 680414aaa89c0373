//! The host and address phases: the exit server stepped by [`plan::host_step`] until it runs
//! with the Service's ports, and the reserved address stepped by [`address_step`] onto it. A
//! created host or reserved address is recorded the moment it exists, so a crash never makes a
//! second one; waiting is a short requeue, never a blocked worker.

use kube::ResourceExt;
use providers::hosts::{TAG_CLUSTER, TAG_TUNNEL_NAMESPACE};
use providers::{Address, AddressBinding, Host, HostProvider};

use super::super::plan::address::{self as address_plan, AddressStep, address_step};
use super::super::plan::{self, HostStep, budget};
use super::super::status::not_ready;
use super::super::{act, observe};
use super::single::Running;
use super::{Desired, Keys, Pass};
use crate::controllers::service::desired::{ANNOTATION_RESERVED_ADDRESS, named_address};
use crate::crd::tunnel::TunnelPhase;
use crate::error::{Error, Result};
use crate::reasons::Reason;

/// Hosts a reconcile may step through before it gives up (a provider handing back hosts that
/// are stopped at once must not make it spin).
const MAX_HOST_STEPS: usize = 4;

impl Pass<'_> {
    /// Finds the exit server (deleting extras), prepares the reserved address, and steps the host
    /// until it runs with the Service's ports. `None`: booting (or being deleted), look again soon.
    pub(super) async fn host(&mut self, want: &Desired, keys: &Keys) -> Result<Option<Running>> {
        let (tunnel, ctx, provider) = (self.tunnel, self.ctx, &want.provider);
        let found = observe::find_host(provider.as_ref(), self.status(), &want.uid).await?;
        act::host::delete_extras(provider.as_ref(), &found.extras, &want.showing(), ctx).await?;
        let address = self.prepare_address(want).await?;
        let address_id = address.as_ref().map(|a| a.id.as_str());
        let mut host = found.host;
        let mut configured = keys.configured.clone();
        for _ in 0..MAX_HOST_STEPS {
            match plan::host_step(host.as_ref(), &configured, &want.ports) {
                HostStep::Ready { ip } => return Ok(host.map(|host| Running { ip, host, address })),
                HostStep::Wait { why } => {
                    self.unpublish(want).await?;
                    let (provider_name, id) = (provider.name().to_string(), host.map(|h| h.id));
                    self.record(|s| {
                        s.phase = Some(TunnelPhase::Provisioning);
                        s.provider = Some(provider_name);
                        s.host_id = id;
                        s.conditions = not_ready(Reason::Provisioning, &why);
                    })
                    .await?;
                    return Ok(None);
                }
                HostStep::Create => {
                    self.unpublish(want).await?;
                    if let Some(why) = address_held(provider.as_ref(), address_id).await? {
                        self.record(|s| {
                            s.phase = Some(TunnelPhase::Provisioning);
                            s.host_id = None;
                            s.conditions = not_ready(Reason::Provisioning, &why);
                        })
                        .await?;
                        return Ok(None);
                    }
                    self.charge_host(None).await?;
                    let created =
                        act::host::create(tunnel, provider.as_ref(), &keys.server, (address.as_ref(), None), ctx)
                            .await?;
                    self.record_created(want, keys, &created).await?;
                    configured = want.ports.clone();
                    host = Some(created);
                }
                HostStep::Replace { id, why } => {
                    act::host::replace_lost(tunnel, provider.as_ref(), (&id, &why), &want.showing(), ctx).await?;
                    host = None;
                }
                HostStep::Reconfigure { id, ip: _ } => {
                    let push = (id.as_str(), &keys.server, want.ports.as_slice());
                    if act::host::reconfigure(tunnel, provider.as_ref(), push, &want.showing(), ctx).await? {
                        let (ports, digest) = (want.ports.clone(), keys.digest.clone());
                        // The push carried the ranges too, where the host enforces them.
                        let (pushed, ranges) =
                            (want.provider.capabilities().host_enforces_source_ranges, ranges_on_host(want, keys));
                        self.record(|s| {
                            s.ports = ports;
                            s.credentials_digest = Some(digest);
                            if pushed {
                                s.source_ranges = ranges;
                            }
                        })
                        .await?;
                        configured = want.ports.clone();
                    } else {
                        host = None;
                    }
                }
            }
        }
        Err(Error::Host(providers::HostError::Unavailable {
            provider: provider.name(),
            message: "the exit server did not reach a usable state".into(),
        }))
    }

    /// Draws one exit server from slot `slot`'s daily budget ([`budget`]), recorded before the
    /// create call so that a crash right after never leaves it uncounted, and from the operator's
    /// hourly one; a spent budget is an error that retries once the budget has room again.
    pub(super) async fn charge_host(&mut self, slot: Option<&'static str>) -> Result<()> {
        let (now, per_day) = (k8s_openapi::jiff::Timestamp::now(), self.ctx.settings.max_hosts_per_day);
        if let Err(next) = budget::allows(&self.status().hosts_created, slot, now, per_day) {
            let wait = std::time::Duration::try_from(next.duration_since(now)).unwrap_or_default();
            let retry_after = wait.max(std::time::Duration::from_secs(1));
            return Err(Error::HostBudget { message: budget::spent_message(slot, per_day, next), retry_after });
        }
        // The operator-wide budget ([`super::super::hourly`]), which no status edit refills.
        if let Err(wait) = self.ctx.creations.take() {
            let message = self.ctx.creations.spent_message(wait);
            return Err(Error::HostBudget { message, retry_after: wait.max(std::time::Duration::from_secs(1)) });
        }
        let created = budget::with_creation(&self.status().hosts_created, slot, now);
        self.record(|s| s.hosts_created = created).await
    }

    /// Recorded before anything else can fail: a restart finds this host, not a new one.
    async fn record_created(&mut self, want: &Desired, keys: &Keys, created: &Host) -> Result<()> {
        let provider = want.provider.name();
        let (ports, digest) = (want.ports.clone(), keys.digest.clone());
        let ranges = ranges_on_host(want, keys);
        self.record(|s| {
            s.source_ranges = ranges;
            s.phase = Some(TunnelPhase::Provisioning);
            s.provider = Some(provider.to_string());
            s.host_id = Some(created.id.clone());
            s.host_ip = created.public_ipv4.clone();
            s.ports = ports;
            s.credentials_digest = Some(digest);
            s.conditions = not_ready(Reason::Provisioning, &format!("created exit server {}", created.id));
        })
        .await?;
        let note = format!("created exit server {} at {provider}", created.id);
        self.ctx.publish(self.tunnel, Reason::Provisioning, note).await;
        Ok(())
    }

    /// Takes the address off the Service while no host serves it.
    pub(super) async fn unpublish(&self, want: &Desired) -> Result<()> {
        match want.publishes() {
            Some(service) => act::set_ingress(service, None, self.ctx).await,
            None => Ok(()),
        }
    }

    /// Before the exit server is stepped, for a Tunnel with a reserved address: finds it, takes a
    /// released one off the Service, releases duplicates, and reserves the address where the
    /// provider needs it first. `None` without one, or not yet reserved.
    pub(super) async fn prepare_address(&mut self, want: &Desired) -> Result<Option<Address>> {
        let (tunnel, ctx, provider) = (self.tunnel, self.ctx, &want.provider);
        if !tunnel.spec.reserves_address() {
            return Ok(None);
        }
        let at = (tunnel.namespace().unwrap_or_default(), tunnel.name_any());
        let named = want.publishes().and_then(named_address).map(str::to_string);
        let tunnel_at = (at.0.as_str(), at.1.as_str());
        let found = observe::find_address(
            provider.as_ref(),
            self.status(),
            &want.uid,
            tunnel_at,
            (named.as_deref(), &ctx.cluster_id),
        )
        .await?;
        act::address::release_extras(provider.as_ref(), &found.extras).await?;
        if address_plan::lost(self.status().address_id.as_deref(), found.address.as_ref()) {
            let old = self.status().address_ip.clone().unwrap_or_default();
            act::address::lost(tunnel, &old, &want.showing(), ctx).await?;
            self.record(|s| {
                s.address_id = None;
                s.address_ip = None;
            })
            .await?;
        }
        let mut found_address = found.address;
        if found_address.is_none() && self.status().address_id.is_none() {
            found_address = match &named {
                Some(named) => Some(self.take_named(want, named).await?),
                None => self.take_over_kept(want).await?,
            };
        }
        match found_address {
            // Found by its host's tags: a reservation whose answer was lost made it.
            Some(address) if self.status().address_reservation.is_some() => {
                self.record_address(provider.name(), &address).await?;
                Ok(Some(address))
            }
            Some(address) => Ok(Some(address)),
            None if address_plan::reserve_first(provider.capabilities().address_binding, None) => {
                self.reserve(want, None).await.map(Some)
            }
            None => Ok(None),
        }
    }

    /// The address an earlier Tunnel of this Service kept for it (deleted while the Service still
    /// asked for one: [`address_plan::keep_for_successor`]), recorded as this Tunnel's at once.
    async fn take_over_kept(&mut self, want: &Desired) -> Result<Option<Address>> {
        if !want.publishes {
            return Ok(None);
        }
        let (tunnel, ctx) = (self.tunnel, self.ctx);
        let live = ctx.tunnels.state().iter().filter_map(|t| t.uid()).collect();
        let namespace = tunnel.namespace().unwrap_or_default();
        let listed = observe::addresses_named(want.provider.as_ref(), &tunnel.name_any()).await?;
        let Some(address) = listed.into_iter().find(|a| address_plan::kept_for(a, &namespace, &ctx.cluster_id, &live))
        else {
            return Ok(None);
        };
        self.record_address(want.provider.name(), &address).await?;
        let note = format!(
            "took over reserved address {} ({}), kept by this Service's previous Tunnel",
            address.ip, address.id
        );
        ctx.publish(tunnel, Reason::AddressTakenOver, note).await;
        Ok(Some(address))
    }

    /// The retained address the Service names (`skyport.dev/reserved-address`, its id or IP),
    /// recorded as this Tunnel's at once; refused with why unless [`address_plan::handed_over`]
    /// proves it may be. Only this namespace's addresses of this cluster are listed, so the
    /// answer for another namespace's address is the one for an address that does not exist.
    async fn take_named(&mut self, want: &Desired, named: &str) -> Result<Address> {
        let (tunnel, ctx, provider) = (self.tunnel, self.ctx, want.provider.as_ref());
        if provider.capabilities().address_binding == AddressBinding::WithHost {
            return Err(Error::Handover(format!(
                "reserved addresses at {} carry no tags, so skyport cannot prove that {named} is this namespace's; remove the Service's annotation {ANNOTATION_RESERVED_ADDRESS}",
                provider.name()
            )));
        }
        let namespace = tunnel.namespace().unwrap_or_default();
        let listed = provider.list_addresses_by_tag(TAG_TUNNEL_NAMESPACE, &namespace).await?;
        let here = |a: &Address| a.tags.get(TAG_CLUSTER) == Some(&ctx.cluster_id);
        let named_one =
            |a: &Address| (a.id == named || a.ip == named) && here(a) && !observe::is_member_address(&a.tags);
        let Some(address) = listed.into_iter().find(named_one) else {
            return Err(Error::Handover(format!(
                "no reserved address {named} at {} was kept by a Tunnel of this namespace in this cluster; the Service's annotation {ANNOTATION_RESERVED_ADDRESS} must name one a deleted Tunnel here kept with deletionPolicy Retain (its id or IP)",
                provider.name()
            )));
        };
        let tunnels = ctx.tunnels.state();
        let live = tunnels.iter().filter_map(|t| t.uid()).collect();
        let others = tunnels
            .iter()
            .filter(|t| t.uid().as_deref() != Some(want.uid.as_str()))
            .filter_map(|t| t.status.as_ref()?.address_id.clone())
            .collect();
        address_plan::handed_over(&address, (&namespace, &ctx.cluster_id), &want.uid, &live, &others).map_err(
            |why| {
                Error::Handover(format!(
                    "{why}; the Service's annotation {ANNOTATION_RESERVED_ADDRESS} cannot be served yet"
                ))
            },
        )?;
        self.record_address(provider.name(), &address).await?;
        let note = format!(
            "took over reserved address {} ({}), named by the Service's annotation {ANNOTATION_RESERVED_ADDRESS}",
            address.ip, address.id
        );
        ctx.publish(tunnel, Reason::AddressTakenOver, note).await;
        Ok(address)
    }

    /// Records `address` as the Tunnel's reserved address, with its provider; a reservation
    /// under way is over.
    pub(super) async fn record_address(&mut self, provider: &str, address: &Address) -> Result<()> {
        let provider = provider.to_string();
        self.record(|s| {
            s.provider = Some(provider);
            s.address_id = Some(address.id.clone());
            s.address_ip = Some(address.ip.clone());
            s.address_reservation = None;
        })
        .await
    }

    /// Steps the reserved address onto the running exit server; without one the Tunnel's address
    /// is the host's own. `None`: the host was deleted to get the address at creation.
    pub(super) async fn address(&mut self, want: &Desired, running: &Running) -> Result<Option<String>> {
        let (tunnel, ctx, provider) = (self.tunnel, self.ctx, &want.provider);
        if !tunnel.spec.reserves_address() {
            return Ok(Some(running.ip.clone()));
        }
        let host_id = running.host.id.as_str();
        let mut address = running.address.clone();
        // Read before the host was created or replaced: where a new host takes the address at
        // creation, only a fresh read shows it there.
        if let Some(stale) = address.as_ref().filter(|a| a.host_id.as_deref() != Some(host_id)) {
            address = provider.get_address(&stale.id).await?;
        }
        for _ in 0..3 {
            match address_step(provider.capabilities().address_binding, address.as_ref(), host_id) {
                AddressStep::Ready { ip } => return Ok(Some(ip)),
                AddressStep::Reserve { onto } => address = Some(self.reserve(want, onto).await?),
                AddressStep::Assign { id, host_id } => {
                    let Some(current) = address.filter(|a| a.id == id) else { break };
                    act::address::assign(tunnel, provider.as_ref(), &current, &host_id, ctx).await?;
                    address = Some(Address { host_id: Some(host_id), ..current });
                }
                AddressStep::ReplaceHost { id, why } => {
                    act::address::replace_host(tunnel, provider.as_ref(), (&id, &why), &want.showing(), ctx).await?;
                    self.record(|s| {
                        s.phase = Some(TunnelPhase::Provisioning);
                        s.host_id = None;
                        s.host_ip = None;
                        s.conditions = not_ready(Reason::Replacing, &why);
                    })
                    .await?;
                    return Ok(None);
                }
            }
        }
        Err(Error::Host(providers::HostError::Unavailable {
            provider: provider.name(),
            message: "the reserved address did not reach the exit server".into(),
        }))
    }
}

/// Why a new host must wait for the reserved address `id` ([`address_plan::may_create`]), read
/// fresh: the host that held it may have just been deleted.
async fn address_held(provider: &dyn HostProvider, id: Option<&str>) -> Result<Option<String>> {
    let Some(id) = id.filter(|_| provider.capabilities().address_binding == AddressBinding::AtCreate) else {
        return Ok(None);
    };
    let address = provider.get_address(id).await?;
    Ok(address_plan::may_create(provider.capabilities().address_binding, address.as_ref()).err())
}

/// The source ranges a host created or reconfigured with `keys.server` enforces by itself (they
/// are in its config, and its firewall reads them there), for `status.sourceRanges`; `None`
/// where the provider's hosts do not, or there are none.
fn ranges_on_host(want: &Desired, keys: &Keys) -> Option<Vec<String>> {
    let on_host = want.provider.capabilities().host_enforces_source_ranges && !keys.source_ranges.is_empty();
    on_host.then(|| keys.source_ranges.clone())
}

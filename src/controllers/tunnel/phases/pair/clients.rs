//! The pair's client Deployments: one per slot, each dialing its own server, rolled one at a
//! time so that the Service never loses the server carrying it ([`roll`], [`roll_both`]).

use std::collections::BTreeMap;
use std::time::Duration;

use providers::Address;
use providers::exit::userdata::render_client_toml;

use super::super::super::placement::Placement;
use super::super::super::plan::failover::{Client, Roll, roll, roll_both};
use super::super::super::{act, desired};
use super::super::{Desired, Failure, Keys, Pass};
use super::Slot;
use crate::error::Error;
use crate::reasons::Reason;

/// How long the holder's stale client waits while the holder itself fails before it is rolled in
/// place: a client Pod normally restarts within seconds, and a failing holder carries nothing a
/// roll could interrupt.
const ROLL_PATIENCE: Duration = Duration::from_secs(60);

/// How long a halted roll waits before a Warning says so: a Deployment's default progress
/// deadline, by which a new client that could roll out has.
const ROLL_DEADLINE: Duration = Duration::from_secs(600);

/// What a pass did with the clients.
pub(super) struct Clients {
    /// The slots whose running client was restarted.
    pub(super) restarted: Vec<usize>,
    /// A client kept on its previous config or image because the other slot's new one has not
    /// proven itself yet, and why (for the Ready message).
    pub(super) waiting: Option<String>,
}

impl Pass<'_> {
    /// One client config per slot whose host's own address is known (all in one Secret write,
    /// only when one changed), and one client Deployment for each, rolled one at a time
    /// ([`roll`]): the holder's last, after the address was handed to the other server; with
    /// `both` addresses published, [`roll_both`].
    pub(super) async fn pair_clients(
        &mut self,
        want: &Desired,
        keys: &Keys,
        slots: &[Slot],
        address: &mut Option<Address>,
        both: bool,
    ) -> Result<Clients, Failure> {
        let (tunnel, ctx) = (self.tunnel, self.ctx);
        let cluster_ip = self.cluster_ip(want)?;
        let ports = (ctx.settings.control_port, ctx.settings.health_port);
        let image = ctx.settings.client_image.as_str();
        let mut configs: BTreeMap<String, String> = keys.stored_pair.clone();
        let mut wanted: [Option<(Placement, String)>; 2] = [None, None];
        let mut clients = [None, None];
        for (i, slot) in slots.iter().enumerate() {
            let Some(ip) = slot.own_ip.as_deref().filter(|_| slot.host.is_some()) else { continue };
            let client = desired::client(want.forwarded(), &keys.credentials, ip, ports, &cluster_ip);
            let toml = render_client_toml(&client).map_err(|e| Error::Internal(format!("client config: {e}")))?;
            let at = slot.client_at(&want.at);
            let checksum = desired::checksum(&toml);
            clients[i] = Some(match act::deployed(&at, image, &checksum, ctx).await? {
                act::Deployed::Missing => Client::Missing,
                act::Deployed::Stale => Client::Stale,
                act::Deployed::Current { rolled_out: true, .. } => Client::Current,
                act::Deployed::Current { rolled_out: false, .. } => Client::Rolling,
            });
            configs.insert(at.client_key(), toml);
            wanted[i] = Some((at, checksum));
        }
        if configs != keys.stored_pair {
            act::write_pair_client_config(tunnel, &want.at, &configs, ctx).await?;
        }
        let holder = address
            .as_ref()
            .and_then(|a| slots.iter().position(|s| s.id().is_some() && s.id() == a.host_id.as_deref()));
        let health = |i: usize| slots[i].check.as_ref().map(|(h, _)| *h);
        let passing = [0, 1].map(|i| health(i).is_some_and(|h| h.passing()));
        // A server not running yet (booting, being replaced) is waited for like a failing one.
        let failing_for = [0, 1].map(|i| health(i).map_or(Duration::ZERO, |h| h.failing_for));
        let step = if both {
            roll_both(clients, passing, failing_for, ROLL_PATIENCE)
        } else {
            roll(clients, holder, passing, failing_for, ROLL_PATIENCE)
        };
        if let (Some(to), Some(from)) = (step.handover_to, holder)
            && let Some(to_id) = slots[to].id()
        {
            *address = Some(self.put_address(want, address.take(), to_id).await?);
            let from_id = slots[from].id().unwrap_or_default();
            let note = format!(
                "moved the reserved address from exit server {from_id} to {to_id}, whose client is current, to roll the client of {from_id}"
            );
            ctx.publish(tunnel, Reason::Handover, note).await;
        }
        for &i in &step.apply {
            if let Some((at, checksum)) = &wanted[i] {
                act::apply_deployment(tunnel, at, image, checksum, ctx).await?;
            }
        }
        let waiting = waiting(&clients, &step, passing, slots);
        if ctx.halted_rolls.overdue(&want.uid, waiting.is_some(), ROLL_DEADLINE)
            && let Some(why) = &waiting
        {
            let deadline = humantime::format_duration(ROLL_DEADLINE);
            let note = format!("the client roll has been halted for {deadline}: {why}");
            ctx.publish(tunnel, Reason::ClientRollHalted, note).await;
        }
        let restarted = step.apply.into_iter().filter(|&i| clients[i] == Some(Client::Stale)).collect();
        Ok(Clients { restarted, waiting })
    }
}

/// Names a stale client that [`roll`] keeps (no handover this pass), and what it waits for.
fn waiting(clients: &[Option<Client>; 2], step: &Roll, passing: [bool; 2], slots: &[Slot]) -> Option<String> {
    if step.handover_to.is_some() {
        return None;
    }
    let kept = (0..2).find(|&i| clients[i] == Some(Client::Stale) && !step.apply.contains(&i))?;
    let other = 1 - kept;
    let (id, other_id) = (slots[kept].id()?, slots[other].id().unwrap_or("of the other slot"));
    let what = match clients[other] {
        Some(Client::Rolling) => "to roll out (its Deployment has no available Pod of the new template yet)",
        Some(Client::Current) if !passing[other] => "to pass its health check",
        None => "to have a server to dial",
        _ => "to be applied",
    };
    Some(format!(
        "the client of exit server {id} keeps its previous configuration and image while it waits for the new client of exit server {other_id} {what}"
    ))
}

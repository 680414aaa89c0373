//! Every exit server a Tunnel creates draws from its slot's daily budget
//! (`--tunnel-max-hosts-per-day`), whatever makes it create one: here, a provider whose hosts
//! stop at once (an account policy or image that stops instances), which is replaced at once.

use std::sync::Arc;

use providers::HostState;
use providers::hosts::TAG_TUNNEL_SLOT;

use super::tests::{harness_settings, ready};
use crate::config::TunnelArgs;
use crate::crd::condition::ConditionStatus;
use crate::crd::tunnel::{AddressMode, HighAvailability, TunnelAddress};

const PER_DAY: u32 = 3;

fn settings() -> TunnelArgs {
    TunnelArgs { max_hosts_per_day: PER_DAY, ..TunnelArgs::default() }
}

#[tokio::test]
async fn hosts_that_stop_at_once_are_bought_at_most_the_days_budget() {
    let mut h = harness_settings(settings());
    h.add_service();
    h.provider.create_as(HostState::Stopped);
    h.new_tunnel();
    let mut refused = 0;
    for _ in 0..12 {
        // A pass gives up on hosts that stop as they come (ProviderUnavailable) before the
        // budget is spent; from then on every pass is refused until a day has passed.
        if let Err(e) = h.reconcile(Arc::new(h.current())).await
            && e.reason() == "HostBudgetSpent"
        {
            let wait = e.retry_after().expect("retried when the budget refills");
            assert!(wait > std::time::Duration::from_secs(23 * 3600), "{wait:?}");
            refused += 1;
        }
    }
    assert_eq!(h.provider.count("create"), PER_DAY as usize, "one day's budget, not one host per pass");
    assert!(refused > 0);
    let t = h.current();
    assert_eq!(ready(&t), (ConditionStatus::False, "HostBudgetSpent".into()));
    let message = crate::controllers::status::ready_condition(&t).unwrap().message.clone();
    assert!(message.contains("--tunnel-max-hosts-per-day 3"), "{message}");
    assert!(h.api.event_reasons().contains(&"HostBudgetSpent".to_string()), "{:?}", h.api.event_reasons());
    // Counted in status: another operator process (a restart, a new leader) sees the same.
    assert_eq!(t.status.unwrap().hosts_created.len(), PER_DAY as usize);
}

#[tokio::test]
async fn each_server_of_a_pair_has_a_budget_of_its_own() {
    let mut h = harness_settings(settings());
    h.add_service();
    let mut t = (*h.new_tunnel()).clone();
    t.spec.address = Some(TunnelAddress { mode: AddressMode::Reserved, ..Default::default() });
    t.spec.high_availability = Some(HighAvailability::default());
    h.put_tunnel(&t);
    h.provider.create_as(HostState::Stopped);
    for _ in 0..12 {
        let _ = h.reconcile(Arc::new(h.current())).await;
    }
    assert_eq!(h.provider.count("create"), 2 * PER_DAY as usize, "{:?}", h.provider.calls());
    let created = h.current().status.unwrap().hosts_created;
    for slot in ["a", "b"] {
        let of_slot = created.iter().filter(|c| c.slot.as_deref() == Some(slot)).count();
        assert_eq!(of_slot, PER_DAY as usize, "slot {slot}: {created:?}");
    }
    let slots: Vec<String> = h.provider.hosts().iter().filter_map(|h| h.tags.get(TAG_TUNNEL_SLOT).cloned()).collect();
    assert!(slots.len() <= 2, "never more than one server per slot at a time: {slots:?}");
}

/// Active, then failing for `--tunnel-replace-after`, again and again (a leak under load, egress
/// closed later): each Active clears the replacements in a row, not the day's budget.
#[tokio::test]
async fn a_failure_after_the_tunnel_was_active_once_draws_from_the_budget() {
    let mut h = harness_settings(settings());
    h.add_service();
    h.new_tunnel();
    let client = "/apis/apps/v1/namespaces/ns/deployments/web-tunnel-client";
    let mut active = 0;
    for _ in 0..8 {
        h.probe.answer(true);
        for _ in 0..2 {
            let _ = h.reconcile(Arc::new(h.current())).await;
        }
        if ready(&h.current()).1 == "Active" {
            active += 1;
        }
        if let Some(mut deployment) = h.api.get(client) {
            deployment["status"] = serde_json::json!({"replicas": 1, "availableReplicas": 1});
            h.api.put(client, deployment);
        }
        h.probe.answer(false);
        let _ = h.reconcile(Arc::new(h.current())).await;
        for host in h.provider.hosts() {
            h.ctx.health.backdate(&host.id, 100 * h.ctx.settings.replace_after);
        }
        for _ in 0..2 {
            let _ = h.reconcile(Arc::new(h.current())).await;
        }
    }
    assert!(active >= PER_DAY, "each server was Active before it failed: {active}");
    assert_eq!(h.provider.count("create"), PER_DAY as usize, "{:?}", h.provider.calls());
    assert_eq!(ready(&h.current()), (ConditionStatus::False, "HostBudgetSpent".into()));
}

/// An EC2 pair server: RunInstances succeeds, AssignPrivateIpAddresses fails with a retryable
/// code, so the adapter terminates the instance and the create fails as retryable: every try
/// bought a VM, and every try draws from the slot's budget.
#[tokio::test]
async fn a_pair_server_whose_secondary_address_fails_retryably_draws_from_the_budget() {
    use providers::HostError;
    let mut h = harness_settings(settings());
    h.provider.move_to_secondary_addresses();
    h.add_service();
    let mut t = (*h.new_tunnel()).clone();
    t.spec.address = Some(TunnelAddress { mode: AddressMode::Reserved, ..Default::default() });
    t.spec.high_availability = Some(HighAvailability::default());
    h.put_tunnel(&t);
    let mut spent = false;
    for _ in 0..12 {
        let message = "AssignPrivateIpAddresses: RequestLimitExceeded; the instance was terminated".into();
        h.provider.fail_next("create", HostError::Unavailable { provider: "fake", message });
        if let Err(e) = h.reconcile(Arc::new(h.current())).await {
            spent |= e.reason() == "HostBudgetSpent";
        }
    }
    assert!(spent, "{:?}", h.provider.calls());
    assert_eq!(h.provider.count("create"), PER_DAY as usize, "slot a's budget: {:?}", h.provider.calls());
    let created = h.current().status.unwrap().hosts_created;
    assert!(created.iter().all(|c| c.slot.as_deref() == Some("a")), "{created:?}");
}

/// A thief with skyport's token erases `status.hostsCreated` or deletes the Service's Tunnel,
/// which skyport makes again with nothing counted: each would refill the daily budget, so the
/// operator's hourly one ([`super::hourly`]), kept in the process, bounds what is bought.
#[tokio::test]
async fn erasing_the_count_or_making_the_tunnel_anew_buys_no_more_than_the_operators_hourly_budget() {
    const PER_HOUR: u32 = 5;
    let mut h = harness_settings(TunnelArgs { max_hosts_per_hour: PER_HOUR, ..settings() });
    h.add_service();
    h.provider.create_as(HostState::Stopped);
    h.new_tunnel();
    let mut refused = None;
    for round in 0..12 {
        for _ in 0..2 {
            if let Err(e) = h.reconcile(Arc::new(h.current())).await
                && e.reason() == "HostBudgetSpent"
            {
                refused = Some(crate::controllers::status::ready_condition(&h.current()).unwrap().message.clone());
            }
        }
        let mut t = h.current();
        if round % 2 == 0 {
            t.status.as_mut().unwrap().hosts_created.clear();
        } else {
            t.metadata.uid = Some(format!("tunnel-uid-{round}"));
            t.status = None;
        }
        h.put_tunnel(&t);
    }
    assert_eq!(h.provider.count("create"), PER_HOUR as usize, "{:?}", h.provider.calls());
    let message = refused.expect("refused once the hour's budget was spent");
    assert!(message.contains("--tunnel-max-hosts-per-hour 5"), "{message}");
}

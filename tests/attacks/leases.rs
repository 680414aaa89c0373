//! Controls for the Lease attacks: the Leases skyport itself writes in its namespace must be
//! admitted for its token (a dry run), or the refusals of the Lease victims would prove only
//! that skyport cannot work. The leader-election Lease (patched) where the install has one; with
//! `--sharding` a shard and a replica Lease of its group (created); first, a shard Lease without
//! the group label must be refused.

use std::time::Duration;

use hyper::Method;
use serde_json::{Value, json};

use super::attempts::DRY_RUN;
use super::install::Install;
use super::judge::Judge;
use super::wire::{Call, JSON, MERGE_PATCH, collection};

/// The install's Lease group: its leader-election Lease's name, the prefix of its shard Leases.
pub fn group(install: &Install) -> &str {
    arg(install, "--lease-name=").expect("the operator's --lease-name")
}

fn arg<'a>(install: &'a Install, flag: &str) -> Option<&'a str> {
    let args = install.operator["spec"]["template"]["spec"]["containers"][0]["args"].as_array();
    args.into_iter().flatten().filter_map(Value::as_str).find_map(|a| a.strip_prefix(flag))
}

fn lease(name: &str, group: Option<&str>) -> Value {
    let labels = group.map_or(json!({}), |g| json!({"skyport.dev/lease-group": g}));
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "labels": labels}, "spec": {"holderIdentity": "attacks-control"}})
}

pub async fn controls(judge: &Judge, install: &Install) {
    let group = group(install);
    let leases = collection("coordination.k8s.io", "v1", "leases", Some(install.namespace()));
    let sharded = arg(install, "--sharding").is_some();
    // The Lease policy in effect (a policy applied or changed takes a moment to load): a shard
    // Lease without its group label is refused. Only then do the controls say anything.
    let unlabelled = lease(&format!("{group}-shard-attacks-unlabelled"), None);
    let probe = Call::new(Method::POST, &leases).with(JSON, unlabelled).query(DRY_RUN);
    let what = "the Lease policy in effect: a shard Lease without its group label refused (dry run)";
    crate::common::eventually(what, Duration::from_secs(30), || async {
        (probe.send(&judge.sa).await.status == 403).then_some(())
    })
    .await;
    let mut admitted = Vec::new();
    if sharded {
        for kind in ["shard", "replica"] {
            let body = lease(&format!("{group}-{kind}-attacks-control"), Some(group));
            admitted.push((format!("create a {kind} Lease"), Call::new(Method::POST, &leases).with(JSON, body)));
        }
    } else {
        let patch = json!({"metadata": {"annotations": null}});
        let call = Call::new(Method::PATCH, format!("{leases}/{group}")).with(MERGE_PATCH, patch);
        admitted.push(("patch the leader-election Lease".into(), call));
    }
    for (what, call) in admitted {
        let answer = call.query(DRY_RUN).send(&judge.sa).await;
        if !answer.admitted() {
            let why = format!("refused, so the Lease attacks prove nothing: {}", answer.brief());
            judge.fail("control", &format!("skyport's own: {what} (dry run)"), why);
        }
    }
}

//! Which shard each object belongs to (see [`crate::shards`]).
//!
//! Queues shard by the AwsAccount they use, so an account's SQS budget and drift pacing stay in
//! one replica; Queues without one form the `default` shard. An AwsAccount is in its own shard
//! (its reconciler writes the finalizer its Queues rely on). Tunnels and the Services behind them
//! are one shard: the orphan sweep, failover and shared exit-server state look across all
//! Tunnels, and their number is small next to Queues'.

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;

use crate::crd::{AwsAccount, Queue, Tunnel};

/// The shard of Queues that use no AwsAccount (the operator's own AWS identity).
pub const DEFAULT_SHARD: &str = "default";
/// The shard of every Tunnel and LoadBalancer Service.
pub const TUNNELS_SHARD: &str = "tunnels";

/// An object that belongs to exactly one shard.
pub trait Sharded {
    /// Whether every object of this kind is in one shard. Their reconciles wait at the gate for
    /// it (they hold no worker another shard needs); those of kinds spread over several shards
    /// return instead, and a takeover reconciles them again ([`super::Acting::takeovers`]).
    const ONE_SHARD: bool = false;

    /// The shard's name: `default`, `tunnels` or `account.<namespace>.<name>`.
    fn shard(&self) -> String;
}

/// The shard of the AwsAccount `namespace/name`. Namespaces hold no dots, so the first dot
/// after the prefix ends the namespace and two accounts never share a shard name.
pub fn account_shard(namespace: &str, name: &str) -> String {
    format!("account.{namespace}.{name}")
}

impl Sharded for Queue {
    fn shard(&self) -> String {
        match &self.spec.account_ref {
            Some(r) => {
                let namespace = r.namespace.clone().or_else(|| self.namespace()).unwrap_or_default();
                account_shard(&namespace, &r.name)
            }
            None => DEFAULT_SHARD.to_string(),
        }
    }
}

impl Sharded for AwsAccount {
    fn shard(&self) -> String {
        account_shard(&self.namespace().unwrap_or_default(), &self.name_any())
    }
}

impl Sharded for Tunnel {
    const ONE_SHARD: bool = true;
    fn shard(&self) -> String {
        TUNNELS_SHARD.to_string()
    }
}

impl Sharded for Service {
    const ONE_SHARD: bool = true;
    fn shard(&self) -> String {
        TUNNELS_SHARD.to_string()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn queue(spec: serde_json::Value) -> Queue {
        serde_json::from_value(json!({"metadata": {"name": "q", "namespace": "team"}, "spec": spec})).unwrap()
    }

    #[test]
    fn queues_shard_by_the_account_they_use_and_its_namespace() {
        assert_eq!(queue(json!({})).shard(), "default");
        assert_eq!(queue(json!({"accountRef": {"name": "prod"}})).shard(), "account.team.prod");
        let elsewhere = queue(json!({"accountRef": {"name": "prod", "namespace": "platform"}}));
        assert_eq!(elsewhere.shard(), "account.platform.prod");
        let account: AwsAccount = serde_json::from_value(json!({"metadata": {"name": "prod", "namespace": "platform"},
            "spec": {"roleArn": "arn:aws:iam::000000000001:role/r", "region": "us-east-1"}}))
        .unwrap();
        assert_eq!(account.shard(), elsewhere.shard(), "an account and its Queues share a shard");
        assert_eq!(Service::default().shard(), "tunnels");
    }
}

//! The roles shipped for skyport's users (deploy/tenant-roles.yaml), through Kubernetes' own
//! aggregation: a ServiceAccount bound to the built-in `edit` in one namespace asks for Queues
//! and Tunnels there, never writes their status, and does not write AwsAccounts; `admin` does.

use std::time::Duration;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use skyport::crd::{AwsAccount, Queue, Tunnel};

use super::forbidden;
use super::install::token_client;
use crate::common::{TestNs, eventually, queue};

/// A ServiceAccount `name` in `ns` bound to the built-in ClusterRole `role` there.
async fn user_bound_to(admin: &Client, ns: &TestNs, name: &str, role: &str) -> Client {
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    ns.api::<ServiceAccount>().create(&PostParams::default(), &sa).await.unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns.name}],
    }))
    .unwrap();
    ns.api::<RoleBinding>().create(&PostParams::default(), &binding).await.unwrap();
    token_client(admin, &ns.name, name).await
}

fn account(name: &str) -> AwsAccount {
    serde_json::from_value(json!({
        "apiVersion": "skyport.dev/v1alpha1", "kind": "AwsAccount", "metadata": {"name": name},
        "spec": {"roleArn": "arn:aws:iam::000000000002:role/team", "region": "eu-west-1"},
    }))
    .unwrap()
}

pub async fn editors_ask_for_queues_and_tunnels_and_never_write_status(admin: &Client) {
    let ns = TestNs::new("rbac-tenant").await;
    let editor = user_bound_to(admin, &ns, "developer", "edit").await;
    let queues: Api<Queue> = Api::namespaced(editor.clone(), &ns.name);
    // The aggregation controller copies the rules into `edit` a moment after they appear.
    eventually("a Queue created by an editor", Duration::from_secs(60), || async {
        queues.create(&PostParams::default(), &queue("orders", json!({}))).await.ok().map(|_| ())
    })
    .await;
    queues.patch("orders", &PatchParams::default(), &Patch::Merge(json!({"spec": {"delaySeconds": 5}}))).await.unwrap();
    let status = json!({"status": {"queueUrl": "https://sqs.example/other-tenants-queue"}});
    forbidden(
        queues.patch_status("orders", &PatchParams::default(), &Patch::Merge(&status)).await,
        "an editor writes a Queue's status",
    );
    let tunnel: Tunnel = serde_json::from_value(json!({
        "apiVersion": "skyport.dev/v1alpha1", "kind": "Tunnel", "metadata": {"name": "web"},
        "spec": {"serviceRef": {"name": "web"}},
    }))
    .unwrap();
    let tunnels: Api<Tunnel> = Api::namespaced(editor.clone(), &ns.name);
    tunnels.create(&PostParams::default(), &tunnel).await.expect("an editor creates a Tunnel");
    let status = json!({"status": {"hostId": "i-0another0tenants0", "addressId": "eipalloc-0another"}});
    forbidden(
        tunnels.patch_status("web", &PatchParams::default(), &Patch::Merge(&status)).await,
        "an editor writes a Tunnel's status",
    );
    let accounts: Api<AwsAccount> = Api::namespaced(editor.clone(), &ns.name);
    accounts.list(&ListParams::default()).await.expect("an editor sees the namespace's AwsAccounts");
    forbidden(accounts.create(&PostParams::default(), &account("mine")).await, "an editor creates an AwsAccount");

    // Namespace admins choose the namespace's AwsAccounts.
    let owner = user_bound_to(admin, &ns, "owner", "admin").await;
    let accounts: Api<AwsAccount> = Api::namespaced(owner, &ns.name);
    eventually("an AwsAccount created by a namespace admin", Duration::from_secs(60), || async {
        accounts.create(&PostParams::default(), &account("team")).await.ok().map(|_| ())
    })
    .await;
    let viewer = user_bound_to(admin, &ns, "auditor", "view").await;
    let seen: Api<Queue> = Api::namespaced(viewer.clone(), &ns.name);
    eventually("Queues seen by a viewer", Duration::from_secs(60), || async { seen.get("orders").await.ok() }).await;
    forbidden(seen.delete("orders", &Default::default()).await, "a viewer deletes a Queue");
    ns.cleanup().await;
}

/// The shipped tenant roles, aggregated into Kubernetes' view, edit and admin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn tenants_bound_to_edit_write_queues_and_tunnels_but_never_their_status() {
    let admin = crate::common::client().await;
    super::install::install_deploy_once().await;
    editors_ask_for_queues_and_tunnels_and_never_write_status(&admin).await;
}

//! Writes: the credentials Secret, the client Deployment, the Service's load-balancer status.
//! Each is written only when it differs from what exists, so an Active Tunnel costs no writes.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::Context;
use super::desired::{self, Credentials};
use super::observe::{KEY_CLIENT, KEY_PRIVATE, KEY_PUBLIC, KEY_TOKEN};
use crate::controllers::FIELD_MANAGER;
use crate::controllers::queue::MANAGED_BY;
use crate::crd::tunnel::Tunnel;
use crate::error::{Error, Result};

/// Pod template annotation carrying [`desired::checksum`] of the client config.
pub const CHECKSUM_ANNOTATION: &str = "skyport.dev/config-checksum";

fn managed_labels(tunnel: &Tunnel) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string()),
        ("skyport.dev/tunnel".to_string(), desired::fit_label(&tunnel.name_any())),
    ])
}

/// Creates the Secret with fresh credentials. A Secret that appeared meanwhile (another run)
/// wins: its credentials are read back, so both runs agree.
pub async fn create_secret(tunnel: &Tunnel, secrets: &Api<Secret>, ctx: &Context) -> Result<Option<Credentials>> {
    let credentials = Credentials::generate();
    let owner = tunnel.controller_owner_ref(&()).ok_or(Error::MissingObjectKey("uid"))?;
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(desired::secret_name(tunnel)),
            labels: Some(managed_labels(tunnel)),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([
            (KEY_PRIVATE.to_string(), ByteString(credentials.keypair.private_key.clone().into_bytes())),
            (KEY_PUBLIC.to_string(), ByteString(credentials.keypair.public_key.clone().into_bytes())),
            (KEY_TOKEN.to_string(), ByteString(credentials.token.clone().into_bytes())),
        ])),
        ..Default::default()
    };
    ctx.api_writes.inc();
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(Some(credentials)),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Writes `client_toml` into the Secret (only the one key, by server-side apply).
pub async fn write_client_config(
    tunnel: &Tunnel,
    secrets: &Api<Secret>,
    client_toml: &str,
    ctx: &Context,
) -> Result<()> {
    let patch = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": desired::secret_name(tunnel)},
        "stringData": {KEY_CLIENT: client_toml},
    });
    ctx.api_writes.inc();
    secrets
        .patch(&desired::secret_name(tunnel), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch))
        .await?;
    Ok(())
}

/// The client Deployment: one replica (two clients with one token would take the service from
/// each other), `Recreate` for the same reason, restarted when the config checksum changes.
pub fn deployment(tunnel: &Tunnel, image: &str, checksum: &str) -> Result<Deployment> {
    let owner = tunnel.controller_owner_ref(&()).ok_or(Error::MissingObjectKey("uid"))?;
    let labels = desired::client_labels(tunnel);
    let value = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": desired::deployment_name(tunnel),
            "labels": managed_labels(tunnel),
            "ownerReferences": [owner],
        },
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": {CHECKSUM_ANNOTATION: checksum}},
                "spec": {
                    "automountServiceAccountToken": false,
                    "enableServiceLinks": false,
                    "securityContext": {
                        "runAsNonRoot": true,
                        "runAsUser": 65532,
                        "runAsGroup": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [{
                        "name": "rathole",
                        "image": image,
                        "args": ["--client", "/etc/rathole/client.toml"],
                        "resources": {
                            "requests": {"cpu": "10m", "memory": "16Mi"},
                            "limits": {"memory": "128Mi"},
                        },
                        "securityContext": {
                            "allowPrivilegeEscalation": false,
                            "readOnlyRootFilesystem": true,
                            "capabilities": {"drop": ["ALL"]},
                        },
                        "volumeMounts": [{"name": "config", "mountPath": "/etc/rathole", "readOnly": true}],
                    }],
                    "volumes": [{
                        "name": "config",
                        "secret": {
                            "secretName": desired::secret_name(tunnel),
                            "items": [{"key": KEY_CLIENT, "path": "client.toml"}],
                            "defaultMode": 0o440,
                        },
                    }],
                },
            },
        },
    });
    serde_json::from_value(value).map_err(|e| Error::InvalidSpec(format!("client Deployment: {e}")))
}

/// Applies the client Deployment unless the existing one already runs `image` with `checksum`.
pub async fn ensure_deployment(tunnel: &Tunnel, ns: &str, image: &str, checksum: &str, ctx: &Context) -> Result<()> {
    let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), ns);
    let name = desired::deployment_name(tunnel);
    if let Some(current) = api.get_opt(&name).await? {
        let template = current.spec.as_ref().map(|s| &s.template);
        let sum = template
            .and_then(|t| t.metadata.as_ref())
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get(CHECKSUM_ANNOTATION));
        let current_image =
            template.and_then(|t| t.spec.as_ref()).and_then(|s| s.containers.first()).and_then(|c| c.image.as_deref());
        let ours = current.owner_references().iter().any(|r| Some(&r.uid) == tunnel.meta().uid.as_ref());
        if ours && sum.map(String::as_str) == Some(checksum) && current_image == Some(image) {
            return Ok(());
        }
    }
    ctx.api_writes.inc();
    let want = deployment(tunnel, image, checksum)?;
    api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&want)).await?;
    Ok(())
}

/// Sets (or with `None` clears) the Service's `status.loadBalancer.ingress`, when it differs.
pub async fn set_ingress(service: &Service, ingress: Option<serde_json::Value>, ctx: &Context) -> Result<()> {
    let ns = service.namespace().ok_or(Error::MissingObjectKey("namespace"))?;
    let want = ingress.unwrap_or_else(|| json!([]));
    let empty = want.as_array().is_some_and(Vec::is_empty);
    let has_any = service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .is_some_and(|i| !i.is_empty());
    if desired::ingress_matches(service, &want) || (empty && !has_any) {
        return Ok(());
    }
    ctx.api_writes.inc();
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    // A merge patch replaces the ingress list as a whole; only this field is ours.
    let patch = json!({"status": {"loadBalancer": {"ingress": want}}});
    api.patch_status(&service.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}

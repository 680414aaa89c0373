//! Where a Tunnel's client Deployment and credentials Secret live, and how skyport knows them as
//! the Tunnel's: pure.
//!
//! Installed (Helm, `deploy/`), skyport runs every tunnel client in a namespace of their own
//! (`--tunnel-client-namespace`), the way the tailscale operator runs its proxies: its account
//! then needs no Deployment write anywhere else, and no Tunnel's keys sit in a tenant's
//! namespace. Not the operator's namespace: the credentials are read back by a patch, which can
//! read any Secret of its namespace, and the operator's own Secrets must stay out of reach. An owner reference cannot cross namespaces, so there the objects are the Tunnel's
//! by their labels (namespace, name and UID of the Tunnel), deleted by the Tunnel's cleanup and,
//! if that never ran, by the orphan sweep. Without the flag (skyport run by hand, the tests)
//! they live beside the Tunnel, controlled by it and garbage-collected with it.

use std::collections::BTreeMap;

use kube::ResourceExt;
use kube::api::ObjectMeta;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::controllers::{MANAGED_BY, owned};
use crate::crd::tunnel::Tunnel;
use crate::error::{Error, Result};

/// The key of the Tunnel's Secret holding a single client's config (a pair's clients have one
/// each, [`Placement::client_key`]).
pub const KEY_CLIENT: &str = "client.toml";

/// Label: the Tunnel's name (fitted to a label value).
pub const LABEL_TUNNEL: &str = "skyport.dev/tunnel";
/// Label: the Tunnel's namespace.
pub const LABEL_TUNNEL_NAMESPACE: &str = "skyport.dev/tunnel-namespace";
/// Label: the Tunnel's UID; what proves a client in the clients' namespace is this Tunnel's.
pub const LABEL_TUNNEL_UID: &str = "skyport.dev/tunnel-uid";

/// The slots of a highly available Tunnel's two exit servers.
pub const SLOTS: [&str; 2] = ["a", "b"];

/// The Tunnel's client objects: namespace and names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub namespace: String,
    pub deployment: String,
    pub secret: String,
    /// In the Tunnel's own namespace, controlled by it.
    pub beside: bool,
    /// The exit server of a highly available pair this client serves ([`Placement::for_slot`]).
    pub slot: Option<&'static str>,
    tunnel_namespace: String,
    tunnel_name: String,
    tunnel_uid: String,
}

impl Placement {
    /// Where `tunnel`'s client goes: `client_namespace`, or beside the Tunnel without one.
    /// In another namespace the names carry the Tunnel's namespace and a hash of namespace and
    /// name, so two tenants' Tunnels never share one (`a-b`/`c` and `a`/`b-c` differ).
    pub fn of(tunnel: &Tunnel, client_namespace: Option<&str>) -> Result<Self> {
        let tunnel_namespace = tunnel.namespace().ok_or(Error::MissingObjectKey("namespace"))?;
        let tunnel_uid = tunnel.uid().ok_or(Error::MissingObjectKey("uid"))?;
        let tunnel_name = tunnel.name_any();
        let (namespace, deployment, secret) = Self::names(&tunnel_namespace, &tunnel_name, client_namespace);
        Ok(Placement {
            beside: namespace == tunnel_namespace,
            namespace,
            deployment,
            secret,
            slot: None,
            tunnel_namespace,
            tunnel_name,
            tunnel_uid,
        })
    }

    /// (namespace, Deployment name, Secret name) of the client of Tunnel `namespace/name`.
    pub fn names(namespace: &str, name: &str, client_namespace: Option<&str>) -> (String, String, String) {
        let client_namespace = client_namespace.filter(|ns| !ns.is_empty()).unwrap_or(namespace);
        let base = if client_namespace == namespace { name.to_string() } else { base_name(namespace, name) };
        (client_namespace.to_string(), format!("{base}-client"), format!("{base}-credentials"))
    }

    /// The client of the pair's exit server `slot`: its own Deployment (`<deployment>-<slot>`)
    /// and config key, the same Secret.
    pub fn for_slot(&self, slot: &'static str) -> Placement {
        Placement { deployment: format!("{}-{slot}", self.deployment), slot: Some(slot), ..self.clone() }
    }

    /// The Secret key holding this client's config.
    pub fn client_key(&self) -> String {
        match self.slot {
            Some(slot) => format!("client-{slot}.toml"),
            None => KEY_CLIENT.to_string(),
        }
    }

    /// Labels of both objects: which Tunnel they serve.
    pub fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (LABEL_TUNNEL.to_string(), fit_label(&self.tunnel_name)),
            (LABEL_TUNNEL_NAMESPACE.to_string(), self.tunnel_namespace.clone()),
            (LABEL_TUNNEL_UID.to_string(), self.tunnel_uid.clone()),
        ])
    }

    /// Metadata of the object `name`: beside the Tunnel, controlled by it ([`owned::meta`]);
    /// elsewhere, labelled with the managed-by label and [`Self::labels`] only.
    pub fn meta(&self, tunnel: &Tunnel, name: &str) -> Result<ObjectMeta> {
        if self.beside {
            return owned::meta(tunnel, name, self.labels());
        }
        let mut labels = BTreeMap::from([(MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string())]);
        labels.extend(self.labels());
        Ok(ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(self.namespace.clone()),
            labels: Some(labels),
            ..Default::default()
        })
    }

    /// Whether `meta` is this very Tunnel's: its controller reference beside it (an earlier
    /// Tunnel of the same name had another UID), its UID label elsewhere.
    pub fn is_ours(&self, meta: &ObjectMeta) -> bool {
        if self.beside {
            return meta
                .owner_references
                .iter()
                .flatten()
                .any(|r| r.controller == Some(true) && r.uid == self.tunnel_uid);
        }
        label(meta, MANAGED_BY.0) == Some(MANAGED_BY.1) && label(meta, LABEL_TUNNEL_UID) == Some(&self.tunnel_uid)
    }

    /// Whether `meta` is a Tunnel's of this namespace and name, this one or an earlier one:
    /// the JSON patch `test`s that read the Secret only then ([`owned::json_patch`]).
    pub fn secret_tests(&self, api_version: &str) -> Vec<Value> {
        if self.beside {
            return owned::owner_tests(&[("apiVersion", api_version), ("kind", "Tunnel"), ("name", &self.tunnel_name)]);
        }
        vec![
            label_test(MANAGED_BY.0, MANAGED_BY.1),
            label_test(LABEL_TUNNEL_NAMESPACE, &self.tunnel_namespace),
            label_test(LABEL_TUNNEL, &fit_label(&self.tunnel_name)),
        ]
    }
}

/// A JSON patch `test` that label `key` has `value`.
pub fn label_test(key: &str, value: &str) -> Value {
    json!({"op": "test", "path": format!("/metadata/labels/{}", key.replace('/', "~1")), "value": value})
}

fn label<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels.as_ref()?.get(key).map(String::as_str)
}

/// `value` if it is a valid label value of at most 63 characters, else a prefix plus a hash.
pub fn fit_label(value: &str) -> String {
    if value.len() <= 63 {
        return value.to_string();
    }
    let digest = Sha256::digest(value.as_bytes());
    let suffix: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    let head = value[..54].trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    format!("{head}-{suffix}")
}

/// `<namespace>-<name>` cut to 38 characters, then 8 hex digits of SHA-256 of `namespace/name`:
/// at most 47, so `-credentials` keeps the Secret's name a valid label too.
fn base_name(namespace: &str, name: &str) -> String {
    let digest = Sha256::digest(format!("{namespace}/{name}").as_bytes());
    let hash: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    let joined = format!("{namespace}-{name}").replace('.', "-");
    let head = joined[..joined.len().min(38)].trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    format!("{head}-{hash}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tunnel(ns: &str, name: &str) -> Tunnel {
        serde_json::from_value(json!({
            "apiVersion": "skyport.dev/v1alpha1", "kind": "Tunnel",
            "metadata": {"name": name, "namespace": ns, "uid": "t-uid"},
            "spec": {"serviceRef": {"name": "web"}},
        }))
        .unwrap()
    }

    #[test]
    fn without_a_client_namespace_the_client_lives_beside_its_tunnel_as_before() {
        let t = tunnel("team-a", "web-tunnel");
        for client_namespace in [None, Some(""), Some("team-a")] {
            let p = Placement::of(&t, client_namespace).unwrap();
            assert_eq!((p.namespace.as_str(), p.deployment.as_str()), ("team-a", "web-tunnel-client"));
            assert_eq!(p.secret, "web-tunnel-credentials");
            assert!(p.beside);
            let meta = p.meta(&t, &p.secret).unwrap();
            assert_eq!(meta.owner_references.as_ref().unwrap()[0].uid, "t-uid");
            assert!(p.is_ours(&meta));
        }
    }

    #[test]
    fn in_the_operators_namespace_names_never_collide_and_labels_prove_the_owner() {
        let t = tunnel("team-a", "web-tunnel");
        let p = Placement::of(&t, Some("skyport-system")).unwrap();
        assert_eq!(p.namespace, "skyport-system");
        assert!(!p.beside);
        assert!(p.deployment.starts_with("team-a-web-tunnel-") && p.deployment.ends_with("-client"), "{p:?}");
        assert_eq!(p.secret, p.deployment.replace("-client", "-credentials"));
        // `a-b`/`c` and `a`/`b-c` join to the same text; the hash tells them apart.
        let one = Placement::of(&tunnel("a-b", "c"), Some("ops")).unwrap();
        let two = Placement::of(&tunnel("a", "b-c"), Some("ops")).unwrap();
        assert_ne!(one.deployment, two.deployment);
        // Long names stay valid label values.
        let long = Placement::of(&tunnel(&"n".repeat(63), &"x".repeat(200)), Some("ops")).unwrap();
        assert!(long.secret.len() <= 63, "{}", long.secret);
        let meta = p.meta(&t, &p.deployment).unwrap();
        assert!(meta.owner_references.is_none(), "no owner reference across namespaces");
        assert_eq!(meta.namespace.as_deref(), Some("skyport-system"));
        assert!(p.is_ours(&meta));
        let earlier = Placement { tunnel_uid: "old-uid".into(), ..p.clone() };
        assert!(!earlier.is_ours(&meta), "an earlier Tunnel of the same name");
        let mut unlabelled = meta.clone();
        unlabelled.labels.as_mut().unwrap().remove(MANAGED_BY.0);
        assert!(!p.is_ours(&unlabelled));
    }

    #[test]
    fn the_secret_is_read_only_when_its_labels_name_this_tunnel() {
        let p = Placement::of(&tunnel("team-a", "web-tunnel"), Some("skyport-system")).unwrap();
        let tests = p.secret_tests("skyport.dev/v1alpha1");
        let paths: Vec<&str> = tests.iter().map(|t| t["path"].as_str().unwrap()).collect();
        assert_eq!(
            paths,
            [
                "/metadata/labels/app.kubernetes.io~1managed-by",
                "/metadata/labels/skyport.dev~1tunnel-namespace",
                "/metadata/labels/skyport.dev~1tunnel"
            ]
        );
        assert!(tests.iter().all(|t| t["op"] == "test"));
    }
}

//! The objects a controller owns in the cluster: how they are marked ([`meta`]: managed-by label
//! and controller reference), created ([`create`]), and, for a Tunnel's credentials Secret in
//! the tunnel clients' namespace, read only when skyport's ([`json_patch`](fn@json_patch)).
//!
//! Reading a Secret only when it is skyport's, with no right to read Secrets at all:
//! skyport is granted no `get` on Secrets: with it, a stolen token would read every Secret of the
//! namespace by name. Instead it sends a JSON patch made only of `test` operations on the Secret's
//! controller owner reference. The API server tests them against the stored object: when one
//! fails it answers 422 and returns nothing of the object; when all pass the patch is a no-op
//! update, whose answer is the object. `patch` itself is a read, though: a JSON patch that copies
//! a value into the name, sent as a dry run, is answered with the value before any admission
//! policy runs. So `patch` on Secrets is granted only in the tunnel clients' namespace (see
//! docs/security.md); Queue Secret exports in tenants' namespaces are never read
//! (`queue::secret_exports`).

use std::collections::BTreeMap;

use hyper::Request;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::{ApiWrites, MANAGED_BY};
use crate::error::{Error, Result};

/// Metadata of an object `owner` controls: `name` in the owner's namespace, the managed-by label
/// (with `labels`), and the owner's controller reference. The reference garbage-collects it with
/// its owner and is what the admission policy checks before it lets skyport write the object.
pub fn meta<K: Resource<DynamicType = ()>>(
    owner: &K,
    name: &str,
    labels: impl IntoIterator<Item = (String, String)>,
) -> Result<ObjectMeta> {
    let reference = owner.controller_owner_ref(&()).ok_or(Error::MissingObjectKey("uid"))?;
    let mut all = BTreeMap::from([(MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string())]);
    all.extend(labels);
    Ok(ObjectMeta {
        name: Some(name.to_string()),
        namespace: owner.namespace(),
        labels: Some(all),
        owner_references: Some(vec![reference]),
        ..Default::default()
    })
}

/// Creates `obj` (counted in `writes`). `Ok(false)`: an object of that name exists already, made
/// by a concurrent reconcile or by anyone else; the caller decides which.
pub async fn create<T>(api: &Api<T>, obj: &T, writes: &ApiWrites) -> Result<bool>
where
    T: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    Ok(create_new(api, obj, writes).await?.is_some())
}

/// [`create`], answering the object as created (its UID); `Ok(None)` when the name is taken.
pub async fn create_new<T>(api: &Api<T>, obj: &T, writes: &ApiWrites) -> Result<Option<T>>
where
    T: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    writes.inc();
    match api.create(&PostParams::default(), obj).await {
        Ok(made) => Ok(Some(made)),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// What a guarded read found.
#[derive(Debug)]
pub enum Guarded<K> {
    Missing,
    /// The object exists and the tests failed: it is not ours, and it was not read.
    NotOurs,
    Ours(K),
}

/// `test` operations: the first owner reference has these fields (`controller` is always tested
/// to be true).
pub fn owner_tests(fields: &[(&str, &str)]) -> Vec<Value> {
    let mut ops: Vec<Value> = fields
        .iter()
        .map(|(field, value)| json!({"op": "test", "path": format!("/metadata/ownerReferences/0/{field}"), "value": value}))
        .collect();
    ops.push(json!({"op": "test", "path": "/metadata/ownerReferences/0/controller", "value": true}));
    ops
}

/// Sends the JSON patch `ops` to the object `name` in `namespace`. With `tests` only (see
/// [`owner_tests`]) it reads the object if they hold, and changes nothing.
pub async fn json_patch<K>(
    client: &Client,
    namespace: &str,
    name: &str,
    ops: &[Value],
) -> Result<Guarded<K>, kube::Error>
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    let url = format!("{}/{name}", K::url_path(&(), Some(namespace)));
    let body = serde_json::to_vec(ops).map_err(kube::Error::SerdeError)?;
    let request = Request::patch(url)
        .header(hyper::header::CONTENT_TYPE, "application/json-patch+json")
        .body(body)
        .map_err(kube::Error::HttpError)?;
    match client.request::<K>(request).await {
        Ok(obj) => Ok(Guarded::Ours(obj)),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(Guarded::Missing),
        Err(kube::Error::Api(e)) if e.code == 422 => Ok(Guarded::NotOurs),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owned_object_is_labelled_and_controlled_by_its_owner() {
        let owner: k8s_openapi::api::core::v1::Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1"},
        }))
        .unwrap();
        let meta = meta(&owner, "web-tunnel", [("extra".to_string(), "x".to_string())]).unwrap();
        assert_eq!((meta.name.as_deref(), meta.namespace.as_deref()), (Some("web-tunnel"), Some("shop")));
        let labels = meta.labels.unwrap();
        assert_eq!(labels.get(MANAGED_BY.0).map(String::as_str), Some(MANAGED_BY.1));
        assert_eq!(labels.get("extra").map(String::as_str), Some("x"));
        let reference = &meta.owner_references.unwrap()[0];
        assert_eq!(
            (reference.uid.as_str(), reference.kind.as_str(), reference.controller),
            ("u-1", "Service", Some(true))
        );
        let anonymous: k8s_openapi::api::core::v1::Service =
            serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap();
        assert!(matches!(super::meta(&anonymous, "y", []), Err(Error::MissingObjectKey("uid"))));
    }

    #[test]
    fn the_controller_flag_is_always_tested() {
        let ops = owner_tests(&[("uid", "u-1")]);
        assert_eq!(ops[0], json!({"op": "test", "path": "/metadata/ownerReferences/0/uid", "value": "u-1"}));
        assert_eq!(ops[1]["path"], "/metadata/ownerReferences/0/controller");
        assert_eq!(ops[1]["value"], json!(true));
    }
}

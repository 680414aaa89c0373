//! Publishing the queue's coordinates: the ConfigMap `<name>-sqs` and the user's `spec.exports`.
//!
//! Every object follows the default ConfigMap's rules: created and owned (controller owner
//! reference, skyport's label, which the admission policy requires of its writes), never written
//! when someone else holds the name, written only when its data differs, deleted when its entry
//! leaves the spec. ConfigMaps are compared with the watch cache. Secrets are not watched (that
//! would need list/watch on every Secret of the cluster), nor ever read with `get`: a Secret is
//! read back only when the Queue controls it ([`owned`]), so one that is someone else's is never
//! seen. What skyport last wrote or read is remembered per Secret and read again at most once per
//! `--queue-tag-resync`.

use crate::controllers::hash_of;
use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::EventType;
use tracing::info;

use super::act::{controlled_by, data_patch, ensure_configmap, ensure_owned_configmap};
use super::desired::configmap_name;
use super::plan::Ready;
use super::{Context, configmaps};
use crate::controllers::owned::{self, Guarded};
use crate::crd::export::{Export, ExportKind, ExportRef};
use crate::crd::queue::Queue;
use crate::error::{Error, Result};

/// Key → value of one exported object.
pub type Data = BTreeMap<String, String>;

/// What publishing found.
#[derive(Debug, Default)]
pub struct Published {
    /// The exports this Queue owns and has written, for `status.exports`.
    pub owned: Vec<ExportRef>,
    /// Why the Queue is not Ready although the queue is: (reason, message).
    pub conflict: Option<(&'static str, String)>,
}

/// The values `export` publishes under its keys (pure).
pub fn data(export: &Export, ready: &Ready) -> Data {
    let keys = &export.keys;
    [(&keys.url, &ready.url), (&keys.arn, &ready.arn), (&keys.name, &ready.name)]
        .into_iter()
        .filter_map(|(key, value)| key.as_ref().map(|k| (k.clone(), value.clone())))
        .collect()
}

/// Objects this Queue wrote (`recorded`) whose entries are no longer in the spec (pure).
pub fn dropped(spec: &[Export], recorded: impl IntoIterator<Item = ExportRef>) -> Vec<ExportRef> {
    let mut gone: Vec<ExportRef> = recorded.into_iter().filter(|r| !spec.iter().any(|e| e.target() == *r)).collect();
    gone.sort();
    gone.dedup();
    gone
}

/// The ConfigMap of a ConfigMap export.
pub fn configmap(queue: &Queue, name: &str, data: Data) -> Result<ConfigMap> {
    Ok(ConfigMap { metadata: owned::meta(queue, name, [])?, data: Some(data), ..Default::default() })
}

/// The Secret of a Secret export (`Opaque`).
pub fn secret(queue: &Queue, name: &str, data: Data) -> Result<Secret> {
    let data = data.into_iter().map(|(k, v)| (k, ByteString(v.into_bytes()))).collect();
    let metadata = owned::meta(queue, name, [])?;
    Ok(Secret { metadata, type_: Some("Opaque".into()), data: Some(data), ..Default::default() })
}

/// Writes the default ConfigMap and every export, and deletes the exports dropped from the spec.
pub async fn publish(queue: &Queue, ready: &Ready, ctx: &Context) -> Result<Published> {
    let mut published = Published::default();
    if let Some(message) = ensure_configmap(queue, ready, ctx).await? {
        published.conflict = Some(("ConfigMapConflict", message));
    }
    for target in dropped(&queue.spec.exports, recorded(queue, ctx)) {
        remove(queue, &target, ctx).await?;
    }
    let mut taken = Vec::new();
    for export in &queue.spec.exports {
        let values = data(export, ready);
        let ours = match export.kind {
            ExportKind::ConfigMap => {
                ensure_owned_configmap(queue, configmap(queue, &export.name, values)?, ctx).await?
            }
            ExportKind::Secret => ensure_secret(queue, secret(queue, &export.name, values)?, ctx).await?,
        };
        if ours {
            published.owned.push(export.target());
        } else {
            taken.push(format!("{} {}", export.kind, export.name));
        }
    }
    if !taken.is_empty() && published.conflict.is_none() {
        published.conflict = Some((
            "ExportConflict",
            format!(
                "{} already exist(s) and do(es) not belong to this Queue; skyport leaves them alone. Rename the export or delete the object, then skyport writes it",
                taken.join(", ")
            ),
        ));
    }
    Ok(published)
}

/// What this Queue wrote: `status.exports`, plus ConfigMaps the cache shows it controls (covers
/// a write whose status update was lost).
fn recorded(queue: &Queue, ctx: &Context) -> Vec<ExportRef> {
    let mut all = queue.status.as_ref().map(|s| s.exports.clone()).unwrap_or_default();
    let (ns, default) = (queue.namespace(), configmap_name(queue));
    let controlled = ctx
        .configmaps
        .state_filter(|cm| Some(&cm.namespace) == ns.as_ref() && cm.name != default && cm.controlled_by(queue));
    all.extend(controlled.iter().map(|cm| ExportRef { kind: ExportKind::ConfigMap, name: cm.name.clone() }));
    all
}

fn fingerprint(uid: &str, data: &Option<BTreeMap<String, ByteString>>) -> u64 {
    hash_of((uid, data.iter().flatten().map(|(k, v)| (k, &v.0)).collect::<Vec<_>>()))
}

/// Like [`ensure_owned_configmap`] for a Secret, with the memory of what was last seen instead
/// of a cache. Nothing of the Secret's data is ever logged.
async fn ensure_secret(queue: &Queue, want: Secret, ctx: &Context) -> Result<bool> {
    let ns = queue.namespace().ok_or(Error::MissingObjectKey("namespace"))?;
    let name = want.name_any();
    let key = format!("{ns}/{name}");
    let wanted = fingerprint(&queue.uid().unwrap_or_default(), &want.data);
    if ctx.secrets.get(&key, |seen, age| *seen == wanted && age < ctx.settings.tag_resync).is_some() {
        return Ok(true);
    }
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let existing = match read_if_controlled(queue, &ns, &name, ctx).await? {
        Guarded::Ours(existing) => existing,
        Guarded::NotOurs => {
            ctx.secrets.forget(&key);
            return Ok(false);
        }
        Guarded::Missing => {
            if owned::create(&api, &want, &ctx.api_writes).await? {
                info!(secret = name, "created export Secret");
                ctx.secrets.record(key, wanted);
                return Ok(true);
            }
            match read_if_controlled(queue, &ns, &name, ctx).await? {
                Guarded::Ours(existing) => existing,
                Guarded::NotOurs => {
                    ctx.secrets.forget(&key);
                    return Ok(false);
                }
                // Created and deleted again since: the next reconcile starts over.
                Guarded::Missing => {
                    return Err(Error::Internal(format!("Secret {name} was deleted right after a conflict")));
                }
            }
        }
    };
    if existing.data != want.data {
        ctx.api_writes.inc();
        api.patch(&name, &PatchParams::default(), &Patch::Merge(data_patch(&existing, &existing.data, &want.data)))
            .await?;
        info!(secret = name, "updated export Secret");
    }
    ctx.secrets.record(key, wanted);
    Ok(true)
}

/// The Secret `name` if `queue` controls it; one that it does not control is not read.
async fn read_if_controlled(queue: &Queue, ns: &str, name: &str, ctx: &Context) -> Result<Guarded<Secret>> {
    let uid = queue.uid().ok_or(Error::MissingObjectKey("uid"))?;
    Ok(owned::json_patch(&ctx.client, ns, name, &owned::owner_tests(&[("uid", &uid)])).await?)
}

/// Deletes an export's object if this Queue controls it (the UID precondition makes sure the one
/// checked is the one deleted); anything else of that name is left alone.
async fn remove(queue: &Queue, target: &ExportRef, ctx: &Context) -> Result<()> {
    let ns = queue.namespace().ok_or(Error::MissingObjectKey("namespace"))?;
    let uid = match target.kind {
        ExportKind::ConfigMap => match ctx.configmaps.get(&configmaps::key(&target.name, &ns)) {
            Some(cached) => cached.controlled_by(queue).then(|| cached.uid.clone()),
            None => {
                let cm = Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns).get_opt(&target.name).await?;
                cm.filter(|cm| controlled_by(cm, queue)).and_then(|cm| cm.uid())
            }
        },
        ExportKind::Secret => {
            ctx.secrets.forget(&format!("{ns}/{}", target.name));
            match read_if_controlled(queue, &ns, &target.name, ctx).await? {
                Guarded::Ours(secret) => secret.uid(),
                Guarded::NotOurs | Guarded::Missing => None,
            }
        }
    };
    let Some(uid) = uid else { return Ok(()) };
    let params = DeleteParams {
        preconditions: Some(Preconditions { uid: Some(uid), resource_version: None }),
        ..Default::default()
    };
    ctx.api_writes.inc();
    let deleted = match target.kind {
        ExportKind::ConfigMap => {
            Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns).delete(&target.name, &params).await.map(|_| ())
        }
        ExportKind::Secret => {
            Api::<Secret>::namespaced(ctx.client.clone(), &ns).delete(&target.name, &params).await.map(|_| ())
        }
    };
    match deleted {
        Ok(_) => {}
        // Already gone, or replaced by another object since it was read: not ours to delete.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    info!(kind = %target.kind, export = target.name, "deleted export dropped from the spec");
    let note = format!("deleted {} {}: its entry was removed from spec.exports", target.kind, target.name);
    ctx.publish(queue, EventType::Normal, "ExportDeleted", note).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::MANAGED_BY;
    use crate::crd::export::ExportKeys;
    use crate::crd::queue::QueueSpec;

    fn ready() -> Ready {
        Ready {
            url: "http://sqs/000000000000/q".into(),
            arn: "arn:aws:sqs:us-east-1:000000000000:q".into(),
            name: "q".into(),
            adopted: false,
            created: None,
            events: Vec::new(),
        }
    }

    fn export(kind: ExportKind, name: &str, url: Option<&str>, arn: Option<&str>) -> Export {
        let keys = ExportKeys { url: url.map(Into::into), arn: arn.map(Into::into), name: None };
        Export { kind, name: name.into(), keys }
    }

    #[test]
    fn only_the_chosen_keys_are_exported() {
        let e = export(ExportKind::Secret, "s", Some("ORDERS_URL"), None);
        assert_eq!(data(&e, &ready()), Data::from([("ORDERS_URL".into(), "http://sqs/000000000000/q".into())]));
        let e = export(ExportKind::ConfigMap, "c", Some("U"), Some("A"));
        assert_eq!(data(&e, &ready()).keys().collect::<Vec<_>>(), ["A", "U"]);
    }

    #[test]
    fn dropped_exports_are_those_recorded_but_no_longer_in_the_spec() {
        let spec = [export(ExportKind::Secret, "a", Some("U"), None)];
        let recorded = [
            ExportRef { kind: ExportKind::Secret, name: "a".into() },
            ExportRef { kind: ExportKind::ConfigMap, name: "a".into() },
            ExportRef { kind: ExportKind::Secret, name: "b".into() },
            ExportRef { kind: ExportKind::Secret, name: "b".into() },
        ];
        assert_eq!(
            dropped(&spec, recorded),
            [
                ExportRef { kind: ExportKind::ConfigMap, name: "a".into() },
                ExportRef { kind: ExportKind::Secret, name: "b".into() }
            ]
        );
        assert!(dropped(&[], Vec::new()).is_empty());
    }

    #[test]
    fn exported_objects_are_labelled_and_controlled_by_the_queue() {
        let mut q = Queue::new("q", QueueSpec::default());
        q.metadata.namespace = Some("ns".into());
        q.metadata.uid = Some("uid-1".into());
        let s = secret(&q, "creds", Data::from([("K".into(), "v".into())])).unwrap();
        assert!(controlled_by(&s, &q));
        assert_eq!(s.labels().get(MANAGED_BY.0).map(String::as_str), Some(MANAGED_BY.1));
        assert_eq!(s.data.unwrap()["K"].0, b"v");
        let c = configmap(&q, "env", Data::new()).unwrap();
        assert!(controlled_by(&c, &q));
        q.metadata.uid = None;
        assert!(secret(&q, "creds", Data::new()).is_err());
    }

    #[test]
    fn a_data_patch_removes_keys_no_longer_wanted_on_the_object_that_was_read() {
        let mut have = ConfigMap::default();
        have.metadata.resource_version = Some("42".into());
        let old = Some(Data::from([("OLD".into(), "1".into()), ("KEEP".into(), "1".into())]));
        let new = Some(Data::from([("KEEP".into(), "2".into()), ("NEW".into(), "3".into())]));
        let patch = data_patch(&have, &old, &new);
        assert_eq!(patch["data"], serde_json::json!({"OLD": null, "KEEP": "2", "NEW": "3"}));
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
        assert_eq!(patch["metadata"]["labels"][MANAGED_BY.0], MANAGED_BY.1);
    }
}

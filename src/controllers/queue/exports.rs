//! Publishing the queue's coordinates: the ConfigMap `<name>-sqs` and the user's `spec.exports`.
//!
//! Every object follows the default ConfigMap's rules: created and owned (controller owner
//! reference, skyport's label, which the admission policy requires of its writes), never written
//! when someone else holds the name, deleted when its entry leaves the spec. ConfigMaps are
//! compared with the watch cache and written when their data differs. Secrets are never read at
//! all, not even back from a write: [`secret_exports`] writes them by the UID recorded at
//! creation.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Preconditions};
use tracing::info;

use super::act::{controlled_by, ensure_configmap, ensure_owned_configmap};
use super::desired::configmap_name;
use super::plan::Ready;
use super::secret_exports::{self, Outcome};
use super::{Context, configmaps};
use crate::controllers::owned;
use crate::crd::export::{Export, ExportKind, ExportRef};
use crate::crd::queue::{ConfigMapPolicy, Queue};
use crate::error::{Error, Result};
use crate::reasons::Reason;

/// Key → value of one exported object.
pub type Data = BTreeMap<String, String>;

/// What publishing found.
#[derive(Debug, Default)]
pub struct Published {
    /// The exports this Queue owns and has written, for `status.exports`.
    pub owned: Vec<ExportRef>,
    /// Why the Queue is not Ready although the queue is: (reason, message).
    pub conflict: Option<(Reason, String)>,
}

/// The values `export` publishes under its keys (pure).
pub fn data(export: &Export, ready: &Ready) -> Data {
    let keys = &export.keys;
    [(&keys.url, &ready.url), (&keys.arn, &ready.arn), (&keys.name, &ready.name)]
        .into_iter()
        .filter_map(|(key, value)| key.as_ref().map(|k| (k.clone(), value.clone())))
        .collect()
}

/// Objects this Queue wrote (`recorded`) whose entries are no longer in the spec, each once, with
/// its UID where one was recorded (pure).
pub fn dropped(spec: &[Export], recorded: impl IntoIterator<Item = ExportRef>) -> Vec<ExportRef> {
    let mut gone: Vec<ExportRef> =
        recorded.into_iter().filter(|r| !spec.iter().any(|e| r.names(e.kind, &e.name))).collect();
    gone.sort();
    gone.dedup_by(|later, kept| {
        let same = kept.names(later.kind, &later.name);
        if same && kept.uid.is_none() {
            kept.uid = later.uid.take();
        }
        same
    });
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

const TAKEN: &str = "exists and was not made by this Queue";

/// Writes the default ConfigMap and every export, and deletes the exports dropped from the spec.
pub async fn publish(queue: &Queue, ready: &Ready, ctx: &Context) -> Result<Published> {
    let mut published = Published::default();
    match queue.spec.config_map {
        ConfigMapPolicy::Write => {
            if let Some(message) = ensure_configmap(queue, ready, ctx).await? {
                published.conflict = Some((Reason::ConfigMapConflict, message));
            }
        }
        ConfigMapPolicy::Skip => drop_default(queue, ctx).await?,
    }
    for target in dropped(&queue.spec.exports, recorded(queue, ctx)) {
        remove(queue, &target, ctx).await?;
    }
    let mut refused = Vec::new();
    for export in &queue.spec.exports {
        let values = data(export, ready);
        // Ok: written, with the Secret's UID; Err: why the name is not this Queue's.
        let written = match export.kind {
            ExportKind::ConfigMap => {
                let ours = ensure_owned_configmap(queue, configmap(queue, &export.name, values)?, ctx).await?;
                if ours { Ok(None) } else { Err(TAKEN) }
            }
            ExportKind::Secret => {
                let uid = recorded_uid(queue, &export.name);
                match secret_exports::ensure(queue, secret(queue, &export.name, values)?, uid, ctx).await? {
                    Outcome::Ours { uid } => Ok(Some(uid)),
                    Outcome::Taken => Err(TAKEN),
                    Outcome::Replaced => Err("is no longer the one this Queue made (replaced, or its owner changed)"),
                }
            }
        };
        match written {
            Ok(uid) => published.owned.push(ExportRef { uid, ..export.target() }),
            Err(why) => refused.push(format!("{} {} {why}", export.kind, export.name)),
        }
    }
    if !refused.is_empty() && published.conflict.is_none() {
        published.conflict = Some((
            Reason::ExportConflict,
            format!(
                "{}; skyport leaves it alone: delete it or rename the export, then skyport writes it",
                refused.join("; ")
            ),
        ));
    }
    Ok(published)
}

/// With `spec.configMap: Skip`, deletes the `<name>-sqs` this Queue wrote. Only the cache is
/// asked: a Queue that skips from its creation costs no read per reconcile.
async fn drop_default(queue: &Queue, ctx: &Context) -> Result<()> {
    let ns = queue.namespace().ok_or(Error::MissingObjectKey("namespace"))?;
    let name = configmap_name(queue);
    crate::controllers::store_synced(&ctx.configmaps).await;
    let ours = ctx.configmaps.get(&configmaps::key(&name, &ns)).is_some_and(|cached| cached.controlled_by(queue));
    if ours && remove_configmap(queue, &ns, &name, ctx).await? {
        info!(configmap = name, "deleted the Queue's ConfigMap: spec.configMap is Skip");
        let note = format!("deleted ConfigMap {name}: spec.configMap is Skip");
        ctx.publish(queue, Reason::ConfigMapDeleted, note).await;
    }
    Ok(())
}

/// The UID `status.exports` records for the Secret export `name`.
fn recorded_uid<'a>(queue: &'a Queue, name: &str) -> Option<&'a str> {
    let exports = &queue.status.as_ref()?.exports;
    exports.iter().find(|r| r.names(ExportKind::Secret, name)).and_then(|r| r.uid.as_deref())
}

/// What this Queue wrote: `status.exports`, plus ConfigMaps the cache shows it controls (covers
/// a write whose status update was lost).
fn recorded(queue: &Queue, ctx: &Context) -> Vec<ExportRef> {
    let mut all = queue.status.as_ref().map(|s| s.exports.clone()).unwrap_or_default();
    let controlled = configmaps::exported_by(queue, &ctx.exported, &ctx.configmaps);
    all.extend(controlled.iter().map(|cm| ExportRef { kind: ExportKind::ConfigMap, name: cm.name.clone(), uid: None }));
    all
}

/// Deletes an export's object if this Queue controls it (a ConfigMap by the cache, a Secret by
/// the UID it was created with; the UID precondition makes sure the one checked is the one
/// deleted); anything else of that name is left alone.
async fn remove(queue: &Queue, target: &ExportRef, ctx: &Context) -> Result<()> {
    let ns = queue.namespace().ok_or(Error::MissingObjectKey("namespace"))?;
    let deleted = match target.kind {
        ExportKind::ConfigMap => remove_configmap(queue, &ns, &target.name, ctx).await?,
        ExportKind::Secret => match secret_exports::uid_to_delete(queue, &target.name, target.uid.as_deref(), ctx) {
            Some(uid) => secret_exports::delete(&ns, &target.name, uid, ctx).await?,
            None => false,
        },
    };
    if !deleted {
        return Ok(());
    }
    info!(kind = %target.kind, export = target.name, "deleted export dropped from the spec");
    let note = format!("deleted {} {}: its entry was removed from spec.exports", target.kind, target.name);
    ctx.publish(queue, Reason::ExportDeleted, note).await;
    Ok(())
}

async fn remove_configmap(queue: &Queue, ns: &str, name: &str, ctx: &Context) -> Result<bool> {
    let api = Api::<ConfigMap>::namespaced(ctx.client.clone(), ns);
    let uid = match ctx.configmaps.get(&configmaps::key(name, ns)) {
        Some(cached) => cached.controlled_by(queue).then(|| cached.uid.clone()),
        None => api.get_opt(name).await?.filter(|cm| controlled_by(cm, queue)).and_then(|cm| cm.uid()),
    };
    let Some(uid) = uid else { return Ok(false) };
    let params = DeleteParams {
        preconditions: Some(Preconditions { uid: Some(uid), resource_version: None }),
        ..Default::default()
    };
    ctx.api_writes.inc();
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        // Already gone, or replaced by another object since it was read: not ours to delete.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::MANAGED_BY;
    use crate::controllers::queue::act::data_patch;
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
            proof: None,
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

    fn target(kind: ExportKind, name: &str, uid: Option<&str>) -> ExportRef {
        ExportRef { kind, name: name.into(), uid: uid.map(Into::into) }
    }

    #[test]
    fn dropped_exports_are_those_recorded_but_no_longer_in_the_spec() {
        let spec = [export(ExportKind::Secret, "a", Some("U"), None)];
        let recorded = [
            target(ExportKind::Secret, "a", Some("u-a")),
            target(ExportKind::ConfigMap, "a", None),
            target(ExportKind::Secret, "b", Some("u-b")),
            target(ExportKind::Secret, "b", None),
        ];
        assert_eq!(
            dropped(&spec, recorded),
            [target(ExportKind::ConfigMap, "a", None), target(ExportKind::Secret, "b", Some("u-b"))],
            "each once, with the UID it was recorded with"
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

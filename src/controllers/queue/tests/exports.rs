//! Exports a Queue wrote but did not record: found through the index of the ConfigMaps each
//! Queue controls ([`configmaps::Exported`]), against the same fakes as the other reconcile tests.

use super::*;

/// A copy of the Queue's own ConfigMap named `name`, controlled by the Queue `owner` (`uid`),
/// stored in the fake API and shown by the cache.
fn configmap(h: &mut Harness, name: &str, owner: &str, uid: &str) -> String {
    let mut cm = h.api.get("/api/v1/namespaces/ns/configmaps/orders-sqs").expect("the Queue's ConfigMap");
    cm["metadata"]["name"] = json!(name);
    cm["metadata"]["uid"] = json!(format!("cm-{name}"));
    cm["metadata"]["ownerReferences"][0]["name"] = json!(owner);
    cm["metadata"]["ownerReferences"][0]["uid"] = json!(uid);
    let path = format!("/api/v1/namespaces/ns/configmaps/{name}");
    let cm: ConfigMap = serde_json::from_value(h.api.put(&path, cm)).unwrap();
    h.configmaps.apply_watcher_event(&watcher::Event::Apply((&cm).into()));
    path
}

/// An export ConfigMap whose status write was lost, and which is no longer in the spec, is found
/// through the index and deleted; one that another Queue controls is left alone.
#[tokio::test]
async fn a_dropped_export_that_status_never_recorded_is_found_and_deleted() {
    let mut h = harness();
    h.reconcile(h.put(&queue(QueueSpec::default()))).await.unwrap();
    let ours = configmap(&mut h, "orders-env", "orders", "uid-1");
    let theirs = configmap(&mut h, "billing-env", "billing", "uid-2");
    assert!(h.current().status.as_ref().is_none_or(|s| s.exports.is_empty()), "status records no export");

    h.ctx.written.forget(&object_key(&h.current()));
    h.reconcile(Arc::new(h.current())).await.unwrap();
    assert!(h.api.get(&ours).is_none(), "the Queue's dropped export is deleted");
    assert!(h.api.get(&theirs).is_some(), "another Queue's is left");
    assert!(h.api.get("/api/v1/namespaces/ns/configmaps/orders-sqs").is_some(), "its own stays");
}

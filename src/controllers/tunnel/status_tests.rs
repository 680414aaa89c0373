//! Status is not ownership: an exit server whose id a tenant writes into `status.hostId` (anyone
//! who may write `tunnels/status` can) is neither adopted, nor deleted as an extra, nor deleted
//! with the Tunnel, unless it carries the Tunnel's UID tag.

use std::sync::Arc;

use providers::{Host, HostState};

use super::tests::harness;

fn theirs() -> Host {
    Host {
        id: "theirs".into(),
        name: "another-tunnel".into(),
        public_ipv4: Some("203.0.113.60".into()),
        state: HostState::Running,
        tags: providers::owner_tags("other-uid", "other", "db-tunnel"),
        placement: None,
    }
}

#[tokio::test]
async fn an_exit_server_named_in_status_without_the_tunnels_tag_is_never_taken_nor_deleted() {
    let mut h = harness();
    h.provider.insert(theirs());
    h.add_service();
    h.reconcile(h.new_tunnel()).await.unwrap();
    let own = h.current().status.unwrap().host_id.unwrap();

    let mut forged = h.current();
    forged.status.as_mut().unwrap().host_id = Some("theirs".into());
    // As after a restart: the controller's memory of its own status write does not mask it.
    h.ctx.written.forget(&crate::controllers::object_key(&forged));
    h.reconcile(h.put_tunnel(&forged)).await.unwrap();
    let ids: Vec<_> = h.provider.hosts().into_iter().map(|h| h.id).collect();
    assert!(ids.contains(&"theirs".to_string()), "not deleted as an extra: {ids:?}");
    let ingress = h.api.get(super::tests::SERVICE).unwrap()["status"]["loadBalancer"]["ingress"].clone();
    assert_ne!(ingress[0]["ip"], "203.0.113.60", "theirs is never published: {ingress}");
    assert!(ids.contains(&own), "its own host stays: {ids:?}");

    let mut deleted = h.current();
    deleted.status.as_mut().unwrap().host_id = Some("theirs".into());
    deleted.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
    h.ctx.written.forget(&crate::controllers::object_key(&deleted));
    h.reconcile(Arc::new((*h.put_tunnel(&deleted)).clone())).await.unwrap();
    let ids: Vec<_> = h.provider.hosts().into_iter().map(|h| h.id).collect();
    assert_eq!(ids, ["theirs"], "only the Tunnel's own host deleted");
}

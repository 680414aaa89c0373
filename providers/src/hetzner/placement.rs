//! A highly available Tunnel's spread placement group: both servers of its pair go into one,
//! whose members Hetzner runs on different physical hosts (API reference, "Placement Groups":
//! `POST /placement_groups` with `name`, `type: spread` and `labels`; `GET /placement_groups`
//! with `label_selector`; `DELETE /placement_groups/{id}`; "Create a Server" takes its id as
//! `placement_group`, and a server reports it as `placement_group`; a spread group holds at most
//! 10 servers).
//!
//! One group per Tunnel, labelled like its servers (the Tunnel's UID among them) and looked up by
//! that label before one is made, so an operator that stopped between making the group and the
//! server finds it again instead of making a second. It goes with the Tunnel
//! ([`crate::HostProvider::delete_placement`]) once no server is in it: a server being deleted
//! may still be listed in it, and that call fails as retryable until it is gone.

use std::collections::BTreeMap;

use reqwest::Method;
use serde::Deserialize;
use serde_json::json;

use super::{HetznerProvider, PROVIDER, unique_name};
use crate::error::HostError;
use crate::hosts::{HostRequest, TAG_BOUND_ADDRESS, TAG_TUNNEL_SLOT, TAG_TUNNEL_UID, TagSyntax};

#[derive(Debug, Deserialize)]
struct Group {
    id: u64,
    #[serde(default)]
    servers: Vec<u64>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
struct GroupBody {
    placement_group: Group,
}

/// A server's `placement_group`, as `Host::placement` shows it.
pub(super) fn describe(id: u64) -> String {
    format!("placement group {id}")
}

impl HetznerProvider {
    async fn groups_labelled(&self, key: &str, value: &str) -> Result<Vec<Group>, HostError> {
        self.labelled("ListPlacementGroups", "/placement_groups", "placement_groups", (key, value)).await
    }

    async fn groups_of(&self, uid: &str) -> Result<Vec<Group>, HostError> {
        self.groups_labelled(TAG_TUNNEL_UID, uid).await
    }

    /// The spread placement group a pair's server (`request` with a failure domain) goes into:
    /// its Tunnel's, made now if it has none. `None` for a single server.
    pub(super) async fn group_for(&self, request: &HostRequest) -> Result<Option<u64>, HostError> {
        let Some(uid) = request.tags.get(TAG_TUNNEL_UID).filter(|_| request.failure_domain.is_some()) else {
            return Ok(None);
        };
        if let Some(group) = self.groups_of(uid).await?.iter().min_by_key(|g| g.id) {
            return Ok(Some(group.id));
        }
        // The Tunnel's labels, not the slot's: both servers share it.
        let labels: BTreeMap<String, String> = request
            .tags
            .iter()
            .filter(|(k, _)| *k != TAG_TUNNEL_SLOT && *k != TAG_BOUND_ADDRESS)
            .map(|(k, v)| TagSyntax::Hetzner.encode(k, v))
            .collect();
        let body = json!({"name": unique_name("skyport-spread", Some(uid)), "type": "spread", "labels": labels});
        let response =
            self.rest.send("CreatePlacementGroup", Method::POST, "/placement_groups", &[], Some(&body)).await?;
        Ok(Some(self.rest.decode::<GroupBody>("CreatePlacementGroup", &response)?.placement_group.id))
    }

    /// The canonical tags of every placement group labelled `key=value`.
    pub(super) async fn group_tags(&self, key: &str, value: &str) -> Result<Vec<BTreeMap<String, String>>, HostError> {
        let groups = self.groups_labelled(key, value).await?;
        let decode = |g: Group| g.labels.iter().map(|(k, v)| TagSyntax::Hetzner.decode(k, v)).collect();
        Ok(groups.into_iter().map(decode).collect())
    }

    /// Deletes Tunnel `uid`'s placement groups, once no server is in them.
    pub(super) async fn delete_groups(&self, uid: &str) -> Result<(), HostError> {
        for group in self.groups_of(uid).await? {
            if !group.servers.is_empty() {
                let message =
                    format!("placement group {} still holds servers {:?} being deleted", group.id, group.servers);
                return Err(HostError::Unavailable { provider: PROVIDER, message });
            }
            let path = format!("/placement_groups/{}", group.id);
            match self.rest.send("DeletePlacementGroup", Method::DELETE, &path, &[], None).await {
                Ok(_) | Err(HostError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

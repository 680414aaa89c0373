//! Writing an object's status: only when it changes, with condition times kept stable.

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::ApiWrites;
use super::memory::OwnWrites;
use super::object_key;
use crate::crd::account::{AwsAccount, AwsAccountStatus};
use crate::crd::condition::{self, Condition, ConditionStatus};
use crate::crd::queue::{Queue, QueueStatus};
use crate::crd::tunnel::{Tunnel, TunnelStatus};
use crate::error::{Error, Result};

/// A status with conditions.
pub trait ObjectStatus: Clone + PartialEq + Default + Serialize {
    /// Fields a merge patch must send as null when they are cleared (a merge patch leaves
    /// absent fields as they are).
    const CLEARABLE: &'static [&'static str] = &[];
    fn conditions(&self) -> &[Condition];
    fn conditions_mut(&mut self) -> &mut Vec<Condition>;

    /// The `Ready` condition.
    fn ready(&self) -> Option<&Condition> {
        self.conditions().iter().find(|c| c.type_ == "Ready")
    }

    /// The reason of a `Ready=False` condition.
    fn not_ready_reason(&self) -> Option<&str> {
        self.ready().filter(|c| c.status == ConditionStatus::False).map(|c| c.reason.as_str())
    }
}

/// An object with an [`ObjectStatus`].
pub trait WithStatus: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug {
    type Status: ObjectStatus;
    fn status(&self) -> Option<&Self::Status>;
}

impl ObjectStatus for QueueStatus {
    // `adopted` is omitted when false: a queue recreated after adoption must clear it. `exports`
    // is omitted when empty: the last export dropped, or a Secret export found replaced, must
    // leave no recorded object (whose UID would be written and deleted by).
    const CLEARABLE: &'static [&'static str] = &["adopted", "exports"];
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.conditions
    }
}

impl WithStatus for Queue {
    type Status = QueueStatus;
    fn status(&self) -> Option<&QueueStatus> {
        self.status.as_ref()
    }
}

impl ObjectStatus for AwsAccountStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.conditions
    }
}

impl WithStatus for AwsAccount {
    type Status = AwsAccountStatus;
    fn status(&self) -> Option<&AwsAccountStatus> {
        self.status.as_ref()
    }
}

impl ObjectStatus for TunnelStatus {
    const CLEARABLE: &'static [&'static str] = &[
        "phase",
        "provider",
        "hostId",
        "hostIp",
        "ports",
        "observedGeneration",
        "replacements",
        "nextReplacementAfter",
        "addressReservation",
    ];
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.conditions
    }
}

impl WithStatus for Tunnel {
    type Status = TunnelStatus;
    fn status(&self) -> Option<&TunnelStatus> {
        self.status.as_ref()
    }
}

/// The `Ready` condition of `obj`, if it has one.
pub fn ready_condition<K: WithStatus>(obj: &K) -> Option<&Condition> {
    obj.status()?.ready()
}

/// Keeps the status last written during one reconcile, and writes a new one only when it
/// differs. With a memory, it starts from (and records) what this controller wrote last, which
/// the cache may not show yet.
pub struct StatusWriter<'a, K: WithStatus> {
    api: &'a Api<K>,
    writes: &'a ApiWrites,
    memory: Option<&'a OwnWrites<K::Status>>,
    key: String,
    name: String,
    generation: Option<i64>,
    last: K::Status,
    /// The object's resourceVersion after our last write, for a conditional patch after it.
    resource_version: Option<String>,
}

impl<'a, K: WithStatus> StatusWriter<'a, K> {
    pub fn new(obj: &K, api: &'a Api<K>, writes: &'a ApiWrites, memory: Option<&'a OwnWrites<K::Status>>) -> Self {
        let key = object_key(obj);
        let remembered = memory.and_then(|m| m.get(&key, |_, _| true)).map(|(status, _)| status);
        StatusWriter {
            api,
            writes,
            memory,
            key,
            name: obj.name_any(),
            generation: obj.meta().generation,
            last: remembered.or_else(|| obj.status().cloned()).unwrap_or_default(),
            resource_version: obj.meta().resource_version.clone(),
        }
    }

    pub fn current(&self) -> &K::Status {
        &self.last
    }

    /// The object's resourceVersion after our last status write (or as we were handed it).
    pub fn resource_version(&self) -> Option<String> {
        self.resource_version.clone()
    }

    /// Applies `change` to the current status; the conditions it sets are stamped with the
    /// object's generation and keep their transition times when their status is unchanged.
    pub async fn write(&mut self, change: impl FnOnce(&mut K::Status)) -> Result<()> {
        let mut new = self.last.clone();
        change(&mut new);
        let now = k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        let generation = self.generation;
        let conditions = std::mem::take(new.conditions_mut()).into_iter().map(|mut c| {
            c.observed_generation = generation;
            c
        });
        *new.conditions_mut() = condition::merge(self.last.conditions(), conditions.collect(), &now);
        if new == self.last {
            return Ok(());
        }
        let mut body = serde_json::to_value(&new).map_err(|e| Error::Internal(format!("status: {e}")))?;
        let before = serde_json::to_value(&self.last).map_err(|e| Error::Internal(format!("status: {e}")))?;
        null_dropped(&before, &mut body);
        if let Some(map) = body.as_object_mut() {
            for field in K::Status::CLEARABLE {
                map.entry(*field).or_insert(serde_json::Value::Null);
            }
        }
        self.writes.inc();
        let patched = self
            .api
            .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(json!({ "status": body })))
            .await?;
        self.resource_version = patched.meta().resource_version.clone();
        if let Some(memory) = self.memory {
            memory.record(self.key.clone(), new.clone());
        }
        self.last = new;
        Ok(())
    }
}

/// Sends null for every field `before` had and `after` leaves out, at any depth: a merge patch
/// keeps absent fields, so a cleared `Option` would otherwise never reach the API server (whether
/// or not its field is listed in [`ObjectStatus::CLEARABLE`], which covers fields this writer has
/// not seen).
fn null_dropped(before: &serde_json::Value, after: &mut serde_json::Value) {
    let (Some(before), Some(after)) = (before.as_object(), after.as_object_mut()) else { return };
    for (key, old) in before {
        match after.get_mut(key) {
            Some(now) => null_dropped(old, now),
            None => {
                after.insert(key.clone(), serde_json::Value::Null);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::testing::FakeApi;
    use serde_json::Value;

    #[tokio::test]
    async fn a_cleared_field_is_cleared_on_the_server_whether_or_not_it_is_listed() {
        let (client, fake) = FakeApi::start();
        let path = "/apis/skyport.dev/v1alpha1/namespaces/team-a/tunnels/web";
        let stored = fake.put(
            path,
            json!({"apiVersion": "skyport.dev/v1alpha1", "kind": "Tunnel",
                   "metadata": {"name": "web", "namespace": "team-a", "uid": "u"},
                   "spec": {"serviceRef": {"name": "web"}},
                   "status": {"addressId": "a-1", "addressIp": "192.0.2.1", "hostId": "h-1"}}),
        );
        let tunnel: Tunnel = serde_json::from_value(stored).unwrap();
        let api: Api<Tunnel> = Api::namespaced(client, "team-a");
        let writes = crate::controllers::ApiWrites::default();
        let mut writer = StatusWriter::new(&tunnel, &api, &writes, None);
        writer
            .write(|s| {
                s.address_id = None;
                s.address_ip = None;
            })
            .await
            .unwrap();
        let status = &fake.get(path).unwrap()["status"];
        assert_eq!((&status["addressId"], &status["addressIp"]), (&Value::Null, &Value::Null), "{status}");
        assert_eq!(status["hostId"], "h-1", "what was not cleared stays");
    }

    #[test]
    fn fields_dropped_at_any_depth_are_sent_as_null() {
        let before = json!({"a": 1, "b": {"c": 2, "d": 3}, "e": [1]});
        let mut after = json!({"b": {"c": 2}, "e": []});
        null_dropped(&before, &mut after);
        assert_eq!(after, json!({"a": null, "b": {"c": 2, "d": null}, "e": []}));
    }
}

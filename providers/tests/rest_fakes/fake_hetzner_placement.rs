//! The fake Hetzner Cloud API's placement groups, as its API reference describes them ("Placement
//! Groups": create with `name`, `type: spread` and `labels`, names unique per project; list with
//! `label_selector`; get; delete). A group's servers are those created in it. Deleting a group
//! that still has servers is refused here; the reference does not say whether Hetzner refuses it,
//! and the adapter never asks.

use std::collections::BTreeMap;

use hyper::Method;
use serde_json::{Value, json};

use crate::fake_hetzner_rules::{labels_in, paged, selected};
use crate::fake_server::{Fake, FakeGroup, State};

impl Fake {
    pub fn placement_groups(
        &self,
        state: &mut State,
        method: &Method,
        segments: &[&str],
        query: &BTreeMap<String, String>,
        body: Value,
    ) -> (u16, Value) {
        let servers = |state: &State, id: u64| -> Vec<u64> {
            state.hosts.iter().filter(|(_, h)| h.placement_group == Some(id)).map(|(n, _)| *n).collect()
        };
        let view = |state: &State, id: u64, g: &FakeGroup| {
            json!({"id": id, "name": g.name, "type": "spread", "labels": g.labels,
                   "servers": servers(state, id), "created": "2026-11-29T06:00:00+00:00"})
        };
        let not_found = |id: &str| self.error(404, "not_found", &format!("placement_group with ID '{id}' not found"));
        match (method, segments) {
            (&Method::POST, ["v1", "placement_groups"]) => {
                let Some(name) = body["name"].as_str() else {
                    return self.error(400, "invalid_input", "invalid input in field 'name': is required");
                };
                if body["type"].as_str() != Some("spread") {
                    return self.error(400, "invalid_input", "invalid input in field 'type'");
                }
                if state.groups.values().any(|g| g.name == name) {
                    return self.error(409, "uniqueness_error", "placement group name is already used");
                }
                let Some(labels) = labels_in(&body) else {
                    return self.error(400, "invalid_input", "invalid input in field 'labels'");
                };
                state.create_bodies.push(body.clone());
                state.next_id += 1;
                let id = state.next_id;
                let group = FakeGroup { name: name.into(), labels };
                let out = json!({"placement_group": view(state, id, &group)});
                state.groups.insert(id, group);
                (201, out)
            }
            (&Method::GET, ["v1", "placement_groups"]) => {
                let matching = state.groups.iter().filter(|(_, g)| selected(&g.labels, query));
                paged("placement_groups", matching.map(|(id, g)| view(state, *id, g)).collect(), query)
            }
            (&Method::DELETE, ["v1", "placement_groups", id]) => match id.parse::<u64>() {
                Ok(n) if state.groups.contains_key(&n) && !servers(state, n).is_empty() => {
                    self.error(422, "resource_in_use", "placement group has servers")
                }
                Ok(n) if state.groups.remove(&n).is_some() => (204, Value::Null),
                _ => not_found(id),
            },
            _ => not_found("?"),
        }
    }
}

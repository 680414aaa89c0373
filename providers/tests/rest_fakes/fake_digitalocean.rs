//! The fake DigitalOcean API: droplets and reserved IPs, as its API reference describes them.

use std::collections::BTreeMap;

use hyper::Method;
use serde_json::{Value, json};

use crate::POLLS_UNTIL_RUNNING;
use crate::fake_server::{Fake, FakeAddress, FakeHost, State};

impl Fake {
    pub fn digitalocean(
        &self,
        state: &mut State,
        method: &Method,
        path: &str,
        query: &BTreeMap<String, String>,
        body: Value,
    ) -> (u16, Value) {
        let public_ip = state.public_ip.clone();
        let droplet = |id: u64, h: &FakeHost, running: bool| {
            let ip = public_ip.clone().unwrap_or_else(|| format!("203.0.113.{}", id % 250));
            let v4 = if running {
                json!([
                    {"ip_address": ip, "netmask": "255.255.255.0", "gateway": "203.0.113.1", "type": "public"},
                    {"ip_address": "10.10.0.5", "netmask": "255.255.0.0", "gateway": null, "type": "private"}
                ])
            } else {
                json!([])
            };
            json!({
                "id": id, "name": h.name, "memory": 1024, "vcpus": 1, "disk": 25, "locked": false,
                "status": if running { "active" } else { "new" },
                "created_at": "2026-11-22T06:00:00Z", "features": [], "backup_ids": [], "snapshot_ids": [],
                "image": {"slug": "ubuntu-24-04-x64"}, "size_slug": "s-1vcpu-1gb",
                "networks": {"v4": v4, "v6": []}, "region": {"slug": h.location},
                "tags": h.tags, "vpc_uuid": "760e09ef-dc84-11e8-981e-3cfdfeaae000"
            })
        };
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        match (method, segments.as_slice()) {
            (&Method::POST, ["v2", "droplets"]) => {
                let size = body["size"].as_str().unwrap_or_default();
                if body["name"].as_str().is_none() || body["image"].is_null() {
                    return self.error(422, "unprocessable_entity", "request payload validation failed");
                }
                if !["s-1vcpu-1gb", "s-1vcpu-512mb-10gb"].contains(&size) {
                    return self.error(
                        422,
                        "unprocessable_entity",
                        "You specified an invalid size for Droplet creation.",
                    );
                }
                state.create_bodies.push(body.clone());
                state.next_id += 1;
                let id = state.next_id;
                // Without `region` DigitalOcean picks one ("region" is optional in
                // `droplet_create.yml`); which one is not promised, so the fake varies it.
                let location = body["region"]
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| ["nyc3", "fra1", "ams3"][(id % 3) as usize].to_string());
                let tags = body["tags"].as_array().into_iter().flatten().filter_map(|t| t.as_str()).map(str::to_string);
                let host = FakeHost {
                    name: body["name"].as_str().unwrap().into(),
                    reads: 0,
                    tags: tags.collect(),
                    labels: BTreeMap::new(),
                    primary_ip: None,
                    location,
                    placement_group: None,
                };
                let out = json!({
                    "droplet": droplet(id, &host, false),
                    "links": {"actions": [{"id": 36804636, "rel": "create", "href": format!("https://api.digitalocean.com/v2/actions/{id}")}]}
                });
                state.hosts.insert(id, host);
                (202, out)
            }
            (&Method::GET, ["v2", "droplets", id]) => {
                match id.parse().ok().and_then(|id| state.hosts.get_mut(&id).map(|h| (id, h))) {
                    Some((id, host)) => {
                        let running = Fake::read(host);
                        (200, json!({"droplet": droplet(id, host, running)}))
                    }
                    None => self.error(404, "not_found", "The resource you requested could not be found."),
                }
            }
            (&Method::DELETE, ["v2", "droplets", id]) => {
                match id.parse().ok().and_then(|id| state.hosts.remove(&id).map(|_| id)) {
                    Some(id) => {
                        // A reserved IP stays in the account, unassigned, when its droplet goes.
                        for a in state.addresses.values_mut().filter(|a| a.host == Some(id)) {
                            a.host = None;
                        }
                        (204, Value::Null)
                    }
                    None => self.error(404, "not_found", "The resource you requested could not be found."),
                }
            }
            (_, ["v2", "reserved_ips", ..]) => {
                let droplets: BTreeMap<u64, Value> =
                    state.hosts.iter().map(|(id, h)| (*id, droplet(*id, h, h.reads > POLLS_UNTIL_RUNNING))).collect();
                self.reserved_ips(state, method, &segments, query, body, &droplets)
            }
            (&Method::GET, ["v2", "droplets"]) => {
                let tag = query.get("tag_name").cloned().unwrap_or_default();
                let per_page: usize = query.get("per_page").and_then(|p| p.parse().ok()).unwrap_or(20);
                let page: usize = query.get("page").and_then(|p| p.parse().ok()).unwrap_or(1);
                let matching: Vec<Value> = state
                    .hosts
                    .iter()
                    .filter(|(_, h)| tag.is_empty() || h.tags.contains(&tag))
                    .map(|(id, h)| droplet(*id, h, h.reads > POLLS_UNTIL_RUNNING))
                    .collect();
                let last = matching.len().div_ceil(per_page).max(1);
                let items: Vec<Value> = matching.iter().skip((page - 1) * per_page).take(per_page).cloned().collect();
                let link = |p: usize| {
                    format!("https://api.digitalocean.com/v2/droplets?page={p}&per_page={per_page}&tag_name={tag}")
                };
                let mut pages = serde_json::Map::new();
                if page > 1 {
                    pages.insert("first".into(), json!(link(1)));
                    pages.insert("prev".into(), json!(link(page - 1)));
                }
                if page < last {
                    pages.insert("next".into(), json!(link(page + 1)));
                    pages.insert("last".into(), json!(link(last)));
                }
                let mut out = json!({"droplets": items, "meta": {"total": matching.len()}});
                // "If the response contains 20 objects or fewer, no links object will be returned."
                if !pages.is_empty() {
                    out["links"] = json!({"pages": pages});
                }
                (200, out)
            }
            _ => self.error(404, "not_found", "The resource you were accessing could not be found."),
        }
    }

    fn reserved_ips(
        &self,
        state: &mut State,
        method: &Method,
        segments: &[&str],
        query: &BTreeMap<String, String>,
        body: Value,
        droplets: &BTreeMap<u64, Value>,
    ) -> (u16, Value) {
        let not_found = || self.error(404, "not_found", "The resource you requested could not be found.");
        let view = |a: &FakeAddress| {
            json!({
                "ip": a.ip,
                "region": {"slug": a.location, "name": "Frankfurt 1", "available": true, "features": [], "sizes": []},
                "droplet": a.host.and_then(|h| droplets.get(&h).cloned()).unwrap_or(Value::Null),
                "locked": false,
                "project_id": "746c6152-2fa2-11ed-92d3-27aaa54e4988"
            })
        };
        let find = |state: &State, ip: &str| state.addresses.iter().find(|(_, a)| a.ip == ip).map(|(k, _)| *k);
        match (method, segments) {
            (&Method::POST, ["v2", "reserved_ips"]) => {
                // Exactly one of droplet_id and region.
                let droplet = body["droplet_id"].as_u64();
                let region = body["region"].as_str();
                if droplet.is_some() == region.is_some() {
                    return self.error(422, "unprocessable_entity", "either droplet_id or region is required");
                }
                if droplet.is_some_and(|d| !state.hosts.contains_key(&d)) {
                    return not_found();
                }
                state.next_id += 1;
                let id = state.next_id;
                let location = droplet.map(|d| state.hosts[&d].location.clone()).or(region.map(str::to_string));
                let address = FakeAddress {
                    name: String::new(),
                    id,
                    ip: format!("192.0.2.{}", id % 250),
                    host: droplet,
                    labels: BTreeMap::new(),
                    location: location.unwrap_or_default(),
                    auto_delete: false,
                };
                let out = json!({"reserved_ip": view(&address), "links": {"droplets": [], "actions": []}});
                state.addresses.insert(id, address);
                (202, out)
            }
            (&Method::GET, ["v2", "reserved_ips"]) => {
                let per_page: usize = query.get("per_page").and_then(|p| p.parse().ok()).unwrap_or(20);
                let page: usize = query.get("page").and_then(|p| p.parse().ok()).unwrap_or(1);
                let all: Vec<Value> = state.addresses.values().map(view).collect();
                let last = all.len().div_ceil(per_page).max(1);
                let items: Vec<Value> = all.iter().skip((page - 1) * per_page).take(per_page).cloned().collect();
                let mut out = json!({"reserved_ips": items, "meta": {"total": all.len()}});
                if page < last {
                    let next =
                        format!("https://api.digitalocean.com/v2/reserved_ips?page={}&per_page={per_page}", page + 1);
                    out["links"] = json!({"pages": {"next": next}});
                }
                (200, out)
            }
            (&Method::GET, ["v2", "reserved_ips", ip]) => match find(state, ip) {
                Some(k) => (200, json!({"reserved_ip": view(&state.addresses[&k])})),
                None => not_found(),
            },
            (&Method::DELETE, ["v2", "reserved_ips", ip]) => match find(state, ip) {
                Some(k) => {
                    state.addresses.remove(&k);
                    (204, Value::Null)
                }
                None => not_found(),
            },
            (&Method::POST, ["v2", "reserved_ips", ip, "actions"]) => {
                let Some(k) = find(state, ip) else { return not_found() };
                let kind = body["type"].as_str().unwrap_or_default();
                match kind {
                    "assign" => {
                        let Some(d) = body["droplet_id"].as_u64().filter(|d| state.hosts.contains_key(d)) else {
                            return self.error(422, "unprocessable_entity", "droplet_id is invalid");
                        };
                        // Product docs, "Reserved IP Availability": reserved IPs "are
                        // region-specific resources and can only be assigned to Droplets within
                        // the same datacenter".
                        if state.hosts[&d].location != state.addresses[&k].location {
                            return self.error(
                                422,
                                "unprocessable_entity",
                                "The reserved IP and the Droplet must be in the same region.",
                            );
                        }
                        state.addresses.get_mut(&k).unwrap().host = Some(d);
                    }
                    "unassign" => state.addresses.get_mut(&k).unwrap().host = None,
                    _ => return self.error(422, "unprocessable_entity", "type must be assign or unassign"),
                }
                let action = json!({"id": 72531856, "status": "in-progress", "type": format!("{kind}_ip"),
                    "started_at": "2026-11-23T06:00:00Z", "completed_at": null, "resource_id": 758604197,
                    "resource_type": "reserved_ip", "region_slug": "fra1"});
                (201, json!({"action": action}))
            }
            _ => not_found(),
        }
    }
}

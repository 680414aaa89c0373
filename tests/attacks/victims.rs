//! The objects skyport does not own, one of each kind the attacks know, each holding a random
//! marker where its data lives, planted by the admin in a tenant's namespace and in the
//! operator's; and how they are read back, compared and put back after a successful attack.

use std::time::Duration;

use hyper::Method;
use k8s_openapi::ByteString;
use kube::Client;
use serde_json::{Value, json};

use super::wire::{Call, JSON, MERGE_PATCH, collection};

/// A kind of object the attacks know how to plant and attack. A granted rule on a resource
/// without a `Kind` here has no attack, and fails the test.
#[derive(Debug)]
pub struct Kind {
    pub group: &'static str,
    pub version: &'static str,
    pub resource: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    /// Whether it has a status subresource (attacked as `<resource>/status`).
    pub status: bool,
    /// Where the planted marker lives (a JSON pointer).
    pub at: &'static str,
}

const fn kind(
    (group, version, resource, kind): (&'static str, &'static str, &'static str, &'static str),
    namespaced: bool,
    status: bool,
    at: &'static str,
) -> Kind {
    Kind { group, version, resource, kind, namespaced, status, at }
}

pub static KINDS: &[Kind] = &[
    kind(("", "v1", "secrets", "Secret"), true, false, "/data/token"),
    kind(("", "v1", "configmaps", "ConfigMap"), true, false, "/data/token"),
    kind(("", "v1", "services", "Service"), true, true, "/metadata/annotations/token"),
    kind(("", "v1", "namespaces", "Namespace"), false, true, "/metadata/annotations/token"),
    kind(("events.k8s.io", "v1", "events", "Event"), true, false, "/note"),
    kind(("coordination.k8s.io", "v1", "leases", "Lease"), true, false, "/spec/holderIdentity"),
    kind(("apps", "v1", "deployments", "Deployment"), true, true, "/spec/template/spec/containers/0/env/0/value"),
    kind(("skyport.dev", "v1alpha1", "queues", "Queue"), true, true, "/spec/tags/token"),
    kind(("skyport.dev", "v1alpha1", "tunnels", "Tunnel"), true, true, "/metadata/annotations/token"),
    kind(("skyport.dev", "v1alpha1", "awsaccounts", "AwsAccount"), true, true, "/spec/roleArn"),
    kind(("skyport.dev", "v1alpha1", "exitserverpools", "ExitServerPool"), false, true, "/spec/region"),
];

pub fn find(group: &str, resource: &str) -> Option<&'static Kind> {
    KINDS.iter().find(|k| k.group == group && k.resource == resource)
}

pub const VICTIM_LABEL: &str = "attacks.skyport.dev/victim";

/// One object skyport does not own.
#[derive(Debug, Clone)]
pub struct Victim {
    pub kind: &'static Kind,
    pub namespace: Option<String>,
    pub name: String,
    /// The JSON pointer of the value an attacker is after, and that value as stored.
    pub at: String,
    pub value: Value,
    /// The random marker planted in it; `None` for an object that was there before the test
    /// (the operator's own Deployment, kube-system), whose values are not secrets of this test.
    pub marker: Option<String>,
    /// What the admin creates to put it back.
    pub template: Value,
}

impl Victim {
    pub fn label(&self) -> String {
        format!("{} {}/{}", self.kind.kind, self.namespace.as_deref().unwrap_or("-"), self.name)
    }

    pub fn collection(&self) -> String {
        collection(self.kind.group, self.kind.version, self.kind.resource, self.namespace.as_deref())
    }

    /// The object's path, `/status` appended for `Some("status")`.
    pub fn path(&self, sub: Option<&str>) -> String {
        let item = format!("{}/{}", self.collection(), self.name);
        sub.map_or(item.clone(), |s| format!("{item}/{s}"))
    }

    /// The marker and its base64: the strings no answer may contain when it is a secret.
    pub fn secrets(&self) -> Vec<String> {
        self.marker.iter().flat_map(|m| [m.clone(), base64(m)]).collect()
    }
}

pub fn base64(s: &str) -> String {
    serde_json::to_value(ByteString(s.as_bytes().to_vec())).unwrap().as_str().unwrap().to_string()
}

fn random_marker() -> String {
    format!("mk{:016x}{:08x}", rand::random::<u64>(), rand::random::<u32>())
}

/// The object of `kind` named `name` holding `value` at `kind.at`, as a tenant would have it.
pub fn object(kind: &Kind, namespace: Option<&str>, name: &str, value: &str) -> Value {
    let api_version =
        if kind.group.is_empty() { kind.version.to_string() } else { format!("{}/{}", kind.group, kind.version) };
    let mut metadata = json!({"name": name, "labels": {VICTIM_LABEL: name}});
    if let Some(ns) = namespace {
        metadata["namespace"] = json!(ns);
    }
    let annotated = |mut metadata: Value| {
        metadata["annotations"] = json!({"token": value});
        metadata
    };
    let body = match kind.resource {
        "secrets" => json!({"metadata": metadata, "type": "Opaque", "data": {"token": base64(value)}}),
        "configmaps" => json!({"metadata": metadata, "data": {"token": value}}),
        "services" => json!({"metadata": annotated(metadata), "spec": {"type": "LoadBalancer",
            "loadBalancerClass": "example.com/other", "ports": [{"port": 80}], "selector": {"app": name}}}),
        "namespaces" => json!({"metadata": annotated(metadata)}),
        "events" => json!({"metadata": metadata, "eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingController": "example.com/tenant", "reportingInstance": "tenant-1", "action": "Probe",
            "reason": "Probe", "type": "Normal", "note": value,
            "regarding": {"apiVersion": "v1", "kind": "ConfigMap", "name": name, "namespace": namespace}}),
        "leases" => json!({"metadata": metadata, "spec": {"holderIdentity": value}}),
        "deployments" => json!({"metadata": metadata, "spec": {"selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c",
            "image": "example.com/tenant:1", "env": [{"name": "TOKEN", "value": value}]}]}}}}),
        "queues" => json!({"metadata": metadata, "spec": {"tags": {"token": value}}}),
        "tunnels" => json!({"metadata": annotated(metadata), "spec": {"serviceRef": {"name": "tenant-lb"}}}),
        "awsaccounts" => json!({"metadata": metadata,
            "spec": {"roleArn": format!("arn:aws:iam::123456789012:role/{value}"), "region": "us-east-1"}}),
        "exitserverpools" => json!({"metadata": metadata,
            "spec": {"provider": "local", "region": value, "allowedNamespaces": ["tenant"]}}),
        other => panic!("no template for {other}"),
    };
    let mut body = body;
    body["apiVersion"] = json!(api_version);
    body["kind"] = json!(kind.kind);
    body
}

/// What an attacker writes over the object: the change it is after (a redirect, a wider grant,
/// another image), as a merge patch, with the labels that would claim it ([`claim`]).
pub fn overwrite(v: &Victim) -> Value {
    let spec = match v.kind.resource {
        "secrets" => json!({"data": {"token": base64("attacker")}}),
        "configmaps" => json!({"data": {"token": "attacker"}}),
        "services" => json!({"spec": {"selector": {"app": "attacker"}}}),
        "namespaces" => json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}}),
        "events" => json!({"note": "attacker"}),
        "leases" => json!({"spec": {"holderIdentity": "attacker"}}),
        "deployments" => json!({"spec": {"template": {"spec": {"containers":
            [{"name": "c", "image": "example.com/attacker:latest"}]}}}}),
        "queues" => json!({"spec": {"tags": {"token": "attacker"}, "deletionPolicy": "Delete"}}),
        "tunnels" => json!({"spec": {"sourceRanges": ["0.0.0.0/0"]}}),
        "awsaccounts" => json!({"spec": {"allowedNamespaces": ["attacker"]}}),
        "exitserverpools" => json!({"spec": {"allowedNamespaces": ["attacker"]}}),
        other => panic!("no overwrite for {other}"),
    };
    let mut patch = json!({"metadata": {"labels": claim(v)}});
    merge(&mut patch, spec);
    patch
}

/// The labels an attacker adds to make `v` look like skyport's: a Lease under a shard or replica
/// name gets its group's label (`skyport.dev/lease-group`), which skyport's own Leases carry.
pub fn claim(v: &Victim) -> Value {
    let mut labels = json!({"attacks.skyport.dev/attacked": "true"});
    let group = ["-shard-", "-replica-"].iter().find_map(|infix| v.name.split_once(infix)).map(|(g, _)| g);
    if let Some(group) = group.filter(|_| v.kind.resource == "leases") {
        labels["skyport.dev/lease-group"] = json!(group);
    }
    labels
}

/// What an attacker writes into a status: only a Service's matters beyond skyport's own kinds
/// (an address published on a load balancer that is not skyport's redirects its clients).
pub fn status_overwrite(kind: &Kind) -> Value {
    match kind.resource {
        "services" => json!({"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.66"}]}}}),
        _ => json!({"status": {"attacked": "true"}}),
    }
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

/// Plants a fresh victim of `kind` in `namespace` (a new Namespace for cluster-scoped kinds),
/// named `name` or at random.
pub async fn plant(admin: &Client, kind: &'static Kind, namespace: Option<&str>, name: Option<&str>) -> Victim {
    let marker = random_marker();
    let name = name
        .map_or_else(|| format!("victim-{}-{:06x}", kind.resource, rand::random::<u32>() & 0xff_ffff), str::to_string);
    let template = object(kind, namespace, &name, &marker);
    let victim = Victim {
        kind,
        namespace: namespace.map(str::to_string),
        at: kind.at.to_string(),
        value: template.pointer(kind.at).cloned().expect("the marker's place"),
        marker: Some(marker),
        name,
        template,
    };
    create(admin, &victim).await;
    victim
}

/// An object that exists already (the operator's own Deployment, kube-system), attacked as found.
pub async fn existing(admin: &Client, kind: &'static Kind, namespace: Option<&str>, name: &str, at: &str) -> Victim {
    let mut victim = Victim {
        kind,
        namespace: namespace.map(str::to_string),
        name: name.to_string(),
        at: at.to_string(),
        value: Value::Null,
        marker: None,
        template: Value::Null,
    };
    let found = get(admin, &victim).await.unwrap_or_else(|| panic!("{} exists", victim.label()));
    victim.value = found.pointer(at).cloned().unwrap_or_else(|| panic!("{} has {at}", victim.label()));
    victim.template = found;
    victim
}

/// The object as stored now; `None` once gone.
pub async fn get(admin: &Client, victim: &Victim) -> Option<Value> {
    let answer = Call::new(Method::GET, victim.path(None)).send(admin).await;
    match answer.status {
        200 => answer.json(),
        404 => None,
        _ => panic!("admin reads {}: {}", victim.label(), answer.brief()),
    }
}

async fn create(admin: &Client, victim: &Victim) {
    let mut body = victim.template.clone();
    if let Some(meta) = body["metadata"].as_object_mut() {
        for field in ["resourceVersion", "uid", "creationTimestamp", "managedFields", "generation"] {
            meta.remove(field);
        }
    }
    if let Some(obj) = body.as_object_mut() {
        obj.remove("status");
    }
    let answer = Call::new(Method::POST, victim.collection()).with(JSON, body).send(admin).await;
    assert!(answer.admitted(), "admin creates {}: {}", victim.label(), answer.brief());
}

/// Puts a victim an attack changed or deleted back: deleted (finalizers cleared) and made anew,
/// with a new UID, so that an owner reference injected into the old one cannot take the new one
/// with it.
pub async fn restore(admin: &Client, victim: &Victim) {
    assert!(
        victim.kind.resource != "namespaces" || victim.marker.is_some(),
        "{} was changed by an attack; a Namespace that was there before is never deleted to restore it",
        victim.label()
    );
    let clear = json!({"metadata": {"finalizers": null, "ownerReferences": null}});
    let _ = Call::new(Method::PATCH, victim.path(None)).with(MERGE_PATCH, clear).send(admin).await;
    let _ = Call::new(Method::DELETE, victim.path(None)).send(admin).await;
    let what = format!("{} gone before it is made again", victim.label());
    crate::common::eventually(&what, Duration::from_secs(90), || async {
        get(admin, victim).await.is_none().then_some(())
    })
    .await;
    create(admin, victim).await;
}

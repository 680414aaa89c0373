//! Applying a case as a user would (`kubectl apply`), and reading its outcome: the Ready
//! condition, the Warning Events, and whether the good objects are still served.

use std::io::Write;
use std::process::{Command, Stdio};

use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DynamicObject};
use kube::discovery::ApiResource;
use serde_json::Value;

use super::TIMEOUT;
use crate::common::{TestNs, eventually};

/// `kubectl apply -f -` in `ns`: what a user types. Err carries kubectl's message.
fn kubectl_apply(ns: &str, object: &Value) -> Result<(), String> {
    let mut child = Command::new("kubectl")
        .args(["apply", "-n", ns, "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kubectl (is the test environment's PATH set?)");
    child.stdin.take().expect("stdin").write_all(object.to_string().as_bytes()).expect("write stdin");
    let out = child.wait_with_output().expect("wait for kubectl");
    if out.status.success() { Ok(()) } else { Err(String::from_utf8_lossy(&out.stderr).trim().to_string()) }
}

pub async fn apply(ns: &str, object: &Value) -> Result<(), String> {
    let (ns, object) = (ns.to_string(), object.clone());
    tokio::task::spawn_blocking(move || kubectl_apply(&ns, &object)).await.expect("kubectl task")
}

/// The object a case's outcome shows on: a Service's is its Tunnel.
pub fn target(object: &Value) -> (&'static str, String) {
    let name = object["metadata"]["name"].as_str().unwrap_or_default().to_string();
    match object["kind"].as_str() {
        Some("Queue") => ("Queue", name),
        Some("Service") => ("Tunnel", format!("{name}-tunnel")),
        _ => ("Tunnel", name),
    }
}

fn resource(kind: &str) -> ApiResource {
    let plural = if kind == "Queue" { "queues" } else { "tunnels" };
    ApiResource {
        group: "skyport.dev".into(),
        version: "v1alpha1".into(),
        api_version: "skyport.dev/v1alpha1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// The Ready condition's (status, reason, message).
pub async fn ready_of(ns: &TestNs, kind: &str, name: &str) -> Option<(String, String, String)> {
    let api: Api<DynamicObject> = Api::namespaced_with(ns.client.clone(), &ns.name, &resource(kind));
    let obj = api.get(name).await.ok()?;
    let conditions = obj.data["status"]["conditions"].as_array()?.clone();
    let c = conditions.into_iter().find(|c| c["type"] == "Ready")?;
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    Some((s("status"), s("reason"), s("message")))
}

/// Warning Events about `kind/name`: (reason, times emitted).
pub async fn warnings(ns: &TestNs, kind: &str, name: &str) -> Vec<(String, i32)> {
    let events: Api<Event> = ns.api();
    let list = events.list(&Default::default()).await.expect("list Events");
    list.items
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .filter(|e| {
            e.regarding.as_ref().is_some_and(|r| r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name))
        })
        .map(|e| (e.reason.unwrap_or_default(), e.series.map_or(1, |s| s.count)))
        .collect()
}

/// The good objects are still served: the Queue Ready, the Tunnel Active.
pub async fn good_still_served(ns: &TestNs, when: &str) {
    eventually(&format!("good Queue Ready {when}"), TIMEOUT, || async {
        (ready_of(ns, "Queue", "good").await?.0 == "True").then_some(())
    })
    .await;
    eventually(&format!("good Tunnel Active {when}"), TIMEOUT, || async {
        (ready_of(ns, "Tunnel", "good-web-tunnel").await?.1 == "Active").then_some(())
    })
    .await;
}

//! Requests as an attacker sends them: raw HTTP through a client, so that every answer, body and
//! error message alike, can be searched for a planted value, and so that any content type,
//! query and body can be sent (kube's typed API would refuse to send most of the attacks).

use hyper::{Method, Request};
use kube::Client;
use kube::client::Body;
use serde_json::Value;

/// What the API server answered: the status code and the raw body.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: String,
}

impl Answer {
    pub fn admitted(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The body as JSON (a Status for errors), if it is JSON.
    pub fn json(&self) -> Option<Value> {
        serde_json::from_str(&self.body).ok()
    }

    /// A short form for a failure report: the status code and the body's message, or its start.
    pub fn brief(&self) -> String {
        let message = self.json().and_then(|v| v["message"].as_str().map(str::to_string));
        let text = message.unwrap_or_else(|| self.body.chars().take(200).collect());
        format!("{} {}", self.status, text)
    }
}

pub const JSON: &str = "application/json";
pub const JSON_PATCH: &str = "application/json-patch+json";
pub const MERGE_PATCH: &str = "application/merge-patch+json";
pub const STRATEGIC_PATCH: &str = "application/strategic-merge-patch+json";
pub const APPLY_PATCH: &str = "application/apply-patch+yaml";

/// One request: method, path with query, and an optional body of the given content type.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: Method,
    pub uri: String,
    pub body: Option<(&'static str, Value)>,
}

impl Call {
    pub fn new(method: Method, uri: impl Into<String>) -> Call {
        Call { method, uri: uri.into(), body: None }
    }

    pub fn with(mut self, content_type: &'static str, body: Value) -> Call {
        self.body = Some((content_type, body));
        self
    }

    /// Adds `query` (`k=v&...`) to the URI.
    pub fn query(mut self, query: &str) -> Call {
        let sep = if self.uri.contains('?') { '&' } else { '?' };
        self.uri = format!("{}{sep}{query}", self.uri);
        self
    }

    /// This call, a PUT made conditional on `object`'s resourceVersion, as a thief who read or
    /// listed it sends it: kinds that refuse unconditional updates (Leases) would otherwise answer
    /// 422 whatever the RBAC and the admission policies say.
    pub fn at_version_of(&self, object: &Value) -> Call {
        let mut call = self.clone();
        if let Some((_, body)) = call.body.as_mut().filter(|_| self.method == Method::PUT) {
            body["metadata"]["resourceVersion"] = object["metadata"]["resourceVersion"].clone();
        }
        call
    }

    pub async fn send(&self, client: &Client) -> Answer {
        let mut request = Request::builder().method(self.method.clone()).uri(&self.uri);
        let mut bytes = Vec::new();
        if let Some((content_type, body)) = &self.body {
            request = request.header("content-type", *content_type);
            bytes = serde_json::to_vec(body).expect("JSON body");
        }
        let request = request.body(Body::from(bytes)).expect("request");
        let response =
            client.send(request).await.unwrap_or_else(|e| panic!("{} {}: no answer: {e}", self.method, self.uri));
        let status = response.status().as_u16();
        let bytes = response.into_body().collect_bytes().await.unwrap_or_default();
        Answer { status, body: String::from_utf8_lossy(&bytes).into_owned() }
    }
}

/// The API path of a resource: its collection in `namespace` (all namespaces with `None` for a
/// namespaced resource), `/name` and `/subresource` appended by the caller.
pub fn collection(group: &str, version: &str, resource: &str, namespace: Option<&str>) -> String {
    let root = if group.is_empty() { format!("/api/{version}") } else { format!("/apis/{group}/{version}") };
    match namespace {
        Some(ns) => format!("{root}/namespaces/{ns}/{resource}"),
        None => format!("{root}/{resource}"),
    }
}

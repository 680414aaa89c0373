//! The table's vocabulary: what a case applies and what it expects, and the builders its
//! manifests are written with.

use serde_json::{Value, json};

#[derive(Clone, Debug)]
pub enum Expect {
    /// `kubectl apply` fails and its message contains every one of these.
    Refused(&'static [&'static str]),
    /// Accepted, then Ready=False with this reason and exactly one Warning Event for it.
    Reported(&'static str),
    /// A valid input at an edge: Ready (a Queue) or Active (a Tunnel).
    Served,
}

pub struct Case {
    pub what: &'static str,
    /// Applied first, must be accepted (an edit's original object, a Tunnel's Service).
    pub before: Vec<Value>,
    /// The bad manifest or edit; for `Reported` and `Served` its kind and name are watched.
    pub apply: Value,
    pub expect: Expect,
}

pub fn case(what: &'static str, apply: Value, expect: Expect) -> Case {
    Case { what, before: vec![], apply, expect }
}

pub fn edit(what: &'static str, before: Value, apply: Value, expect: Expect) -> Case {
    Case { what, before: vec![before], apply, expect }
}

pub fn q(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "skyport.dev/v1alpha1", "kind": "Queue", "metadata": {"name": name}, "spec": spec})
}

pub fn t(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "skyport.dev/v1alpha1", "kind": "Tunnel", "metadata": {"name": name}, "spec": spec})
}

/// An ExitServerPool (cluster-scoped: the name is the whole cluster's, so cases name theirs
/// `bad-input-*`), allowing namespace `a`, with `spec` added.
pub fn pool(name: &str, spec: Value) -> Value {
    let mut s = json!({"allowedNamespaces": ["a"]});
    s.as_object_mut().unwrap().extend(spec.as_object().unwrap().clone());
    json!({"apiVersion": "skyport.dev/v1alpha1", "kind": "ExitServerPool", "metadata": {"name": name}, "spec": s})
}

pub fn svc(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec})
}

pub fn lb(name: &str, ports: Value) -> Value {
    svc(name, json!({"type": "LoadBalancer", "loadBalancerClass": "skyport.dev/tunnel", "ports": ports}))
}

/// A FIFO Queue: `spec` with `fifo: true` added.
pub fn fifo(name: &str, spec: Value) -> Value {
    let mut s = json!({"fifo": true});
    s.as_object_mut().unwrap().extend(spec.as_object().unwrap().clone());
    q(name, s)
}

pub fn long(n: usize) -> String {
    "a".repeat(n)
}

pub fn many_tags(n: usize) -> Value {
    Value::Object((0..n).map(|i| (format!("k{i}"), json!("v"))).collect())
}

pub fn arns(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("arn:aws:sqs:us-east-1:000000000000:src-{i}")).collect()
}

/// A valid access policy of about `bytes` bytes (one statement per queue ARN).
pub fn policy(bytes: usize) -> Value {
    let statement = |i: usize| {
        json!({"Sid": format!("s{i}"), "Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::000000000000:root"},
               "Action": "sqs:SendMessage", "Resource": format!("arn:aws:sqs:us-east-1:000000000000:q{i}")})
    };
    let per = statement(0).to_string().len() + 1;
    json!({"Version": "2012-10-17", "Statement": (0..bytes / per + 1).map(statement).collect::<Vec<_>>()})
}

//! Tunnels against the real test environment with the local provider: a real kube-apiserver
//! (+ the garbage collector), real rathole exit servers on their own 127.77.x.y addresses, and
//! the real rathole client run from the client Deployment by `common::kubelet`.

mod common;
#[path = "common/tunnels.rs"]
mod tunnels;

#[path = "tunnel/ec2.rs"]
mod ec2;
#[path = "tunnel/lifecycle.rs"]
mod lifecycle;
#[path = "tunnel/readiness.rs"]
mod readiness;
#[path = "tunnel/rules.rs"]
mod rules;

const NEEDS_ENV: &str = "needs the test environment: tests/env.sh up";

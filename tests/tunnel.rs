//! Tunnels against the real test environment with the local provider: a real kube-apiserver
//! (+ the garbage collector), real rathole exit servers on their own 127.77.x.y addresses, and
//! the real rathole client run from the client Deployment by `common::kubelet`.

mod artifact;
mod ec2;
mod ec2_network;
mod lifecycle;
mod readiness;
mod rules;

const NEEDS_ENV: &str = "needs the test environment: tests/env.sh up";

//! Tunnels against the real test environment with the local provider: a real kube-apiserver
//! (+ the garbage collector) and real rathole exit servers on addresses of their own. The life of
//! a Tunnel (lifecycle.rs) runs on the test node, its client a real Pod; the others run the
//! client from the client Deployment with `common::kubelet` on the node-less shared cluster.

mod artifact;
mod ec2;
mod ec2_network;
mod lifecycle;
mod pool;
mod pool_addresses;
mod proxy_protocol;
mod readiness;
mod rules;
mod sweep;

const NEEDS_ENV: &str = "needs the test environment: tests/env.sh up";

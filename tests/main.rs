//! Every integration test, in one binary: each file beside this one is a module, so the operator
//! is compiled into one test executable instead of one per file. The tests run against the real
//! environment of `tests/env.sh up` (kube-apiserver, etcd, kube-controller-manager, LocalStack).
//!
//! Run all with `tests/run.sh`; one area with, for example,
//! `eval "$(tests/env.sh up)" && cargo test --test integration queue:: -- --include-ignored`.

mod common;

mod apiserver_away;
mod apiserver_matrix;
mod attacks;
mod bad_input;
mod cloud_faults;
mod cloud_wiped;
mod crash;
mod crds;
mod deploy;
mod guest;
mod health;
mod install;
mod monitoring;
mod node;
mod operate;
mod queue;
mod queue_accounts;
mod queue_exports;
mod queue_ownership;
mod queue_secret_exports;
mod queue_tenancy;
mod rbac;
mod secrets;
mod shards;
mod shared_server;
mod shutdown;
mod tunnel;
mod tunnel_address;
mod tunnel_allow;
mod tunnel_clients;
mod tunnel_ec2_ha;
mod tunnel_failover;
mod tunnel_faults;
mod tunnel_guest;
mod tunnel_guest_ha;
mod tunnel_guest_ranges;
mod two_operators;

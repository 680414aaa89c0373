//! skyport: a Kubernetes operator for cloud resources that live outside the cluster.
//!
//! The binary (`src/main.rs`) only parses flags and wires these modules together; tests and
//! benchmarks drive the same controllers in-process.

pub mod admission;
pub mod clouds;
pub mod config;
pub mod controllers;
pub mod crd;
pub mod error;
pub mod http;
pub mod leader;
pub mod mac;
pub mod metrics;
pub mod reasons;
pub mod shards;
pub mod telemetry;
pub mod tunnel;

pub use error::{Error, Result};

/// `skyport::hosts` is another name for [`clouds`], used by the integration tests.
pub use clouds as hosts;

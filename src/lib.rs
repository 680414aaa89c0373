//! skyport: a Kubernetes operator for cloud resources that live outside the cluster.
//!
//! The binary (`src/main.rs`) only parses flags and wires these modules together; tests and
//! benchmarks drive the same controllers in-process.

pub mod clouds;
pub mod config;
pub mod controllers;
pub mod crd;
pub mod error;
pub mod http;
pub mod leader;
pub mod metrics;
pub mod telemetry;
pub mod tunnel;

pub use error::{Error, Result};

/// The module's former name, kept so that existing callers (the integration tests) still build.
pub use clouds as hosts;

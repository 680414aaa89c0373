//! Cloud provider adapters for skyport.
//!
//! The operator talks to clouds only through the traits defined here, so that controllers can be
//! exercised against any backend that keeps the same contract, and every adapter shares one way
//! of rate limiting and of classifying errors.

pub mod error;
pub mod limiter;
pub mod sqs;

pub use error::{ErrorClass, QueueError};
pub use limiter::{CallCounters, Limiter};
pub use sqs::{QueueBackend, SqsProvider, SqsSettings};

//! Cloud provider adapters for skyport.
//!
//! The operator talks to clouds only through the traits defined here, so that controllers can be
//! exercised against any backend that keeps the same contract, and every adapter shares one way
//! of rate limiting and of classifying errors.

pub mod addresses;
pub mod aws;
pub mod cidr;
pub mod digitalocean;
pub mod ec2;
pub mod error;
pub mod exit;
pub mod guest;
pub mod hetzner;
mod host_files;
pub mod hosts;
pub mod limiter;
pub mod local;
mod reservations;
pub mod rest;
pub mod sqs;

pub use digitalocean::{DigitalOceanProvider, DigitalOceanSettings};
pub use ec2::{Ec2Provider, Ec2Settings};
pub use error::{ErrorClass, HostError, QueueError};
pub use exit::userdata::{
    Artifact, ClientService, ExitServer, NoiseKeypair, Protocol, ProxyProtocol, TunnelClient, TunnelService,
    render_client_toml, render_cloud_config,
};
pub use hetzner::{HetznerProvider, HetznerSettings};
pub use hosts::{
    Address, AddressBinding, AddressRequest, Capabilities, Host, HostProvider, HostRequest, HostState, MovedAddress,
    Spread, TagSyntax, owner_tags,
};
pub use limiter::{CallCounters, Limiter};
pub use rest::{ApiToken, Budget, RestSettings};
pub use sqs::{AssumeRole, QueueBackend, SqsProvider, SqsSettings};

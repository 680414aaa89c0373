//! The moved Elastic IP of a highly available Tunnel, on a secondary private IPv4 of each server.
//!
//! An Elastic IP is associated with one private IPv4 of a network interface (AssociateAddress
//! `PrivateIpAddress`: "If no private IP address is specified, the Elastic IP address is
//! associated with the primary private IP address"), and the instance's auto-assigned public
//! IPv4, which the server's own tunnel client dials, is the association of its primary private
//! IPv4. AWS's Elastic IP rules say that associating one "with an instance or its primary network
//! interface" releases that public IPv4; its public IPv4 rules add that an instance whose public
//! IPv4 is released "while it has a secondary private IP address that is associated with an
//! Elastic IP address" gets no new one, i.e. an Elastic IP on a secondary private IPv4 and the
//! public IPv4 coexist. That reading is this module's premise; it was not checked on AWS itself
//! (LocalStack keeps one public IPv4 per interface, see docs/tested-against.md). So each server of a pair
//! (a request tagged [`TAG_MOVED_ADDRESS`]) gets one secondary private IPv4 on its primary interface
//! right after launch (AssignPrivateIpAddresses, `SecondaryPrivateIpAddressCount` 1), and
//! [`Ec2Provider::associate_address`] associates the Elastic IP with that address (`InstanceId` +
//! `PrivateIpAddress`, `AllowReassociation`): moving it onto the standby leaves each instance its
//! own public IPv4.
//! The server's OS puts the secondary address on its interface at boot, read from the instance
//! metadata ([`crate::exit::userdata::InterfaceAddresses::Ec2Secondary`]).
//!
//! Why after launch rather than in RunInstances' `NetworkInterfaces` (`SecondaryPrivateIpAddressCount`
//! there does the same in one call on AWS): that form moves the subnet and security groups into
//! the interface specification and changes how the public IPv4 is decided, for every launch; and
//! LocalStack accepts the count there but assigns nothing, so only the separate call is exercised
//! by the tests. EC2 assigns the address within the call, long before the instance boots.
//!
//! A pair's server found without a secondary address (its assignment failed and the instance
//! could not be terminated either) gets one when the Elastic IP is first moved onto it.

use aws_sdk_ec2::operation::associate_address::builders::AssociateAddressFluentBuilder;
use aws_sdk_ec2::types::Instance;
use tracing::warn;

use super::{Ec2Provider, Regional, map_err, unavailable};
use crate::error::HostError;
use crate::hosts::TAG_MOVED_ADDRESS;

/// Whether `instance` is a server of a highly available Tunnel's pair that takes the moved
/// address (not one of a pair that publishes both servers' own addresses).
pub(super) fn in_pair(instance: &Instance) -> bool {
    instance.tags().iter().any(|t| t.key() == Some(TAG_MOVED_ADDRESS))
}

/// The primary network interface of `instance` (device index 0, or its only one).
pub(super) fn primary_interface(instance: &Instance) -> Option<&aws_sdk_ec2::types::InstanceNetworkInterface> {
    let interfaces = instance.network_interfaces();
    interfaces
        .iter()
        .find(|n| n.attachment().and_then(|a| a.device_index()) == Some(0))
        .or_else(|| if interfaces.len() == 1 { interfaces.first() } else { None })
}

/// The first secondary private IPv4 of the instance's primary interface.
pub(super) fn secondary_ip(instance: &Instance) -> Option<String> {
    let interface = primary_interface(instance)?;
    let primary = interface.private_ip_address();
    interface
        .private_ip_addresses()
        .iter()
        .filter(|p| p.primary() != Some(true))
        .filter_map(|p| p.private_ip_address())
        .find(|ip| Some(*ip) != primary)
        .map(str::to_string)
}

/// The AssociateAddress request moving allocation `allocation` onto `instance_id`: onto its
/// private IPv4 `private_ip` where given (a pair's server), else onto its primary one (which
/// then replaces the instance's own public IPv4: a single exit server has no other to keep).
pub(super) fn associate(
    builder: AssociateAddressFluentBuilder,
    allocation: &str,
    instance_id: &str,
    private_ip: Option<String>,
) -> AssociateAddressFluentBuilder {
    builder
        .allocation_id(allocation)
        .instance_id(instance_id)
        .set_private_ip_address(private_ip)
        .allow_reassociation(true)
}

impl Ec2Provider {
    /// Gives instance `instance_id`'s interface `interface` one secondary private IPv4.
    pub(super) async fn assign_secondary(
        &self,
        r: &Regional,
        instance_id: &str,
        interface: &str,
    ) -> Result<(), HostError> {
        self.call(r, "AssignPrivateIpAddresses", async {
            r.client
                .assign_private_ip_addresses()
                .network_interface_id(interface)
                .secondary_private_ip_address_count(1)
                .send()
                .await
                .map_err(map_err)
        })
        .await
        .map(|_| ())
        .map_err(|e| {
            warn!(instance = %instance_id, error = %e, "could not give the exit server its secondary private address");
            e
        })
    }

    /// Where on instance `instance_id` the pair's Elastic IP goes: `None` (its primary private
    /// IPv4) unless it is a server of a pair, whose secondary private IPv4 is given (one assigned
    /// now if it has none).
    pub(super) async fn association_ip(&self, r: &Regional, instance_id: &str) -> Result<Option<String>, HostError> {
        let gone = || HostError::NotFound { provider: super::PROVIDER, message: format!("instance {instance_id}") };
        let instance = self.describe(r, instance_id).await?.ok_or_else(gone)?;
        if !in_pair(&instance) {
            return Ok(None);
        }
        if let Some(ip) = secondary_ip(&instance) {
            return Ok(Some(ip));
        }
        let interface = primary_interface(&instance)
            .and_then(|n| n.network_interface_id())
            .ok_or_else(|| unavailable(&format!("instance {instance_id} has no network interface yet")))?
            .to_string();
        warn!(instance = %instance_id, "exit server of a pair without a secondary private address; assigning one");
        self.assign_secondary(r, instance_id, &interface).await?;
        let instance = self.describe(r, instance_id).await?.ok_or_else(gone)?;
        secondary_ip(&instance)
            .map(Some)
            .ok_or_else(|| unavailable(&format!("instance {instance_id} shows no secondary private address yet")))
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_ec2::types::{
        InstanceNetworkInterface, InstanceNetworkInterfaceAttachment, InstancePrivateIpAddress, Tag,
    };

    use super::*;

    fn interface(device: i32, id: &str, ips: &[(&str, bool)]) -> InstanceNetworkInterface {
        let primary = ips.iter().find(|(_, p)| *p).map(|(ip, _)| ip.to_string());
        InstanceNetworkInterface::builder()
            .attachment(InstanceNetworkInterfaceAttachment::builder().device_index(device).build())
            .network_interface_id(id)
            .set_private_ip_address(primary)
            .set_private_ip_addresses(Some(
                ips.iter()
                    .map(|(ip, p)| InstancePrivateIpAddress::builder().private_ip_address(*ip).primary(*p).build())
                    .collect(),
            ))
            .build()
    }

    fn instance(slot: bool, interfaces: Vec<InstanceNetworkInterface>) -> Instance {
        let tag = |k: &str| Tag::builder().key(k).value("a").build();
        let tags = if slot { vec![tag("Name"), tag(TAG_MOVED_ADDRESS)] } else { vec![tag("Name")] };
        Instance::builder().instance_id("i-1").set_tags(Some(tags)).set_network_interfaces(Some(interfaces)).build()
    }

    #[test]
    fn a_pairs_server_is_known_by_its_tag_and_takes_the_address_on_its_secondary_ip() {
        let eth0 = interface(0, "eni-0", &[("172.31.5.10", true), ("172.31.5.77", false)]);
        let eth1 = interface(1, "eni-1", &[("172.31.9.1", true), ("172.31.9.2", false)]);
        let both = instance(true, vec![eth1, eth0.clone()]);
        assert!(in_pair(&both) && !in_pair(&instance(false, vec![eth0.clone()])));
        assert_eq!(primary_interface(&both).and_then(|n| n.network_interface_id()), Some("eni-0"));
        assert_eq!(secondary_ip(&both).as_deref(), Some("172.31.5.77"), "of the primary interface only");
        let bare = instance(true, vec![interface(0, "eni-0", &[("172.31.5.10", true)])]);
        assert_eq!(secondary_ip(&bare), None);
        assert_eq!(secondary_ip(&instance(true, vec![])), None);
    }

    #[test]
    fn the_association_names_the_secondary_ip_and_moves_the_address_from_wherever_it_is() {
        let config = aws_sdk_ec2::Config::builder()
            .behavior_version(aws_sdk_ec2::config::BehaviorVersion::latest())
            .region(aws_config::Region::new("eu-west-1"))
            .build();
        let client = aws_sdk_ec2::Client::from_conf(config);
        let pair = associate(client.associate_address(), "eipalloc-1", "i-1", Some("172.31.5.77".into()));
        let input = pair.as_input();
        assert_eq!(input.get_allocation_id().as_deref(), Some("eipalloc-1"));
        assert_eq!(input.get_instance_id().as_deref(), Some("i-1"));
        assert_eq!(input.get_private_ip_address().as_deref(), Some("172.31.5.77"));
        assert_eq!(input.get_allow_reassociation(), &Some(true));
        assert_eq!(input.get_network_interface_id(), &None, "the instance id or the interface, never both");
        let single = associate(client.associate_address(), "eipalloc-1", "i-1", None);
        assert_eq!(single.as_input().get_private_ip_address(), &None, "a single server: its primary address");
    }
}

//! Where an instance and its security group go: the configured subnet (`--ec2-subnet-id`) and the
//! VPC that subnet belongs to, or the region's default VPC.
//!
//! A security group belongs to one VPC and RunInstances refuses a group of another VPC than the
//! subnet's, so the group's VPC is derived from the subnet (DescribeSubnets) rather than
//! configured twice. Without a subnet both go to the default VPC; an account created after
//! 2013-12 in a region where someone deleted it, or an organisation that never creates one, has
//! none, and AWS answers `VPCIdNotSpecified` only at launch. The region's default VPC is looked up
//! first (DescribeVpcs `isDefault=true`) so the Tunnel says what to configure before anything is
//! made. A region's answer is kept for the provider's life: subnets do not move between VPCs.

use aws_sdk_ec2::types::Filter;

use super::{Ec2Provider, PROVIDER, Regional, map_err};
use crate::error::HostError;

/// What to do when a region has no default VPC; also appended to AWS's own `VPCIdNotSpecified`.
pub const NO_DEFAULT_VPC_FIX: &str = "set --ec2-subnet-id (Helm value tunnel.ec2SubnetId) to a public subnet of the \
     operator's default region (one with a route to an internet gateway and public IPv4 on launch); Tunnels \
     naming another region need a default VPC there";

/// The subnet to launch in and the VPC to make the security group in; `None` means the region's
/// default (which exists).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct Network {
    pub subnet: Option<String>,
    pub vpc: Option<String>,
}

impl Ec2Provider {
    /// The network of region `r`, looked up once per region.
    pub(super) async fn network(&self, r: &Regional) -> Result<Network, HostError> {
        r.network.get_or_try_init(|| self.look_up_network(r)).await.cloned()
    }

    async fn look_up_network(&self, r: &Regional) -> Result<Network, HostError> {
        let region = r.name.clone().or_else(|| self.default_region.clone()).unwrap_or_else(|| "(default)".into());
        if let Some(subnet) = self.settings.subnet_id.as_deref().filter(|_| r.name.is_none()) {
            let out = self
                .call(r, "DescribeSubnets", async {
                    r.client.describe_subnets().subnet_ids(subnet).send().await.map_err(map_err)
                })
                .await
                .map_err(|e| match e {
                    HostError::Invalid { .. } | HostError::NotFound { .. } => HostError::Invalid {
                        provider: PROVIDER,
                        message: format!("subnet {subnet} (--ec2-subnet-id) is not in region {region}: {e}"),
                    },
                    e => e,
                })?;
            return vpc_of(subnet, out.subnets().first().and_then(|s| s.vpc_id()), &region);
        }
        let out = self
            .call(r, "DescribeVpcs", async {
                r.client
                    .describe_vpcs()
                    .filters(Filter::builder().name("isDefault").values("true").build())
                    .send()
                    .await
                    .map_err(map_err)
            })
            .await?;
        default_network(out.vpcs().iter().filter_map(|v| v.vpc_id()).next(), &region)
    }
}

/// The network for a configured subnet, from DescribeSubnets' answer.
fn vpc_of(subnet: &str, vpc: Option<&str>, region: &str) -> Result<Network, HostError> {
    match vpc {
        Some(vpc) => Ok(Network { subnet: Some(subnet.to_string()), vpc: Some(vpc.to_string()) }),
        None => Err(HostError::Invalid {
            provider: PROVIDER,
            message: format!("subnet {subnet} (--ec2-subnet-id) is not in region {region}"),
        }),
    }
}

/// The default network, or why there is none.
fn default_network(default_vpc: Option<&str>, region: &str) -> Result<Network, HostError> {
    match default_vpc {
        Some(_) => Ok(Network::default()),
        None => Err(HostError::NoDefaultVpc {
            provider: PROVIDER,
            message: format!("region {region} has no default VPC and no subnet is configured; {NO_DEFAULT_VPC_FIX}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subnet_takes_its_vpc_and_no_default_vpc_says_what_to_set() {
        let net = vpc_of("subnet-1", Some("vpc-9"), "eu-west-1").unwrap();
        assert_eq!(net, Network { subnet: Some("subnet-1".into()), vpc: Some("vpc-9".into()) });
        assert!(matches!(vpc_of("subnet-1", None, "eu-west-1"), Err(HostError::Invalid { .. })));
        assert_eq!(default_network(Some("vpc-d"), "eu-west-1").unwrap(), Network::default());
        let e = default_network(None, "eu-west-1").unwrap_err();
        assert!(matches!(e, HostError::NoDefaultVpc { .. }));
        let text = e.to_string();
        assert!(text.contains("eu-west-1 has no default VPC") && text.contains("--ec2-subnet-id"), "{text}");
        let aws = super::super::error_from_code("VPCIdNotSpecified", "No default VPC for this user".into());
        assert!(matches!(&aws, HostError::NoDefaultVpc { message, .. } if message.contains("tunnel.ec2SubnetId")));
    }
}

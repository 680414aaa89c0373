//! Where an instance and its security group go: the configured subnets (`--ec2-subnet-ids`) and
//! the VPC they belong to, or the region's default VPC.
//!
//! A security group belongs to one VPC and RunInstances refuses a group of another VPC than the
//! subnet's, so the group's VPC is derived from the subnets (DescribeSubnets) rather than
//! configured twice, and subnets of two VPCs are refused. Several subnets are there to place a
//! highly available Tunnel's two instances in different availability zones (its slot picks the
//! subnet), so two subnets of one zone are refused too: they would look spread and not be.
//!
//! Without a subnet both go to the default VPC; an account created after 2013-12 in a region
//! where someone deleted it, or an organisation that never creates one, has none, and AWS answers
//! `VPCIdNotSpecified` only at launch. The region's default VPC is looked up first (DescribeVpcs
//! `isDefault=true`) so the Tunnel says what to configure before anything is made. A region's
//! answer is kept for the provider's life: subnets do not move between VPCs or zones.

use aws_sdk_ec2::types::Filter;

use super::{Ec2Provider, PROVIDER, Regional, map_err};
use crate::error::HostError;

/// What to do when a region has no default VPC; also appended to AWS's own `VPCIdNotSpecified`.
pub const NO_DEFAULT_VPC_FIX: &str = "set --ec2-subnet-ids (Helm value tunnel.ec2SubnetIds) to public subnets of the \
     operator's default region (with a route to an internet gateway and public IPv4 on launch); Tunnels \
     naming another region need a default VPC there";

/// The subnets to launch in (empty: the region's default) and the VPC to make the security group
/// in (`None`: the default VPC, which exists).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct Network {
    pub subnets: Vec<String>,
    pub vpc: Option<String>,
}

impl Network {
    /// The subnet of failure domain `domain` (a pair's slot; a single server takes the first).
    pub fn subnet_for(&self, domain: Option<usize>) -> Option<String> {
        let n = self.subnets.len().max(1);
        self.subnets.get(domain.unwrap_or(0) % n).cloned()
    }
}

/// A subnet as DescribeSubnets answers it: id, VPC, availability zone.
type Described = (String, Option<String>, Option<String>);

impl Ec2Provider {
    /// The network of region `r`, looked up once per region.
    pub(super) async fn network(&self, r: &Regional) -> Result<Network, HostError> {
        r.network.get_or_try_init(|| self.look_up_network(r)).await.cloned()
    }

    async fn look_up_network(&self, r: &Regional) -> Result<Network, HostError> {
        let region = r.name.clone().or_else(|| self.default_region.clone()).unwrap_or_else(|| "(default)".into());
        let configured = &self.settings.subnet_ids;
        if !configured.is_empty() && r.name.is_none() {
            let out = self
                .call(r, "DescribeSubnets", async {
                    r.client.describe_subnets().set_subnet_ids(Some(configured.clone())).send().await.map_err(map_err)
                })
                .await
                .map_err(|e| match e {
                    HostError::Invalid { .. } | HostError::NotFound { .. } => HostError::Invalid {
                        provider: PROVIDER,
                        message: format!(
                            "subnets {} (--ec2-subnet-ids) are not all in region {region}: {e}",
                            configured.join(", ")
                        ),
                    },
                    e => e,
                })?;
            let described: Vec<Described> = out
                .subnets()
                .iter()
                .filter_map(|s| {
                    let id = s.subnet_id()?.to_string();
                    Some((id, s.vpc_id().map(str::to_string), s.availability_zone().map(str::to_string)))
                })
                .collect();
            return network_of(configured, &described, &region);
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

/// The network of the configured subnets, from DescribeSubnets' answer: one VPC, one zone each.
fn network_of(configured: &[String], described: &[Described], region: &str) -> Result<Network, HostError> {
    let invalid = |message: String| HostError::Invalid { provider: PROVIDER, message };
    let mut seen: Vec<(&str, &str, &str)> = Vec::new();
    for subnet in configured {
        let Some((_, Some(vpc), zone)) = described.iter().find(|(id, _, _)| id == subnet) else {
            return Err(invalid(format!("subnet {subnet} (--ec2-subnet-ids) is not in region {region}")));
        };
        let zone = zone.as_deref().unwrap_or_default();
        if let Some((other, other_vpc, _)) = seen.iter().find(|(_, v, _)| v != vpc) {
            return Err(invalid(format!(
                "subnets {other} ({other_vpc}) and {subnet} ({vpc}) (--ec2-subnet-ids) are in different VPCs: an exit \
                 server's security group belongs to one VPC, so give subnets of one VPC"
            )));
        }
        if let Some((other, _, _)) = seen.iter().find(|(_, _, z)| !zone.is_empty() && *z == zone) {
            return Err(invalid(format!(
                "subnets {other} and {subnet} (--ec2-subnet-ids) are both in availability zone {zone}: a highly \
                 available Tunnel's two exit servers take different subnets to run in different zones, so give one \
                 subnet per zone"
            )));
        }
        seen.push((subnet, vpc, zone));
    }
    let vpc = seen.first().map(|(_, vpc, _)| vpc.to_string());
    Ok(Network { subnets: configured.to_vec(), vpc })
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

    fn subnet(id: &str, vpc: Option<&str>, zone: &str) -> Described {
        (id.into(), vpc.map(str::to_string), Some(zone.into()))
    }

    #[test]
    fn subnets_take_their_vpc_and_no_default_vpc_says_what_to_set() {
        let two = ["subnet-1".to_string(), "subnet-2".to_string()];
        let described =
            [subnet("subnet-2", Some("vpc-9"), "eu-west-1b"), subnet("subnet-1", Some("vpc-9"), "eu-west-1a")];
        let net = network_of(&two, &described, "eu-west-1").unwrap();
        assert_eq!(net, Network { subnets: two.to_vec(), vpc: Some("vpc-9".into()) });
        assert_eq!(net.subnet_for(None).as_deref(), Some("subnet-1"), "a single server takes the first");
        assert_eq!(net.subnet_for(Some(1)).as_deref(), Some("subnet-2"));
        assert_eq!(Network::default().subnet_for(Some(1)), None, "the default VPC's subnet");
        let e = network_of(&two[..1], &[subnet("subnet-1", None, "eu-west-1a")], "eu-west-1").unwrap_err();
        assert!(e.to_string().contains("subnet-1 (--ec2-subnet-ids) is not in region eu-west-1"), "{e}");
        assert_eq!(default_network(Some("vpc-d"), "eu-west-1").unwrap(), Network::default());
        let e = default_network(None, "eu-west-1").unwrap_err();
        assert!(matches!(e, HostError::NoDefaultVpc { .. }));
        let text = e.to_string();
        assert!(text.contains("eu-west-1 has no default VPC") && text.contains("--ec2-subnet-ids"), "{text}");
        let aws = super::super::error_from_code("VPCIdNotSpecified", "No default VPC for this user".into());
        assert!(matches!(&aws, HostError::NoDefaultVpc { message, .. } if message.contains("tunnel.ec2SubnetIds")));
    }

    #[test]
    fn subnets_of_two_vpcs_or_sharing_a_zone_are_refused_with_what_to_give() {
        let two = ["subnet-1".to_string(), "subnet-2".to_string()];
        let vpcs = [subnet("subnet-1", Some("vpc-9"), "eu-west-1a"), subnet("subnet-2", Some("vpc-8"), "eu-west-1b")];
        let e = network_of(&two, &vpcs, "eu-west-1").unwrap_err().to_string();
        assert!(e.contains("different VPCs") && e.contains("vpc-8") && e.contains("vpc-9"), "{e}");
        let zone = [subnet("subnet-1", Some("vpc-9"), "eu-west-1a"), subnet("subnet-2", Some("vpc-9"), "eu-west-1a")];
        let e = network_of(&two, &zone, "eu-west-1").unwrap_err().to_string();
        assert!(e.contains("both in availability zone eu-west-1a") && e.contains("one subnet per zone"), "{e}");
    }
}

//! A highly available Tunnel on EC2 (LocalStack) through the operator, for the EC2 failover tests
//! and the EC2 arm of the failover benchmark: Service `web` asking for a reserved address and two
//! exit servers at provider `ec2`.
//!
//! LocalStack boots no VM, so no exit server could answer the operator's end-to-end check.
//! [`StandIn`] stands in for the exit servers: a check of an instance's own public IPv4 passes
//! while the test says that instance's server answers, and nothing answers anywhere else (not at
//! the Elastic IP). Everything else is real: the EC2 calls (RunInstances, AssignPrivateIpAddresses,
//! AllocateAddress, AssociateAddress, TerminateInstances, ReleaseAddress) against LocalStack, the
//! tags, the operator's decisions with its default hysteresis, its status, Events and the
//! Service's ingress; the operator's EC2 requests pass through [`asked::Asked`] on their way, to
//! read what LocalStack ignores. No bytes flow: nothing here measures or proves the data path.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, PostParams};
use providers::HostProvider;
use providers::ec2::Ec2Provider;
use skyport::controllers::tunnel::observe::Probe;
use skyport::crd::Tunnel;
use skyport::crd::tunnel::HighAvailabilityStatus;

use crate::common::tunnels::{self, TunnelOperator, fast_tunnel_settings, finish_tunnels, service};
use crate::common::{TestNs, eventually};

#[path = "asked.rs"]
pub mod asked;

/// The exit servers' side of the end-to-end check, as the test says it is (see the module).
#[derive(Default)]
pub struct StandIn {
    answering: Mutex<BTreeSet<String>>,
    checked: Mutex<Vec<String>>,
}

impl StandIn {
    /// The exit server whose own public IPv4 is `ip` answers (`true`) or not.
    pub fn answer(&self, ip: &str, answers: bool) {
        let mut answering = self.answering.lock().unwrap();
        if answers {
            answering.insert(ip.to_string())
        } else {
            answering.remove(ip)
        };
    }

    /// Every address checked, in order.
    pub fn checked(&self) -> Vec<String> {
        self.checked.lock().unwrap().clone()
    }
}

#[async_trait::async_trait]
impl Probe for StandIn {
    async fn check(&self, host_ip: &str, port: u16, token: &str, _timeout: Duration) -> Result<(), String> {
        assert!(!token.is_empty(), "the operator checks with the tunnel's token");
        self.checked.lock().unwrap().push(host_ip.to_string());
        match self.answering.lock().unwrap().contains(host_ip) {
            true => Ok(()),
            false => Err(format!("no answer from {host_ip}:{port} (the stand-in exit server is down)")),
        }
    }

    async fn reachable(&self, host_ip: &str, _port: u16) -> bool {
        self.answering.lock().unwrap().contains(host_ip)
    }

    /// The stand-in servers never refused their binary.
    async fn install_report(&self, _host_ip: &str, _port: u16) -> Option<String> {
        None
    }
}

/// Service `web` (TCP 8080) asking for a highly available Tunnel on EC2 with a reserved address.
pub fn web() -> Service {
    let annotations = serde_json::json!({
        "skyport.dev/provider": "ec2",
        "skyport.dev/address": "reserved",
        "skyport.dev/high-availability": "true",
    });
    let ports = serde_json::json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    service("web", Some("skyport.dev/tunnel"), annotations, ports)
}

pub fn ha(t: &Tunnel) -> HighAvailabilityStatus {
    t.status.as_ref().and_then(|s| s.high_availability.clone()).expect("status.highAvailability")
}

/// The pair, Active: the Elastic IP on one instance, both instances' stand-ins answering.
pub struct Ec2Pair {
    pub ns: TestNs,
    pub op: TunnelOperator,
    pub ec2: Arc<Ec2Provider>,
    /// The operator's (and the test's) EC2 requests.
    pub asked: asked::Asked,
    pub stand_in: Arc<StandIn>,
    pub services: Api<Service>,
    pub tunnels: Api<Tunnel>,
    /// The Elastic IP's allocation id and address.
    pub allocation: String,
    pub ip: String,
    /// The instance holding it, and the other.
    pub active: String,
    pub standby: String,
}

impl Ec2Pair {
    pub async fn start(prefix: &str) -> Self {
        Self::start_with(prefix, fast_tunnel_settings()).await
    }

    /// [`Ec2Pair::start`] with the operator's Tunnel settings `settings`.
    pub async fn start_with(prefix: &str, tunnel_settings: skyport::config::TunnelArgs) -> Self {
        let ns = TestNs::new(prefix).await;
        let asked = asked::Asked::start().await;
        let mut settings = providers::Ec2Settings::new("ami-0123456789abcdef0");
        settings.endpoint_url = Some(asked.url.clone());
        let ec2 = Arc::new(Ec2Provider::from_env(settings).await.expect("EC2 provider"));
        let stand_in = Arc::new(StandIn::default());
        let op = TunnelOperator::start_with_probe(&ns, tunnel_settings, vec![ec2.clone()], stand_in.clone()).await;
        let (services, tunnels): (Api<Service>, Api<Tunnel>) = (ns.api(), ns.api());
        services.create(&PostParams::default(), &web()).await.unwrap();
        let pair = Ec2Pair {
            ns,
            op,
            ec2,
            asked,
            stand_in,
            services,
            tunnels,
            allocation: String::new(),
            ip: String::new(),
            active: String::new(),
            standby: String::new(),
        };
        let own = pair.own_addresses(&[]).await;
        for ip in own.values() {
            pair.stand_in.answer(ip, true);
        }
        let t = eventually("the Elastic IP on one instance, the Tunnel Active", Duration::from_secs(60), || async {
            let t = pair.tunnels.get("web-tunnel").await.ok()?;
            let active = t.status.as_ref()?.phase == Some(skyport::crd::TunnelPhase::Active);
            (active && ha(&t).active.is_some()).then_some(t)
        })
        .await;
        let status = t.status.clone().unwrap();
        let active = ha(&t).active.unwrap();
        let standby = own.keys().find(|id| **id != active).expect("two instances").clone();
        let (allocation, ip) = (status.address_id.unwrap(), status.host_ip.unwrap());
        Ec2Pair { allocation, ip, active, standby, ..pair }
    }

    pub async fn tunnel(&self) -> Tunnel {
        self.tunnels.get("web-tunnel").await.unwrap()
    }

    /// Each server's own public IPv4 by instance id, once both servers have one in status and
    /// neither is one of `gone`.
    pub async fn own_addresses(&self, gone: &[&str]) -> std::collections::BTreeMap<String, String> {
        eventually("both servers with their own address", Duration::from_secs(60), || async {
            let t = self.tunnels.get("web-tunnel").await.ok()?;
            let servers = t.status.as_ref()?.high_availability.as_ref()?.servers.clone();
            let own: std::collections::BTreeMap<_, _> =
                servers.into_iter().filter_map(|s| Some((s.host_id?, s.host_ip?))).collect();
            (own.len() == 2 && own.keys().all(|id| !gone.contains(&id.as_str()))).then_some(own)
        })
        .await
    }

    /// (instance, private IPv4) the Elastic IP is associated with, as DescribeAddresses says.
    pub async fn associated(&self) -> (Option<String>, Option<String>) {
        let out = self.ec2.client().describe_addresses().allocation_ids(&self.allocation).send().await.unwrap();
        let a = &out.addresses()[0];
        let some = |s: Option<&str>| s.filter(|s| !s.is_empty()).map(str::to_string);
        (some(a.instance_id()), some(a.private_ip_address()))
    }

    /// (instance, private IPv4) of each AssociateAddress the operator sent, in order.
    pub fn associations(&self) -> Vec<(String, String)> {
        let asked = self.asked.of("AssociateAddress", &["InstanceId", "PrivateIpAddress", "AllowReassociation"]);
        let each = asked.into_iter().map(|a| {
            assert_eq!(a[2].as_deref(), Some("true"), "moved from wherever it is");
            (a[0].clone().unwrap_or_default(), a[1].clone().unwrap_or_default())
        });
        each.collect()
    }

    /// How long after `since` DescribeAddresses first showed the Elastic IP on an instance other
    /// than `from`, polled every 50 ms; and that instance.
    pub async fn moved_off(&self, from: &str, since: Instant) -> (Duration, String) {
        let deadline = Duration::from_secs(60);
        loop {
            if let (Some(instance), _) = self.associated().await
                && instance != from
            {
                return (since.elapsed(), instance);
            }
            assert!(since.elapsed() < deadline, "the Elastic IP is still on {from} after {deadline:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The secondary private IPv4s of instance `id`'s interface.
    pub async fn secondary_ips(&self, id: &str) -> Vec<String> {
        let out = self.ec2.client().describe_instances().instance_ids(id).send().await.unwrap();
        let instance = &out.reservations()[0].instances()[0];
        let [eth0] = instance.network_interfaces() else { panic!("one interface: {instance:?}") };
        let secondary = eth0.private_ip_addresses().iter().filter(|a| a.primary() == Some(false));
        secondary.filter_map(|a| a.private_ip_address()).map(str::to_string).collect()
    }

    /// Terminates instance `id` behind the operator's back, as when AWS loses it: its exit
    /// server stops answering with it.
    pub async fn terminate(&self, id: &str) {
        let own = self.own_addresses(&[]).await;
        self.ec2.client().terminate_instances().instance_ids(id).send().await.unwrap();
        self.stand_in.answer(&own[id], false);
    }

    /// Deletes the Service and checks nothing is left at LocalStack: every instance the Tunnel
    /// ever had terminated, its Elastic IP released.
    pub async fn finish(self, instances: &[String]) {
        self.services.delete("web", &Default::default()).await.unwrap();
        tunnels::gone(&self.tunnels, "web-tunnel").await;
        for id in instances {
            assert_eq!(self.ec2.get(id).await.unwrap(), None, "instance {id} terminated");
        }
        assert_eq!(self.ec2.get_address(&self.allocation).await.unwrap(), None, "the Elastic IP is released");
        finish_tunnels(self.op, self.ns).await;
    }
}

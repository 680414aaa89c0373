use super::*;
use crate::error::ErrorClass;

#[test]
fn ec2_error_codes_map_to_the_shared_classes() {
    let class = |code: &str| error_from_code(code, "m".into());
    assert!(matches!(class("RequestLimitExceeded"), HostError::RateLimited { .. }));
    assert!(matches!(class("UnauthorizedOperation"), HostError::Unauthorized { .. }));
    assert!(matches!(class("AuthFailure"), HostError::Unauthorized { .. }));
    assert!(matches!(class("InvalidInstanceID.NotFound"), HostError::NotFound { .. }));
    assert!(matches!(class("InvalidGroup.NotFound"), HostError::NotFound { .. }));
    assert!(matches!(class("InvalidGroup.Duplicate"), HostError::AlreadyExists { .. }));
    assert!(matches!(class("InvalidAMIID.Malformed"), HostError::Invalid { .. }));
    assert!(matches!(class("InvalidParameterValue"), HostError::Invalid { .. }));
    assert!(matches!(class("InstanceLimitExceeded"), HostError::Quota { .. }));
    assert!(matches!(class("VcpuLimitExceeded"), HostError::Quota { .. }));
    assert!(matches!(class("DependencyViolation"), HostError::Unavailable { .. }));
    assert!(matches!(class("InsufficientInstanceCapacity"), HostError::Unavailable { .. }));
    assert!(matches!(class("SomethingNew"), HostError::Unavailable { .. }));
    assert_eq!(class("InvalidAMIID.NotFound").class(), ErrorClass::Permanent);
    assert_eq!(class("DependencyViolation").class(), ErrorClass::Transient);
    assert_eq!(
        error_from_code("InvalidAMIID.Malformed", "Invalid id: \"ami-x\"".into()).to_string(),
        "ec2 rejected the request: InvalidAMIID.Malformed: Invalid id: \"ami-x\""
    );
}

fn request() -> HostRequest {
    use crate::exit::userdata::{ExitServer, TunnelService};
    let service = |port, protocol| TunnelService {
        name: format!("s{port}"),
        protocol,
        port,
        token: "t".into(),
        source_ranges: Vec::new(),
        proxy_protocol: None,
        bind: None,
    };
    HostRequest {
        name: "skyport-team-a-web".into(),
        region: None,
        size: None,
        user_data: "secret".into(),
        server: ExitServer {
            control_port: 2333,
            noise_private_key: "k".into(),
            services: vec![service(80, Protocol::Tcp), service(53, Protocol::Udp)],
        },
        tags: crate::hosts::owner_tags("uid", "team-a", "web"),
        address: None,
        failure_domain: None,
    }
}

/// (protocol, port, sources) of each rule [`ingress`] makes.
fn rules(request: &HostRequest) -> Vec<(String, i32, Vec<String>)> {
    ingress(request)
        .iter()
        .map(|r| {
            assert_eq!(r.from_port(), r.to_port(), "single ports");
            let v4 = r.ip_ranges().iter().filter_map(|c| c.cidr_ip());
            let sources = v4.chain(r.ipv6_ranges().iter().filter_map(|c| c.cidr_ipv6())).map(str::to_string).collect();
            (r.ip_protocol().unwrap_or_default().to_string(), r.from_port().unwrap_or_default(), sources)
        })
        .collect()
}

#[test]
fn ingress_opens_the_control_and_push_ports_over_tcp_and_each_service_with_its_protocol() {
    let rule = |p: &str, port, cidr: &str| (p.to_string(), port, vec![cidr.to_string()]);
    let anywhere = "0.0.0.0/0";
    assert_eq!(
        rules(&request()),
        [
            rule("tcp", 80, anywhere),
            rule("tcp", 2333, anywhere),
            rule("tcp", 2335, anywhere),
            rule("udp", 53, anywhere)
        ]
    );
}

#[test]
fn source_ranges_narrow_only_their_service_port_canonically_and_v6_goes_to_v6_ranges() {
    let rule = |p: &str, port, cidr: &str| (p.to_string(), port, vec![cidr.to_string()]);
    let mut request = request();
    request.server.services[0].source_ranges = vec!["203.0.113.9/24".into(), "2001:DB8::1/32".into()];
    assert_eq!(
        rules(&request),
        [
            rule("tcp", 80, "2001:db8::/32"),
            rule("tcp", 80, "203.0.113.0/24"),
            rule("tcp", 2333, "0.0.0.0/0"),
            rule("tcp", 2335, "0.0.0.0/0"),
            rule("udp", 53, "0.0.0.0/0"),
        ],
        "port 80 from its ranges only; the control, push and the other service port unchanged"
    );
}

#[test]
fn groups_are_named_after_the_host_and_never_collide() {
    let a = group_name("skyport-team-a-web");
    assert!(a.starts_with("skyport-team-a-web-") && a.len() == "skyport-team-a-web-".len() + 8, "{a}");
    assert_ne!(a, group_name("skyport-team-a-web"), "a replacement host gets its own group");
    assert!(group_name("web").starts_with("skyport-web-"));
    assert!(group_name(&"x".repeat(300)).len() <= MAX_GROUP_NAME);
}

#[test]
fn instance_states_map_to_host_states_and_terminated_is_gone() {
    use aws_sdk_ec2::types::InstanceState;
    let instance = |state: InstanceStateName| {
        Instance::builder()
            .instance_id("i-1")
            .public_ip_address("54.214.1.2")
            .state(InstanceState::builder().name(state).build())
            .set_tags(Some(tags(&request())))
            .build()
    };
    let state = |s| host(&instance(s)).map(|h| h.state);
    assert_eq!(state(InstanceStateName::Pending), Some(HostState::Provisioning));
    assert_eq!(state(InstanceStateName::Running), Some(HostState::Running));
    assert_eq!(state(InstanceStateName::Stopping), Some(HostState::Stopped));
    assert_eq!(state(InstanceStateName::Stopped), Some(HostState::Stopped));
    assert_eq!(state(InstanceStateName::ShuttingDown), Some(HostState::Deleting));
    assert_eq!(state(InstanceStateName::Terminated), None);
    let running = host(&instance(InstanceStateName::Running)).unwrap();
    assert_eq!(running.name, "skyport-team-a-web");
    assert_eq!(running.public_ipv4.as_deref(), Some("54.214.1.2"));
    assert_eq!(running.tags, request().tags, "Name is not an owner tag");
}

#[test]
fn instances_are_launched_with_imdsv2_only_and_a_hop_limit_of_one() {
    let options = metadata_options();
    assert_eq!(options.http_tokens(), Some(&HttpTokensState::Required));
    assert_eq!(options.http_put_response_hop_limit(), Some(1));
    assert_eq!(options.http_endpoint(), Some(&InstanceMetadataEndpointState::Enabled));
}

#[test]
fn region_names_are_checked_before_they_reach_a_client_or_an_id() {
    for ok in ["eu-west-1", "us-gov-west-1", "ap-southeast-5"] {
        assert!(check_region(ok).is_ok(), "{ok}");
    }
    for bad in ["", "EU-WEST-1", "../x", "eu west 1", "1-eu", &"a".repeat(33)] {
        assert!(matches!(check_region(bad), Err(HostError::Invalid { .. })), "{bad}");
    }
    assert!(matches!(error_from_code("InvalidAllocationID.NotFound", String::new()), HostError::NotFound { .. }));
    assert!(matches!(error_from_code("AddressLimitExceeded", String::new()), HostError::Quota { .. }));
}

#[test]
fn throttling_auth_and_quota_codes_from_the_issue() {
    let class = |code: &str| error_from_code(code, String::new());
    assert!(matches!(class("Throttling"), HostError::RateLimited { .. }));
    assert!(matches!(class("InvalidClientTokenId"), HostError::Unauthorized { .. }));
    assert!(matches!(class("InvalidSubnetID.NotFound"), HostError::Invalid { .. }));
    assert!(matches!(class("InvalidParameterCombination"), HostError::Invalid { .. }));
    assert!(matches!(class("VolumeLimitExceeded"), HostError::Quota { .. }));
    assert!(matches!(class("InternalError"), HostError::Unavailable { .. }));
    assert_eq!(class("Unsupported").class(), ErrorClass::Permanent);
    // delete's answer while the instance shuts down: retried, and says why.
    let in_use = group_in_use("sg-1");
    assert_eq!(in_use.class(), ErrorClass::Transient);
    assert!(in_use.to_string().contains("sg-1 is still in use"), "{in_use}");
}

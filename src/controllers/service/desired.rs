//! Which Services skyport serves, and the Tunnel it makes for one: pure.

use k8s_openapi::api::core::v1::Service;
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::config::TunnelArgs;
use crate::controllers::owned;
use crate::crd::tunnel::{PoolRef, ProxyProtocol, Tunnel};
use crate::error::{Error, Result};

/// The loadBalancerClass skyport implements.
pub const LOAD_BALANCER_CLASS: &str = "skyport.dev/tunnel";
/// Opt-out (`"false"`) / opt-in (`"true"`, required with `--annotated-only`) annotation.
pub const ANNOTATION: &str = "skyport.dev/tunnel";
pub const ANNOTATION_PROVIDER: &str = "skyport.dev/provider";
pub const ANNOTATION_REGION: &str = "skyport.dev/region";
pub const ANNOTATION_SIZE: &str = "skyport.dev/size";
/// `reserved` or `ephemeral`: the Tunnel's `spec.address.mode`.
pub const ANNOTATION_ADDRESS: &str = "skyport.dev/address";
/// `delete` or `retain`: the Tunnel's `spec.address.deletionPolicy`.
pub const ANNOTATION_ADDRESS_DELETION: &str = "skyport.dev/address-deletion-policy";

/// The provider id or IP of a reserved address kept with `Retain` by a deleted Tunnel of this
/// namespace and cluster, for this Service's Tunnel to take instead of reserving a new one (DNS
/// and allow-lists outside the cluster keep working). Implies `skyport.dev/address: reserved`.
/// Read from the Service at each take, never from the Tunnel, so only who may annotate the
/// Service can hand an address to it.
pub const ANNOTATION_RESERVED_ADDRESS: &str = "skyport.dev/reserved-address";

/// The address `service` names to take over ([`ANNOTATION_RESERVED_ADDRESS`]), trimmed.
pub fn named_address(service: &Service) -> Option<&str> {
    service.annotations().get(ANNOTATION_RESERVED_ADDRESS).map(|v| v.trim()).filter(|v| !v.is_empty())
}

/// `true` or `false`: the Tunnel's `spec.highAvailability` (needs `skyport.dev/address: reserved`).
pub const ANNOTATION_HIGH_AVAILABILITY: &str = "skyport.dev/high-availability";
/// The PROXY protocol header (`v1`, `v2`) the exit server writes ahead of each connection.
pub const ANNOTATION_PROXY_PROTOCOL: &str = "skyport.dev/proxy-protocol";
/// The ExitServerPool whose shared exit server carries the Service.
pub const ANNOTATION_POOL: &str = "skyport.dev/exit-server-pool";
/// Annotations that say where an exit server of the Service's own runs: a pool decides that.
const PLACEMENT_ANNOTATIONS: [&str; 7] = [
    ANNOTATION_PROVIDER,
    ANNOTATION_REGION,
    ANNOTATION_SIZE,
    ANNOTATION_ADDRESS,
    ANNOTATION_ADDRESS_DELETION,
    ANNOTATION_RESERVED_ADDRESS,
    ANNOTATION_HIGH_AVAILABILITY,
];

/// Whether skyport serves `service`, with the reason when it does not (for logs).
pub fn served(service: &Service, settings: &TunnelArgs) -> Result<(), &'static str> {
    let spec = service.spec.as_ref().ok_or("no spec")?;
    if spec.type_.as_deref() != Some("LoadBalancer") {
        return Err("not of type LoadBalancer");
    }
    let annotation = service.annotations().get(ANNOTATION).map(String::as_str);
    if annotation == Some("false") {
        return Err("annotated skyport.dev/tunnel: \"false\"");
    }
    if settings.annotated_only && annotation != Some("true") {
        return Err("not annotated skyport.dev/tunnel: \"true\" (skyport runs with --annotated-only)");
    }
    match spec.load_balancer_class.as_deref() {
        Some(LOAD_BALANCER_CLASS) => Ok(()),
        Some(_) => Err("another loadBalancerClass"),
        None if settings.default_load_balancer => Ok(()),
        None => Err("no loadBalancerClass and skyport is not the default load balancer"),
    }
}

/// The Tunnel skyport makes for a Service.
pub fn tunnel_name(service: &Service) -> String {
    format!("{}-tunnel", service.name_any())
}

/// The Tunnel for `service`: owned by it, spec from its annotations.
pub fn tunnel_for(service: &Service) -> Result<Tunnel> {
    let annotation = |k: &str| service.annotations().get(k).cloned();
    let value = json!({
        "apiVersion": "skyport.dev/v1alpha1",
        "kind": "Tunnel",
        "metadata": owned::meta(service, &tunnel_name(service), [])?,
        "spec": {
            "serviceRef": {"name": service.name_any()},
            "provider": annotation(ANNOTATION_PROVIDER),
            "region": annotation(ANNOTATION_REGION),
            "size": annotation(ANNOTATION_SIZE),
            "address": address(service)?,
            "highAvailability": high_availability(service)?,
        },
    });
    let mut tunnel: Tunnel = serde_json::from_value(value).map_err(|e| Error::Internal(format!("Tunnel: {e}")))?;
    tunnel.spec.pool = pool(service)?;
    tunnel.spec.provider = tunnel.spec.provider.filter(|s| !s.is_empty());
    tunnel.spec.region = tunnel.spec.region.filter(|s| !s.is_empty());
    tunnel.spec.size = tunnel.spec.size.filter(|s| !s.is_empty());
    tunnel.spec.source_ranges = source_ranges(service);
    tunnel.spec.proxy_protocol = proxy_protocol(service)?;
    Ok(tunnel)
}

/// `spec.proxyProtocol` from its annotation (`v1` or `v2`, case-insensitive); anything else is
/// refused with the annotation's name rather than silently sending no header.
pub fn proxy_protocol(service: &Service) -> Result<Option<ProxyProtocol>> {
    let Some(value) = service.annotations().get(ANNOTATION_PROXY_PROTOCOL) else { return Ok(None) };
    match value.trim().to_ascii_lowercase().as_str() {
        "v1" => Ok(Some(ProxyProtocol::V1)),
        "v2" => Ok(Some(ProxyProtocol::V2)),
        other => {
            Err(Error::InvalidSpec(format!("annotation {ANNOTATION_PROXY_PROTOCOL}: {other:?} is not one of v1, v2")))
        }
    }
}

/// `spec.pool` from its annotation; refused beside an annotation that places an exit server of
/// the Service's own, which the pool's server would silently ignore.
fn pool(service: &Service) -> Result<Option<PoolRef>> {
    let Some(name) = service.annotations().get(ANNOTATION_POOL).map(|v| v.trim()).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let placed: Vec<&str> =
        PLACEMENT_ANNOTATIONS.into_iter().filter(|a| service.annotations().contains_key(*a)).collect();
    if !placed.is_empty() {
        return Err(Error::InvalidSpec(format!(
            "annotation {ANNOTATION_POOL}: the pool decides where its shared exit server runs; remove {}",
            placed.join(", ")
        )));
    }
    Ok(Some(PoolRef { name: name.to_string() }))
}

/// The annotation older clients set instead of `spec.loadBalancerSourceRanges` (comma separated).
pub const ANNOTATION_SOURCE_RANGES: &str = "service.beta.kubernetes.io/load-balancer-source-ranges";

/// Who may reach the Service: `spec.loadBalancerSourceRanges`, else the annotation, as Kubernetes
/// reads them (the API server validated both as CIDRs; spaces trimmed). Empty: anywhere.
pub fn source_ranges(service: &Service) -> Vec<String> {
    let spec = service.spec.as_ref().and_then(|s| s.load_balancer_source_ranges.clone()).unwrap_or_default();
    let listed: Vec<String> = if spec.is_empty() {
        service.annotations().get(ANNOTATION_SOURCE_RANGES).map(|a| a.split(',').map(str::to_string).collect())
    } else {
        Some(spec)
    }
    .unwrap_or_default();
    listed.iter().map(|r| r.trim().to_string()).filter(|r| !r.is_empty()).collect()
}

/// `spec.address` from the annotations (values case-insensitive, as people write them), `None`
/// when neither is set. An unknown value is refused here rather than silently meaning the default.
fn address(service: &Service) -> Result<Option<serde_json::Value>> {
    let read = |key: &str, allowed: [&str; 2]| -> Result<Option<String>> {
        let Some(value) = service.annotations().get(key).map(|v| v.trim().to_ascii_lowercase()) else {
            return Ok(None);
        };
        match allowed.iter().find(|a| a.to_ascii_lowercase() == value) {
            Some(a) => Ok(Some(a.to_string())),
            None => {
                Err(Error::InvalidSpec(format!("annotation {key}: {value:?} is not one of {}", allowed.join(", "))))
            }
        }
    };
    let mut mode = read(ANNOTATION_ADDRESS, ["Reserved", "Ephemeral"])?;
    let policy = read(ANNOTATION_ADDRESS_DELETION, ["Delete", "Retain"])?;
    if named_address(service).is_some() {
        if mode.as_deref() == Some("Ephemeral") {
            return Err(Error::InvalidSpec(format!(
                "annotation {ANNOTATION_RESERVED_ADDRESS} names a reserved address to take, but {ANNOTATION_ADDRESS} is ephemeral: remove one of them"
            )));
        }
        mode = Some("Reserved".into());
    }
    if mode.is_none() && policy.is_none() {
        return Ok(None);
    }
    Ok(Some(
        json!({"mode": mode.unwrap_or_else(|| "Ephemeral".into()), "deletionPolicy": policy.unwrap_or_else(|| "Delete".into())}),
    ))
}

/// `spec.highAvailability` from its annotation. Refused here, with the annotation's name, when
/// the address is not reserved: the Tunnel would be refused at admission with the field's name.
fn high_availability(service: &Service) -> Result<Option<serde_json::Value>> {
    let Some(value) = service.annotations().get(ANNOTATION_HIGH_AVAILABILITY) else { return Ok(None) };
    match value.trim().to_ascii_lowercase().as_str() {
        "false" => Ok(None),
        "true" if address(service)?.is_some_and(|a| a["mode"] == "Reserved") => {
            Ok(Some(json!({"mode": "ActiveStandby"})))
        }
        "true" => Err(Error::InvalidSpec(format!(
            "annotation {ANNOTATION_HIGH_AVAILABILITY}: \"true\" needs {ANNOTATION_ADDRESS}: reserved (the address moved between the two exit servers); \"both-addresses\" needs none"
        ))),
        "both-addresses" if address(service)?.is_some_and(|a| a["mode"] == "Reserved") => {
            Err(Error::InvalidSpec(format!(
                "annotation {ANNOTATION_HIGH_AVAILABILITY}: \"both-addresses\" publishes each exit server's own address: remove {ANNOTATION_ADDRESS}: reserved"
            )))
        }
        "both-addresses" => Ok(Some(json!({"mode": "BothAddresses"}))),
        other => Err(Error::InvalidSpec(format!(
            "annotation {ANNOTATION_HIGH_AVAILABILITY}: {other:?} is not one of true, both-addresses, false"
        ))),
    }
}

/// Whether `service` is the controller owner of `tunnel`.
pub fn owned_by(tunnel: &Tunnel, service: &Service) -> bool {
    let uid = service.meta().uid.as_deref();
    tunnel.owner_references().iter().any(|r| r.controller == Some(true) && Some(r.uid.as_str()) == uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(type_: &str, class: Option<&str>, annotation: Option<&str>) -> Service {
        let mut annotations = serde_json::Map::new();
        if let Some(a) = annotation {
            annotations.insert(ANNOTATION.into(), a.into());
        }
        annotations.insert(ANNOTATION_PROVIDER.into(), "local".into());
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "a", "uid": "u1", "annotations": annotations},
            "spec": {"type": type_, "loadBalancerClass": class, "ports": [{"port": 80}]},
        }))
        .unwrap()
    }

    fn settings(default_lb: bool, annotated_only: bool) -> TunnelArgs {
        TunnelArgs { default_load_balancer: default_lb, annotated_only, ..Default::default() }
    }

    #[test]
    fn class_default_and_annotations_decide_which_services_are_served() {
        let class = Some(LOAD_BALANCER_CLASS);
        assert!(served(&service("LoadBalancer", class, None), &settings(false, false)).is_ok());
        assert!(served(&service("ClusterIP", class, None), &settings(true, false)).is_err());
        assert!(served(&service("LoadBalancer", None, None), &settings(false, false)).is_err());
        assert!(served(&service("LoadBalancer", None, None), &settings(true, false)).is_ok());
        assert!(served(&service("LoadBalancer", Some("other.io/lb"), None), &settings(true, false)).is_err());
        assert!(served(&service("LoadBalancer", class, Some("false")), &settings(false, false)).is_err());
        assert!(served(&service("LoadBalancer", class, None), &settings(false, true)).is_err());
        assert!(served(&service("LoadBalancer", class, Some("true")), &settings(false, true)).is_ok());
        assert!(served(&service("LoadBalancer", None, Some("true")), &settings(false, true)).is_err());
    }

    #[test]
    fn the_tunnel_is_owned_by_the_service_and_takes_its_annotations() {
        let svc = service("LoadBalancer", Some(LOAD_BALANCER_CLASS), None);
        let t = tunnel_for(&svc).unwrap();
        assert_eq!(t.name_any(), "web-tunnel");
        assert_eq!(t.spec.service_name(), Some("web"));
        assert_eq!(t.spec.provider.as_deref(), Some("local"));
        assert_eq!(t.spec.region, None);
        assert_eq!(t.spec.address, None);
        assert!(owned_by(&t, &svc));
    }

    #[test]
    fn address_annotations_set_the_tunnels_address_and_unknown_values_are_refused() {
        use crate::crd::tunnel::{AddressDeletionPolicy, AddressMode, TunnelAddress};
        let annotated = |pairs: &[(&str, &str)]| {
            let mut svc = service("LoadBalancer", Some(LOAD_BALANCER_CLASS), None);
            for (k, v) in pairs {
                svc.metadata.annotations.get_or_insert_default().insert(k.to_string(), v.to_string());
            }
            tunnel_for(&svc)
        };
        let t = annotated(&[(ANNOTATION_ADDRESS, "reserved")]).unwrap();
        let want = TunnelAddress { mode: AddressMode::Reserved, deletion_policy: AddressDeletionPolicy::Delete };
        assert_eq!(t.spec.address, Some(want));
        assert!(t.spec.reserves_address());
        let t = annotated(&[(ANNOTATION_ADDRESS, "Reserved"), (ANNOTATION_ADDRESS_DELETION, "retain")]).unwrap();
        assert_eq!(t.spec.address_deletion_policy(), AddressDeletionPolicy::Retain);
        assert!(!annotated(&[(ANNOTATION_ADDRESS, "ephemeral")]).unwrap().spec.reserves_address());
        let refused = annotated(&[(ANNOTATION_ADDRESS, "static")]).unwrap_err().to_string();
        assert!(refused.contains("skyport.dev/address") && refused.contains("\"static\""), "{refused}");
        assert!(annotated(&[(ANNOTATION_ADDRESS_DELETION, "keep")]).is_err());
        // Naming a kept address to take implies a reserved one; an ephemeral one contradicts it.
        let named = annotated(&[(ANNOTATION_RESERVED_ADDRESS, " eipalloc-0abc ")]).unwrap();
        assert!(named.spec.reserves_address());
        let both = [(ANNOTATION_RESERVED_ADDRESS, "203.0.113.7"), (ANNOTATION_ADDRESS, "ephemeral")];
        let refused = annotated(&both).unwrap_err().to_string();
        assert!(refused.contains("skyport.dev/reserved-address") && refused.contains("ephemeral"), "{refused}");
    }

    #[test]
    fn the_pool_annotation_names_the_pool_and_refuses_annotations_that_place_a_server() {
        let mut svc = service("LoadBalancer", Some(LOAD_BALANCER_CLASS), None);
        let annotations = svc.metadata.annotations.get_or_insert_default();
        annotations.insert(ANNOTATION_POOL.into(), " shared-eu ".into());
        let refused = tunnel_for(&svc).unwrap_err().to_string();
        assert!(refused.contains(ANNOTATION_POOL) && refused.contains("remove skyport.dev/provider"), "{refused}");
        svc.metadata.annotations.get_or_insert_default().remove(ANNOTATION_PROVIDER);
        let t = tunnel_for(&svc).unwrap();
        assert_eq!(t.spec.pool, Some(PoolRef { name: "shared-eu".into() }));
        assert_eq!((t.spec.provider, t.spec.address, t.spec.high_availability), (None, None, None));
        svc.metadata.annotations.get_or_insert_default().insert(ANNOTATION_POOL.into(), " ".into());
        assert_eq!(tunnel_for(&svc).unwrap().spec.pool, None, "an empty annotation names no pool");
    }

    #[test]
    fn the_high_availability_annotation_needs_a_reserved_address() {
        let annotated = |pairs: &[(&str, &str)]| {
            let mut svc = service("LoadBalancer", Some(LOAD_BALANCER_CLASS), None);
            for (k, v) in pairs {
                svc.metadata.annotations.get_or_insert_default().insert(k.to_string(), v.to_string());
            }
            tunnel_for(&svc)
        };
        let t = annotated(&[(ANNOTATION_HIGH_AVAILABILITY, "True"), (ANNOTATION_ADDRESS, "reserved")]).unwrap();
        assert!(t.spec.high_availability() && t.spec.reserves_address());
        let off = annotated(&[(ANNOTATION_HIGH_AVAILABILITY, "false"), (ANNOTATION_ADDRESS, "reserved")]).unwrap();
        assert!(!off.spec.high_availability());
        assert!(!annotated(&[]).unwrap().spec.high_availability());
        let alone = annotated(&[(ANNOTATION_HIGH_AVAILABILITY, "true")]).unwrap_err().to_string();
        assert!(alone.contains("skyport.dev/address: reserved"), "{alone}");
        let ephemeral = [(ANNOTATION_HIGH_AVAILABILITY, "true"), (ANNOTATION_ADDRESS, "ephemeral")];
        assert!(annotated(&ephemeral).is_err());
        let unknown = annotated(&[(ANNOTATION_HIGH_AVAILABILITY, "yes")]).unwrap_err().to_string();
        assert!(unknown.contains("\"yes\""), "{unknown}");
        // Both servers' own addresses: no reserved address, and none allowed.
        let both = annotated(&[(ANNOTATION_HIGH_AVAILABILITY, "both-addresses")]).unwrap();
        assert!(both.spec.both_addresses() && !both.spec.reserves_address());
        let clash = [(ANNOTATION_HIGH_AVAILABILITY, "both-addresses"), (ANNOTATION_ADDRESS, "reserved")];
        assert!(annotated(&clash).unwrap_err().to_string().contains("own address"));
    }

    #[test]
    fn source_ranges_come_from_the_spec_else_the_annotation() {
        let mut svc = service("LoadBalancer", Some(LOAD_BALANCER_CLASS), None);
        assert!(tunnel_for(&svc).unwrap().spec.source_ranges.is_empty(), "no ranges: anywhere");
        let annotations = svc.metadata.annotations.get_or_insert_default();
        annotations.insert(ANNOTATION_SOURCE_RANGES.into(), " 198.51.100.0/24, 203.0.113.7/32 ,".into());
        assert_eq!(tunnel_for(&svc).unwrap().spec.source_ranges, ["198.51.100.0/24", "203.0.113.7/32"]);
        svc.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["10.0.0.0/8".into()]);
        assert_eq!(source_ranges(&svc), ["10.0.0.0/8"], "the field wins over the annotation");
    }

    #[test]
    fn the_proxy_protocol_annotation_is_v1_or_v2_and_anything_else_is_refused_by_name() {
        let annotated = |value: &str| {
            let mut svc = service("LoadBalancer", Some(LOAD_BALANCER_CLASS), None);
            svc.metadata.annotations.get_or_insert_default().insert(ANNOTATION_PROXY_PROTOCOL.into(), value.into());
            tunnel_for(&svc)
        };
        assert_eq!(annotated("v1").unwrap().spec.proxy_protocol, Some(ProxyProtocol::V1));
        assert_eq!(annotated(" V2 ").unwrap().spec.proxy_protocol, Some(ProxyProtocol::V2));
        let plain = service("LoadBalancer", Some(LOAD_BALANCER_CLASS), None);
        assert_eq!(tunnel_for(&plain).unwrap().spec.proxy_protocol, None, "no annotation, no header");
        let refused = annotated("true").unwrap_err().to_string();
        assert!(refused.contains("skyport.dev/proxy-protocol") && refused.contains("\"true\""), "{refused}");
    }
}

use super::*;

fn tcp(port: i32) -> TunnelPort {
    TunnelPort { port, protocol: "TCP".into(), proxy_protocol: None }
}

fn udp(port: i32) -> TunnelPort {
    TunnelPort { port, protocol: "UDP".into(), proxy_protocol: None }
}

fn rules() -> Rules {
    Rules {
        allowed_namespaces: ["a", "b", "c"].map(String::from).into(),
        health_ports: 40000..=40002,
        per_service: false,
    }
}

fn claim(uid: &str, namespace: &str, created: &str, wants: &[TunnelPort]) -> Claim {
    Claim {
        uid: uid.into(),
        namespace: namespace.into(),
        created: created.into(),
        wants: wants.to_vec(),
        holds: Vec::new(),
        health_port: None,
    }
}

fn holding(mut c: Claim, holds: &[TunnelPort], health_port: u16) -> Claim {
    c.holds = holds.to_vec();
    c.health_port = Some(health_port);
    c
}

fn carried(ports: &[TunnelPort], health_port: u16) -> Admission {
    Admission::Carried { ports: ports.to_vec(), health_port, refused: None }
}

#[test]
fn services_on_distinct_ports_share_the_address_each_with_its_own_health_port() {
    let out = admit(
        &rules(),
        &[
            claim("u1", "a", "2026-01-01T00:00:00Z", &[tcp(80), udp(53)]),
            claim("u2", "b", "2026-01-02T00:00:00Z", &[tcp(443), tcp(53)]),
        ],
    );
    assert_eq!(out["u1"], carried(&[udp(53), tcp(80)], 40000));
    assert_eq!(out["u2"], carried(&[tcp(53), tcp(443)], 40001), "TCP 53 is not UDP 53");
}

/// With an address each, two namespaces serve the same port; the health-check range and the pool's
/// size still hold.
#[test]
fn members_with_an_address_each_share_port_numbers() {
    let per_service = Rules { per_service: true, ..rules() };
    let out = admit(
        &per_service,
        &[
            claim("u1", "a", "2026-01-01T00:00:00Z", &[tcp(80), udp(53)]),
            claim("u2", "b", "2026-01-02T00:00:00Z", &[tcp(80), udp(53)]),
            claim("u3", "c", "2026-01-03T00:00:00Z", &[tcp(40001)]),
        ],
    );
    assert_eq!(out["u1"], carried(&[udp(53), tcp(80)], 40000));
    assert_eq!(out["u2"], carried(&[udp(53), tcp(80)], 40001));
    assert!(matches!(&out["u3"], Admission::Refused(Refusal::InHealthRange(..))), "{:?}", out["u3"]);
    // The same two on one shared address: the younger is refused.
    let shared = admit(
        &rules(),
        &[claim("u1", "a", "2026-01-01T00:00:00Z", &[tcp(80)]), claim("u2", "b", "2026-01-02T00:00:00Z", &[tcp(80)])],
    );
    assert_eq!(shared["u2"], Admission::Refused(Refusal::Taken(vec![tcp(80)])));
}

#[test]
fn a_namespace_the_pool_does_not_allow_is_refused_even_when_it_held_ports() {
    let out = admit(&rules(), &[holding(claim("u1", "z", "2026-01-01T00:00:00Z", &[tcp(80)]), &[tcp(80)], 40000)]);
    assert_eq!(out["u1"], Admission::Refused(Refusal::NamespaceNotAllowed));
    assert!(out["u1"].ports().is_empty());
}

#[test]
fn the_older_new_claim_wins_a_port_and_the_refusal_names_no_namespace() {
    let out = admit(
        &rules(),
        &[
            claim("late", "b", "2026-01-02T00:00:00Z", &[tcp(80), tcp(81)]),
            claim("early", "a", "2026-01-01T00:00:00Z", &[tcp(80)]),
        ],
    );
    assert_eq!(out["early"], carried(&[tcp(80)], 40000));
    assert_eq!(out["late"], Admission::Refused(Refusal::Taken(vec![tcp(80)])));
    let message = Refusal::Taken(vec![tcp(80)]).to_string();
    assert_eq!(message, "port 80/TCP is already served on the pool's shared address; choose other ports");
    assert!(!message.contains('"') && !message.contains(" a ") && !message.contains("early"));
}

#[test]
fn what_a_member_carries_is_never_taken_by_an_older_member_that_asks_for_it_later() {
    let incumbent = holding(claim("young", "b", "2026-01-02T00:00:00Z", &[tcp(80)]), &[tcp(80)], 40000);
    let elder = holding(claim("old", "a", "2026-01-01T00:00:00Z", &[tcp(8080), tcp(80)]), &[tcp(8080)], 40001);
    let out = admit(&rules(), &[incumbent, elder]);
    assert_eq!(out["young"], carried(&[tcp(80)], 40000));
    assert_eq!(
        out["old"],
        Admission::Carried { ports: vec![tcp(8080)], health_port: 40001, refused: Some(Refusal::Taken(vec![tcp(80)])) },
        "the edit waits whole; what it served stays"
    );
}

#[test]
fn a_member_keeps_its_health_port_when_an_older_one_leaves() {
    let out = admit(&rules(), &[holding(claim("u2", "b", "2026-01-02T00:00:00Z", &[tcp(443)]), &[tcp(443)], 40001)]);
    assert_eq!(out["u2"], carried(&[tcp(443)], 40001));
    // A newcomer older than it takes the lowest free port, not the one held.
    let out = admit(
        &rules(),
        &[
            holding(claim("u2", "b", "2026-01-02T00:00:00Z", &[tcp(443)]), &[tcp(443)], 40000),
            claim("u0", "a", "2026-01-01T00:00:00Z", &[tcp(80)]),
        ],
    );
    assert_eq!(out["u2"], carried(&[tcp(443)], 40000));
    assert_eq!(out["u0"], carried(&[tcp(80)], 40001));
}

#[test]
fn ports_in_the_health_range_are_refused_and_a_full_pool_refuses_newcomers_only() {
    let out = admit(&rules(), &[claim("u1", "a", "2026-01-01T00:00:00Z", &[tcp(40001)])]);
    assert_eq!(out["u1"], Admission::Refused(Refusal::InHealthRange(vec![tcp(40001)], 40000..=40002)));
    assert!(out["u1"].clone() != carried(&[], 40000));

    let mut claims: Vec<Claim> = (0..3)
        .map(|i| {
            holding(
                claim(&format!("u{i}"), "a", "2026-01-02T00:00:00Z", &[tcp(80 + i)]),
                &[tcp(80 + i)],
                40000 + i as u16,
            )
        })
        .collect();
    claims.push(claim("first", "c", "2026-01-01T00:00:00Z", &[tcp(90)]));
    let out = admit(&rules(), &claims);
    assert_eq!(out["first"], Admission::Refused(Refusal::Full), "older, but the ports are held");
    assert!((0..3).all(|i| matches!(out[&format!("u{i}")], Admission::Carried { refused: None, .. })));
}

#[test]
fn a_stale_status_never_hands_one_port_or_health_port_out_twice() {
    let out = admit(
        &rules(),
        &[
            holding(claim("u1", "a", "2026-01-01T00:00:00Z", &[tcp(80)]), &[tcp(80)], 40000),
            holding(claim("u2", "b", "2026-01-02T00:00:00Z", &[tcp(80)]), &[tcp(80)], 40000),
        ],
    );
    assert_eq!(out["u1"], carried(&[tcp(80)], 40000));
    assert_eq!(out["u2"], Admission::Refused(Refusal::Taken(vec![tcp(80)])));
}

#[test]
fn a_refused_newcomer_frees_its_health_port_for_the_next() {
    let out = admit(
        &rules(),
        &[
            holding(claim("u1", "a", "2026-01-01T00:00:00Z", &[tcp(80)]), &[tcp(80)], 40000),
            claim("u2", "b", "2026-01-02T00:00:00Z", &[tcp(80)]),
            claim("u3", "c", "2026-01-03T00:00:00Z", &[tcp(81)]),
        ],
    );
    assert_eq!(out["u2"], Admission::Refused(Refusal::Taken(vec![tcp(80)])));
    assert_eq!(out["u3"], carried(&[tcp(81)], 40001));
}

#[test]
fn a_member_that_drops_every_port_it_held_is_new_again() {
    let out = admit(
        &rules(),
        &[
            holding(claim("u1", "a", "2026-01-01T00:00:00Z", &[tcp(81)]), &[tcp(80)], 40000),
            holding(claim("u2", "b", "2026-01-02T00:00:00Z", &[tcp(81)]), &[tcp(81)], 40001),
        ],
    );
    assert_eq!(out["u1"], Admission::Refused(Refusal::Taken(vec![tcp(81)])));
    assert_eq!(out["u2"], carried(&[tcp(81)], 40001));
}

#[test]
fn what_the_status_records_is_read_back_as_what_members_hold() {
    let member: Tunnel = serde_json::from_value(serde_json::json!({
        "apiVersion": "skyport.dev/v1alpha1", "kind": "Tunnel",
        "metadata": {"name": "web-tunnel", "namespace": "a", "uid": "u1", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"serviceRef": {"name": "web"}, "pool": {"name": "shared"}},
    }))
    .unwrap();
    let first = admit(&rules(), &[claim_of(&member, vec![tcp(80)], &[]).unwrap()]);
    let status = recorded(&first);
    assert_eq!(
        status,
        [PoolMember { uid: "u1".into(), ports: vec![tcp(80)], health_port: Some(40000), refused: None }]
    );
    let again = claim_of(&member, vec![tcp(80), tcp(81)], &status).unwrap();
    assert_eq!((again.holds.clone(), again.health_port), (vec![tcp(80)], Some(40000)));
    let refused = recorded(&BTreeMap::from([("u2".to_string(), Admission::Refused(Refusal::Full))]));
    assert_eq!(refused[0].health_port, None);
    assert!(refused[0].refused.as_deref().is_some_and(|r| r.contains("health ports")));
}

/// A server that holds two addresses of its own keeps the member that has one and the oldest
/// other; the newest is refused with the limit, naming nobody else, and a refused member stays so.
#[test]
fn members_past_the_servers_address_limit_are_refused_the_holder_and_the_oldest_kept() {
    let per_service = Rules { per_service: true, ..rules() };
    let claims = [
        claim("old", "a", "2026-01-01T00:00:00Z", &[tcp(80)]),
        claim("holder", "b", "2026-01-03T00:00:00Z", &[tcp(80)]),
        claim("new", "c", "2026-01-02T00:00:00Z", &[tcp(80)]),
        claim("outsider", "z", "2026-01-01T00:00:00Z", &[tcp(80)]),
    ];
    let mut out = admit(&per_service, &claims);
    let created: BTreeMap<String, String> = claims.iter().map(|c| (c.uid.clone(), c.created.clone())).collect();
    cap_addresses(&mut out, 2, &BTreeSet::from(["holder".to_string()]), &created);
    assert!(matches!(out["holder"], Admission::Carried { .. }), "{:?}", out["holder"]);
    assert!(matches!(out["old"], Admission::Carried { .. }), "{:?}", out["old"]);
    assert_eq!(out["new"], Admission::Refused(Refusal::NoAddress(2)));
    assert_eq!(out["outsider"], Admission::Refused(Refusal::NamespaceNotAllowed), "refused stays refused");
    let why = Refusal::NoAddress(2).to_string();
    assert!(why.contains("at most 2") && why.contains("spec.size") && !why.contains("holder"), "{why}");
    cap_addresses(&mut out, 0, &BTreeSet::new(), &created);
    assert!(out.values().all(|a| matches!(a, Admission::Refused(_))));
}

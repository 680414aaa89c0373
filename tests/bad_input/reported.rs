//! Bad input only the controllers can judge, reported as Ready=False with a reason and exactly
//! one Warning Event, and valid input at the edges, which must be served.

use serde_json::{Value, json};

use super::cases::Expect::{Reported, Served};
use super::cases::{Case, case, fifo, lb, long, policy, q, svc, t};

/// `sqs_taken`: an existing SQS queue skyport did not create.
pub fn cases(sqs_taken: &str) -> Vec<Case> {
    vec![
        // What only the controllers can judge: Ready=False, a reason, one Warning Event.
        Case {
            what: "dead-letter cycle A -> B -> A",
            before: vec![q("cyc-b", json!({"deadLetter": {"queueRef": {"name": "cyc-a"}, "maxReceiveCount": 3}}))],
            apply: q("cyc-a", json!({"deadLetter": {"queueRef": {"name": "cyc-b"}, "maxReceiveCount": 3}})),
            expect: Reported("DeadLetterCycle"),
        },
        Case {
            what: "FIFO queue with a standard dead-letter queue",
            before: vec![q("std-dlq", json!({}))],
            apply: fifo("fifo-src", json!({"deadLetter": {"queueRef": {"name": "std-dlq"}, "maxReceiveCount": 3}})),
            expect: Reported("InvalidDeadLetterQueue"),
        },
        case(
            "dead-letter Queue that does not exist",
            q("dl-missing", json!({"deadLetter": {"queueRef": {"name": "nobody"}, "maxReceiveCount": 3}})),
            Reported("DeadLetterQueueNotReady"),
        ),
        case(
            "an existing SQS queue skyport did not create",
            q("taken", json!({"queueName": sqs_taken})),
            Reported("AlreadyExists"),
        ),
        case(
            "policy above SQS's 8192 bytes",
            q("huge-policy", json!({"policy": policy(9000)})),
            Reported("InvalidSpec"),
        ),
        case(
            "Tunnel for a missing Service",
            t("tun-missing", json!({"serviceRef": {"name": "nowhere"}})),
            Reported("ServiceNotFound"),
        ),
        Case {
            // A hand-written Tunnel obeys the rules Services do: a headless ClusterIP Service is
            // not one skyport serves.
            what: "Tunnel for a headless Service with 0 ports",
            before: vec![svc("headless0", json!({"clusterIP": "None"}))],
            apply: t("tun-headless0", json!({"serviceRef": {"name": "headless0"}})),
            expect: Reported("ServiceNotServed"),
        },
        case(
            "Service with an SCTP port",
            lb("sctp", json!([{"port": 9000, "protocol": "SCTP"}])),
            Reported("InvalidService"),
        ),
        case("Service on the tunnel's control port", lb("ctl", json!([{"port": 2333}])), Reported("InvalidService")),
        case("Service on the tunnel's health port", lb("hlth", json!([{"port": 2334}])), Reported("InvalidService")),
        Case {
            what: "Tunnel naming a provider skyport is not configured for",
            before: vec![lb("far", json!([{"port": 80}]))],
            apply: t("tun-far", json!({"serviceRef": {"name": "far"}, "provider": "hetzner"})),
            expect: Reported("ProviderNotConfigured"),
        },
        // Valid input at the edges.
        case("Queue name of 249 characters", q(&long(249), json!({})), Served),
        case(
            "44 tags of the longest keys and values, unicode",
            q(
                "tags-max",
                json!({"tags": (0..44).map(|i| (format!("{i:02}-{}", "é".repeat(125)), json!("données".repeat(36)))).collect::<serde_json::Map<_, _>>()}),
            ),
            Served,
        ),
        case(
            "Service with 100 ports",
            lb("wide", Value::Array((0..100).map(|i| json!({"name": format!("p{i}"), "port": 20000 + i})).collect())),
            Served,
        ),
        case(
            "UDP and TCP on one port",
            lb(
                "dual",
                json!([{"name": "dns-tcp", "port": 8053, "protocol": "TCP"}, {"name": "dns-udp", "port": 8053, "protocol": "UDP"}]),
            ),
            Served,
        ),
        Case {
            what: "Tunnel name of 235 characters",
            before: vec![lb("plain", json!([{"port": 80}]))],
            apply: t(&long(235), json!({"serviceRef": {"name": "plain"}})),
            expect: Served,
        },
    ]
}

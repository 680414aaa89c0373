//! Bad input the API server refuses at admission, by the CRDs' schema bounds, enums and CEL
//! rules (immutable fields included): `kubectl apply` fails with a message that says what to do.

use serde_json::json;

use super::cases::Expect::Refused;
use super::cases::{Case, arns, case, edit, fifo, lb, long, many_tags, pool, q, t};

pub fn cases() -> Vec<Case> {
    vec![
        // Queue: every schema bound.
        case(
            "visibilityTimeoutSeconds above 43200",
            q("b1", json!({"visibilityTimeoutSeconds": 43201})),
            Refused(&["less than or equal to 43200"]),
        ),
        case(
            "visibilityTimeoutSeconds negative",
            q("b2", json!({"visibilityTimeoutSeconds": -1})),
            Refused(&["greater than or equal to 0"]),
        ),
        case(
            "messageRetentionSeconds below 60",
            q("b3", json!({"messageRetentionSeconds": 59})),
            Refused(&["greater than or equal to 60"]),
        ),
        case(
            "messageRetentionSeconds above 14 days",
            q("b4", json!({"messageRetentionSeconds": 1209601})),
            Refused(&["less than or equal to 1209600"]),
        ),
        case("delaySeconds above 900", q("b5", json!({"delaySeconds": 901})), Refused(&["less than or equal to 900"])),
        case(
            "maximumMessageSizeBytes below 1024",
            q("b6", json!({"maximumMessageSizeBytes": 1023})),
            Refused(&["greater than or equal to 1024"]),
        ),
        case(
            "maximumMessageSizeBytes above 1 MiB",
            q("b7", json!({"maximumMessageSizeBytes": 1048577})),
            Refused(&["less than or equal to 1048576"]),
        ),
        case(
            "receiveWaitTimeSeconds above 20",
            q("b8", json!({"receiveWaitTimeSeconds": 21})),
            Refused(&["less than or equal to 20"]),
        ),
        case(
            "kmsDataKeyReusePeriodSeconds below 60",
            q("b9", json!({"kmsKeyId": "alias/aws/sqs", "kmsDataKeyReusePeriodSeconds": 59})),
            Refused(&["greater than or equal to 60"]),
        ),
        case(
            "kmsDataKeyReusePeriodSeconds above a day",
            q("b10", json!({"kmsKeyId": "alias/aws/sqs", "kmsDataKeyReusePeriodSeconds": 86401})),
            Refused(&["less than or equal to 86400"]),
        ),
        case("kmsKeyId empty", q("b11", json!({"kmsKeyId": ""})), Refused(&["spec.kmsKeyId", "at least 1"])),
        case("queueName empty", q("b12", json!({"queueName": ""})), Refused(&["spec.queueName", "at least 1"])),
        case(
            "queueName of 81 characters",
            q("b13", json!({"queueName": long(81)})),
            Refused(&["spec.queueName", "80"]),
        ),
        case(
            "queueName with unicode",
            q("b14", json!({"queueName": "bestellungen-größe"})),
            Refused(&["spec.queueName", "should match"]),
        ),
        case(
            "deadLetter maxReceiveCount 0",
            q("b15", json!({"deadLetter": {"queueRef": {"name": "x"}, "maxReceiveCount": 0}})),
            Refused(&["greater than or equal to 1"]),
        ),
        case(
            "deadLetter maxReceiveCount 1001",
            q("b16", json!({"deadLetter": {"queueRef": {"name": "x"}, "maxReceiveCount": 1001}})),
            Refused(&["less than or equal to 1000"]),
        ),
        case(
            "deadLetter without maxReceiveCount",
            q("b17", json!({"deadLetter": {"queueRef": {"name": "x"}}})),
            Refused(&["maxReceiveCount", "Required value"]),
        ),
        case(
            "deadLetter targetArn not an SQS ARN",
            q("b18", json!({"deadLetter": {"targetArn": "orders-dlq", "maxReceiveCount": 3}})),
            Refused(&["targetArn", "should match"]),
        ),
        case(
            "deadLetter queueRef name empty",
            q("b19", json!({"deadLetter": {"queueRef": {"name": ""}, "maxReceiveCount": 3}})),
            Refused(&["queueRef.name", "at least 1"]),
        ),
        case(
            "redriveAllowPolicy with 11 source ARNs",
            q("b20", json!({"redriveAllowPolicy": {"redrivePermission": "byQueue", "sourceQueueArns": arns(11)}})),
            Refused(&["sourceQueueArns", "at most 10"]),
        ),
        case("45 tags", q("b21", json!({"tags": many_tags(45)})), Refused(&["spec.tags", "at most 44"])),
        // Queue: every enum.
        case(
            "deduplicationScope not an SQS value",
            fifo("b22", json!({"deduplicationScope": "global"})),
            Refused(&["Unsupported value", "\"messageGroup\""]),
        ),
        case(
            "fifoThroughputLimit not an SQS value",
            fifo("b23", json!({"fifoThroughputLimit": "unlimited"})),
            Refused(&["Unsupported value", "\"perQueue\""]),
        ),
        case(
            "redrivePermission not an SQS value",
            q("b24", json!({"redriveAllowPolicy": {"redrivePermission": "everyone"}})),
            Refused(&["Unsupported value", "\"allowAll\""]),
        ),
        case(
            "deletionPolicy misspelt",
            q("b25", json!({"deletionPolicy": "Destroy"})),
            Refused(&["Unsupported value", "\"Retain\""]),
        ),
        // Queue: every CEL rule.
        case(
            "FIFO queue named without .fifo",
            fifo("b26", json!({"queueName": "jobs"})),
            Refused(&["must end in '.fifo' exactly when fifo is true"]),
        ),
        case(
            "standard queue named .fifo",
            q("b27", json!({"queueName": "jobs.fifo"})),
            Refused(&["must end in '.fifo' exactly when fifo is true"]),
        ),
        case(
            "FIFO settings on a standard queue",
            q("b28", json!({"contentBasedDeduplication": true})),
            Refused(&["apply only to FIFO queues (set fifo: true)"]),
        ),
        case(
            "perMessageGroupId without messageGroup scope",
            fifo("b29", json!({"fifoThroughputLimit": "perMessageGroupId", "deduplicationScope": "queue"})),
            Refused(&["requires deduplicationScope messageGroup"]),
        ),
        case(
            "SSE-SQS and SSE-KMS together",
            q("b30", json!({"sqsManagedEncryption": true, "kmsKeyId": "alias/aws/sqs"})),
            Refused(&["choose one kind of encryption"]),
        ),
        case(
            "kmsDataKeyReusePeriodSeconds without kmsKeyId",
            q("b31", json!({"kmsDataKeyReusePeriodSeconds": 300})),
            Refused(&["only applies with kmsKeyId"]),
        ),
        case(
            "deadLetter with queueRef and targetArn",
            q(
                "b32",
                json!({"deadLetter": {"queueRef": {"name": "x"}, "targetArn": "arn:aws:sqs:us-east-1:000000000000:x", "maxReceiveCount": 3}}),
            ),
            Refused(&["exactly one of queueRef and targetArn"]),
        ),
        case(
            "deadLetter with neither queueRef nor targetArn",
            q("b33", json!({"deadLetter": {"maxReceiveCount": 3}})),
            Refused(&["exactly one of queueRef and targetArn"]),
        ),
        case(
            "byQueue without sourceQueueArns",
            q("b34", json!({"redriveAllowPolicy": {"redrivePermission": "byQueue"}})),
            Refused(&["sourceQueueArns is required with redrivePermission byQueue"]),
        ),
        case(
            "allowAll with sourceQueueArns",
            q("b35", json!({"redriveAllowPolicy": {"redrivePermission": "allowAll", "sourceQueueArns": arns(1)}})),
            Refused(&["not allowed otherwise"]),
        ),
        case(
            "tag key reserved for skyport",
            q("b36", json!({"tags": {"skyport.dev/owner-uid": "x"}})),
            Refused(&["reserved for skyport"]),
        ),
        case(
            "tag key reserved for AWS",
            q("b37", json!({"tags": {"aws:createdBy": "x"}})),
            Refused(&["'aws:' for AWS"]),
        ),
        case(
            "tag key of 129 characters",
            q("b38", json!({"tags": {long(129): "x"}})),
            Refused(&["tag keys are at most 128 characters"]),
        ),
        case(
            "tag value of 257 characters",
            q("b39", json!({"tags": {"team": long(257)}})),
            Refused(&["values at most 256"]),
        ),
        case(
            "dead-letter queue is the Queue itself",
            q("b40", json!({"deadLetter": {"queueRef": {"name": "b40"}, "maxReceiveCount": 3}})),
            Refused(&["names this Queue itself"]),
        ),
        case(
            "Queue name of 250 characters (its ConfigMap would exceed 253)",
            q(&long(250), json!({})),
            Refused(&["at most 249 characters"]),
        ),
        // Queue: types, unknown fields, names.
        case(
            "unknown field (typo)",
            q("b42", json!({"visibilityTimeout": 30})),
            Refused(&["unknown field \"spec.visibilityTimeout\""]),
        ),
        case(
            "unknown top-level field",
            json!({"apiVersion": "skyport.dev/v1alpha1", "kind": "Queue", "metadata": {"name": "b43"}, "specs": {}}),
            Refused(&["unknown field \"specs\""]),
        ),
        case(
            "number given as a string",
            q("b44", json!({"visibilityTimeoutSeconds": "30"})),
            Refused(&["must be of type integer"]),
        ),
        case(
            "policy as a JSON string, not an object",
            q("b45", json!({"policy": "{\"Version\":\"2012-10-17\"}"})),
            Refused(&["spec.policy", "must be of type object"]),
        ),
        case(
            "tags as a list",
            q("b46", json!({"tags": ["team=shop"]})),
            Refused(&["spec.tags", "must be of type object"]),
        ),
        case("Queue name with unicode", q("bestellung-ü", json!({})), Refused(&["RFC 1123"])),
        case(
            "Queue name of 254 characters",
            q(&long(254), json!({})),
            Refused(&["must be no more than 253 characters"]),
        ),
        // Queue: edits.
        edit(
            "queueName changed",
            q("e1", json!({"queueName": "e1-first"})),
            q("e1", json!({"queueName": "e1-second"})),
            Refused(&["queueName is immutable"]),
        ),
        edit(
            "queueName removed",
            q("e2", json!({"queueName": "e2-first"})),
            q("e2", json!({})),
            Refused(&["queueName is immutable"]),
        ),
        edit("fifo flipped", q("e3", json!({})), q("e3", json!({"fifo": true})), Refused(&["fifo is immutable"])),
        edit(
            "edit to a reserved tag",
            q("e4", json!({"tags": {"team": "a"}})),
            q("e4", json!({"tags": {"skyport.dev/owner-name": "b"}})),
            Refused(&["reserved for skyport"]),
        ),
        edit(
            "edit out of bounds",
            q("e5", json!({"delaySeconds": 1})),
            q("e5", json!({"delaySeconds": 9000})),
            Refused(&["less than or equal to 900"]),
        ),
        // Tunnel: schema, CEL, edits.
        case("Tunnel without serviceRef", t("bt1", json!({})), Refused(&["serviceRef is required", "the Service"])),
        case(
            "serviceRef not a Service name",
            t("bt2", json!({"serviceRef": {"name": "Web_1"}})),
            Refused(&["serviceRef.name", "should match"]),
        ),
        case(
            "unknown provider",
            t("bt3", json!({"serviceRef": {"name": "web"}, "provider": "aws"})),
            Refused(&["spec.provider", "local|guest|ec2|digitalocean|hetzner"]),
        ),
        case(
            "region with capitals",
            t("bt4", json!({"serviceRef": {"name": "web"}, "region": "EU_WEST"})),
            Refused(&["spec.region", "should match"]),
        ),
        case(
            "size of 64 characters",
            t("bt5", json!({"serviceRef": {"name": "web"}, "size": long(64)})),
            Refused(&["spec.size", "63"]),
        ),
        case(
            "unknown Tunnel field",
            t("bt6", json!({"serviceRef": {"name": "web"}, "ports": [80]})),
            Refused(&["unknown field \"spec.ports\""]),
        ),
        case(
            "Tunnel name of 236 characters",
            t(&long(236), json!({"serviceRef": {"name": "web"}})),
            Refused(&["at most 235 characters"]),
        ),
        edit(
            "serviceRef changed",
            t("et1", json!({"serviceRef": {"name": "gone"}})),
            t("et1", json!({"serviceRef": {"name": "other"}})),
            Refused(&["serviceRef is immutable"]),
        ),
        edit(
            "provider set later",
            t("et2", json!({"serviceRef": {"name": "gone"}})),
            t("et2", json!({"serviceRef": {"name": "gone"}, "provider": "local"})),
            Refused(&["provider is immutable"]),
        ),
        edit(
            "region changed",
            t("et3", json!({"serviceRef": {"name": "gone"}, "region": "a"})),
            t("et3", json!({"serviceRef": {"name": "gone"}, "region": "b"})),
            Refused(&["region is immutable"]),
        ),
        edit(
            "size changed",
            t("et4", json!({"serviceRef": {"name": "gone"}, "size": "a"})),
            t("et4", json!({"serviceRef": {"name": "gone"}, "size": "b"})),
            Refused(&["size is immutable"]),
        ),
        edit(
            "address mode changed",
            t("et5", json!({"serviceRef": {"name": "gone"}, "address": {"mode": "Reserved"}})),
            t("et5", json!({"serviceRef": {"name": "gone"}, "address": {"mode": "Ephemeral"}})),
            Refused(&["address is immutable"]),
        ),
        edit(
            "address deletion policy changed",
            t("et6", json!({"serviceRef": {"name": "gone"}, "address": {"mode": "Reserved"}})),
            t(
                "et6",
                json!({"serviceRef": {"name": "gone"}, "address": {"mode": "Reserved", "deletionPolicy": "Retain"}}),
            ),
            Refused(&["address is immutable"]),
        ),
        edit(
            "address set later",
            t("et7", json!({"serviceRef": {"name": "gone"}})),
            t("et7", json!({"serviceRef": {"name": "gone"}, "address": {"mode": "Reserved"}})),
            Refused(&["address is immutable"]),
        ),
        case(
            "unknown address mode",
            t("bt7", json!({"serviceRef": {"name": "web"}, "address": {"mode": "Static"}})),
            Refused(&["spec.address.mode", "Unsupported value"]),
        ),
        case(
            "high availability without a reserved address",
            t("bt8", json!({"serviceRef": {"name": "web"}, "highAvailability": {}})),
            Refused(&["needs address.mode: Reserved"]),
        ),
        case(
            "high availability with an ephemeral address",
            t("bt9", json!({"serviceRef": {"name": "web"}, "address": {}, "highAvailability": {}})),
            Refused(&["needs address.mode: Reserved"]),
        ),
        case(
            "both addresses published and a reserved one",
            t(
                "bt10",
                json!({"serviceRef": {"name": "web"}, "address": {"mode": "Reserved"}, "highAvailability": {"mode": "BothAddresses"}}),
            ),
            Refused(&["mode BothAddresses publishes each exit server's own address"]),
        ),
        edit(
            "high availability turned on later",
            t("et8", json!({"serviceRef": {"name": "gone"}, "address": {"mode": "Reserved"}})),
            t("et8", json!({"serviceRef": {"name": "gone"}, "address": {"mode": "Reserved"}, "highAvailability": {}})),
            Refused(&["highAvailability is immutable"]),
        ),
        case(
            "a pool with an address per Service and one shared address",
            pool("bad-input-own-1", json!({"addressing": "PerService", "address": {"mode": "Reserved"}})),
            Refused(&["address configures the one shared address"]),
        ),
        case(
            "a pool with an address per Service on two exit servers",
            pool("bad-input-own-2", json!({"addressing": "PerService", "highAvailability": {"mode": "BothAddresses"}})),
            Refused(&["BothAddresses is not available with it"]),
        ),
        case(
            "a pool with an address per Service on a pair without the address that marks the active one",
            pool("bad-input-own-4", json!({"addressing": "PerService", "highAvailability": {}})),
            Refused(&["needs address.mode: Reserved"]),
        ),
        edit(
            "a pool's addressing changed",
            pool("bad-input-own-3", json!({})),
            pool("bad-input-own-3", json!({"addressing": "PerService"})),
            Refused(&["addressing is immutable"]),
        ),
        // Services the API server itself refuses.
        case("LoadBalancer Service with 0 ports", lb("s0", json!([])), Refused(&["spec.ports", "Required value"])),
    ]
}

//! The table of reasons: name, kinds, severity, what it means, what to do. A new reason is one
//! more entry here; its name is its string, so an entry is never renamed (tests and alerts
//! compare the strings).

super::reasons! {
    // Any failed reconcile (`crate::Error::reason`): recorded as Ready=False with a Warning Event.
    KubernetesApiError: [Queue, Tunnel] Warning,
        "a call to the Kubernetes API failed",
        "retried with backoff; if it persists, check the API server and skyport's RBAC (the message names the call)";
    InvalidObject: [Queue, Tunnel] Warning,
        "the object lacks its namespace or UID",
        "recreate the object through the API server; nothing is retried until it changes";
    InvalidSpec: [Queue, Tunnel] Warning,
        "the spec (or the Service's annotations, or the credentials Secret) cannot be served as written",
        "fix the field the message names; nothing is retried until the object changes";
    InternalError: [Queue, Tunnel] Warning,
        "skyport failed on its own side (a document it builds, its own configuration); never the spec",
        "retried with backoff; if it persists, report it with the message and skyport's log";
    // The SQS queue's failures (Queue).
    NotFound: [Queue] Warning,
        "the SQS queue of an observe-only Queue (managementPolicy Observe) does not exist",
        "create the queue in SQS (looked at again every resync), or let skyport manage it";
    RecentlyDeleted: [Queue] Warning,
        "SQS refuses the name for 60 s after a queue of that name was deleted",
        "wait: skyport creates the queue when SQS allows it";
    AlreadyExists: [Queue] Warning,
        "an SQS queue of that name exists with other attributes, or is being created by another Queue",
        "choose another spec.queueName, or align the spec with the existing queue";
    InvalidAttribute: [Queue] Warning,
        "SQS refused an attribute of the spec",
        "fix the attribute the message names; nothing is retried until the spec changes";
    AccessDenied: [Queue] Warning,
        "SQS refused the call: the operator's (or the AwsAccount role's) IAM policy does not allow it",
        "grant the action the message names to that role; nothing is retried until the spec changes";
    CredentialsRejected: [Queue] Warning,
        "AWS refused the credentials (expired, unknown, a key being rotated)",
        "fix the operator's AWS credentials; retried at most once per resync";
    AssumeRoleDenied: [Queue] Warning,
        "STS refused to let the operator assume the AwsAccount's role",
        "let the operator's identity assume the role with the external id in the AwsAccount's status";
    Throttled: [Queue] Warning,
        "SQS throttled the call",
        "retried with backoff; lower --sqs-rate if it persists";
    SqsUnavailable: [Queue] Warning,
        "SQS did not answer (network, endpoint, outage)",
        "retried with backoff; check the endpoint and the network path to SQS";
    SqsError: [Queue] Warning,
        "SQS answered with an error skyport does not classify",
        "read the message; retried with backoff";
    // The exit-server provider's failures (Tunnel; on the Service too).
    ProviderRateLimited: [Tunnel, Service] Warning,
        "the cloud provider rate-limited the call",
        "retried after the time the provider asked for; nothing to do unless it persists";
    ProviderUnauthorized: [Tunnel, Service] Warning,
        "the cloud provider refused the credentials or the permission",
        "fix the provider's credentials Secret or the token's permissions; nothing is retried until the Tunnel changes";
    ProviderRejected: [Tunnel, Service] Warning,
        "the cloud provider refused the request as invalid (size, region, image)",
        "fix the size or region the message names; nothing is retried until the Tunnel changes";
    ProviderNotFound: [Tunnel, Service] Warning,
        "the cloud provider does not know something the request names (region, image, network)",
        "fix the name the message gives; nothing is retried until the Tunnel changes";
    ProviderConflict: [Tunnel, Service] Warning,
        "the cloud provider says the object exists already",
        "retried with backoff; if it persists, remove the object the message names at the provider";
    ProviderQuotaExceeded: [Tunnel, Service] Warning,
        "the cloud account's quota is used up (servers, addresses: EC2 allows 5 Elastic IPs per region)",
        "raise the quota at the provider or free some of it; retried with backoff";
    ProviderUnavailable: [Tunnel, Service] Warning,
        "the cloud provider did not answer, or answered with a server error",
        "retried with backoff; check the provider's status page and the network path";
    HostBudgetSpent: [Tunnel] Warning,
        "the Tunnel (or a highly available pair's slot) created --tunnel-max-hosts-per-day exit servers in the last 24 hours, or the operator created --tunnel-max-hosts-per-hour for all Tunnels in the last hour",
        "find why exit servers do not last, or which Tunnels are deleted and made again (the Tunnels' earlier Events, the provider's console); skyport creates the next when the budget named in the message has room again";
    ProviderNoDefaultVpc: [Tunnel, Service] Warning,
        "the EC2 region has no default VPC to put the exit server in",
        "create a default VPC in that region, or choose another region";
    ProviderNotConfigured: [Tunnel, Service] Warning,
        "the Tunnel names no provider skyport has credentials for (or none, and skyport runs without --provider)",
        "configure the provider's credentials in skyport, or name a configured provider";
    ArtifactUnavailable: [Tunnel, Service] Warning,
        "skyport could not fetch the exit-server binary from --exit-server-url to check it",
        "make the URL serve this release's binary; retried with backoff";
    ArtifactDigestMismatch: [Tunnel, Service] Warning,
        "the exit-server binary at --exit-server-url is not this operator release's, so exit servers would refuse it",
        "make the URL serve this exact release's binary; retried with backoff";
    // A Tunnel's own progress and problems.
    ServiceNotFound: [Tunnel] Warning,
        "the Service the Tunnel serves does not exist",
        "create the Service, or delete the Tunnel";
    ServiceNotServed: [Tunnel] Warning,
        "the Service is not one skyport serves (not a LoadBalancer, another class, not annotated under --annotated-only)",
        "make the Service one skyport serves, or delete the Tunnel";
    PoolNotFound: [Tunnel] Warning,
        "the ExitServerPool the Tunnel names (spec.pool, the Service's skyport.dev/exit-server-pool annotation) does not exist",
        "create the pool, or name an existing one; the Tunnel waits for it";
    PoolNotAllowed: [Tunnel] Warning,
        "the ExitServerPool the Tunnel names does not allow its namespace (the pool's spec.allowedNamespaces)",
        "ask the platform team to allow the namespace, or use another pool or an exit server of its own";
    PoolRefused: [Tunnel] Warning,
        "the ExitServerPool's shared server cannot carry the Service as it asks: a port another Service serves there, a port in the pool's health-check range, or a full pool (no health port left, or as many addresses of their own as the server's size can hold)",
        "choose other ports, or another pool; what the Service already carried stays";
    PoolAddressingUnavailable: [Tunnel] Warning,
        "the ExitServerPool asks for an address per Service (spec.addressing: PerService) on a provider whose servers take one public address (DigitalOcean), or on a pair whose servers would share one machine (local) or bind private addresses of their own (EC2), or with highAvailability mode BothAddresses",
        "use addressing: Shared on that provider, leave highAvailability out (EC2, local), a pool on a provider that takes several and moves them (Hetzner Cloud), or mode ActiveStandby; nothing was bought";
    NotAPoolServer: [Tunnel] Warning,
        "a Tunnel without spec.serviceRef runs an ExitServerPool's shared server, which only skyport makes, in its own namespace and controlled by the pool",
        "name the Service to expose in spec.serviceRef";
    InvalidService: [Tunnel, Service] Warning,
        "the Service's ports cannot be tunnelled (SCTP, none, the tunnel's control or health port, a UDP port with the PROXY protocol)",
        "change the Service's ports, or remove the skyport.dev/proxy-protocol annotation the message names";
    InvalidSourceRanges: [Tunnel, Service] Warning,
        "the source ranges (spec.sourceRanges, the Service's loadBalancerSourceRanges) are not CIDRs",
        "fix the ranges; nothing is retried until they change";
    NotAllowed: [Tunnel, Service] Warning,
        "the size or region is not on the operator's allow-lists; no exit server was created",
        "choose an allowed size or region, or ask the platform team to allow it (--tunnel-allowed-sizes, -regions)";
    HighAvailabilityUnavailable: [Tunnel] Warning,
        "highAvailability (ActiveStandby) was asked for, but the provider cannot move an address between servers",
        "use another provider, highAvailability.mode BothAddresses, or no highAvailability";
    Provisioning: [Tunnel] Normal,
        "the exit server is being created or booting",
        "nothing: wait; past --tunnel-boot-timeout the side at fault becomes the reason";
    WaitingForTunnel: [Tunnel] Normal,
        "the exit server runs; the end-to-end check through the tunnel does not pass yet",
        "nothing while it boots; the message has the check's error";
    ClientNotAvailable: [Tunnel, Service] Warning,
        "the exit server answers, but the client Deployment has no available replica",
        "look at the client's pods (kubectl describe); the exit server is never replaced for this";
    ExitServerUnreachable: [Tunnel, Service] Warning,
        "the exit server does not accept connections on its control port",
        "check the provider's console and firewalls; the exit server is replaced after --tunnel-replace-after";
    ExitServerArtifactRefused: [Tunnel, Service] Warning,
        "the exit server's install refused the binary (download failed, digest mismatch, architecture)",
        "fix --exit-server-url, then delete the Tunnel; a new exit server would refuse it too";
    ExitServerNotStarted: [Tunnel, Service] Warning,
        "the binary was installed, but the exit server did not start (the failed step is in the message)",
        "read the VM's console; the exit server is replaced after --tunnel-replace-after";
    TunnelNotEstablished: [Tunnel, Service] Warning,
        "the exit server answers and the client runs, but the tunnel is not through",
        "check the cluster's egress to the exit server's control port; replaced after --tunnel-replace-after";
    Replacing: [Tunnel] Normal,
        "the exit server is being replaced (unhealthy, lost its address, or its ports cannot be changed in place)",
        "nothing; the message says why";
    ExitServerLost: [Tunnel] Warning,
        "the exit server recorded in status is gone at the provider",
        "nothing: a new one is provisioned; find out at the provider who deleted it";
    Failover: [Tunnel, Service] Warning,
        "a highly available Tunnel moved its reserved address to the other exit server",
        "nothing for traffic; look at why the old server failed (the message)";
    Handover: [Tunnel] Normal,
        "a highly available Tunnel's clients are rolled one at a time",
        "nothing";
    ClientRollHalted: [Tunnel] Warning,
        "a highly available Tunnel's client roll has waited 10 minutes for one server's new client to roll out or pass its check (an image that cannot be pulled, a config its server refuses)",
        "fix what the message says the new client waits for (its Deployment's Pods and Events); the other server keeps serving with its previous client meanwhile";
    AddressWithdrawn: [Tunnel] Warning,
        "an exit server's address left the Service (its check failed, or its client restarts)",
        "nothing while the other server serves; the message says why";
    AddressLost: [Tunnel] Warning,
        "the reserved address recorded in status is gone at the provider",
        "nothing: a new one is reserved, and the Service's address changes; find out who released it";
    AddressReserved: [Tunnel] Normal,
        "a reserved address was reserved at the provider",
        "nothing";
    AddressAssigned: [Tunnel] Normal,
        "the reserved address was put on the exit server",
        "nothing";
    AddressAdopted: [Tunnel] Normal,
        "a reserved address made by a reservation whose answer was lost (the operator stopped) was found and recorded",
        "nothing";
    AddressUnproven: [Tunnel] Warning,
        "a reservation's answer was lost and the reserved addresses that appeared since cannot be proven skyport's",
        "the operator's log names the addresses (not the Event: they may be another tenant's); release at the provider those that are nobody's; skyport leaves them alone";
    AddressTakenOver: [Tunnel] Normal,
        "a reserved address kept by the Service's previous Tunnel became this Tunnel's",
        "nothing";
    AddressNotHandedOver: [Tunnel] Warning,
        "the reserved address the Service names (skyport.dev/reserved-address) cannot be taken: not found in this namespace and cluster, not kept with deletionPolicy Retain, or still held by a live Tunnel",
        "name an address that a deleted Tunnel of this namespace kept with deletionPolicy Retain (its id or IP, from that Tunnel's AddressRetained Event), or delete the Tunnel that still holds it; retried with backoff";
    AddressRetained: [Tunnel] Normal,
        "the deleted Tunnel's reserved address was kept (deletionPolicy Retain)",
        "release it at the provider when no longer needed";
    AddressKept: [Tunnel] Normal,
        "the deleted Tunnel's reserved address was kept for the Service's next Tunnel",
        "nothing; delete the Service, or change its type or class, to release it";
    AddressReleased: [Tunnel] Normal,
        "the deleted Tunnel's reserved address was released",
        "nothing";
    PortsChanged: [Tunnel] Normal,
        "the exit server was reconfigured for the Service's new ports",
        "nothing";
    SourceRangesChanged: [Tunnel, Service] Normal,
        "the exit server admits the Service's ports from new source ranges",
        "nothing";
    Active: [Tunnel] Ready,
        "the tunnel is through and the Service has its address",
        "nothing";
    // Queues: names, ownership, dead letters, exports, accounts.
    QueueNameReserved: [Queue] Warning,
        "spec.queueName has another namespace's default form, or the platform granted it to other namespaces",
        "choose another spec.queueName";
    AdoptionNotAllowed: [Queue] Warning,
        "the SQS queue exists, was not created by skyport, and this namespace was not granted its name",
        "ask the platform team for --queue-name-grant, or choose another spec.queueName";
    OwnedByAnotherQueue: [Queue] Warning,
        "the SQS queue belongs to another Queue of this namespace",
        "choose another spec.queueName, or delete the other Queue";
    OwnedByAnotherNamespace: [Queue] Warning,
        "the SQS queue belongs to a Queue of another namespace",
        "choose another spec.queueName";
    OwnedByAnotherCluster: [Queue] Warning,
        "the SQS queue belongs to another cluster sharing the AWS account (or has no cluster tag)",
        "choose another spec.queueName, or tag the queue with this cluster's id if it is this cluster's";
    DeadLetterQueueNotReady: [Queue] Warning,
        "the Queue named in deadLetter.queueRef is not Ready (or does not exist)",
        "make that Queue Ready; this Queue looks again when it is";
    InvalidDeadLetterQueue: [Queue] Warning,
        "the dead-letter queue does not suit this Queue (FIFO and standard mixed)",
        "point deadLetter at a queue of the same type";
    DeadLetterCycle: [Queue] Warning,
        "the dead-letter references form a cycle (A to B to A)",
        "remove deadLetter from one of the Queues";
    DeadLetterQueueNotFound: [Queue] Warning,
        "the dead-letter target does not exist in this Queue's account",
        "create it first; looked at again every resync";
    DeadLetterNotAllowed: [Queue] Warning,
        "the dead-letter target is not this namespace's queue, or not beside this queue",
        "point deadLetter at a Queue of this namespace (deadLetter.queueRef)";
    ConfigMapConflict: [Queue] Warning,
        "the ConfigMap `<name>-sqs` exists and is not this Queue's",
        "delete or rename that ConfigMap; the queue itself is fine";
    ExportConflict: [Queue] Warning,
        "an export's name is held by an object this Queue does not own (or a Secret export was replaced)",
        "delete that object or rename the export; the queue and the other exports are fine";
    AccountNotFound: [Queue] Warning,
        "spec.accountRef names an AwsAccount of this namespace that does not exist",
        "create the AwsAccount or fix spec.accountRef; the Queue looks again when it appears";
    AccountNotAllowed: [Queue] Warning,
        "the AwsAccount of another namespace does not exist or does not allow this namespace",
        "ask its owners to add this namespace to spec.allowedNamespaces, or use one of this namespace";
    AccountDeleting: [Queue] Warning,
        "the AwsAccount is being deleted and serves only the cleanup of its Queues",
        "use another AwsAccount";
    AccountChanged: [Queue] Warning,
        "the AwsAccount now names another role, region or endpoint than the queue was created in",
        "restore the AwsAccount, or delete this Queue and create a new one";
    InsecureEndpoint: [Queue, AwsAccount] Warning,
        "the AwsAccount's SQS endpoint is not https:// and the operator does not allow http://",
        "use an https:// endpoint (or run the operator with --allow-http-account-endpoints)";
    Adopted: [Queue] Normal,
        "an existing SQS queue became this Queue's",
        "nothing";
    Created: [Queue] Normal,
        "the SQS queue was created",
        "nothing";
    Recreated: [Queue] Normal,
        "the SQS queue was gone and was created again",
        "nothing; find out who deleted it";
    Updated: [Queue] Normal,
        "the SQS queue's attributes or tags were changed to the spec",
        "nothing";
    ExportDeleted: [Queue] Normal,
        "an export removed from the spec was deleted",
        "nothing";
    ConfigMapDeleted: [Queue] Normal,
        "the ConfigMap `<name>-sqs` was deleted because `spec.configMap` is `Skip`",
        "nothing; set `spec.configMap: Write` to have it again";
    NothingCreated: [Queue] Normal,
        "a deleted Queue whose role STS refused never created a queue: nothing to delete",
        "nothing";
    NotDeleted: [Queue] Warning,
        "a deleted Queue names an AwsAccount this namespace may not use now: its queue was not looked for",
        "delete the SQS queue by hand if it exists";
    NotOwned: [Queue] Normal,
        "a deleted Queue's SQS queue belongs to someone else now and was left",
        "nothing";
    Retained: [Queue] Normal,
        "a deleted Queue's SQS queue was kept (deletionPolicy Retain, or adopted)",
        "delete the SQS queue by hand when no longer needed";
    Available: [Queue] Ready,
        "the SQS queue exists and matches the spec",
        "nothing";
    ReconcileSuccess: [Queue] Ready,
        "the last reconcile applied the spec (the Synced condition)",
        "nothing";
    // Shared by kinds.
    Deleting: [Tunnel, AwsAccount] Normal,
        "the object is being deleted: its exit server, or the Queues still using the account, first",
        "nothing: wait";
    Deleted: [Queue, Tunnel] Normal,
        "the cloud resource (SQS queue, exit server) was deleted",
        "nothing";
    Usable: [AwsAccount] Ready,
        "Queues can use the account: they assume its role with the external id in status",
        "nothing";
    // The Service controller.
    InvalidAnnotation: [Service] Warning,
        "a skyport.dev annotation on the Service cannot be read; no Tunnel is made, or the existing one keeps its spec",
        "fix the annotation the message names";
    ProxyProtocolChanged: [Service] Normal,
        "the Service's skyport.dev/proxy-protocol annotation reached its Tunnel, which pushes it to the exit server",
        "nothing";
    TunnelCreated: [Service] Normal,
        "the Service's Tunnel was created",
        "nothing";
    TunnelDeleted: [Service] Normal,
        "the Service's Tunnel was deleted: the Service is no longer served",
        "nothing";
}

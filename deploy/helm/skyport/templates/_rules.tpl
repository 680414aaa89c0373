{{/* The rules of the controllers in the namespaces they watch (same as deploy/rbac.yaml). */}}
{{- define "skyport.rules" }}
  # Queue controller: watch Queues, add and remove its finalizer, write status; get the Queue
  # an SQS owner tag names, to refuse adopting a queue another live Queue owns, and a Queue
  # itself before creating its queue from the cache's copy (which may be behind).
  - apiGroups: ["skyport.dev"]
    resources: ["queues"]
    verbs: ["get", "list", "watch", "patch"]
  - apiGroups: ["skyport.dev"]
    resources: ["queues/status"]
    verbs: ["patch"]
  # AwsAccounts (the IAM role and region of a Queue's spec.accountRef), watched: a change wakes
  # the Queues that use it. Patched only for the finalizer that keeps one while Queues use it
  # (their cleanup needs its role; get reads the account again when that patch meets a newer
  # copy), and status for the external id skyport derives.
  - apiGroups: ["skyport.dev"]
    resources: ["awsaccounts"]
    verbs: ["get", "list", "watch", "patch"]
  - apiGroups: ["skyport.dev"]
    resources: ["awsaccounts/status"]
    verbs: ["patch"]
  # The ConfigMaps each Queue owns (`<name>-sqs` and spec.exports; created, then server-side
  # apply), watched by label; get only to tell a ConfigMap of the same name that skyport does not
  # own, which it never writes; delete for an export removed from a Queue's spec (only one the
  # Queue controls, by UID precondition; the admission policy allows only Queue-owned ones).
  - apiGroups: [""]
    resources: ["configmaps"]
    verbs: ["get", "list", "watch", "create", "patch", "delete"]
  # Tunnel controller: watch Tunnels, add and remove its finalizer, write status. The Service
  # controller creates the Tunnel of each LoadBalancer Service it serves and deletes it when the
  # Service opts out.
  - apiGroups: ["skyport.dev"]
    resources: ["tunnels"]
    verbs: ["list", "watch", "patch", "create", "delete"]
  - apiGroups: ["skyport.dev"]
    resources: ["tunnels/status"]
    verbs: ["patch"]
  # Services are watched; only their status.loadBalancer.ingress is ever written.
  - apiGroups: [""]
    resources: ["services"]
    verbs: ["list", "watch"]
  - apiGroups: [""]
    resources: ["services/status"]
    verbs: ["patch"]
  # Queue Secret exports (spec.exports): created, then only replaced as a whole (`update`, with
  # the UID recorded at creation, which the API server checks) and deleted when removed from the
  # spec (UID precondition). Never get, list, watch or patch: a JSON patch is a read (one that
  # copies a value into the name is answered with the value, before any admission policy runs),
  # while an update's answer is the caller's own object, and the admission policy refuses updates
  # and deletes of Secrets no Queue controls. (Tunnel clients and their credentials live in the
  # tunnel clients' namespace only: see the Role skyport-tunnel-clients.)
  - apiGroups: [""]
    resources: ["secrets"]
    verbs: ["create", "update", "delete"]
  # Events on the objects skyport manages: created, and a repeat replaces the first whole
  # (update). No patch: a JSON patch is a read of any Event (its note copied into the name comes
  # back in the error, before admission); an update's answer is the object sent.
  - apiGroups: ["events.k8s.io"]
    resources: ["events"]
    verbs: ["create", "update"]
{{- end }}

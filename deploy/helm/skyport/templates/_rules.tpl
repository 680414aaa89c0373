{{/* The rules of the controllers in the namespaces they watch (same as deploy/rbac.yaml). */}}
{{- define "skyport.rules" }}
  # Queue controller: watch Queues, add and remove its finalizer, write status; get the Queue
  # an SQS owner tag names, to refuse adopting a queue another live Queue owns.
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
  # Queue Secret exports (spec.exports): created, updated, and deleted when removed from the spec.
  # Never get, list or watch: a Secret is read back only as the answer to a patch whose tests
  # prove skyport's object controls it, and the admission policy refuses any write to a Secret
  # that none does, so no other Secret can be read. (Tunnel clients and their credentials live
  # in the operator's namespace only: see the Role skyport-tunnel-clients.)
  - apiGroups: [""]
    resources: ["secrets"]
    verbs: ["create", "patch", "delete"]
  # Events on the objects skyport manages.
  - apiGroups: ["events.k8s.io"]
    resources: ["events"]
    verbs: ["create", "patch"]
{{- end }}

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
  # (their cleanup needs its role), and status for the external id skyport derives.
  - apiGroups: ["skyport.dev"]
    resources: ["awsaccounts"]
    verbs: ["list", "watch", "patch"]
  - apiGroups: ["skyport.dev"]
    resources: ["awsaccounts/status"]
    verbs: ["patch"]
  # The ConfigMaps each Queue owns (`<name>-sqs` and spec.exports; created, then server-side
  # apply), watched by label; get only to tell a ConfigMap of the same name that skyport does not
  # own, which it never writes; delete for an export removed from a Queue's spec (only one the
  # Queue controls, by UID precondition; the admission policy allows only labelled ones).
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
  # Each Tunnel's credentials Secret: created once, client config written by server-side apply.
  # Queue Secret exports (spec.exports): read by name, created, applied, and deleted when removed
  # from the spec. Never list or watch: that would read every Secret in scope.
  - apiGroups: [""]
    resources: ["secrets"]
    verbs: ["get", "create", "patch", "delete"]
  # Each Tunnel's client Deployment (server-side apply), watched by label.
  - apiGroups: ["apps"]
    resources: ["deployments"]
    verbs: ["get", "list", "watch", "create", "patch"]
  # Events on the objects skyport manages.
  - apiGroups: ["events.k8s.io"]
    resources: ["events"]
    verbs: ["create", "patch"]
{{- end }}

//! Which AWS identity and region a Queue's SQS calls use: the operator's own (no
//! `spec.accountRef`), or the IAM role of an [`AwsAccount`] the Queue may use.
//!
//! One SQS client per AwsAccount, rebuilt when its spec changes; one rate-limit budget per AWS
//! account and region (SQS quotas are per account), shared by every AwsAccount naming it. A
//! Queue keeps the account it was created in: the role, region and endpoint are recorded in its
//! status, and a Queue whose AwsAccount now points elsewhere is refused (`AccountChanged`) rather
//! than moved. Cleanup looks for the queue only through what the AwsAccount names now (status is
//! not the Queue owner's alone to write; the owner tag decides what is deleted). The external id
//! and session name are derived from the cluster and the AwsAccount's namespace ([`external_id`],
//! [`session_name`]), never read from the spec.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use providers::{AssumeRole, Limiter, QueueBackend, SqsProvider, SqsSettings};

use crate::crd::account::{AccountRef, AwsAccount, AwsAccountSpec, account_id, external_id, session_name};
use crate::crd::queue::Queue;
use crate::reasons::Reason;

/// `status.account` of a Queue using the operator's own identity.
pub const DEFAULT_ACCOUNT: &str = "default";

/// One SQS budget: (AWS account id, region), or ([`DEFAULT_ACCOUNT`], its region) for the
/// operator's own identity.
pub type Budget = (String, String);

/// The budget of the AWS account and region `spec` names.
pub fn budget_key(spec: &AwsAccountSpec) -> Budget {
    (account_id(&spec.role_arn).unwrap_or(&spec.role_arn).to_string(), spec.region.clone())
}

/// The budget of the operator's own identity, whose client is `default`.
pub fn default_budget(default: &dyn QueueBackend) -> Budget {
    (DEFAULT_ACCOUNT.into(), default.region().unwrap_or_default())
}

/// Where a Queue's calls go.
#[derive(Clone)]
pub struct Placement {
    pub sqs: Arc<dyn QueueBackend>,
    /// `status.account`: the AwsAccount (`name`, or `namespace/name` from elsewhere) or `default`.
    pub account: String,
    pub region: Option<String>,
    /// The assumed role; `None` for the operator's own identity.
    pub role_arn: Option<String>,
    /// The AwsAccount's own SQS endpoint, if it names one.
    pub endpoint_url: Option<String>,
    /// The AwsAccount used, which must keep its finalizer while this Queue exists.
    pub holder: Option<Arc<AwsAccount>>,
    /// The budget its calls spend.
    pub budget: Budget,
}

/// Why a Queue cannot use the account it names: (reason, message).
pub type Refusal = (Reason, String);

/// The per-account clients and budgets.
pub struct Accounts {
    pub store: Store<AwsAccount>,
    settings: SqsSettings,
    /// This cluster's id, part of every external id.
    cluster: String,
    clients: Mutex<HashMap<String, (AwsAccountSpec, Arc<SqsProvider>)>>,
    budgets: Mutex<HashMap<(String, String), Arc<Limiter>>>,
}

/// Whether a Queue in `queue_ns` may use `account` (found or not) through `r` (pure). An
/// AwsAccount of another namespace that is missing and one that does not allow `queue_ns` are
/// refused alike (`AccountNotAllowed`, one message): a tenant learns nothing about which names
/// exist in namespaces it cannot read.
pub fn check(queue_ns: &str, r: &AccountRef, account: Option<&AwsAccount>) -> Result<(), Refusal> {
    let (ns, name) = r.target(queue_ns);
    if ns != queue_ns && !account.is_some_and(|a| a.spec.allowed_namespaces.iter().any(|n| n == queue_ns)) {
        return Err((
            Reason::AccountNotAllowed,
            format!(
                "AwsAccount {ns}/{name} does not exist or does not allow Queues of namespace {queue_ns}: its owners can add {queue_ns} to its spec.allowedNamespaces, or use an AwsAccount of this namespace (the Queue is looked at again when that AwsAccount changes)"
            ),
        ));
    }
    if account.is_none() {
        return Err((
            Reason::AccountNotFound,
            format!(
                "AwsAccount {ns}/{name} does not exist; create it or fix spec.accountRef (the Queue is looked at again when it appears)"
            ),
        ));
    }
    Ok(())
}

/// Why no Queue may use `account` now, whoever asks (pure); the account's own status says the same.
pub fn unusable(account: &AwsAccount, allow_http: bool) -> Option<Refusal> {
    let name = account.metadata.name.as_deref().unwrap_or_default();
    insecure(account, allow_http).or_else(|| {
        account.metadata.deletion_timestamp.is_some().then(|| {
            (
                Reason::AccountDeleting,
                format!(
                    "AwsAccount {name} is being deleted: it serves only the cleanup of the Queues that used it; use another AwsAccount"
                ),
            )
        })
    })
}

/// An `http://` endpoint the operator does not allow (pure): refused even for cleanups.
fn insecure(account: &AwsAccount, allow_http: bool) -> Option<Refusal> {
    let name = account.metadata.name.as_deref().unwrap_or_default();
    let endpoint = account.spec.endpoint_url.as_deref()?;
    (!allow_http && !endpoint.starts_with("https://")).then(|| {
        (
            Reason::InsecureEndpoint,
            format!(
                "AwsAccount {name} names the SQS endpoint {endpoint}, which is not https://: requests signed with the role's session token would cross the network in clear; use an https:// endpoint (the operator allows http:// only with --allow-http-account-endpoints)"
            ),
        )
    })
}

/// A Queue created under one role, region or endpoint whose AwsAccount now says another (pure).
pub fn moved(queue: &Queue, spec: &AwsAccountSpec) -> Option<Refusal> {
    let status = queue.status.as_ref()?;
    let (role, region) = (status.role_arn.as_deref().map(String::as_str)?, status.region.as_deref()?);
    let endpoint = status.endpoint_url.as_deref().map(String::as_str);
    let changed = role != spec.role_arn || region != spec.region || endpoint != spec.endpoint_url.as_deref();
    let at = |e: Option<&str>| e.map(|e| format!(" at {e}")).unwrap_or_default();
    changed.then(|| {
        (
            Reason::AccountChanged,
            format!(
                "the SQS queue lives in {region} as {role}{}, but the AwsAccount now says {} as {}{}; skyport does not move queues: restore the AwsAccount (deleting this Queue then deletes its queue), or delete this Queue and create a new one; skyport deletes only through what the AwsAccount names now, so a queue in a role or region it no longer names is left for you to delete",
                at(endpoint),
                spec.region,
                spec.role_arn,
                at(spec.endpoint_url.as_deref())
            ),
        )
    })
}

impl Accounts {
    pub fn new(store: Store<AwsAccount>, settings: SqsSettings) -> Self {
        let (clients, budgets) = (Mutex::default(), Mutex::default());
        Accounts { store, settings, cluster: String::new(), clients, budgets }
    }

    /// In the cluster `cluster`.
    pub fn within(self, cluster: String) -> Self {
        Accounts { cluster, ..self }
    }

    /// The external id AwsAccounts of `namespace` send.
    pub fn external_id(&self, namespace: &str) -> String {
        external_id(&self.cluster, namespace)
    }

    /// Whether AwsAccounts may name `http://` SQS endpoints.
    pub fn allow_http(&self) -> bool {
        self.settings.allow_http_endpoints
    }

    /// The budgets every (account, region) gets.
    pub fn settings(&self) -> &SqsSettings {
        &self.settings
    }

    /// Whether the AwsAccount cache has listed once (Queues with an accountRef wait for it).
    pub fn synced(&self) -> bool {
        crate::controllers::has_synced(&self.store)
    }

    fn get(&self, queue_ns: &str, r: &AccountRef) -> Option<Arc<AwsAccount>> {
        let (ns, name) = r.target(queue_ns);
        self.store.get(&ObjectRef::new(name).within(ns))
    }

    /// The AwsAccount `queue` names and may use, from the cache.
    pub fn account_of(&self, queue: &Queue) -> Option<Arc<AwsAccount>> {
        let r = queue.spec.account_ref.as_ref()?;
        let queue_ns = queue.metadata.namespace.as_deref().unwrap_or_default();
        self.get(queue_ns, r).filter(|a| check(queue_ns, r, Some(a)).is_ok())
    }

    /// Where `queue`'s calls go now, or why they cannot.
    pub async fn place(&self, queue: &Queue, default: &Arc<dyn QueueBackend>) -> Result<Placement, Refusal> {
        let Some(r) = &queue.spec.account_ref else { return Ok(own(default)) };
        let queue_ns = queue.namespace().unwrap_or_default();
        crate::controllers::store_synced(&self.store).await;
        let account = self.get(&queue_ns, r);
        if let Err(refusal) = check(&queue_ns, r, account.as_deref()) {
            // The tenant's message does not say which; the operator's log may.
            tracing::debug!(account = %r.name, found = account.is_some(), "AwsAccount refused to this Queue");
            return Err(refusal);
        }
        let Some(account) = account else { unreachable!("check refuses a missing account") };
        if let Some(refusal) = unusable(&account, self.allow_http()) {
            return Err(refusal);
        }
        if let Some(refusal) = moved(queue, &account.spec) {
            return Err(refusal);
        }
        let account_ns = account.namespace().unwrap_or_default();
        let key = format!("{account_ns}/{}", account.name_any());
        let sqs = self.client(&key, &account_ns, &account.spec).await;
        let shown = if account_ns == queue_ns { r.name.clone() } else { key };
        Ok(Placement {
            sqs,
            account: shown,
            region: Some(account.spec.region.clone()),
            role_arn: Some(account.spec.role_arn.clone()),
            endpoint_url: account.spec.endpoint_url.clone(),
            budget: budget_key(&account.spec),
            holder: Some(account),
        })
    }

    /// Where `queue`'s SQS queue is looked for, and deleted if its owner tag names the Queue: the
    /// operator's own identity without an accountRef, else the AwsAccount it names, as that
    /// AwsAccount is now, if this namespace may use it (also while it is being deleted). Never
    /// the role, region or endpoint recorded in status: whoever may write the Queue's status
    /// (`queues/status`) would choose them, and the cleanup would assume a role, or send signed
    /// requests to an endpoint, that no AwsAccount this namespace may use names. `Err`: why there
    /// is nowhere to look (the queue, if any, is left).
    pub async fn for_cleanup(
        &self,
        queue: &Queue,
        default: &Arc<dyn QueueBackend>,
    ) -> Result<Arc<dyn QueueBackend>, String> {
        let Some(r) = &queue.spec.account_ref else { return Ok(default.clone()) };
        let ns = queue.namespace().unwrap_or_default();
        crate::controllers::store_synced(&self.store).await;
        let account = self.get(&ns, r);
        if let Err((_, why)) = check(&ns, r, account.as_deref()) {
            return Err(why);
        }
        let Some(account) = account else { unreachable!("check refuses a missing account") };
        if let Some((_, why)) = insecure(&account, self.allow_http()) {
            return Err(why);
        }
        let account_ns = account.namespace().unwrap_or_default();
        let key = format!("{account_ns}/{}", account.name_any());
        Ok(self.client(&key, &account_ns, &account.spec).await)
    }

    /// The client for the AwsAccount `key` of `namespace` with `spec`, built again when the spec
    /// changed.
    async fn client(&self, key: &str, namespace: &str, spec: &AwsAccountSpec) -> Arc<dyn QueueBackend> {
        if let Some((seen, client)) = self.clients.lock().unwrap_or_else(|p| p.into_inner()).get(key)
            && seen == spec
        {
            return client.clone();
        }
        let budget = self.budget(spec);
        let role = AssumeRole {
            role_arn: spec.role_arn.clone(),
            external_id: self.external_id(namespace),
            session_name: session_name(namespace),
            region: spec.region.clone(),
            endpoint_url: spec.endpoint_url.clone(),
        };
        let client = Arc::new(SqsProvider::assuming(&self.settings, &role, budget).await);
        self.clients.lock().unwrap_or_else(|p| p.into_inner()).insert(key.to_string(), (spec.clone(), client.clone()));
        client
    }

    /// The budget of the AWS account and region `spec` names, made like the default SQS budget.
    fn budget(&self, spec: &AwsAccountSpec) -> Arc<Limiter> {
        let mut budgets = self.budgets.lock().unwrap_or_else(|p| p.into_inner());
        budgets.entry(budget_key(spec)).or_insert_with(|| Arc::new(self.settings.limiter())).clone()
    }

    /// The limiter of `budget`: the one its clients share, or one like it before any client
    /// was built (only its rates are read then).
    pub fn limiter_of(&self, budget: &Budget) -> Arc<Limiter> {
        let budgets = self.budgets.lock().unwrap_or_else(|p| p.into_inner());
        budgets.get(budget).cloned().unwrap_or_else(|| Arc::new(self.settings.limiter()))
    }

    /// The calls made per (account, region) budget, for tests and metrics.
    pub fn budgets(&self) -> Vec<((String, String), Arc<Limiter>)> {
        let budgets = self.budgets.lock().unwrap_or_else(|p| p.into_inner());
        budgets.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

fn own(default: &Arc<dyn QueueBackend>) -> Placement {
    Placement {
        sqs: default.clone(),
        account: DEFAULT_ACCOUNT.into(),
        region: default.region(),
        role_arn: None,
        endpoint_url: None,
        holder: None,
        budget: default_budget(&**default),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::queue::{QueueSpec, QueueStatus};

    fn account(ns: &str, allowed: &[&str]) -> AwsAccount {
        let mut a = AwsAccount::new(
            "team",
            AwsAccountSpec {
                role_arn: "arn:aws:iam::000000000002:role/team".into(),
                region: "eu-west-1".into(),
                allowed_namespaces: allowed.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            },
        );
        a.metadata.namespace = Some(ns.into());
        a
    }

    fn reference(ns: Option<&str>) -> AccountRef {
        AccountRef { name: "team".into(), namespace: ns.map(Into::into) }
    }

    #[test]
    fn an_account_serves_its_own_namespace_and_the_ones_it_allows() {
        assert_eq!(check("a", &reference(None), Some(&account("a", &[]))), Ok(()));
        let refused = check("b", &reference(Some("a")), Some(&account("a", &[]))).unwrap_err();
        assert_eq!(refused.0, "AccountNotAllowed");
        assert!(refused.1.contains("allowedNamespaces"), "{}", refused.1);
        assert_eq!(check("b", &reference(Some("a")), Some(&account("a", &["b"]))), Ok(()));
        let missing = check("b", &reference(None), None).unwrap_err();
        assert_eq!(missing.0, "AccountNotFound", "its own namespace: nothing to hide");
        assert!(missing.1.contains("b/team"), "{}", missing.1);
    }

    #[test]
    fn another_namespaces_missing_and_forbidden_accounts_read_the_same() {
        let forbidden = check("b", &reference(Some("a")), Some(&account("a", &["c"]))).unwrap_err();
        let missing = check("b", &reference(Some("a")), None).unwrap_err();
        assert_eq!(forbidden, missing, "one reason, one message: whether a/team exists stays unknown");
    }

    #[test]
    fn a_queue_stays_in_the_account_it_was_created_in() {
        let mut q = Queue::new("q", QueueSpec::default());
        let spec = account("a", &[]).spec;
        assert_eq!(moved(&q, &spec), None, "nothing recorded yet");
        q.status = Some(QueueStatus {
            role_arn: Some(Box::new(spec.role_arn.clone())),
            region: Some("eu-west-1".into()),
            ..Default::default()
        });
        assert_eq!(moved(&q, &spec), None);
        let elsewhere = AwsAccountSpec { region: "us-east-2".into(), ..spec.clone() };
        assert_eq!(moved(&q, &elsewhere).map(|r| r.0.as_str()), Some("AccountChanged"));
        let other_role = AwsAccountSpec { role_arn: "arn:aws:iam::000000000003:role/x".into(), ..spec.clone() };
        assert_eq!(moved(&q, &other_role).map(|r| r.0.as_str()), Some("AccountChanged"));
        let other_endpoint = AwsAccountSpec { endpoint_url: Some("https://sqs.example".into()), ..spec };
        let refused = moved(&q, &other_endpoint).expect("a new endpoint is a move");
        assert!(refused.1.contains("https://sqs.example"), "{}", refused.1);
    }

    #[test]
    fn plain_http_endpoints_and_deleting_accounts_are_refused() {
        let mut a = account("a", &[]);
        a.spec.endpoint_url = Some("http://10.0.0.1:4566".into());
        let refused = unusable(&a, false).expect("refused");
        assert_eq!(refused.0, "InsecureEndpoint");
        assert!(refused.1.contains("--allow-http-account-endpoints"), "{}", refused.1);
        assert_eq!(unusable(&a, true), None);
        a.spec.endpoint_url = Some("https://sqs.vpce.example".into());
        assert_eq!(unusable(&a, false), None);
        a.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()));
        assert_eq!(unusable(&a, false).map(|r| r.0.as_str()), Some("AccountDeleting"));
    }
}

//! Which AWS identity and region a Queue's SQS calls use: the operator's own (no
//! `spec.accountRef`), or the IAM role of an [`AwsAccount`] the Queue may use.
//!
//! One SQS client per AwsAccount, rebuilt when its spec changes; one rate-limit budget per AWS
//! account and region (SQS quotas are per account), shared by every AwsAccount naming it. A
//! Queue keeps the account it was created in: the role and region are recorded in its status,
//! a Queue whose AwsAccount now points elsewhere is refused (`AccountChanged`) rather than
//! moved, and cleanup deletes in the recorded account.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use providers::{AssumeRole, Limiter, QueueBackend, SqsProvider, SqsSettings};

use crate::crd::account::{AccountRef, AwsAccount, AwsAccountSpec, account_id};
use crate::crd::queue::Queue;

/// `status.account` of a Queue using the operator's own identity.
pub const DEFAULT_ACCOUNT: &str = "default";

/// Where a Queue's calls go.
#[derive(Clone)]
pub struct Placement {
    pub sqs: Arc<dyn QueueBackend>,
    /// `status.account`: the AwsAccount (`name`, or `namespace/name` from elsewhere) or `default`.
    pub account: String,
    pub region: Option<String>,
    /// The assumed role; `None` for the operator's own identity.
    pub role_arn: Option<String>,
}

/// Why a Queue cannot use the account it names: (reason, message).
pub type Refusal = (&'static str, String);

/// The per-account clients and budgets.
pub struct Accounts {
    pub store: Store<AwsAccount>,
    settings: SqsSettings,
    clients: Mutex<HashMap<String, (AwsAccountSpec, Arc<SqsProvider>)>>,
    budgets: Mutex<HashMap<(String, String), Arc<Limiter>>>,
}

/// The namespace and name an accountRef points at, from a Queue in `queue_ns`.
pub fn target<'a>(queue_ns: &'a str, r: &'a AccountRef) -> (&'a str, &'a str) {
    (r.namespace.as_deref().unwrap_or(queue_ns), &r.name)
}

/// Whether a Queue in `queue_ns` may use `account` (found or not) through `r` (pure).
pub fn check(queue_ns: &str, r: &AccountRef, account: Option<&AwsAccount>) -> Result<(), Refusal> {
    let (ns, name) = target(queue_ns, r);
    let Some(account) = account else {
        return Err((
            "AccountNotFound",
            format!(
                "AwsAccount {ns}/{name} does not exist; create it or fix spec.accountRef (the Queue is looked at again when it appears)"
            ),
        ));
    };
    if ns != queue_ns && !account.spec.allowed_namespaces.iter().any(|n| n == queue_ns) {
        return Err((
            "AccountNotAllowed",
            format!(
                "AwsAccount {ns}/{name} does not allow Queues of namespace {queue_ns}: add {queue_ns} to its spec.allowedNamespaces, or use an AwsAccount of this namespace"
            ),
        ));
    }
    Ok(())
}

/// A Queue created under one role or region whose AwsAccount now says another (pure).
pub fn moved(queue: &Queue, spec: &AwsAccountSpec) -> Option<Refusal> {
    let status = queue.status.as_ref()?;
    let (role, region) = (status.role_arn.as_deref()?, status.region.as_deref()?);
    (role != spec.role_arn || region != spec.region).then(|| {
        (
            "AccountChanged",
            format!(
                "the SQS queue lives in {region} as {role}, but the AwsAccount now says {} as {}; skyport does not move queues: restore the AwsAccount, or delete this Queue (its queue is deleted as {role}) and create a new one",
                spec.region, spec.role_arn
            ),
        )
    })
}

impl Accounts {
    pub fn new(store: Store<AwsAccount>, settings: SqsSettings) -> Self {
        Accounts { store, settings, clients: Mutex::default(), budgets: Mutex::default() }
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
        let (ns, name) = target(queue_ns, r);
        self.store.get(&ObjectRef::new(name).within(ns))
    }

    /// Where `queue`'s calls go now, or why they cannot.
    pub async fn place(&self, queue: &Queue, default: &Arc<dyn QueueBackend>) -> Result<Placement, Refusal> {
        let Some(r) = &queue.spec.account_ref else { return Ok(own(default)) };
        let queue_ns = queue.namespace().unwrap_or_default();
        crate::controllers::store_synced(&self.store).await;
        let account = self.get(&queue_ns, r);
        check(&queue_ns, r, account.as_deref())?;
        let account = account.expect("checked");
        if let Some(refusal) = moved(queue, &account.spec) {
            return Err(refusal);
        }
        let key = format!("{}/{}", account.namespace().unwrap_or_default(), account.name_any());
        let sqs = self.client(&key, &account.spec).await;
        let shown = if account.namespace().as_deref() == Some(queue_ns.as_str()) { r.name.clone() } else { key };
        Ok(Placement {
            sqs,
            account: shown,
            region: Some(account.spec.region.clone()),
            role_arn: Some(account.spec.role_arn.clone()),
        })
    }

    /// Where `queue`'s SQS queue was created, for deleting it: the recorded role and region, through
    /// the AwsAccount when it still says the same (its external id and endpoint), else directly.
    pub async fn for_cleanup(&self, queue: &Queue, default: &Arc<dyn QueueBackend>) -> Arc<dyn QueueBackend> {
        let status = queue.status.as_ref();
        let recorded = status.and_then(|s| Some((s.role_arn.clone()?, s.region.clone()?)));
        let Some((role, region)) = recorded else {
            // Never created anywhere but (at most) the default account: the owner tag decides.
            return match self.place(queue, default).await {
                Ok(p) => p.sqs,
                Err(_) => default.clone(),
            };
        };
        let ns = queue.namespace().unwrap_or_default();
        if let Some(r) = &queue.spec.account_ref
            && let Some(account) = self.get(&ns, r)
            && account.spec.role_arn == role
            && account.spec.region == region
        {
            let key = format!("{}/{}", account.namespace().unwrap_or_default(), account.name_any());
            return self.client(&key, &account.spec).await;
        }
        let spec = AwsAccountSpec { role_arn: role.clone(), region: region.to_string(), ..Default::default() };
        self.client(&format!("recorded:{role}:{region}"), &spec).await
    }

    /// The client for the AwsAccount `key` with `spec`, built again when the spec changed.
    async fn client(&self, key: &str, spec: &AwsAccountSpec) -> Arc<dyn QueueBackend> {
        if let Some((seen, client)) = self.clients.lock().unwrap_or_else(|p| p.into_inner()).get(key)
            && seen == spec
        {
            return client.clone();
        }
        let budget = self.budget(spec);
        let role = AssumeRole {
            role_arn: spec.role_arn.clone(),
            external_id: spec.external_id.clone(),
            session_name: "skyport".into(),
            region: spec.region.clone(),
            endpoint_url: spec.endpoint_url.clone(),
        };
        let client = Arc::new(SqsProvider::assuming(&self.settings, &role, budget).await);
        self.clients.lock().unwrap_or_else(|p| p.into_inner()).insert(key.to_string(), (spec.clone(), client.clone()));
        client
    }

    /// The budget of the AWS account and region `spec` names, made like the default SQS budget.
    fn budget(&self, spec: &AwsAccountSpec) -> Arc<Limiter> {
        let account = account_id(&spec.role_arn).unwrap_or(&spec.role_arn).to_string();
        let mut budgets = self.budgets.lock().unwrap_or_else(|p| p.into_inner());
        budgets.entry((account, spec.region.clone())).or_insert_with(|| Arc::new(self.settings.limiter())).clone()
    }

    /// The calls made per (account, region) budget, for tests and metrics.
    pub fn budgets(&self) -> Vec<((String, String), Arc<Limiter>)> {
        let budgets = self.budgets.lock().unwrap_or_else(|p| p.into_inner());
        budgets.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// Queues (from `queues`) whose accountRef names `account`: they look again when it changes.
    pub fn users(account: &AwsAccount, queues: &Store<Queue>) -> Vec<ObjectRef<Queue>> {
        let (ns, name) = (account.namespace().unwrap_or_default(), account.name_any());
        queues
            .state()
            .into_iter()
            .filter(|q| {
                let queue_ns = q.namespace().unwrap_or_default();
                q.spec.account_ref.as_ref().is_some_and(|r| target(&queue_ns, r) == (ns.as_str(), name.as_str()))
            })
            .map(|q| ObjectRef::from_obj(&*q))
            .collect()
    }
}

fn own(default: &Arc<dyn QueueBackend>) -> Placement {
    Placement { sqs: default.clone(), account: DEFAULT_ACCOUNT.into(), region: default.region(), role_arn: None }
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
        assert_eq!(missing.0, "AccountNotFound");
        assert!(missing.1.contains("b/team"), "{}", missing.1);
    }

    #[test]
    fn a_queue_stays_in_the_account_it_was_created_in() {
        let mut q = Queue::new("q", QueueSpec::default());
        let spec = account("a", &[]).spec;
        assert_eq!(moved(&q, &spec), None, "nothing recorded yet");
        q.status = Some(QueueStatus {
            role_arn: Some(spec.role_arn.clone()),
            region: Some("eu-west-1".into()),
            ..Default::default()
        });
        assert_eq!(moved(&q, &spec), None);
        let elsewhere = AwsAccountSpec { region: "us-east-2".into(), ..spec.clone() };
        assert_eq!(moved(&q, &elsewhere).map(|r| r.0), Some("AccountChanged"));
        let other_role = AwsAccountSpec { role_arn: "arn:aws:iam::000000000003:role/x".into(), ..spec };
        assert_eq!(moved(&q, &other_role).map(|r| r.0), Some("AccountChanged"));
    }
}

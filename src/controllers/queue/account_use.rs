//! AwsAccounts while Queues use them: a finalizer keeps an AwsAccount until the last Queue using
//! it has deleted its SQS queue (a namespace being deleted removes both at once, and a Queue's
//! cleanup must still reach the queue), and its status shows what skyport sends to STS.
//!
//! A Queue adds the finalizer ([`hold`]) before its first SQS call with the account. A small
//! reconciler of AwsAccounts, sharing the Queue cache rather than watching Queues again, removes
//! it once no Queue names the account; a Queue's cleanup wakes it ([`released`]), since the
//! Queue cache may still show that Queue when the wake arrives. It also writes the account's
//! status and wakes the Queues using an account whose spec changed or whose deletion began.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::Context;
use super::accounts::{Placement, budget_key, check, unusable};
use super::pace;
use super::refs::Refs;
use crate::controllers::status::StatusWriter;
use crate::controllers::{error_policy, has_finalizer, hash_of, jittered, reconcile_with, remove_finalizer};
use crate::crd::account::{AwsAccount, session_name};
use crate::crd::condition::{Condition, ConditionStatus};
use crate::crd::queue::Queue;
use crate::error::Result;
use crate::reasons::Reason;

/// Keeps an AwsAccount while Queues use it.
pub const ACCOUNT_FINALIZER: &str = "awsaccounts.skyport.dev/in-use";

/// Adds the finalizer to the account `placement` uses, before the Queue's first SQS call with it.
pub async fn hold(placement: &Placement, ctx: &Context) -> Result<()> {
    let Some(account) = &placement.holder else { return Ok(()) };
    if has_finalizer(&**account, ACCOUNT_FINALIZER) {
        return Ok(());
    }
    ctx.api_writes.inc();
    add(&api(ctx, account), account).await
}

/// Adds the finalizer to `account`, or to what it is now if it changed since it was read: a
/// Queue's [`hold`] and this reconciler may add it at once, and the account's status write moves
/// its resourceVersion under a cached copy. Neither is a failure to back off from.
async fn add(api: &Api<AwsAccount>, account: &AwsAccount) -> Result<()> {
    match add_to(api, account).await {
        Err(crate::Error::Kube(kube::Error::Api(e))) if e.code == 409 || e.code == 422 => {
            let now = api.get(&account.name_any()).await?;
            if has_finalizer(&now, ACCOUNT_FINALIZER) {
                return Ok(());
            }
            add_to(api, &now).await
        }
        other => other,
    }
}

/// Adds the finalizer without overwriting one added meanwhile: conditional on the finalizer
/// list (not the resourceVersion, which every status write moves) when there is one.
async fn add_to(api: &Api<AwsAccount>, account: &AwsAccount) -> Result<()> {
    let name = account.name_any();
    let finalizers = account.finalizers();
    if finalizers.is_empty() {
        crate::controllers::add_finalizer(api, account, ACCOUNT_FINALIZER).await?;
    } else {
        let ops = json!([
            {"op": "test", "path": "/metadata/finalizers", "value": finalizers},
            {"op": "add", "path": "/metadata/finalizers/-", "value": ACCOUNT_FINALIZER},
        ]);
        let patch: json_patch::Patch =
            serde_json::from_value(ops).map_err(|e| crate::Error::Internal(e.to_string()))?;
        api.patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch)).await?;
    }
    Ok(())
}

/// What a cleanup's look for the queue found (`owned`), unless STS refused the role of a Queue
/// that never recorded creating anything with it: then nothing can exist there (creating needs
/// the same role), and waiting for a trust policy that may never change would keep the Queue,
/// and its namespace, from ever being deleted.
pub async fn unless_never_trusted<T>(queue: &Queue, owned: Result<Option<T>>, ctx: &Context) -> Result<Option<T>> {
    let created = queue.status.as_ref().is_some_and(|s| s.role_arn.is_some());
    match owned {
        Err(crate::Error::Queue(providers::QueueError::AssumeRoleRefused { .. })) if !created => {
            let note = "STS refused the AwsAccount's role and this Queue never created an SQS queue with it: nothing to delete";
            ctx.publish(queue, Reason::NothingCreated, note.into()).await;
            Ok(None)
        }
        other => other,
    }
}

/// Called when `queue`'s cleanup has released its finalizer: its account no longer waits for it.
pub fn released(queue: &Queue, ctx: &Context) {
    let Some(r) = &queue.spec.account_ref else { return };
    let queue_ns = queue.namespace().unwrap_or_default();
    let (ns, name) = r.target(&queue_ns);
    let usage = &ctx.usage;
    if let Some(uid) = queue.uid() {
        usage.released.lock().unwrap_or_else(|p| p.into_inner()).insert(uid, ObjectRef::from_obj(queue));
    }
    let _ = usage.wakes.unbounded_send(ObjectRef::new(name).within(ns));
}

/// Runs the AwsAccount reconciler on `accounts` (the AwsAccount watch) and the wakes of
/// [`released`], until `shutdown`.
pub fn controller(
    accounts: impl futures::Stream<Item = std::result::Result<AwsAccount, kube::runtime::watcher::Error>> + Send + 'static,
    store: Store<AwsAccount>,
    wakes: UnboundedReceiver<ObjectRef<AwsAccount>>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
    ctx: Arc<Context>,
) -> impl std::future::Future<Output = ()> + Send {
    Controller::for_stream(accounts, store)
        .reconcile_on(wakes)
        .reconcile_all_on(ctx.acting.takeovers())
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(crate::log_result!(awsaccount))
}

async fn reconcile(account: Arc<AwsAccount>, ctx: Arc<Context>) -> Result<Action> {
    reconcile_with(account, ctx, reconcile_inner).await
}

async fn reconcile_inner(account: Arc<AwsAccount>, ctx: Arc<Context>) -> Result<Action> {
    let usage = &ctx.usage;
    let users = usage.users(&account, (&ctx.refs, &ctx.queues));
    if usage.changed(&account) {
        for queue in &users.named {
            let _ = ctx.dependents.unbounded_send(queue.clone());
        }
    }
    let api = api(&ctx, &account);
    let deleting = account.meta().deletion_timestamp.is_some();
    let held = has_finalizer(&*account, ACCOUNT_FINALIZER);
    let users = users.holders;
    if users.is_empty() && held {
        ctx.api_writes.inc();
        remove_finalizer(&api, &*account, ACCOUNT_FINALIZER).await?;
    } else if !users.is_empty() && !held && !deleting {
        ctx.api_writes.inc();
        add(&api, &account).await?;
    }
    if deleting && users.is_empty() {
        // Gone once other finalizers (not ours) are released: nothing left to show or wait for.
        usage.seen.lock().unwrap_or_else(|p| p.into_inner()).remove(&account.uid().unwrap_or_default());
        return Ok(Action::await_change());
    }
    let namespace = account.namespace().unwrap_or_default();
    let (status, reason, message) = match unusable(&account, ctx.accounts.allow_http()) {
        Some((Reason::AccountDeleting, _)) => (
            ConditionStatus::False,
            Reason::Deleting,
            format!("waiting for {} Queue(s) using this account to delete their SQS queues", users.len()),
        ),
        Some((reason, message)) => (ConditionStatus::False, reason, message),
        None => (
            ConditionStatus::True,
            Reason::Usable,
            format!("Queues assume {} with the external id in status.externalId", account.spec.role_arn),
        ),
    };
    let pace = ctx.pace_of(&budget_key(&account.spec));
    let written = StatusWriter::new(&*account, &api, &ctx.api_writes, None)
        .write(|s| {
            s.external_id = Some(ctx.accounts.external_id(&namespace));
            s.role_session_name = Some(session_name(&namespace));
            s.budget_queues = Some(pace.queues as u64);
            s.drift_check_period = Some(pace::shown(pace.resync));
            s.tag_check_period = Some(pace::shown(pace.tag_resync));
            s.conditions = vec![Condition::new("Ready", status, reason.as_str(), message)];
        })
        .await;
    match written {
        Err(crate::Error::Kube(kube::Error::Api(e))) if e.code == 404 => return Ok(Action::await_change()),
        other => other?,
    }
    ctx.backoff.reset(&crate::controllers::object_key(&*account));
    // While deleting, the wakes of cleanups are the trigger and this is the net under them;
    // otherwise the drift check periods in status follow the Queues added and deleted.
    Ok(Action::requeue(jittered(ctx.settings.resync)))
}

fn api(ctx: &Context, account: &AwsAccount) -> Api<AwsAccount> {
    Api::namespaced(ctx.client.clone(), &account.namespace().unwrap_or_default())
}

/// The Queues naming one AwsAccount ([`Usage::users`]).
#[derive(Debug, Default)]
pub struct Users {
    /// Every Queue naming it.
    pub named: Vec<ObjectRef<Queue>>,
    /// Those it allows: they keep its finalizer.
    pub holders: Vec<ObjectRef<Queue>>,
}

/// What the AwsAccount reconciler ([`controller`]) remembers between its runs.
pub struct Usage {
    pub(super) wakes: UnboundedSender<ObjectRef<AwsAccount>>,
    /// Queues whose cleanup finished (by UID), until the Queue cache drops them.
    pub(super) released: Mutex<HashMap<String, ObjectRef<Queue>>>,
    /// Per AwsAccount UID: its generation and whether it is being deleted, when last reconciled.
    pub(super) seen: Mutex<HashMap<String, u64>>,
}

impl Usage {
    /// A memory, and the wakes its [`released`] sends, for [`controller`].
    pub fn new() -> (Self, UnboundedReceiver<ObjectRef<AwsAccount>>) {
        let (wakes, rx) = unbounded();
        (Usage { wakes, released: Mutex::default(), seen: Mutex::default() }, rx)
    }

    /// The Queues that name `account`, except those whose cleanup has finished: all of them
    /// (`named`, woken when the account changes: a namespace added to `allowedNamespaces` may
    /// use it now), and those that may use it (`holders`, which keep its finalizer). A Queue the
    /// account does not allow never holds it: a tenant could otherwise keep another namespace's
    /// AwsAccount, and that namespace, from ever being deleted.
    pub(super) fn users(&self, account: &AwsAccount, (refs, queues): (&Refs, &Store<Queue>)) -> Users {
        let (ns, name) = (account.namespace().unwrap_or_default(), account.name_any());
        let mut released = self.released.lock().unwrap_or_else(|p| p.into_inner());
        // A release is needed only while the cache still shows the Queue.
        released.retain(|uid, at| queues.get(at).is_some_and(|q| q.metadata.uid.as_ref() == Some(uid)));
        let mut users = Users::default();
        for q in super::refs::account_users(refs, queues, (&ns, &name)) {
            let (Some(r), Some(queue_ns)) = (q.spec.account_ref.as_deref(), q.metadata.namespace.as_deref()) else {
                continue;
            };
            if released.contains_key(q.metadata.uid.as_deref().unwrap_or_default()) {
                continue;
            }
            if check(queue_ns, r, Some(account)).is_ok() {
                users.holders.push(ObjectRef::from_obj(&*q));
            }
            users.named.push(ObjectRef::from_obj(&*q));
        }
        users
    }

    /// Whether `account`'s spec or deletion changed since it was last looked at (or it is new):
    /// then the Queues using it look again.
    pub(super) fn changed(&self, account: &AwsAccount) -> bool {
        let seen = hash_of((account.meta().generation, account.meta().deletion_timestamp.is_some()));
        let uid = account.uid().unwrap_or_default();
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).insert(uid, seen) != Some(seen)
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector::Store;
    use kube::runtime::watcher;

    use super::*;
    use crate::controllers::queue::refs::{self, Refs};
    use crate::controllers::testing::{FakeApi, ready_store};

    /// The Queue cache holding `queue`, and the index of what Queues name.
    fn cached(queue: Queue) -> (Arc<Refs>, Store<Queue>) {
        let (queues, writer) = ready_store();
        let index = Arc::new(Refs::default());
        refs::feed(writer, index.clone()).apply_watcher_event(&watcher::Event::Apply(queue));
        (index, queues)
    }

    #[test]
    fn a_queue_holds_its_account_until_its_cleanup_released_it() {
        let queue: Queue = serde_json::from_value(json!({"apiVersion": "skyport.dev/v1alpha1", "kind": "Queue",
            "metadata": {"name": "q", "namespace": "a", "uid": "queue-1"},
            "spec": {"accountRef": {"name": "team"}}}))
        .unwrap();
        let (index, queues) = cached(queue.clone());
        let queues = (&*index, &queues);
        let mut account = AwsAccount::new("team", Default::default());
        account.metadata.namespace = Some("a".into());
        account.metadata.uid = Some("account-1".into());
        let mut other = account.clone();
        other.metadata.name = Some("other".into());
        let (usage, _wakes) = Usage::new();
        assert_eq!(usage.users(&account, queues).holders.len(), 1);
        assert!(usage.users(&other, queues).named.is_empty(), "only the account it names");
        usage.released.lock().unwrap().insert("queue-1".into(), ObjectRef::from_obj(&queue));
        assert!(usage.users(&account, queues).named.is_empty(), "released, though still cached");
        assert!(usage.changed(&account), "new");
        assert!(!usage.changed(&account), "the same");
        account.metadata.generation = Some(2);
        assert!(usage.changed(&account), "its spec changed");
    }

    #[test]
    fn a_queue_the_account_does_not_allow_never_holds_it() {
        let foreign: Queue = serde_json::from_value(json!({"apiVersion": "skyport.dev/v1alpha1", "kind": "Queue",
            "metadata": {"name": "pin", "namespace": "b", "uid": "queue-b"},
            "spec": {"accountRef": {"name": "team", "namespace": "a"}}}))
        .unwrap();
        let (index, queues) = cached(foreign);
        let queues = (&*index, &queues);
        let mut account = AwsAccount::new("team", Default::default());
        account.metadata.namespace = Some("a".into());
        let (usage, _wakes) = Usage::new();
        let users = usage.users(&account, queues);
        assert!(users.holders.is_empty(), "namespace b is not allowed: no finalizer for it");
        assert_eq!(users.named.len(), 1, "still woken when the account changes");
        account.spec.allowed_namespaces = vec!["b".into()];
        assert_eq!(usage.users(&account, queues).holders.len(), 1, "allowed now");
    }

    const PATH: &str = "/apis/skyport.dev/v1alpha1/namespaces/a/awsaccounts/team";

    fn account_at(fake: &FakeApi) -> AwsAccount {
        let account = json!({"apiVersion": "skyport.dev/v1alpha1", "kind": "AwsAccount",
            "metadata": {"name": "team", "namespace": "a", "uid": "account-1"},
            "spec": {"roleArn": "arn:aws:iam::000000000002:role/team", "region": "eu-west-1"}});
        serde_json::from_value(fake.put(PATH, account)).unwrap()
    }

    #[tokio::test]
    async fn a_finalizer_added_to_a_copy_older_than_a_status_write_still_lands() {
        let (client, fake) = FakeApi::start();
        let cached = account_at(&fake);
        let mut now = fake.get(PATH).unwrap();
        now["status"] = json!({"externalId": "x"});
        fake.put(PATH, now);
        add(&Api::namespaced(client, "a"), &cached).await.expect("not a conflict to back off from");
        assert_eq!(fake.get(PATH).unwrap()["metadata"]["finalizers"], json!([ACCOUNT_FINALIZER]));
        assert_eq!(fake.get(PATH).unwrap()["status"]["externalId"], "x", "the status write is kept");
    }

    #[tokio::test]
    async fn a_finalizer_the_other_writer_added_first_is_not_added_twice() {
        let (client, fake) = FakeApi::start();
        let cached = account_at(&fake);
        let mut now = fake.get(PATH).unwrap();
        now["metadata"]["finalizers"] = json!([ACCOUNT_FINALIZER]);
        fake.put(PATH, now);
        add(&Api::namespaced(client, "a"), &cached).await.expect("already held");
        assert_eq!(fake.get(PATH).unwrap()["metadata"]["finalizers"], json!([ACCOUNT_FINALIZER]));
        let patches = fake.calls().iter().filter(|c| c.method == hyper::Method::PATCH).count();
        assert_eq!(patches, 1, "one refused patch, then a read");
    }
}

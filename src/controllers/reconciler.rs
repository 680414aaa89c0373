//! The reconcile every controller with a finalizer runs: the finalizer preamble, the deletion
//! branch and the one policy for failures, around what a [`Reconciler`] does with a live object.
//!
//! A failure is recorded in the object's status either way, then:
//! - permanent (the user's input, a cloud refusal that would only repeat): nothing is retried
//!   until the object changes;
//! - transient: returned, so [`super::error_policy`] retries it with the object's backoff.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

use kube::Resource;
use kube::api::Api;
use kube::runtime::controller::Action;
use serde::de::DeserializeOwned;
use tracing::debug;

use super::context::{Context, api_beside, reconcile_with};
use super::{add_finalizer, has_finalizer, object_key};
use crate::error::{Error, Result};

/// What a controller adds to the shared reconcile, implemented by its state `S` (the context is
/// `Context<S, S::Memory>`).
pub trait Reconciler: Sized + Send + Sync + 'static {
    /// The object reconciled.
    type Object: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + super::Sharded
        + Send
        + Sync
        + 'static;
    /// What the context remembers per object ([`super::memory::OwnWrites`]).
    type Memory: Send + Sync + 'static;
    /// The finalizer guarding what the object made outside the cluster.
    const FINALIZER: &'static str;
    /// How the user gets a permanent failure retried, appended to its message.
    const PERMANENT_HINT: &'static str;

    /// Runs first, on every reconcile (deleted objects too).
    fn begin(_obj: &Self::Object, _ctx: &Context<Self, Self::Memory>) {}

    /// Converges a live object whose finalizer is in place (`added`: added by this reconcile).
    fn apply(
        obj: Arc<Self::Object>,
        ctx: Arc<Context<Self, Self::Memory>>,
        added: bool,
    ) -> impl Future<Output = Result<Action>> + Send;

    /// Deletes what the finalizer guards, then removes it (called only while it is there).
    fn cleanup(
        obj: Arc<Self::Object>,
        ctx: Arc<Context<Self, Self::Memory>>,
    ) -> impl Future<Output = Result<Action>> + Send;

    /// Records a failed [`Reconciler::apply`] in status: not ready, with the error's reason and
    /// `message`.
    fn report_failure(
        obj: &Self::Object,
        ctx: &Context<Self, Self::Memory>,
        error: &Error,
        message: &str,
    ) -> impl Future<Output = Result<()>> + Send;
}

/// The entry point of a controller whose state is a [`Reconciler`], as kube-runtime calls it.
pub async fn reconcile<S: Reconciler>(obj: Arc<S::Object>, ctx: Arc<Context<S, S::Memory>>) -> Result<Action> {
    reconcile_with(obj, ctx, run::<S>).await
}

async fn run<S: Reconciler>(obj: Arc<S::Object>, ctx: Arc<Context<S, S::Memory>>) -> Result<Action> {
    S::begin(&obj, &ctx);
    if obj.meta().deletion_timestamp.is_some() {
        if !has_finalizer(&*obj, S::FINALIZER) {
            return Ok(Action::await_change());
        }
        return S::cleanup(obj, ctx).await;
    }
    let added = !has_finalizer(&*obj, S::FINALIZER);
    let obj = if added {
        let api: Api<S::Object> = api_beside(&ctx.client, &*obj)?;
        ctx.api_writes.inc();
        Arc::new(add_finalizer(&api, &obj, S::FINALIZER).await?)
    } else {
        obj
    };
    let key = object_key(&*obj);
    match S::apply(obj.clone(), ctx.clone(), added).await {
        Ok(action) => {
            ctx.backoff.reset(&key);
            Ok(action)
        }
        Err(error) => failed::<S>(&obj, &ctx, error).await,
    }
}

/// The failure policy: recorded in status, then waited on (permanent) or retried (transient).
async fn failed<S: Reconciler>(obj: &S::Object, ctx: &Context<S, S::Memory>, error: Error) -> Result<Action> {
    let (permanent, message) = failure_message(&error, S::PERMANENT_HINT);
    let reported = S::report_failure(obj, ctx, &error, &message).await;
    if permanent {
        // The user must learn of it: a status write that failed is retried.
        reported?;
        return Ok(Action::await_change());
    }
    // Best effort: the API server may be what is failing.
    if let Err(status_err) = reported {
        debug!(error = %status_err, "could not record the failure in status");
    }
    Err(error)
}

/// Whether `error` is permanent, and the message status shows for it.
pub fn failure_message(error: &Error, permanent_hint: &str) -> (bool, String) {
    if error.is_permanent() {
        (true, format!("{error}; {permanent_hint}"))
    } else {
        (false, format!("{error}; retrying with backoff"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_error_waits_with_the_hint_an_internal_failure_retries() {
        let hint = "fix the spec, nothing is retried until it changes";
        let (permanent, message) = failure_message(&Error::InvalidSpec("bad annotation".into()), hint);
        assert!(permanent);
        assert_eq!(message, format!("bad annotation; {hint}"));
        let (permanent, message) = failure_message(&Error::Internal("status: not JSON".into()), hint);
        assert!(!permanent);
        assert_eq!(message, "internal error: status: not JSON; retrying with backoff");
    }
}

//! Secret exports, written without ever reading a Secret.
//!
//! skyport holds `create`, `update` and `delete` on Secrets in tenants' namespaces, and nothing
//! that reads or that applies operations of the caller's choosing to a stored Secret (`get`,
//! `list`, `watch`, `patch`: a JSON patch copying a value into the name is answered with the
//! value). So an export is:
//! - created, and the UID of the created object recorded (`status.exports`, and in memory until
//!   the status write shows);
//! - then only replaced as a whole (`update`, a PUT) with that UID in its metadata: the API
//!   server refuses the write when the stored object has another UID (409), the admission policy
//!   when no Queue controls it (403), and its answer is the object just written;
//! - recreated when the update finds nothing (404);
//! - rewritten when its data changes and once per `--queue-tag-resync`, which repairs edits made
//!   to it meanwhile (what skyport last wrote is remembered as a hash, never the values);
//! - deleted, when dropped from the spec, with the recorded UID as precondition.
//!
//! A name that a create finds taken, or a recorded object replaced since, is not this Queue's:
//! it is reported (condition and Event, naming the Secret only) and never written.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use tracing::info;

use super::Context;
use crate::controllers::{hash_of, owned};
use crate::crd::queue::Queue;
use crate::error::{Error, Result};

/// What this process last wrote to a Secret export: the object's UID and a hash of its data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    pub uid: String,
    pub hash: u64,
}

/// The next write of one Secret export (pure decision, [`step`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Written with the wanted data less than a resync ago: nothing to send.
    Keep { uid: String },
    /// No object of this Queue's is known under the name: create one.
    Create,
    /// Replace the object with this UID (the one this Queue created) by the wanted one.
    Update { uid: String },
}

/// How writing a Secret export ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The Queue's own object, with its UID, holds the wanted data.
    Ours { uid: String },
    /// A create found the name taken: someone else's object (or one whose UID was never recorded).
    Taken,
    /// The object recorded as this Queue's has been replaced, or is no longer controlled by it.
    Replaced,
}

/// Decides the next write (pure). `recorded`: the UID in `status.exports`; `remembered`: what
/// this process last wrote, and how long ago. Fresh memory wins over status (the status write
/// that records a new UID lags the write); older memory only stands in for a missing status.
pub fn step(recorded: Option<&str>, remembered: Option<(&Written, Duration)>, hash: u64, resync: Duration) -> Step {
    match (remembered, recorded) {
        (Some((w, age)), _) if age < resync && w.hash == hash => Step::Keep { uid: w.uid.clone() },
        (Some((w, age)), _) if age < resync => Step::Update { uid: w.uid.clone() },
        (_, Some(uid)) => Step::Update { uid: uid.to_string() },
        (Some((w, _)), None) => Step::Update { uid: w.uid.clone() },
        (None, None) => Step::Create,
    }
}

/// The memory's key of `queue`'s export `name`: per Queue, so a Queue never writes with the UID
/// of another Queue's Secret of the same name.
fn key(queue: &Queue, name: &str) -> String {
    format!("{}/{name}", queue.uid().unwrap_or_default())
}

/// Writes `want` (built by `exports::secret`) as [`step`] decides. Nothing of its data is logged.
pub async fn ensure(queue: &Queue, want: Secret, recorded: Option<&str>, ctx: &Context) -> Result<Outcome> {
    let ns = queue.namespace().ok_or(Error::MissingObjectKey("namespace"))?;
    let name = want.name_any();
    let key = key(queue, &name);
    let hash = hash_of(want.data.iter().flatten().map(|(k, v)| (k, &v.0)).collect::<Vec<_>>());
    let remembered = ctx.secrets.get(&key, |_, _| true);
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let uid = match step(recorded, remembered.as_ref().map(|(w, age)| (w, *age)), hash, ctx.settings.tag_resync) {
        Step::Keep { uid } => return Ok(Outcome::Ours { uid }),
        Step::Create => return create(&api, &want, &key, hash, ctx).await,
        Step::Update { uid } => uid,
    };
    let mut whole = want.clone();
    whole.metadata.uid = Some(uid);
    ctx.api_writes.inc();
    match api.replace(&name, &PostParams::default(), &whole).await {
        Ok(written) => {
            let uid = written.uid().ok_or(Error::MissingObjectKey("uid"))?;
            info!(secret = name, "rewrote export Secret");
            ctx.secrets.record(&key, Written { uid: uid.clone(), hash });
            Ok(Outcome::Ours { uid })
        }
        // Deleted by someone: made again.
        Err(kube::Error::Api(e)) if e.code == 404 => create(&api, &want, &key, hash, ctx).await,
        // Another object under the name (UID precondition), or one no Queue controls (admission).
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 403 => {
            ctx.secrets.forget(&key);
            Ok(Outcome::Replaced)
        }
        Err(e) => Err(e.into()),
    }
}

async fn create(api: &Api<Secret>, want: &Secret, key: &str, hash: u64, ctx: &Context) -> Result<Outcome> {
    let Some(made) = owned::create_new(api, want, &ctx.api_writes).await? else {
        ctx.secrets.forget(key);
        return Ok(Outcome::Taken);
    };
    let uid = made.uid().ok_or(Error::MissingObjectKey("uid"))?;
    info!(secret = want.name_any(), "created export Secret");
    ctx.secrets.record(key, Written { uid: uid.clone(), hash });
    Ok(Outcome::Ours { uid })
}

/// The UID to delete the dropped export `name` with: the recorded one, else this process's
/// memory. `None`: nothing proves any object of that name this Queue's, so none is deleted.
pub fn uid_to_delete(queue: &Queue, name: &str, recorded: Option<&str>, ctx: &Context) -> Option<String> {
    let key = key(queue, name);
    let remembered = ctx.secrets.get(&key, |_, _| true).map(|(w, _)| w.uid);
    ctx.secrets.forget(&key);
    recorded.map(str::to_string).or(remembered)
}

/// Deletes the Secret `name` only if it is the object with `uid`. `Ok(false)`: gone already, or
/// another object (409) or one the admission policy does not let skyport delete (403).
pub async fn delete(ns: &str, name: &str, uid: String, ctx: &Context) -> Result<bool> {
    let params = DeleteParams {
        preconditions: Some(Preconditions { uid: Some(uid), resource_version: None }),
        ..Default::default()
    };
    ctx.api_writes.inc();
    match Api::<Secret>::namespaced(ctx.client.clone(), ns).delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if matches!(e.code, 403 | 404 | 409) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RESYNC: Duration = Duration::from_secs(600);

    fn written(uid: &str, hash: u64) -> Written {
        Written { uid: uid.into(), hash }
    }

    #[test]
    fn an_export_never_written_is_created() {
        assert_eq!(step(None, None, 1, RESYNC), Step::Create);
    }

    #[test]
    fn a_recorded_export_is_replaced_with_its_uid_never_created_again() {
        assert_eq!(step(Some("u-1"), None, 1, RESYNC), Step::Update { uid: "u-1".into() });
    }

    #[test]
    fn fresh_memory_of_the_same_data_sends_nothing() {
        let w = written("u-1", 7);
        assert_eq!(step(Some("u-1"), Some((&w, Duration::from_secs(5))), 7, RESYNC), Step::Keep { uid: "u-1".into() });
        // The status write of a just created Secret has not shown yet: still nothing to send.
        assert_eq!(step(None, Some((&w, Duration::from_secs(5))), 7, RESYNC), Step::Keep { uid: "u-1".into() });
    }

    #[test]
    fn changed_data_is_written_at_once() {
        let w = written("u-1", 7);
        assert_eq!(
            step(Some("u-1"), Some((&w, Duration::from_secs(5))), 8, RESYNC),
            Step::Update { uid: "u-1".into() }
        );
    }

    #[test]
    fn the_same_data_is_rewritten_once_per_resync_to_repair_drift() {
        let w = written("u-1", 7);
        assert_eq!(step(Some("u-1"), Some((&w, RESYNC)), 7, RESYNC), Step::Update { uid: "u-1".into() });
    }

    #[test]
    fn fresh_memory_wins_over_a_lagging_status_and_old_memory_does_not() {
        // Recreated after a 404 a moment ago: status still names the deleted object.
        let w = written("u-2", 7);
        assert_eq!(
            step(Some("u-1"), Some((&w, Duration::from_secs(1))), 8, RESYNC),
            Step::Update { uid: "u-2".into() }
        );
        // Long ago (another replica may have written since): status is the truth.
        assert_eq!(step(Some("u-3"), Some((&w, RESYNC * 2)), 7, RESYNC), Step::Update { uid: "u-3".into() });
        // No status at all (its write failed): the memory stands in.
        assert_eq!(step(None, Some((&w, RESYNC * 2)), 7, RESYNC), Step::Update { uid: "u-2".into() });
    }
}

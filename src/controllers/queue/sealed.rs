//! The ownership proof kept across restarts. A Queue proves its SQS queue its own by the owner
//! tag (ListQueueTags, the tightest SQS quota); the proof is remembered per process
//! ([`observe::Proofs`]), so a restart or a takeover would read every queue's tags again. With an
//! ownership key, the proof is also written to `status.ownershipProof`, sealed with
//! HMAC-SHA256 over the Queue's UID, the queue's URL and creation time, when it was proven and
//! for which generation. A fresh process takes a proof whose seal verifies as if it had made it
//! itself: same URL, same queue (creation time), same age, so the tags are re-read on the same
//! cadence as without the restart, and whenever the spec changed.
//!
//! Why a seal: `queues/status` is writable by whoever may write status (and by a stolen operator
//! token), so an unsealed proof would let them skip the owner check. The key comes from a file
//! the kubelet mounts from a Secret that the operator's ServiceAccount cannot read through the
//! API: a stolen token cannot forge a seal, and a seal cannot move to another Queue (the UID is
//! sealed) or another queue (the URL and creation time are). Without a key nothing is written
//! and every restart reads every queue's tags.
//!
//! [`observe::Proofs`]: super::observe::Proofs

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::Context;
use super::observe::Verified;
use crate::config::OwnershipKey;
use crate::crd::queue::{OwnershipProof, Queue};
use crate::mac::hmac_sha256;

/// The proof this process made for the Queue, else the one its status carries sealed.
pub(super) fn proof(ctx: &Context, queue: &Queue, uid: &str) -> Option<Verified> {
    let key = ctx.settings.ownership_key.as_ref();
    ctx.verified.get(uid).or_else(|| key.and_then(|key| restore(key, queue)))
}

/// Domain separation: a seal is no other MAC skyport makes with the same bytes.
const CONTEXT: &[u8] = b"skyport-queue-ownership-v1";
/// Seals with the operator's ownership key.
pub trait Seal {
    fn mac(&self, uid: &str, url: &str, proof: &Unsealed) -> String;
}

impl Seal for OwnershipKey {
    /// The first 16 bytes of the HMAC: 128 bits is beyond forging, and the record is kept in
    /// every Queue of the cache.
    fn mac(&self, uid: &str, url: &str, proof: &Unsealed) -> String {
        let mut message = CONTEXT.to_vec();
        for part in [uid, url, proof.created.unwrap_or("-")] {
            message.push(0);
            message.extend_from_slice(part.as_bytes());
        }
        message.push(0);
        message.extend_from_slice(&proof.proven_at.to_be_bytes());
        message.extend_from_slice(&proof.generation.unwrap_or(-1).to_be_bytes());
        hex(&hmac_sha256(self.bytes(), &message)[..16])
    }
}

/// What a seal covers besides the Queue's UID and the queue's URL.
pub struct Unsealed<'a> {
    created: Option<&'a str>,
    proven_at: i64,
    generation: Option<i64>,
}

/// The status record of `verified`, proven at `at`, of the queue at `url` made at `created`.
pub fn seal(
    key: &OwnershipKey,
    uid: &str,
    url: &str,
    created: Option<&str>,
    at: Instant,
    generation: Option<i64>,
) -> OwnershipProof {
    let proven = SystemTime::now() - at.elapsed();
    let proven_at = proven.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    let mac = key.mac(uid, url, &Unsealed { created, proven_at, generation });
    OwnershipProof { created: created.map(Into::into), proven_at, generation, seal: mac.into() }
}

/// The proof `queue`'s status carries, when its seal verifies under `key` for this Queue and
/// the URL its status records; `None` otherwise (then the tags are read).
pub fn restore(key: &OwnershipKey, queue: &Queue) -> Option<Verified> {
    let status = queue.status.as_ref()?;
    let (proof, url, uid) =
        (status.ownership_proof.as_ref()?, status.queue_url.as_deref()?, queue.metadata.uid.as_deref()?);
    let unsealed =
        Unsealed { created: proof.created.as_deref(), proven_at: proof.proven_at, generation: proof.generation };
    if !same(key.mac(uid, url, &unsealed).as_bytes(), proof.seal.as_bytes()) {
        return None;
    }
    let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?.as_secs() as i64;
    let age = Duration::from_secs(now.saturating_sub(proof.proven_at).max(0) as u64);
    let at = Instant::now().checked_sub(age)?;
    Some(Verified::new(url, proof.created.as_deref(), at, proof.generation))
}

/// Equality in time independent of where the inputs differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::queue::QueueStatus;
    use providers::sqs::Attributes;

    const URL: &str = "http://sqs/000000000000/a-orders";

    fn queue(uid: &str, proof: OwnershipProof) -> Queue {
        let mut q = Queue::new("orders", Default::default());
        q.metadata.uid = Some(uid.into());
        q.metadata.namespace = Some("a".into());
        let ownership_proof = Some(Box::new(proof));
        q.status = Some(QueueStatus { queue_url: Some(URL.into()), ownership_proof, ..Default::default() });
        q
    }

    fn made_at(created: &str) -> Attributes {
        Attributes::from([("CreatedTimestamp".to_string(), created.to_string())])
    }

    #[test]
    fn a_sealed_proof_restores_with_its_age_and_covers_only_its_queue() {
        let key = OwnershipKey::from_bytes(&[7; 32]);
        let at = Instant::now() - Duration::from_secs(120);
        let proof = seal(&key, "u1", URL, Some("1700000000"), at, Some(3));
        let restored = restore(&key, &queue("u1", proof)).expect("a seal made with the key verifies");
        assert!(restored.covers(URL, &made_at("1700000000")));
        assert!(!restored.covers(URL, &made_at("1700000100")), "a queue made again under the URL is another");
        assert_eq!(restored.generation, Some(3));
        let age = restored.at.elapsed().as_secs();
        assert!(
            (119..=122).contains(&age),
            "the proof keeps its age ({age} s), so tags are due when they would have been"
        );
    }

    #[test]
    fn a_seal_does_not_verify_for_another_queue_uid_url_or_key_or_when_edited() {
        let key = OwnershipKey::from_bytes(&[7; 32]);
        let proof = seal(&key, "u1", URL, Some("1700000000"), Instant::now(), Some(3));
        assert!(restore(&key, &queue("u2", proof.clone())).is_none(), "moved to another Queue");
        assert!(restore(&OwnershipKey::from_bytes(&[8; 32]), &queue("u1", proof.clone())).is_none(), "another key");
        let mut other_url = queue("u1", proof.clone());
        other_url.status.as_mut().unwrap().queue_url = Some("http://sqs/000000000000/b-x".into());
        assert!(restore(&key, &other_url).is_none(), "another queue's URL");
        for edit in [
            OwnershipProof { created: Some("1700000001".into()), ..proof.clone() },
            OwnershipProof { created: None, ..proof.clone() },
            OwnershipProof { proven_at: proof.proven_at + 600, ..proof.clone() },
            OwnershipProof { generation: Some(4), ..proof.clone() },
            OwnershipProof { seal: "00".repeat(16).into(), ..proof.clone() },
        ] {
            assert!(restore(&key, &queue("u1", edit.clone())).is_none(), "edited: {edit:?}");
        }
    }
}

//! The sealed ownership proof in status, across an operator restart.

use std::collections::HashMap;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use skyport::config::QueueArgs;
use skyport::crd::{ConditionStatus, Queue};

use super::*;

/// With an ownership key, the proof that a queue is its Queue's survives the operator: a new
/// process reads no tags for a Queue whose sealed proof verifies, and reads them again for one
/// whose record was edited (a status writer cannot forge a seal) or moved from another Queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_sealed_ownership_proof_spares_the_tag_read_after_a_restart_and_a_forged_one_does_not() {
    let ns = TestNs::new("own-sealed").await;
    let settings = || QueueArgs {
        ownership_key: Some(skyport::config::OwnershipKey::from_bytes(&[42; 32])),
        resync: Duration::from_secs(1),
        ..fast_settings()
    };
    let queues: Api<Queue> = ns.api();
    let op = Operator::start(&ns, settings()).await;
    for name in ["kept", "forged", "moved"] {
        queues.create(&PostParams::default(), &queue(name, json!({}))).await.unwrap();
    }
    let mut proofs = HashMap::new();
    for name in ["kept", "forged", "moved"] {
        let q = wait_ready(&queues, name, ConditionStatus::True, "Available", READY_TIMEOUT).await;
        let proof = status_of(&q).ownership_proof.expect("a sealed proof in status");
        proofs.insert(name, proof);
    }
    op.stop().await;

    // A status writer edits one record and copies another Queue's onto a third.
    let mut edited = serde_json::to_value(&proofs["forged"]).unwrap();
    edited["provenAt"] = json!(proofs["forged"].proven_at + 3600);
    let moved = serde_json::to_value(&proofs["kept"]).unwrap();
    for (name, proof) in [("forged", edited), ("moved", moved)] {
        let patch = json!({"status": {"ownershipProof": proof}});
        queues.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    }

    let op = Operator::start(&ns, settings()).await;
    eventually("both tampered Queues proven again from their tags", READY_TIMEOUT, || async {
        (op.sqs_succeeded().get("ListQueueTags").copied().unwrap_or(0) >= 2).then_some(())
    })
    .await;
    // Several resyncs of all three: the kept proof still spares the read.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(op.sqs_succeeded().get("ListQueueTags").copied(), Some(2), "only the two tampered Queues read tags");
    for name in ["forged", "moved"] {
        let q = queues.get(name).await.unwrap();
        let proof = status_of(&q).ownership_proof.expect("a fresh proof");
        assert!(proof.proven_at >= proofs[name].proven_at, "{name}: proven again, sealed anew");
    }
    assert_no_failures(&op.ctx.metrics, "reconciles failed");
    finish(op, ns).await;
}

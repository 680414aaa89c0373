//! How often converged Queues come back: paced by the budget their own account and region
//! really have, against the same fakes as the other reconcile tests.

use super::*;

/// With 3,000 Queues in the cache and the default budget (48 calls/s), resyncs every 60 s would
/// take 50 calls/s: all of it, and new Queues would wait behind them. A converged Queue comes
/// back after 3,000 / 24 = 125 s instead (less up to 10 % jitter).
#[tokio::test]
async fn many_converged_queues_stretch_their_resync_to_half_the_budget() {
    let mut h = harness_with(FakeSqs::with_limiter(providers::SqsSettings::default().limiter()));
    h.reconcile(h.put(&queue(QueueSpec::default()))).await.unwrap();
    let resync = |h: &Harness| h.ctx.resyncs.due_in(&object_key(&h.current())).expect("resynced").as_secs_f64();
    let alone = resync(&h);
    assert!((54.0..=60.0).contains(&alone), "one Queue resyncs at --queue-resync: {alone} s");
    h.cache_others(3_000);
    h.ctx.written.forget(&object_key(&h.current()));
    h.reconcile(Arc::new(h.current())).await.unwrap();
    let many = resync(&h);
    assert!((112.0..=125.5).contains(&many), "3,000 Queues resync every 125 s: {many} s");
    assert_eq!(h.ctx.tag_resync(&h.current()), Duration::from_secs(600), "3,000 tag reads per 10 min fit half of 24/s");
}

/// Each AWS account and region paces its own Queues: 3,000 Queues of an AwsAccount leave the
/// 10 Queues of the operator's own account checked at the flags, and their own checks stretch
/// to 3,000 / 24 = 125 s (one count over all Queues stretched both).
#[tokio::test]
async fn each_account_and_region_paces_its_own_queues() {
    use crate::crd::account::{AccountRef, AwsAccountSpec};
    let mut h = harness_with(FakeSqs::with_limiter(providers::SqsSettings::default().limiter()));
    let spec = AwsAccountSpec {
        role_arn: "arn:aws:iam::000000000002:role/team".into(),
        region: "eu-west-1".into(),
        ..Default::default()
    };
    let mut team = AwsAccount::new("team", spec);
    team.metadata.namespace = Some("ns".into());
    h.accounts.apply_watcher_event(&watcher::Event::Apply(team));
    let theirs = |i: usize| {
        let mut q = queue(QueueSpec {
            account_ref: Some(Box::new(AccountRef { name: "team".into(), namespace: None })),
            ..Default::default()
        });
        q.metadata.name = Some(format!("t-{i}"));
        q
    };
    for i in 0..3_000 {
        h.queues.apply_watcher_event(&watcher::Event::Apply(theirs(i)));
    }
    h.cache_others(10);
    let own = queue(QueueSpec::default());
    assert_eq!(h.ctx.resync(&own), h.ctx.settings.resync, "10 Queues in the operator's own account");
    assert_eq!(h.ctx.tag_resync(&own), h.ctx.settings.tag_resync);
    assert_eq!(h.ctx.resync(&theirs(0)).as_secs_f64().round(), 125.0, "3,000 checks at half of 48/s");
    let paces = h.ctx.paces();
    let team = paces.iter().find(|(b, _)| b.0 == "000000000002").expect("the team's budget");
    assert_eq!((team.0.1.as_str(), team.1.queues), ("eu-west-1", 3_000));
    let own = paces.iter().find(|(b, _)| b.0 == accounts::DEFAULT_ACCOUNT).expect("the operator's own budget");
    assert_eq!(own.1.queues, 10);
}

/// The pace comes from the budget the SQS client really has, not from the settings the controller
/// was handed beside it: the benchmark once gave a 300/s client a controller told 48/s, which
/// then checked 1,000 Queues every 42 s instead of every 10 s.
#[tokio::test]
async fn the_resync_is_paced_by_the_sqs_clients_own_budget() {
    // The fake's budget is 1,000 calls/s; the controller's settings say 48.
    let mut h = harness();
    h.cache_others(3_000);
    let q = queue(QueueSpec::default());
    assert_eq!(h.ctx.resync(&q), h.ctx.settings.resync, "3,000 checks per minute fit half of 1,000/s");
    assert_eq!(h.ctx.tag_resync(&q), h.ctx.settings.tag_resync);
}

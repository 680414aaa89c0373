//! The Events a controller publishes: a repeated one is one Event with a series count.

use kube::api::Api;

use crate::common::TestNs;

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_repeated_event_is_one_event_with_a_series_and_another_note_is_another_event() {
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::events::v1::Event;
    use skyport::controllers::events::{EventType, Events};
    let ns = TestNs::new("sq-events").await;
    let events = Events::new(ns.client.clone(), "skyport.dev/test", None);
    let regarding = ObjectReference {
        api_version: Some("skyport.dev/v1alpha1".into()),
        kind: Some("Queue".into()),
        name: Some("orders".into()),
        namespace: Some(ns.name.clone()),
        uid: Some("8c0b3a55-0000-4000-8000-000000000001".into()),
        ..Default::default()
    };
    for _ in 0..3 {
        events.publish(&regarding, EventType::Warning, "Failed", "Reconcile", "SQS said no").await.unwrap();
    }
    events.publish(&regarding, EventType::Warning, "Failed", "Reconcile", "SQS said no again").await.unwrap();
    let api: Api<Event> = ns.api();
    let mut seen: Vec<(String, i32)> = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|e| (e.note.unwrap_or_default(), e.series.map_or(1, |s| s.count)))
        .collect();
    seen.sort();
    assert_eq!(seen, [("SQS said no".to_string(), 3), ("SQS said no again".to_string(), 1)]);
    assert_eq!(events.remembered(), 2);
}

//! An STS stand-in in front of LocalStack that enforces role trust as AWS does and LocalStack's
//! community STS does not: `AssumeRole` (query protocol, as the SDK sends it: a form-encoded
//! POST with `Action`, `RoleArn`, `RoleSessionName`, `ExternalId`) succeeds only for a role in
//! its trust table, with the external id (and session-name prefix, when set) the role requires.
//! Anything else gets AWS's `AccessDenied` (HTTP 403, the query protocol's XML error). Allowed
//! requests, and every other action, are forwarded to LocalStack, whose credentials place the
//! queues made with them in the role's account.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use tokio::sync::oneshot;

use super::Operator;
use super::sqs_faults::{Reply, forward};

/// What a role's trust policy requires of the operator.
#[derive(Debug, Clone)]
struct Trust {
    external_id: String,
    session_prefix: Option<String>,
}

/// One AssumeRole as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assumed {
    pub role_arn: String,
    pub external_id: Option<String>,
    pub session_name: String,
    pub allowed: bool,
}

#[derive(Clone, Default)]
struct Shared {
    trust: Arc<Mutex<HashMap<String, Trust>>>,
    calls: Arc<Mutex<Vec<Assumed>>>,
}

pub struct Sts {
    pub addr: SocketAddr,
    shared: Shared,
}

impl Sts {
    /// Listens on a free loopback port, forwarding to LocalStack (`AWS_ENDPOINT_URL`). No role
    /// trusts anyone until [`Sts::trust`] says so.
    pub async fn start() -> Sts {
        let endpoint = std::env::var("AWS_ENDPOINT_URL").expect("AWS_ENDPOINT_URL (tests/env.sh env)");
        let upstream = endpoint.trim_start_matches("http://").trim_end_matches('/').to_string();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let shared = Shared::default();
        let serving = shared.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (shared, upstream) = (serving.clone(), upstream.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |req| handle(req, shared.clone(), upstream.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Sts { addr, shared }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `role` trusts the operator when it sends `external_id`.
    pub fn trust(&self, role: &str, external_id: &str) {
        let trust = Trust { external_id: external_id.to_string(), session_prefix: None };
        self.shared.trust.lock().unwrap().insert(role.to_string(), trust);
    }

    /// `role` trusts the operator when it sends `external_id` and a session name starting with
    /// `prefix` (`sts:RoleSessionName` with `StringLike`).
    pub fn trust_session(&self, role: &str, external_id: &str, prefix: &str) {
        let trust = Trust { external_id: external_id.to_string(), session_prefix: Some(prefix.to_string()) };
        self.shared.trust.lock().unwrap().insert(role.to_string(), trust);
    }

    /// Every AssumeRole received so far.
    pub fn calls(&self) -> Vec<Assumed> {
        self.shared.calls.lock().unwrap().clone()
    }
}

/// The external id skyport derives for AwsAccounts of `namespace` in the test cluster.
pub fn external_id(namespace: &str) -> String {
    skyport::crd::account::external_id(super::TEST_CLUSTER, namespace)
}

/// SQS as `role` in `region`, assumed independently of skyport's adapter.
pub async fn sqs_as(role: &str, region: &str) -> aws_sdk_sqs::Client {
    let _ = super::sqs().await; // checks the environment
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
            aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https();
    let base = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .http_client(http)
        .region(aws_config::Region::new(region.to_string()))
        .load()
        .await;
    let provider =
        aws_config::sts::AssumeRoleProvider::builder(role).session_name("skyport-test").configure(&base).build().await;
    aws_sdk_sqs::Client::from_conf(aws_sdk_sqs::config::Builder::from(&base).credentials_provider(provider).build())
}

impl Operator {
    /// A Queue controller for `ns` whose AssumeRole calls go through `sts`, allowing `http://`
    /// AwsAccount endpoints when `allow_http` (LocalStack and the test proxies speak plain HTTP).
    pub async fn start_with_sts(
        ns: &super::TestNs,
        settings: skyport::config::QueueArgs,
        sts: &Sts,
        allow_http: bool,
    ) -> Self {
        let aws = providers::SqsSettings {
            operation_timeout: std::time::Duration::from_secs(5),
            tag_rate_per_second: std::num::NonZeroU32::new(40).expect("non-zero"),
            sts_endpoint_url: Some(sts.url()),
            allow_http_endpoints: allow_http,
            ..Default::default()
        };
        let sqs = providers::SqsProvider::from_env(&aws).await;
        let (tx, rx) = oneshot::channel::<()>();
        let (ctx, run) = skyport::controllers::queue::controller(
            ns.client.clone(),
            Arc::new(sqs),
            aws,
            settings,
            Some(ns.name.clone()),
            skyport::controllers::Acting::always(),
            async {
                let _ = rx.await;
            },
        );
        Operator { ctx, stop: Some(tx), task: tokio::spawn(run) }
    }
}

async fn handle(req: Request<Incoming>, shared: Shared, upstream: String) -> Reply {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(std::io::Error::other)?.to_bytes();
    let form: HashMap<String, String> = form_urlencoded::parse(&body).into_owned().collect();
    if form.get("Action").map(String::as_str) != Some("AssumeRole") {
        return forward(&upstream, parts, body).await;
    }
    let role_arn = form.get("RoleArn").cloned().unwrap_or_default();
    let external_id = form.get("ExternalId").cloned();
    let session_name = form.get("RoleSessionName").cloned().unwrap_or_default();
    let trust = shared.trust.lock().unwrap().get(&role_arn).cloned();
    let allowed = trust.is_some_and(|t| {
        external_id.as_deref() == Some(t.external_id.as_str())
            && t.session_prefix.is_none_or(|p| session_name.starts_with(&p))
    });
    shared.calls.lock().unwrap().push(Assumed { role_arn: role_arn.clone(), external_id, session_name, allowed });
    if allowed {
        return forward(&upstream, parts, body).await;
    }
    let message = format!(
        "User: arn:aws:iam::000000000000:user/skyport-operator is not authorized to perform: sts:AssumeRole on resource: {role_arn}"
    );
    let xml = format!(
        r#"<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error><Type>Sender</Type><Code>AccessDenied</Code><Message>{message}</Message></Error><RequestId>00000000-0000-0000-0000-000000000000</RequestId></ErrorResponse>"#
    );
    Ok(Response::builder()
        .status(403)
        .header("content-type", "text/xml")
        .header("x-amzn-requestid", "00000000-0000-0000-0000-000000000000")
        .body(Full::new(Bytes::from(xml)))
        .unwrap())
}

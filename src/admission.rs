//! Proof, before the operator acts, that skyport's ValidatingAdmissionPolicies cover the identity
//! it runs as. RBAC cannot name objects created later, so it lets skyport write any Secret and
//! ConfigMap it reaches, any Queue's or Tunnel's metadata and any AwsAccount; only the policies
//! narrow that to skyport's own objects, and they recognise skyport by the ServiceAccount named in
//! their matchConditions. An install that moved the namespace or renamed the ServiceAccount
//! without changing those, or left the policies out, would run with the bare RBAC and look
//! healthy. So the operator asks the API server, with a dry run, whether it would create an
//! unlabelled Secret without an owner in the tunnel clients' namespace (where every install lets
//! it create Secrets), which the policies refuse, and does not start when the answer is yes.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, PostParams};
use tracing::{info, warn};

/// The name prefix of the probe Secret (a dry run: nothing is ever stored).
pub const PROBE_PREFIX: &str = "skyport-admission-probe-";

/// How often, and how far apart, an admitted probe is tried again: the API server picks up a
/// policy installed together with the operator from a watch, a moment after it is stored.
const ATTEMPTS: u32 = 5;
const PAUSE: Duration = Duration::from_secs(2);

/// What the API server answered the probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A ValidatingAdmissionPolicy refused it: the policies cover this identity.
    Covered,
    /// It would have been stored: no policy covers this identity.
    Uncovered,
    /// RBAC refused it first (no `create` on Secrets there), so coverage cannot be told.
    Unprovable(String),
}

/// One dry-run create of an unlabelled Opaque Secret without an owner in `namespace`.
pub async fn probe(client: &Client, namespace: &str) -> Result<Verdict, kube::Error> {
    let secret = Secret {
        metadata: kube::api::ObjectMeta { generate_name: Some(PROBE_PREFIX.into()), ..Default::default() },
        type_: Some("Opaque".into()),
        ..Default::default()
    };
    let dry_run = PostParams { dry_run: true, ..Default::default() };
    match Api::<Secret>::namespaced(client.clone(), namespace).create(&dry_run, &secret).await {
        Ok(_) => Ok(Verdict::Uncovered),
        Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains("ValidatingAdmissionPolicy") => {
            Ok(Verdict::Covered)
        }
        Err(kube::Error::Api(e)) if e.code == 403 => Ok(Verdict::Unprovable(e.message)),
        Err(e) => Err(e),
    }
}

/// Probes until a policy answers (see [`ATTEMPTS`]); `Err` says why the operator must not start
/// and how to fix it. With `allow` (`--allow-without-admission-policies`) an uncovered identity
/// is only warned about.
pub async fn verify(client: &Client, namespace: &str, allow: bool) -> anyhow::Result<()> {
    let mut verdict = probe(client, namespace).await?;
    for _ in 1..ATTEMPTS {
        if verdict == Verdict::Covered {
            break;
        }
        tokio::time::sleep(PAUSE).await;
        verdict = probe(client, namespace).await?;
    }
    let why = match verdict {
        Verdict::Covered => {
            info!(namespace, "the admission policies cover this operator's identity");
            return Ok(());
        }
        Verdict::Uncovered => format!(
            "no ValidatingAdmissionPolicy covers this operator's identity ({}): the API server would let it \
             create a Secret it does not own in {namespace}",
            identity(client).await
        ),
        Verdict::Unprovable(refusal) => format!(
            "cannot prove that the admission policies cover this operator's identity ({}): RBAC refused the \
             dry-run probe in {namespace} ({refusal})",
            identity(client).await
        ),
    };
    if allow {
        warn!(
            why,
            "starting without admission policies (--allow-without-admission-policies): a stolen token of this identity writes whatever its RBAC reaches"
        );
        return Ok(());
    }
    anyhow::bail!(
        "{why}. Install the policies of deploy/admission.yaml with every matchCondition naming this \
         ServiceAccount (Helm: rbac.admissionPolicy=true renders them for the release's namespace and \
         ServiceAccount), or, where the cluster cannot have them, pass --allow-without-admission-policies \
         (unsafe: see docs/security.md)"
    )
}

/// The user name the API server sees for `client`, for the error.
async fn identity(client: &Client) -> String {
    let api: Api<SelfSubjectReview> = Api::all(client.clone());
    match api.create(&PostParams::default(), &SelfSubjectReview::default()).await {
        Ok(review) => review.status.and_then(|s| s.user_info).and_then(|u| u.username).unwrap_or_default(),
        Err(_) => "unknown".into(),
    }
}

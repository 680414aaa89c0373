//! The operator's pod: the Deployment is hardened, probed and passes flags the binary accepts,
//! and the image is a static binary run as non-root.

use std::path::Path;

use clap::Parser;
use k8s_openapi::api::apps::v1::Deployment;

use super::harness::{read, root};

#[test]
fn deployment_is_hardened_probed_and_passes_flags_the_binary_accepts() {
    let deployment: Deployment = serde_saphyr::from_str(&read("deploy/deployment.yaml")).unwrap();
    let pod = deployment.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some("skyport"));
    let pod_security = pod.security_context.unwrap();
    assert_eq!(pod_security.run_as_non_root, Some(true));
    assert_eq!(pod_security.seccomp_profile.unwrap().type_, "RuntimeDefault");
    let container = &pod.containers[0];
    let security = container.security_context.clone().unwrap();
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.capabilities.unwrap().drop, Some(vec!["ALL".to_string()]));
    let probe_path = |p: &Option<k8s_openapi::api::core::v1::Probe>| p.clone().unwrap().http_get.unwrap().path.unwrap();
    assert_eq!(probe_path(&container.liveness_probe), "/healthz");
    assert_eq!(probe_path(&container.readiness_probe), "/readyz");
    let env: Vec<(String, String)> = container
        .env
        .clone()
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.value_from.and_then(|v| v.field_ref).map(|f| f.field_path).unwrap_or_default()))
        .collect();
    assert!(env.contains(&("POD_NAME".into(), "metadata.name".into())), "{env:?}");
    assert!(env.contains(&("POD_NAMESPACE".into(), "metadata.namespace".into())), "{env:?}");
    let client_image = container.env.iter().flatten().find(|e| e.name == "SKYPORT_TUNNEL_CLIENT_IMAGE");
    assert_eq!(
        client_image.and_then(|e| e.value.clone()),
        container.image.clone(),
        "tunnel clients run the operator's image, where an overlay's `images:` changes both"
    );
    let secrets: Vec<(String, Option<bool>)> = container
        .env_from
        .clone()
        .unwrap()
        .into_iter()
        .map(|e| e.secret_ref.map(|s| (s.name, s.optional)).unwrap_or_default())
        .collect();
    assert_eq!(
        secrets,
        [("skyport-aws".to_string(), Some(true)), ("skyport-providers".to_string(), Some(true))],
        "optional credentials Secrets: AWS, exit-server providers"
    );
    assert!(container.resources.clone().unwrap().requests.is_some());

    let args = container.args.clone().unwrap();
    let cli = skyport::config::Cli::try_parse_from(std::iter::once("skyport".to_string()).chain(args.clone()))
        .unwrap_or_else(|e| panic!("deploy/deployment.yaml passes flags skyport rejects: {e}"));
    let skyport::config::Command::Run(run) = cli.command else { panic!("not `skyport run`: {args:?}") };
    assert!(run.leader.enabled, "replicas > 1 must be safe");
    assert_eq!(run.leader.lease_name, "skyport", "must match the Role's resourceNames");
    assert_eq!(run.listen_address.port(), 8080, "must match the container port");
    assert_eq!(run.tunnel.provider, None, "no cloud is chosen for the user: --provider is set in an overlay");
    assert!(!run.tunnel.default_load_balancer && !run.tunnel.annotated_only);
    assert_eq!(run.tunnel.cluster_id, None, "default: the kube-system namespace's UID (RBAC allows that get)");
}

#[test]
fn dockerfile_builds_a_static_binary_into_a_non_root_image() {
    let dockerfile = read("Dockerfile");
    assert!(dockerfile.matches("FROM ").count() >= 2, "multi-stage");
    assert!(dockerfile.contains("USER 65532:65532"), "non-root, matching runAsUser in the manifests");
    assert!(Path::new(&root().join(".dockerignore")).exists(), "keep target/ out of the build context");
}

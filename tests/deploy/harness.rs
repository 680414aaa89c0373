//! How the tests reach the manifests: files under the repository root, YAML streams, and
//! `kubectl` / `helm` run as processes against the test environment.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::Value;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every document of a YAML stream, without empty ones.
pub fn documents(yaml: &str) -> Vec<Value> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).unwrap_or_else(|e| panic!("invalid YAML: {e}\n{yaml}"));
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

pub fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the manifests"))
}

/// Runs `program args` with `stdin`; panics with its output unless it succeeds.
pub fn run(program: &str, args: &[&str], stdin: Option<&str>) -> String {
    let mut child = Command::new(program)
        .args(args)
        .current_dir(root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e} (is the test environment's PATH set?)"));
    let mut input = child.stdin.take().expect("stdin");
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).expect("write stdin");
    }
    drop(input);
    let out = child.wait_with_output().expect("wait");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{program} {args:?} failed ({}):\n{stdout}\n{stderr}", out.status);
    stdout.into_owned()
}

pub fn require_env() {
    assert!(
        std::env::var_os("KUBECONFIG").is_some(),
        "KUBECONFIG is not set: start the test environment with `eval \"$(tests/env.sh up)\"` (or run tests/run.sh)"
    );
}

/// helm built from its Go module: SKYPORT_HELM (tests/run.sh), else tests/env/build-helm.sh.
pub fn helm() -> String {
    if let Some(path) = std::env::var_os("SKYPORT_HELM") {
        return path.to_string_lossy().into_owned();
    }
    run("tests/env/build-helm.sh", &[], None).trim().to_string()
}

pub fn kustomize() -> String {
    run("kubectl", &["kustomize", "deploy/"], None)
}

pub fn helm_template(extra: &[&str]) -> String {
    let mut args =
        vec!["template", "skyport", "deploy/helm/skyport", "--namespace", "skyport-system", "--include-crds"];
    args.extend_from_slice(extra);
    run(&helm(), &args, None)
}

/// The install namespace must exist for a server-side dry run of the objects inside it (the
/// dry run does not create the Namespace). Applying it is what an install does first anyway.
/// Once per process: two tests applying it at the same moment both find it missing, and the
/// second create fails with AlreadyExists (it did in CI).
pub fn ensure_install_namespace() {
    static APPLIED: std::sync::Once = std::sync::Once::new();
    APPLIED.call_once(|| {
        run("kubectl", &["apply", "-f", "deploy/namespace.yaml"], None);
    });
}

//! What `deploy/` must hold: exact copies of `crds/`, and every manifest listed in its
//! kustomization.

use std::collections::BTreeMap;

use serde_json::Value;

use super::harness::{read, root};

#[test]
fn deploy_crds_are_copies_of_the_generated_crds() {
    let canonical: BTreeMap<String, String> = std::fs::read_dir(root().join("crds"))
        .expect("crds/")
        .map(|e| e.expect("entry").path())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read_to_string(&p).unwrap()))
        .collect();
    for dir in ["deploy/crds", "deploy/helm/skyport/crds"] {
        let copies: BTreeMap<String, String> = std::fs::read_dir(root().join(dir))
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .map(|e| e.expect("entry").path())
            .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read_to_string(&p).unwrap()))
            .collect();
        assert!(copies == canonical, "{dir}/ differs from crds/: regenerate both with `cargo run -- crds --write-all`");
    }
}

#[test]
fn kustomization_lists_every_manifest_in_deploy() {
    let kustomization: Value = serde_saphyr::from_str(&read("deploy/kustomization.yaml")).unwrap();
    let listed: Vec<&str> =
        kustomization["resources"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    for entry in std::fs::read_dir(root().join("deploy")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".yaml") && name != "kustomization.yaml" {
            assert!(listed.contains(&name.as_str()), "deploy/{name} is not in deploy/kustomization.yaml");
        }
    }
    for crd in std::fs::read_dir(root().join("crds")).unwrap() {
        let name = format!("crds/{}", crd.unwrap().file_name().to_string_lossy());
        assert!(listed.contains(&name.as_str()), "{name} is not in deploy/kustomization.yaml");
    }
}

//! Every checked-in copy of the CRDs (`crds/`, and the kustomize and Helm copies under
//! `deploy/`) must be exactly what the Rust types generate: `skyport crds --write-all` writes them.

#[test]
fn checked_in_crds_match_the_rust_types() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for copy in ["crds", "deploy/crds", "deploy/helm/skyport/crds"] {
        let dir = root.join(copy);
        let mut expected: Vec<String> = Vec::new();
        for crd in skyport::crd::all() {
            let name = skyport::crd::file_name(&crd);
            let generated = skyport::crd::to_yaml(std::slice::from_ref(&crd)).expect("CRDs serialize");
            let on_disk = std::fs::read_to_string(dir.join(&name)).unwrap_or_default();
            assert!(
                generated == on_disk,
                "{copy}/{name} is stale or missing: regenerate with `cargo run -- crds --write-all`"
            );
            expected.push(name);
        }
        let mut present: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        present.sort();
        expected.sort();
        assert_eq!(present, expected, "{copy}/ holds exactly one file per CRD");
    }
}

#[test]
fn every_schema_property_has_a_description() {
    // `kubectl explain queue.spec.<field>` should teach the API; an undocumented field is a bug.
    fn walk(path: &str, schema: &serde_json::Value, missing: &mut Vec<String>) {
        if let Some(props) = schema.get("properties").and_then(|p| p.as_object()) {
            for (name, sub) in props {
                let here = format!("{path}.{name}");
                if sub.get("description").is_none() && !["metadata", "apiVersion", "kind"].contains(&name.as_str()) {
                    missing.push(here.clone());
                }
                walk(&here, sub, missing);
            }
        }
        if let Some(items) = schema.get("items") {
            walk(&format!("{path}[]"), items, missing);
        }
    }
    for crd in skyport::crd::all() {
        let json = serde_json::to_value(&crd).unwrap();
        let schema = &json["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        let mut missing = Vec::new();
        walk(&crd.metadata.name.clone().unwrap_or_default(), schema, &mut missing);
        assert!(missing.is_empty(), "fields without description: {missing:?}");
    }
}

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
    let list = |key: &str| -> Vec<String> {
        let entries = kustomization[key].as_array().map(Vec::as_slice).unwrap_or_default();
        entries.iter().map(|v| v.as_str().unwrap().to_string()).collect()
    };
    let listed = list("resources");
    // Transformer configurations (kustomizeconfig.yaml) are listed too, but not as resources.
    let configurations = list("configurations");
    for entry in std::fs::read_dir(root().join("deploy")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".yaml") && name != "kustomization.yaml" && !configurations.contains(&name) {
            assert!(listed.contains(&name), "deploy/{name} is not in deploy/kustomization.yaml");
        }
    }
    for crd in std::fs::read_dir(root().join("crds")).unwrap() {
        let name = format!("crds/{}", crd.unwrap().file_name().to_string_lossy());
        assert!(listed.contains(&name), "{name} is not in deploy/kustomization.yaml");
    }
}

/// The release's assets carry the names the default `--exit-server-url` asks for, and digests a
/// VM's check agrees with; a tag that is not the crate's version publishes nothing.
#[test]
fn release_assets_are_named_for_the_download_url_and_carry_their_digests() {
    use sha2::{Digest, Sha256};
    let dir = std::env::temp_dir().join(format!("skyport-release-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (platform, bytes) in [("amd64", "x86 binary"), ("arm64", "arm binary")] {
        std::fs::create_dir_all(dir.join("dist").join(platform)).unwrap();
        std::fs::write(dir.join("dist").join(platform).join("skyport"), bytes).unwrap();
    }
    let script = root().join("deploy/release.sh");
    let run = |args: &[&std::ffi::OsStr]| std::process::Command::new(&script).args(args).output().unwrap();
    let out = run(&["assets".as_ref(), dir.join("dist").as_os_str(), dir.join("out").as_os_str()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let values = read("deploy/helm/skyport/values.yaml");
    assert!(values.contains("releases/download/v{version}/skyport-{arch}\""), "the default URL names skyport-{{arch}}");
    for (arch, bytes) in [("x86_64", "x86 binary"), ("aarch64", "arm binary")] {
        let asset = dir.join("out").join(format!("skyport-{arch}"));
        assert_eq!(std::fs::read_to_string(&asset).unwrap(), bytes);
        let digest: String = Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect();
        let file = std::fs::read_to_string(dir.join("out").join(format!("skyport-{arch}.sha256"))).unwrap();
        assert_eq!(file, format!("{digest}  skyport-{arch}\n"));
        assert!(std::fs::read_to_string(dir.join("out/SHA256SUMS")).unwrap().contains(&file));
    }
    let version = env!("CARGO_PKG_VERSION");
    assert!(run(&["check-version".as_ref(), version.as_ref()]).status.success());
    assert!(!run(&["check-version".as_ref(), "0.0.0-not-this".as_ref()]).status.success());
    std::fs::remove_dir_all(&dir).unwrap();
}

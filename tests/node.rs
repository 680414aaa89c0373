//! The test node's cluster (tests/env/node.sh) as the install and node Tunnel tests reach it: its
//! kubeconfig, `kubectl` and `helm` against it, the node's container runtime (image import, the
//! process of a running container), and the kernel's view of that process.

use std::path::PathBuf;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::Value;

use crate::deploy::harness::{helm, run};

#[path = "node/pair.rs"]
pub mod pair;
#[path = "node/tunnels.rs"]
pub mod tunnels;

/// Turns on the node's cluster: an install (`write`) brings and removes cluster-wide objects (CRDs
/// with `kubectl delete -k`, admission policies) and runs an operator that would take every
/// LoadBalancer Service for itself; tests with an in-process operator there (`read`) run beside
/// each other but never beside an install.
pub static NODE_CLUSTER: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

pub struct Node {
    kubeconfig: String,
    /// LocalStack as Pods reach it (the node's address).
    pub aws_endpoint: String,
    /// Addresses the node routes to itself, for the local provider's exit servers.
    pub exit_addresses: String,
    containerd: String,
    bin: PathBuf,
    pub client: Client,
}

/// What `SKYPORT_NODE` / `SKYPORT_NODE_ERROR` / `SKYPORT_NODE_KUBECONFIG` of `tests/env.sh up`
/// say. `None` only for the explicit opt-out, which is printed; a node that should be there
/// and is not fails the test.
pub async fn node() -> Option<Node> {
    if std::env::var("SKYPORT_NODE").as_deref() == Ok("0") {
        eprintln!("SKIPPED: SKYPORT_NODE=0, the environment was started without its node");
        return None;
    }
    if let Ok(reason) = std::env::var("SKYPORT_NODE_ERROR") {
        panic!("the test node did not start: {reason} (opt out with SKYPORT_NODE=0)");
    }
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!("{name} is not set: start the environment with `eval \"$(tests/env.sh up)\"`, which starts the node")
        })
    };
    let kubeconfig = var("SKYPORT_NODE_KUBECONFIG");
    let config = Kubeconfig::read_from(&kubeconfig).expect("the node's kubeconfig");
    let config = Config::from_custom_kubeconfig(config, &KubeConfigOptions::default()).await.expect("kube config");
    let _ = rustls::crypto::ring::default_provider().install_default();
    Some(Node {
        client: Client::try_from(config).expect("kube client"),
        aws_endpoint: var("SKYPORT_NODE_AWS_ENDPOINT_URL"),
        exit_addresses: var("SKYPORT_NODE_EXIT_ADDRESSES"),
        containerd: var("SKYPORT_NODE_CONTAINERD"),
        bin: PathBuf::from(var("SKYPORT_NODE_BIN")),
        kubeconfig,
    })
}

impl Node {
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> String {
        let mut all = vec!["--kubeconfig", &self.kubeconfig];
        all.extend_from_slice(args);
        run("kubectl", &all, stdin)
    }

    pub fn helm(&self, args: &[&str]) -> String {
        let mut all = vec!["--kubeconfig", &self.kubeconfig];
        all.extend_from_slice(args);
        run(&helm(), &all, None)
    }

    /// Runs `program --kubeconfig <node> args`, for clean-ups that may find nothing to do.
    pub fn attempt(&self, program: &str, args: &[&str]) -> bool {
        let status = std::process::Command::new(program)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        status.is_ok_and(|s| s.success())
    }

    /// skyport's image (tests/env/build-image.sh, or `SKYPORT_IMAGE="<archive> <reference>"` from
    /// tests/run.sh) imported into the node's runtime; returns (repository, tag).
    pub fn import_skyport_image(&self) -> (String, String) {
        self.import("SKYPORT_IMAGE", "tests/env/build-image.sh")
    }

    /// The Tunnel tests' backend image (tests/env/build-echo.sh) imported; returns its reference.
    pub fn import_echo_image(&self) -> String {
        let (repository, tag) = self.import("SKYPORT_ECHO_IMAGE", "tests/env/build-echo.sh");
        format!("{repository}:{tag}")
    }

    /// The image `script` builds (or `var` names as "<archive> <reference>") imported into the
    /// node's runtime; returns (repository, tag).
    fn import(&self, var: &str, script: &str) -> (String, String) {
        let built = match std::env::var(var) {
            Ok(line) => line,
            Err(_) => run(script, &[], None),
        };
        let (archive, reference) = built.trim().split_once(' ').expect("\"<archive> <reference>\"");
        run("ctr", &["--address", &self.containerd, "--namespace", "k8s.io", "images", "import", archive], None);
        let (repository, tag) = reference.rsplit_once(':').expect("name:tag");
        (repository.to_string(), tag.to_string())
    }

    fn crictl(&self, args: &[&str]) -> String {
        let endpoint = format!("unix://{}", self.containerd);
        let mut all = vec!["--runtime-endpoint", &endpoint];
        all.extend_from_slice(args);
        run(&self.bin.join("crictl").to_string_lossy(), &all, None)
    }

    /// The host pid of the running container `container` of Pod `pod`.
    pub fn container_pid(&self, pod: &str, container: &str) -> u32 {
        let label = format!("io.kubernetes.pod.name={pod}");
        let ids = self.crictl(&["ps", "--state", "Running", "--name", container, "--label", &label, "-q"]);
        let id = ids.lines().next().unwrap_or_else(|| panic!("no running container {container} in Pod {pod}"));
        let info: Value = serde_json::from_str(&self.crictl(&["inspect", id])).expect("crictl inspect JSON");
        info["info"]["pid"].as_u64().expect("info.pid") as u32
    }
}

/// What the kernel says about a process: the fields of /proc/<pid>/status.
pub fn proc_status(pid: u32, field: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/<pid>/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
        .trim()
        .to_string()
}

/// The mount options of the process's `/`.
pub fn root_mount_options(pid: u32) -> String {
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).expect("mountinfo");
    // Fields: id parent major:minor root mount-point options ...
    mountinfo
        .lines()
        .rev()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .find(|f| f.len() > 5 && f[4] == "/")
        .map(|f| f[5].to_string())
        .expect("a mount at /")
}

/// The memory limit of the process's cgroup (v1 memory controller, or v2 memory.max).
pub fn memory_limit(pid: u32) -> u64 {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("/proc/<pid>/cgroup");
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let file = if controllers.split(',').any(|c| c == "memory") {
            format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
        } else if controllers.is_empty() && std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            format!("/sys/fs/cgroup{path}/memory.max")
        } else {
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{file}: {e}"));
        return text.trim().parse().unwrap_or_else(|_| panic!("{file}: {text}"));
    }
    panic!("no memory cgroup for pid {pid}:\n{cgroups}");
}

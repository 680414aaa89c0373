//! A control plane of its own for one kube-apiserver build: the environment's etcd and that
//! kube-apiserver on free loopback ports in a temporary directory, serving with the environment's
//! test PKI (read, never written) and reached through a kubeconfig of its own. Dropping it stops
//! both processes and deletes the directory; a failing test first prints the apiserver's log tail.

use std::fs;
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const READY: Duration = Duration::from_secs(120);

pub struct Cluster {
    dir: PathBuf,
    processes: Vec<Child>,
    kubeconfig: PathBuf,
}

/// A port nobody listens on now (the kernel's pick; the window until etcd binds it is short).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind a loopback port").local_addr().expect("its address").port()
}

fn spawn(program: &Path, args: &[String], log: &Path) -> Child {
    let out = fs::File::create(log).expect("create a log file");
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("clone the log handle"))
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", program.display()))
}

fn etcd_args(dir: &Path, client: u16, peer: u16) -> Vec<String> {
    let (client, peer) = (format!("http://127.0.0.1:{client}"), format!("http://127.0.0.1:{peer}"));
    vec![
        "--name=matrix".into(),
        format!("--data-dir={}", dir.join("etcd").display()),
        format!("--listen-client-urls={client}"),
        format!("--advertise-client-urls={client}"),
        format!("--listen-peer-urls={peer}"),
        format!("--initial-advertise-peer-urls={peer}"),
        format!("--initial-cluster=matrix={peer}"),
        // Disposable data: fsync would only slow the test down.
        "--unsafe-no-fsync=true".into(),
    ]
}

/// The flags of tests/env.sh's kube-apiserver (see there why each is set), on other ports.
fn apiserver_args(dir: &Path, pki: &Path, etcd: u16, port: u16) -> Vec<String> {
    let p = |f: &str| pki.join(f).display().to_string();
    vec![
        format!("--etcd-servers=http://127.0.0.1:{etcd}"),
        "--advertise-address=127.0.0.1".into(),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        format!("--cert-dir={}", dir.join("apiserver").display()),
        format!("--tls-cert-file={}", p("apiserver.crt")),
        format!("--tls-private-key-file={}", p("apiserver.key")),
        format!("--client-ca-file={}", p("ca.crt")),
        format!("--token-auth-file={}", p("tokens.csv")),
        "--authorization-mode=RBAC".into(),
        format!("--service-account-issuer=https://127.0.0.1:{port}/"),
        format!("--service-account-key-file={}", p("sa.pub")),
        format!("--service-account-signing-key-file={}", p("sa.key")),
        "--service-cluster-ip-range=10.0.0.0/24".into(),
        "--disable-admission-plugins=ServiceAccount".into(),
        "--endpoint-reconciler-type=none".into(),
    ]
}

fn kubeconfig_for(pki: &Path, port: u16) -> String {
    let tokens = fs::read_to_string(pki.join("tokens.csv")).expect("read the test PKI's tokens.csv");
    let token = tokens.split(',').next().expect("a token");
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: matrix\n  cluster:\n    server: https://127.0.0.1:{port}\n    \
         certificate-authority: {}\nusers:\n- name: admin\n  user:\n    token: {token}\ncontexts:\n- name: matrix\n  \
         context:\n    cluster: matrix\n    user: admin\ncurrent-context: matrix\n",
        pki.join("ca.crt").display()
    )
}

impl Cluster {
    /// etcd and `apiserver` started, the apiserver ready (its /readyz checks etcd too).
    pub fn start(apiserver: &Path) -> Cluster {
        let state = std::env::var_os("SKYPORT_TEST_ENV")
            .expect("SKYPORT_TEST_ENV is not set: eval \"$(tests/env.sh up)\" (its etcd and PKI are reused)");
        let pki = PathBuf::from(state).join("pki");
        let dir = std::env::temp_dir().join(format!("skyport-matrix-{}-{}", std::process::id(), free_port()));
        fs::create_dir_all(&dir).expect("create the cluster's directory");
        let (etcd, peer, port) = (free_port(), free_port(), free_port());
        let kubeconfig = dir.join("kubeconfig");
        fs::write(&kubeconfig, kubeconfig_for(&pki, port)).expect("write the kubeconfig");
        let etcd_bin = which("etcd");
        let mut cluster = Cluster { dir: dir.clone(), processes: vec![], kubeconfig };
        cluster.processes.push(spawn(&etcd_bin, &etcd_args(&dir, etcd, peer), &dir.join("etcd.log")));
        cluster.processes.push(spawn(apiserver, &apiserver_args(&dir, &pki, etcd, port), &dir.join("apiserver.log")));
        cluster.wait_ready();
        cluster
    }

    fn wait_ready(&mut self) {
        let start = Instant::now();
        while self.kubectl(&["get", "--raw", "/readyz"]).as_deref() != Ok("ok") {
            for p in &mut self.processes {
                if let Ok(Some(status)) = p.try_wait() {
                    panic!("a control-plane process exited ({status}) before the apiserver was ready");
                }
            }
            assert!(start.elapsed() < READY, "kube-apiserver not ready within {READY:?}");
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// `kubectl ARGS` against this cluster: Ok(stdout) or Err(stderr), trimmed.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        self.kubectl_in(args, None)
    }

    /// The same with `input` on stdin (for `-f -`).
    pub fn kubectl_in(&self, args: &[&str], input: Option<&str>) -> Result<String, String> {
        let mut child = Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run kubectl (is the test environment's PATH set?)");
        let mut stdin = child.stdin.take().expect("kubectl's stdin");
        stdin.write_all(input.unwrap_or_default().as_bytes()).expect("write kubectl's stdin");
        drop(stdin);
        let out = child.wait_with_output().expect("wait for kubectl");
        let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_string();
        if out.status.success() { Ok(text(&out.stdout)) } else { Err(text(&out.stderr)) }
    }

    /// Like `kubectl`, but a failure fails the test.
    pub fn must(&self, args: &[&str]) -> String {
        self.kubectl(args).unwrap_or_else(|e| panic!("kubectl {}: {e}", args.join(" ")))
    }
}

/// The absolute path of `name` on PATH (the environment's bin dir holds etcd).
fn which(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("no {name} on PATH: eval \"$(tests/env.sh up)\""))
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The apiserver first, so it does not spend its shutdown retrying a vanished etcd.
        for p in self.processes.iter_mut().rev() {
            let _ = p.kill();
            let _ = p.wait();
        }
        if std::thread::panicking() {
            let log = fs::read_to_string(self.dir.join("apiserver.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            eprintln!("kube-apiserver's last log lines:");
            tail.iter().rev().for_each(|l| eprintln!("  {l}"));
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

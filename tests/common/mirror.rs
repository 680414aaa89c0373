//! A mirror of the project's release downloads for guests: serves one file at
//! `/v<version>/skyport-<arch>` (the default `--exit-server-url`'s shape) over HTTPS, with a
//! certificate for [`HOST_ALIAS`] from a CA made for this mirror alone (openssl, into a temporary
//! folder), and counts the downloads: the guests' (curl) apart from the operator's check of the
//! file. It listens on the host's addresses, so every guest reaches it as [`HOST_ALIAS`] over its
//! own link; guests trust it once given [`Mirror::ca_file`], the operator with
//! `--exit-server-ca-file` and `--exit-server-resolve` ([`Mirror::check_settings`]).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use providers::guest::HOST_ALIAS;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

pub struct Mirror {
    /// For `--exit-server-url`.
    pub url_template: String,
    /// The CA's certificate (PEM), for the guests to trust.
    pub ca_file: PathBuf,
    requests: Arc<AtomicU32>,
    checks: Arc<AtomicU32>,
    dir: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Mirror {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Mirror {
    /// Downloads of the file by guests so far (other paths are answered 404 and not counted).
    pub fn downloads(&self) -> u32 {
        self.requests.load(Ordering::SeqCst)
    }

    /// Downloads of the file by the operator's check so far.
    pub fn checks(&self) -> u32 {
        self.checks.load(Ordering::SeqCst)
    }

    /// `settings` with the operator's check of the exit-server binary on and aimed at this
    /// mirror: its CA trusted, its name reached on this machine.
    pub fn check_settings(&self, settings: skyport::config::TunnelArgs) -> skyport::config::TunnelArgs {
        skyport::config::TunnelArgs {
            skip_exit_server_check: false,
            exit_server_ca_file: Some(self.ca_file.clone()),
            exit_server_resolve: vec![format!("{HOST_ALIAS}=127.0.0.1")],
            ..settings
        }
    }

    /// The CA certificate as PEM.
    pub fn ca_pem(&self) -> String {
        std::fs::read_to_string(&self.ca_file).unwrap()
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("openssl").current_dir(dir).args(args).output().expect("openssl");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A CA and a server certificate for [`HOST_ALIAS`] signed by it, in `dir`.
fn certificates(dir: &Path) {
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    let ca =
        ["req", "-x509", "-days", "2", "-subj", "/CN=skyport test mirror CA", "-keyout", "ca.key", "-out", "ca.pem"];
    let ca_ext = ["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"];
    openssl(dir, &[&ca[..], &ec, &ca_ext].concat());
    let subject = format!("/CN={HOST_ALIAS}");
    openssl(dir, &[&["req", "-subj", &subject, "-keyout", "server.key", "-out", "server.csr"][..], &ec].concat());
    std::fs::write(
        dir.join("server.ext"),
        format!("subjectAltName=DNS:{HOST_ALIAS}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"),
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "server.ext",
            "-out",
            "server.pem",
        ],
    );
}

/// Serves `body` as the exit-server binary of this version and architecture.
pub async fn https_mirror(body: Vec<u8>) -> Mirror {
    let dir = std::env::temp_dir().join(format!("skyport-mirror-{:08x}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).unwrap();
    certificates(&dir);
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(dir.join("server.pem")).unwrap().collect::<Result<_, _>>().unwrap();
    let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));

    let listener = TcpListener::bind(("0.0.0.0", 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let path = format!("/v{}/skyport-{}", env!("CARGO_PKG_VERSION"), std::env::consts::ARCH);
    let (requests, checks) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let counters = (requests.clone(), checks.clone());
    let body = Arc::new(body);
    let task = tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let (acceptor, body, path, (guests, operator)) =
                (acceptor.clone(), body.clone(), path.clone(), counters.clone());
            tokio::spawn(async move {
                let Ok(mut conn) = acceptor.accept(conn).await else { return };
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
                    if conn.read_exact(&mut byte).await.is_err() {
                        return;
                    }
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
                let line = head.lines().next().unwrap_or_default().to_string();
                let path = path.to_ascii_lowercase();
                let asked = |method: &str| {
                    [format!("{method} {path} http/1.1"), format!("{method} {path} http/1.0")].contains(&line)
                };
                let (get, ok) = (asked("get"), asked("get") || asked("head"));
                if get {
                    let by_operator = head.lines().any(|l| l.starts_with("user-agent: skyport/"));
                    (if by_operator { &operator } else { &guests }).fetch_add(1, Ordering::SeqCst);
                }
                let (status, length) = if ok { ("200 OK", body.len()) } else { ("404 Not Found", 0) };
                let reply = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {length}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n"
                );
                let _ = conn.write_all(reply.as_bytes()).await;
                if get {
                    let _ = conn.write_all(&body).await;
                }
                let _ = conn.shutdown().await;
            });
        }
    });
    Mirror {
        url_template: format!("https://{HOST_ALIAS}:{port}/v{{version}}/skyport-{{arch}}"),
        ca_file: dir.join("ca.pem"),
        requests,
        checks,
        dir,
        task,
    }
}

/// Whether the ELF executable at `path` is static (no program interpreter): what a Debian guest
/// of any release runs, unlike a binary linked against this host's glibc.
pub fn is_static(path: &Path) -> bool {
    let Ok(elf) = std::fs::read(path) else { return false };
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    if elf.len() < 64 || &elf[..4] != b"\x7fELF" || elf[4] != 2 {
        return false;
    }
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
    let (size, count) = (u16_at(0x36), u16_at(0x38));
    // PT_INTERP (3) names the dynamic loader.
    (0..count).all(|i| {
        let at = phoff + i * size;
        elf.get(at..at + 4).is_some_and(|t| u32::from_le_bytes(t.try_into().unwrap()) != 3)
    })
}

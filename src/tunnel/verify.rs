//! The exit-server binary checked before a VM is bought: the operator downloads what
//! `--exit-server-url` serves for each architecture and compares its SHA-256 with the digest
//! the VM will demand ([`super::exit_server_artifacts`]). A VM handed a URL that serves nothing,
//! or other bytes, can only fail its install script and be billed until it is replaced; the
//! Tunnel says so instead (`ArtifactUnavailable`, `ArtifactDigestMismatch`) and retries with
//! backoff, so a file published later is picked up without touching the Tunnel.
//!
//! - A HEAD first: 404/410 ends the check (nothing published there) and a `Content-Length`
//!   above [`MAX_BYTES`] too; any other answer (S3-signed release redirects refuse HEAD with
//!   403) leaves the verdict to the GET.
//! - The GET streams the body through SHA-256, stopping at [`MAX_BYTES`].
//! - Results are kept per (URL, digest): a pass for `--exit-server-check-ttl`, a failure for at
//!   most [`FAILURE_TTL`], so many Tunnels needing hosts cost one download, and a fixed mirror is
//!   seen soon. One check runs at a time.
//! - A mirror with a private CA is checked with `--exit-server-ca-file`, one the VMs know by a
//!   name the operator cannot resolve with `--exit-server-resolve NAME=ADDRESS`.
//! - `--skip-exit-server-check` turns it off for setups where the VMs reach a mirror the
//!   operator cannot; providers whose hosts download nothing (local) are never checked.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use providers::exit::userdata::Artifact;
use sha2::{Digest, Sha256};
use tracing::info;

use crate::reasons::Reason;

/// Largest file accepted: the shipped binary is about 23 MiB.
pub const MAX_BYTES: u64 = 256 * 1024 * 1024;
/// Longest time a failed check is believed.
pub const FAILURE_TTL: Duration = Duration::from_secs(30);

/// Why exit servers could not run what the URL serves. Messages hold no secrets (URLs are the
/// operator's configuration, digests are public).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArtifactProblem {
    #[error(
        "the exit-server binary {url} cannot be downloaded by the operator ({why}), so exit servers could only fail and none is created; publish the file there, point --exit-server-url (Helm tunnel.exitServerUrl) at a mirror that has it, or pass --skip-exit-server-check (Helm tunnel.skipExitServerCheck) when only the VMs can reach it"
    )]
    Unavailable { url: String, why: String },
    #[error(
        "the exit-server binary {url} has SHA-256 {actual}, not {expected} (this operator's own {arch} binary), so exit servers would refuse to run it and none is created; the URL must serve the binary of this exact operator release"
    )]
    DigestMismatch { url: String, arch: String, expected: String, actual: String },
}

impl ArtifactProblem {
    /// The Tunnel's `Ready` reason.
    pub fn reason(&self) -> Reason {
        match self {
            ArtifactProblem::Unavailable { .. } => Reason::ArtifactUnavailable,
            ArtifactProblem::DigestMismatch { .. } => Reason::ArtifactDigestMismatch,
        }
    }
}

/// What a HEAD answer decides: `Ok(())` leaves it to the GET.
pub fn after_head(status: u16, content_length: Option<u64>) -> Result<(), String> {
    match status {
        404 | 410 => Err(format!("HTTP {status}: nothing is published at this URL")),
        200..=299 if content_length.is_some_and(|n| n > MAX_BYTES) => {
            Err(format!("it is {} bytes, larger than any skyport binary ({MAX_BYTES})", content_length.unwrap_or(0)))
        }
        _ => Ok(()),
    }
}

/// The verdict on downloaded bytes of SHA-256 `actual` for `artifact`.
pub fn verdict(artifact: &Artifact, actual: &str) -> Result<(), ArtifactProblem> {
    if actual.eq_ignore_ascii_case(&artifact.sha256) {
        return Ok(());
    }
    Err(ArtifactProblem::DigestMismatch {
        url: artifact.url.clone(),
        arch: artifact.arch.clone(),
        expected: artifact.sha256.clone(),
        actual: actual.to_string(),
    })
}

/// A remembered check.
#[derive(Debug, Clone)]
pub struct Checked {
    pub at: Instant,
    pub outcome: Result<(), ArtifactProblem>,
}

/// The remembered outcome if it is still fresh at `now`: a pass for `ttl`, a failure for at most
/// [`FAILURE_TTL`].
pub fn fresh(entry: Option<&Checked>, now: Instant, ttl: Duration) -> Option<Result<(), ArtifactProblem>> {
    let entry = entry?;
    let keep = if entry.outcome.is_ok() { ttl } else { ttl.min(FAILURE_TTL) };
    (now.saturating_duration_since(entry.at) < keep).then(|| entry.outcome.clone())
}

type Cache = Mutex<HashMap<(String, String), Checked>>;

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// Checks every artifact (each architecture a VM might have), from the cache where fresh,
/// downloading as `settings` say (`--exit-server-ca-file`, `--exit-server-resolve`).
pub async fn check(artifacts: &[Artifact], settings: &crate::config::TunnelArgs) -> Result<(), ArtifactProblem> {
    let ttl = settings.exit_server_check_ttl;
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _turn = ONE_AT_A_TIME.lock().await;
    for artifact in artifacts {
        let key = (artifact.url.clone(), artifact.sha256.clone());
        let remembered = fresh(cache().lock().unwrap_or_else(|p| p.into_inner()).get(&key), Instant::now(), ttl);
        let outcome = match remembered {
            Some(outcome) => outcome,
            None => {
                let outcome = download(artifact, settings).await;
                let entry = Checked { at: Instant::now(), outcome: outcome.clone() };
                cache().lock().unwrap_or_else(|p| p.into_inner()).insert(key, entry);
                outcome
            }
        };
        outcome?;
    }
    Ok(())
}

/// [`check`] where it applies: the provider's hosts download the binary and the check is on.
pub async fn before_create(
    provider: &dyn providers::HostProvider,
    artifacts: &[Artifact],
    settings: &crate::config::TunnelArgs,
) -> Result<(), ArtifactProblem> {
    if settings.skip_exit_server_check || !provider.capabilities().fetches_artifact {
        return Ok(());
    }
    check(artifacts, settings).await
}

/// The `(name, address)` pairs of `--exit-server-resolve`.
pub fn resolve_overrides(entries: &[String]) -> Result<Vec<(String, std::net::IpAddr)>, String> {
    entries
        .iter()
        .map(|entry| {
            let (name, address) = entry.split_once('=').unwrap_or((entry, ""));
            match address.trim().parse() {
                Ok(ip) if !name.trim().is_empty() => Ok((name.trim().to_string(), ip)),
                _ => Err(format!("--exit-server-resolve {entry:?} is not NAME=ADDRESS (an IP address)")),
            }
        })
        .collect()
}

/// The client of the check, made once per CA file and overrides.
fn client(settings: &crate::config::TunnelArgs) -> Result<reqwest::Client, String> {
    type Made = (Option<std::path::PathBuf>, Vec<String>, reqwest::Client);
    static CLIENT: Mutex<Option<Made>> = Mutex::new(None);
    let mut made = CLIENT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((ca, resolve, client)) = made.as_ref()
        && *ca == settings.exit_server_ca_file
        && *resolve == settings.exit_server_resolve
    {
        return Ok(client.clone());
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = reqwest::Client::builder()
        .user_agent(concat!("skyport/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(300));
    if let Some(path) = &settings.exit_server_ca_file {
        let pem = std::fs::read(path).map_err(|e| format!("--exit-server-ca-file {}: {e}", path.display()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .ok()
            .filter(|c| !c.is_empty())
            .ok_or_else(|| format!("--exit-server-ca-file {} holds no PEM certificate", path.display()))?;
        builder = builder.tls_certs_merge(certs);
    }
    for (name, ip) in resolve_overrides(&settings.exit_server_resolve)? {
        builder = builder.resolve(&name, std::net::SocketAddr::new(ip, 0));
    }
    let client = builder.build().map_err(|e| format!("cannot build an HTTP client: {e}"))?;
    *made = Some((settings.exit_server_ca_file.clone(), settings.exit_server_resolve.clone(), client.clone()));
    Ok(client)
}

/// HEAD, then GET through SHA-256 with the size guard.
async fn download(artifact: &Artifact, settings: &crate::config::TunnelArgs) -> Result<(), ArtifactProblem> {
    let url = &artifact.url;
    let unavailable = |why: String| ArtifactProblem::Unavailable { url: url.clone(), why };
    let http = client(settings).map_err(unavailable)?;
    if let Ok(head) = http.head(url).send().await {
        let length = head.headers().get(reqwest::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse().ok());
        after_head(head.status().as_u16(), length).map_err(unavailable)?;
    }
    let mut response = http.get(url).send().await.map_err(|e| unavailable(describe(&e)))?;
    if !response.status().is_success() {
        return Err(unavailable(format!("HTTP {}", response.status())));
    }
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    while let Some(chunk) = response.chunk().await.map_err(|e| unavailable(describe(&e)))? {
        size += chunk.len() as u64;
        if size > MAX_BYTES {
            return Err(unavailable(format!("it is larger than any skyport binary ({MAX_BYTES} bytes)")));
        }
        hasher.update(&chunk);
    }
    let actual: String = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
    verdict(artifact, &actual)?;
    info!(%url, arch = %artifact.arch, bytes = size, "exit-server binary checked: its SHA-256 is the operator's");
    Ok(())
}

/// A transport error without the URL (the message names it already).
fn describe(e: &reqwest::Error) -> String {
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connection failed"
    } else {
        "request failed"
    };
    let mut cause = String::new();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        cause = s.to_string();
        source = s.source();
    }
    if cause.is_empty() { what.to_string() } else { format!("{what}: {cause}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn artifact() -> Artifact {
        Artifact { arch: "x86_64".into(), url: "https://mirror.example/skyport-x86_64".into(), sha256: "ab".repeat(32) }
    }

    #[test]
    fn resolve_overrides_are_name_equals_address() {
        let ok = resolve_overrides(&["mirror.internal=10.0.0.7".into(), "m6=::1".into()]).unwrap();
        assert_eq!(
            ok,
            [
                ("mirror.internal".to_string(), [10, 0, 0, 7].into()),
                ("m6".to_string(), [0u16, 0, 0, 0, 0, 0, 0, 1].into())
            ]
        );
        for bad in ["mirror.internal", "mirror.internal=somewhere", "=10.0.0.7"] {
            let e = resolve_overrides(&[bad.into()]).unwrap_err();
            assert!(e.contains("NAME=ADDRESS") && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn head_ends_the_check_only_for_missing_or_oversized_files() {
        assert!(after_head(404, None).unwrap_err().contains("nothing is published"));
        assert!(after_head(410, None).is_err());
        assert!(after_head(200, Some(MAX_BYTES + 1)).unwrap_err().contains("larger than"));
        assert_eq!(after_head(200, Some(23 << 20)), Ok(()));
        // Signed release redirects refuse HEAD; servers without HEAD answer 405: the GET decides.
        for status in [403, 405, 500, 302] {
            assert_eq!(after_head(status, Some(MAX_BYTES + 1)), Ok(()), "{status}");
        }
    }

    #[test]
    fn only_the_expected_digest_passes_and_the_mismatch_names_both() {
        let a = artifact();
        assert_eq!(verdict(&a, &"AB".repeat(32)), Ok(()));
        let e = verdict(&a, &"cd".repeat(32)).unwrap_err();
        assert_eq!(e.reason(), "ArtifactDigestMismatch");
        let text = e.to_string();
        assert!(
            text.contains(&"cd".repeat(32)) && text.contains(&"ab".repeat(32)) && text.contains("x86_64"),
            "{text}"
        );
        let gone = ArtifactProblem::Unavailable { url: a.url.clone(), why: "HTTP 404".into() };
        assert_eq!(gone.reason(), "ArtifactUnavailable");
        assert!(gone.to_string().contains("--skip-exit-server-check"), "{gone}");
    }

    #[test]
    fn a_pass_is_kept_for_the_ttl_a_failure_for_at_most_thirty_seconds() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(600);
        let pass = Checked { at: t0, outcome: Ok(()) };
        let fail = Checked { at: t0, outcome: verdict(&artifact(), "00") };
        assert_eq!(fresh(None, t0, ttl), None);
        assert_eq!(fresh(Some(&pass), t0 + Duration::from_secs(599), ttl), Some(Ok(())));
        assert_eq!(fresh(Some(&pass), t0 + ttl, ttl), None);
        assert!(fresh(Some(&fail), t0 + Duration::from_secs(29), ttl).is_some_and(|o| o.is_err()));
        assert_eq!(fresh(Some(&fail), t0 + FAILURE_TTL, ttl), None);
        let short = Duration::from_secs(1);
        assert_eq!(fresh(Some(&fail), t0 + short, short), None, "a TTL below 30 s bounds failures too");
    }
}

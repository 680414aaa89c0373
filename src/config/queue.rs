//! Queue controller flags; the Tunnel controller falls back to their error backoff.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;

use clap::Args;

/// Queue controller settings.
#[derive(Debug, Clone, Args)]
pub struct QueueArgs {
    /// How often a Ready Queue is compared with SQS to catch changes made outside skyport
    /// (each period is shortened by up to 10% at random so reconciles do not bunch up). With
    /// more Queues in one AWS account and region than half of --sqs-rate can check in this
    /// period, their period stretches to Queues / (--sqs-rate / 2), so new and changed Queues
    /// keep the other half; each account and region is paced by its own Queues.
    #[arg(long = "queue-resync", env = "SKYPORT_QUEUE_RESYNC", default_value = "60s", value_parser = humantime::parse_duration)]
    pub resync: Duration,

    /// How often, at most, a converged queue's tags are re-read (attributes are read every
    /// resync; tags also whenever the spec changes). Stretches like --queue-resync, against
    /// half of each account and region's --sqs-tag-rate.
    #[arg(long = "queue-tag-resync", env = "SKYPORT_QUEUE_TAG_RESYNC", default_value = "10m", value_parser = humantime::parse_duration)]
    pub tag_resync: Duration,

    /// Queues reconciled in parallel. One AWS account and region holds at most all but one of
    /// them, and its share while other accounts have work, so a throttled or slow account does
    /// not stop the others.
    #[arg(long = "queue-concurrency", env = "SKYPORT_QUEUE_CONCURRENCY", default_value_t = 8)]
    pub concurrency: u16,

    /// First retry delay after a transient error; doubles per consecutive failure.
    #[arg(long = "error-backoff-min", env = "SKYPORT_ERROR_BACKOFF_MIN", default_value = "1s", value_parser = humantime::parse_duration)]
    pub backoff_min: Duration,

    /// Longest retry delay after repeated transient errors.
    #[arg(long = "error-backoff-max", env = "SKYPORT_ERROR_BACKOFF_MAX", default_value = "5m", value_parser = humantime::parse_duration)]
    pub backoff_max: Duration,

    /// Retry delay while SQS refuses to reuse a recently deleted queue name (the refusal lasts
    /// 60 s after the deletion).
    #[arg(long = "recently-deleted-retry", env = "SKYPORT_RECENTLY_DELETED_RETRY", default_value = "15s", value_parser = humantime::parse_duration)]
    pub recently_deleted_retry: Duration,

    /// Existing SQS queues that carry no skyport owner tag (made outside skyport) which Queues of
    /// a namespace may adopt, and explicit `spec.queueName`s reserved for that namespace, as
    /// NAMESPACE=PATTERN (`*` matches any run of characters, e.g. `payments=legacy-payments-*`);
    /// repeat the flag or separate with commas. Without a grant no namespace adopts a queue
    /// skyport did not create, and a name matching another namespace's pattern is refused.
    #[arg(long = "queue-name-grant", env = "SKYPORT_QUEUE_NAME_GRANTS", value_delimiter = ',', value_parser = name_grant, value_name = "NAMESPACE=PATTERN")]
    pub name_grants: Vec<NameGrant>,

    /// A file holding the key that seals each Queue's ownership proof in its status, so that a
    /// restarted operator or a new leader does not read every queue's tags again (at least 32
    /// bytes; the chart mounts it from a Secret the operator's ServiceAccount cannot read).
    /// Unset, or no such file: proofs live in memory only.
    #[arg(long = "ownership-key-file", env = "SKYPORT_OWNERSHIP_KEY_FILE", value_name = "PATH")]
    pub ownership_key_file: Option<PathBuf>,

    /// The key read from --ownership-key-file at start.
    #[arg(skip)]
    pub ownership_key: Option<OwnershipKey>,

    /// This cluster's identity (`--cluster-id`, else the kube-system namespace's UID), tagged on
    /// every queue so that clusters sharing an AWS account never take each other's queues.
    #[arg(skip)]
    pub cluster_id: String,
}

/// Shortest ownership key taken: HMAC-SHA256's full strength.
pub const MIN_KEY_BYTES: usize = 32;

/// The ownership key (see `--ownership-key-file`). Never printed.
#[derive(Clone)]
pub struct OwnershipKey(Vec<u8>);

impl std::fmt::Debug for OwnershipKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OwnershipKey(redacted)")
    }
}

impl OwnershipKey {
    /// The key in `path`, surrounding whitespace dropped. `Ok(None)` when the file does not
    /// exist: the Secret behind it is optional.
    pub fn load(path: &Path) -> anyhow::Result<Option<OwnershipKey>> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading the ownership key {}", path.display())),
        };
        let key = bytes.trim_ascii().to_vec();
        anyhow::ensure!(
            key.len() >= MIN_KEY_BYTES,
            "the ownership key {} has {} bytes; it needs at least {MIN_KEY_BYTES} (e.g. `openssl rand -hex 32`)",
            path.display(),
            key.len()
        );
        Ok(Some(OwnershipKey(key)))
    }

    /// A key of these bytes (tests).
    pub fn from_bytes(key: &[u8]) -> OwnershipKey {
        OwnershipKey(key.to_vec())
    }

    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// SQS queue names granted to one namespace (see `--queue-name-grant`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameGrant {
    pub namespace: String,
    pub pattern: String,
}

impl NameGrant {
    /// Whether `name` matches the pattern, where `*` stands for any run of characters.
    pub fn matches(&self, name: &str) -> bool {
        glob_match(&self.pattern, name)
    }
}

fn glob_match(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else { return false };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else { return rest.is_empty() };
    for part in middle {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

fn name_grant(s: &str) -> Result<NameGrant, String> {
    let (namespace, pattern) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected NAMESPACE=PATTERN, e.g. payments=legacy-payments-*"))?;
    let label = |n: &str| {
        !n.is_empty()
            && n.len() <= 63
            && n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !n.starts_with('-')
            && !n.ends_with('-')
    };
    if !label(namespace) {
        return Err(format!("{namespace:?} is not a namespace name"));
    }
    let valid = |c: char| c.is_ascii_alphanumeric() || "-_.*".contains(c);
    if pattern.is_empty() || pattern.len() > 80 || !pattern.chars().all(valid) {
        return Err(format!("{pattern:?}: a pattern is 1-80 characters of letters, digits, '-', '_', '.' and '*'"));
    }
    Ok(NameGrant { namespace: namespace.into(), pattern: pattern.into() })
}

impl Default for QueueArgs {
    fn default() -> Self {
        QueueArgs {
            resync: Duration::from_secs(60),
            tag_resync: Duration::from_secs(600),
            concurrency: 8,
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            recently_deleted_retry: Duration::from_secs(15),
            name_grants: Vec::new(),
            ownership_key_file: None,
            ownership_key: None,
            cluster_id: String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_names_a_namespace_and_a_pattern() {
        let grant = name_grant("payments=legacy-*-q").unwrap();
        assert_eq!(grant.namespace, "payments");
        assert!(grant.matches("legacy-orders-q"));
        assert!(grant.matches("legacy--q"));
        assert!(!grant.matches("legacy-orders"));
        assert!(!grant.matches("new-legacy-orders-q"));
        assert!(name_grant("payments").is_err());
        assert!(name_grant("Payments=x").is_err());
        assert!(name_grant("payments=a/b").is_err());
    }

    #[test]
    fn a_pattern_without_a_star_matches_only_itself() {
        let exact = NameGrant { namespace: "a".into(), pattern: "orders".into() };
        assert!(exact.matches("orders"));
        assert!(!exact.matches("orders2"));
        let all = NameGrant { namespace: "a".into(), pattern: "*".into() };
        assert!(all.matches("anything"));
        let ends = NameGrant { namespace: "a".into(), pattern: "a*a".into() };
        assert!(!ends.matches("a"), "the two ends cannot share a character");
        assert!(ends.matches("aa"));
    }

    #[test]
    fn a_short_key_is_refused_and_a_missing_file_means_no_key() {
        let dir = std::env::temp_dir().join(format!("skyport-sealed-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let short = dir.join("short");
        std::fs::write(&short, "abc\n").unwrap();
        let message = OwnershipKey::load(&short).unwrap_err().to_string();
        assert!(message.contains("at least 32") && !message.contains("abc"), "{message}");
        assert!(OwnershipKey::load(&dir.join("absent")).unwrap().is_none());
        let good = dir.join("good");
        std::fs::write(&good, format!("{}\n", "k".repeat(64))).unwrap();
        let key = OwnershipKey::load(&good).unwrap().unwrap();
        assert_eq!(format!("{key:?}"), "OwnershipKey(redacted)");
        std::fs::remove_dir_all(dir).unwrap();
    }
}

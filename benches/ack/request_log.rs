//! SQS calls counted from LocalStack's request log, so that skyport and ACK (another SDK, another
//! language) are counted the same way.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

/// Counts SQS requests as LocalStack logged them (`localstack.request.aws ... AWS sqs.X => 200`),
/// between two offsets of its log: the same count for any client, whatever its SDK.
pub(crate) struct RequestLog(pub(crate) PathBuf);

impl RequestLog {
    pub(crate) fn find() -> anyhow::Result<Self> {
        let state = std::env::var_os("SKYPORT_TEST_ENV").context("SKYPORT_TEST_ENV is not set (tests/env.sh up)")?;
        let path = Path::new(&state).join("localstack/localstack.log");
        if !path.exists() {
            bail!("no LocalStack log at {}", path.display());
        }
        Ok(RequestLog(path))
    }
    pub(crate) fn offset(&self) -> u64 {
        std::fs::metadata(&self.0).map(|m| m.len()).unwrap_or(0)
    }
    /// SQS action → count, logged since `from`.
    pub(crate) fn sqs_calls_since(&self, from: u64) -> BTreeMap<String, u64> {
        use std::io::{Read, Seek, SeekFrom};
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.0) {
            let _ = f.seek(SeekFrom::Start(from));
            let _ = f.read_to_string(&mut text);
        }
        let mut calls = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.split("AWS sqs.").nth(1)
                && let Some((action, _)) = rest.split_once(" => ")
            {
                *calls.entry(action.to_string()).or_default() += 1;
            }
        }
        calls
    }
}

pub(crate) fn total(calls: &BTreeMap<String, u64>) -> u64 {
    calls.values().sum()
}

pub(crate) fn describe_calls(calls: &BTreeMap<String, u64>, per: f64) -> String {
    let parts: Vec<String> = calls.iter().map(|(k, v)| format!("{k} {:.2}", *v as f64 / per)).collect();
    format!("{:.2} ({})", total(calls) as f64 / per, parts.join(", "))
}

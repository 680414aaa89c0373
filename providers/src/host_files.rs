//! The hosts of the providers that run them on this machine (`local`, `guest`): one folder per
//! host under the provider's state directory, named by the host's id, with its record in
//! `host.json`, so hosts outlive an operator restart as VMs do and are found again by tag.

use std::marker::PhantomData;
use std::path::PathBuf;

use serde::de::DeserializeOwned;

use crate::error::HostError;

/// The host folders of one state directory, with records of type `T`.
pub(crate) struct HostFiles<T> {
    dir: PathBuf,
    provider: &'static str,
    /// Whether a name is one of this provider's host ids (other files are not hosts).
    valid_id: fn(&str) -> bool,
    record: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> HostFiles<T> {
    pub(crate) fn new(dir: PathBuf, provider: &'static str, valid_id: fn(&str) -> bool) -> Self {
        HostFiles { dir, provider, valid_id, record: PhantomData }
    }

    fn unavailable(&self, message: String) -> HostError {
        HostError::Unavailable { provider: self.provider, message }
    }

    /// The record of host `id`; `None` when there is no such host.
    pub(crate) fn read(&self, id: &str) -> Result<Option<T>, HostError> {
        if !(self.valid_id)(id) {
            return Ok(None);
        }
        let path = self.dir.join(id).join("host.json");
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| self.unavailable(format!("corrupt {}: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.unavailable(format!("cannot read {}: {e}", path.display()))),
        }
    }

    /// Every host's record, by id; an unreadable one is skipped with a warning.
    pub(crate) fn all(&self) -> Result<Vec<T>, HostError> {
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| self.unavailable(format!("cannot list {}: {e}", self.dir.display())))?;
        let mut ids: Vec<String> = entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        ids.sort();
        let mut out = Vec::new();
        for id in ids {
            match self.read(&id) {
                Ok(Some(r)) => out.push(r),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(provider = self.provider, host = %id, error = %e, "skipping an unreadable host")
                }
            }
        }
        Ok(out)
    }
}

//! An in-memory host provider with failure injection, counting calls.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::Mutex;

use async_trait::async_trait;
use providers::{ExitServer, Host, HostError, HostProvider, HostRequest, HostState, Limiter};

#[derive(Default)]
struct Hosts {
    by_id: BTreeMap<String, Host>,
    next_id: u32,
    calls: Vec<&'static str>,
    failures: BTreeMap<&'static str, HostError>,
    /// The state a created host reports at first.
    created_state: Option<HostState>,
    /// Per host: the Noise private key it was created or last reconfigured with.
    keys: BTreeMap<String, String>,
}

pub struct FakeProvider {
    hosts: Mutex<Hosts>,
    limiter: Limiter,
}

pub const NAME: &str = "fake";

impl Default for FakeProvider {
    fn default() -> Self {
        let n = NonZeroU32::new(1000).expect("non-zero");
        FakeProvider { hosts: Mutex::default(), limiter: Limiter::new(n, n) }
    }
}

impl FakeProvider {
    fn call(&self, op: &'static str) -> Result<std::sync::MutexGuard<'_, Hosts>, HostError> {
        let mut h = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
        h.calls.push(op);
        match h.failures.remove(op) {
            Some(e) => Err(e),
            None => Ok(h),
        }
    }

    /// The next call of `op` (`"create"`, `"delete"`, `"list_by_tag"`, …) fails with `error`.
    pub fn fail_next(&self, op: &'static str, error: HostError) {
        self.hosts.lock().unwrap().failures.insert(op, error);
    }

    /// Created hosts report `state` (Running with an address by default).
    pub fn create_as(&self, state: HostState) {
        self.hosts.lock().unwrap().created_state = Some(state);
    }

    pub fn calls(&self) -> Vec<&'static str> {
        self.hosts.lock().unwrap().calls.clone()
    }

    pub fn hosts(&self) -> Vec<Host> {
        self.hosts.lock().unwrap().by_id.values().cloned().collect()
    }

    /// The Noise private key host `id` runs with.
    pub fn key_of(&self, id: &str) -> Option<String> {
        self.hosts.lock().unwrap().keys.get(id).cloned()
    }

    pub fn insert(&self, host: Host) {
        self.hosts.lock().unwrap().by_id.insert(host.id.clone(), host);
    }
}

#[async_trait]
impl HostProvider for FakeProvider {
    async fn create(&self, request: &HostRequest) -> Result<Host, HostError> {
        let mut h = self.call("create")?;
        h.next_id += 1;
        let state = h.created_state.unwrap_or(HostState::Running);
        let host = Host {
            id: format!("h-{}", h.next_id),
            name: request.name.clone(),
            public_ipv4: (state == HostState::Running).then(|| format!("203.0.113.{}", h.next_id)),
            state,
            tags: request.tags.clone(),
        };
        h.by_id.insert(host.id.clone(), host.clone());
        h.keys.insert(host.id.clone(), request.server.noise_private_key.clone());
        Ok(host)
    }
    async fn get(&self, id: &str) -> Result<Option<Host>, HostError> {
        Ok(self.call("get")?.by_id.get(id).cloned())
    }
    async fn delete(&self, id: &str) -> Result<(), HostError> {
        self.call("delete")?.by_id.remove(id);
        Ok(())
    }
    async fn list_by_tag(&self, key: &str, value: &str) -> Result<Vec<Host>, HostError> {
        let h = self.call("list_by_tag")?;
        Ok(h.by_id.values().filter(|host| host.tags.get(key).map(String::as_str) == Some(value)).cloned().collect())
    }
    async fn reconfigure(&self, id: &str, server: &ExitServer) -> Result<bool, HostError> {
        self.call("reconfigure")?.keys.insert(id.to_string(), server.noise_private_key.clone());
        Ok(true)
    }
    fn name(&self) -> &'static str {
        NAME
    }
    fn limiter(&self) -> &Limiter {
        &self.limiter
    }
}

//! Small statistics and `/proc` readings (CPU seconds, RSS) shared by the scenarios.

use std::path::PathBuf;
use std::time::Duration;

pub(crate) fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    match s.len() {
        0 => f64::NAN,
        n if n.is_multiple_of(2) => (s[n / 2 - 1] + s[n / 2]) / 2.0,
        n => s[n / 2],
    }
}

/// Nearest-rank percentile (`q` in 0..=1) of `v`; NaN when empty.
pub(crate) fn percentile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s[((q * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1]
}

pub(crate) fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// User + system CPU seconds of a process (`/proc/<pid>/stat`, USER_HZ = 100).
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some((f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?) as f64 / 100.0)
}

/// A `Vm*` line of `/proc/<pid>/status`, in KiB.
pub(crate) fn vm_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()
}

pub(crate) fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The processes of the test environment, to show where the CPU went.
pub(crate) struct EnvProcs(Vec<(&'static str, u32)>);

impl EnvProcs {
    pub(crate) fn find() -> Self {
        let mut procs = vec![("bench+operator", std::process::id())];
        if let Some(state) = std::env::var_os("SKYPORT_TEST_ENV").map(PathBuf::from) {
            for (name, file) in [
                ("kube-apiserver", state.join("run/kube-apiserver.pid")),
                ("etcd", state.join("run/etcd.pid")),
                ("localstack", state.join("localstack/localstack.pid")),
            ] {
                if let Some(pid) = std::fs::read_to_string(file).ok().and_then(|s| s.trim().parse().ok()) {
                    procs.push((name, pid));
                }
            }
        }
        EnvProcs(procs)
    }
    pub(crate) fn snapshot(&self) -> Vec<f64> {
        self.0.iter().map(|(_, pid)| cpu_seconds(*pid).unwrap_or(f64::NAN)).collect()
    }
    pub(crate) fn describe(&self, before: &[f64], after: &[f64], wall: Duration) -> String {
        self.0
            .iter()
            .zip(before.iter().zip(after))
            .map(|((name, _), (b, a))| format!("{name} {:.0}%", 100.0 * (a - b) / secs(wall)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

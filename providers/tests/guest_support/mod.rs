//! What the guest provider's tests share: a provider over a fresh state directory that is
//! emptied whatever happens, and what a guest's network namespace carries.
#![allow(dead_code)] // each test binary uses a different part

use std::path::PathBuf;
use std::time::Duration;

use providers::guest::{GuestProvider, GuestSettings, Machine};

/// A provider over a fresh state directory, or `None` where guests cannot boot and the opt-out
/// is set; dropping the guard removes every guest and the directory, whatever happened.
pub fn provider(test: &str) -> Option<(GuestProvider, State)> {
    let rootfs = match (providers::guest::machine::check_host(), std::env::var_os("SKYPORT_GUEST_ROOTFS")) {
        (Ok(()), Some(rootfs)) => PathBuf::from(rootfs),
        (check, rootfs) => {
            let why = check.err().unwrap_or_else(|| format!("SKYPORT_GUEST_ROOTFS is {rootfs:?}"));
            assert!(
                std::env::var("SKYPORT_SKIP_GUEST_TESTS").is_ok_and(|v| v == "1"),
                "{test}: cannot boot a guest here: {why}. Run as root with SKYPORT_GUEST_ROOTFS=$(tests/env/build-guest.sh), \
                 or set SKYPORT_SKIP_GUEST_TESTS=1 to skip."
            );
            eprintln!("\n!!! SKIPPED {test}: cannot boot a guest here ({why}); SKYPORT_SKIP_GUEST_TESTS=1 opts out.\n");
            return None;
        }
    };
    // Guests an earlier run cut short left behind would eat this machine's inotify instances.
    static SWEEP: std::sync::Once = std::sync::Once::new();
    SWEEP.call_once(|| {
        for removed in Machine::sweep_left_overs(&std::env::temp_dir()) {
            eprintln!("removed a left-over guest: {removed}");
        }
    });
    let dir = std::env::temp_dir().join(format!("skyport-guest-provider-{test}-{:08x}", rand::random::<u32>()));
    let mut settings = GuestSettings::new(&dir, rootfs);
    settings.stop_grace = Duration::from_secs(10);
    Some((GuestProvider::new(settings.clone()).unwrap(), State(settings)))
}

pub struct State(pub GuestSettings);

impl Drop for State {
    fn drop(&mut self) {
        if let Ok(p) = GuestProvider::new(self.0.clone()) {
            p.remove_all();
        }
        let _ = std::fs::remove_dir_all(&self.0.state_dir);
    }
}

/// The lines of `ip -4 -o addr` in guest `name`'s network namespace that carry `ip`.
pub fn carried(name: &str, ip: &str) -> Vec<String> {
    let out = std::process::Command::new("ip").args(["-n", name, "-4", "-o", "addr", "show"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&format!("inet {ip}/32 ")))
        .map(String::from)
        .collect()
}

pub async fn until_carried(machine: &Machine, ip: &str) -> Vec<String> {
    for _ in 0..600 {
        let lines = carried(&machine.name, ip);
        if !lines.is_empty() {
            return lines;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{ip} never reached the guest's interface: {}", machine.diagnostics());
}

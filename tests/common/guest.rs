//! Real Linux guests for the tests ([`providers::guest::Machine`]: a Debian root file system from
//! tests/env/build-guest.sh, booted with systemd-nspawn, cloud-init reading a NoCloud seed), and
//! the policy for machines that cannot boot one: the guest tests fail there, unless
//! `SKYPORT_SKIP_GUEST_TESTS=1` opts out explicitly, and then each says loudly that it skipped.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use providers::guest::Machine;

/// The explicit opt-out of the guest tests on a machine that cannot boot guests.
pub const SKIP_VAR: &str = "SKYPORT_SKIP_GUEST_TESTS";

/// Whether guests can boot here; `Err` says why not.
pub fn available() -> Result<PathBuf, String> {
    providers::guest::machine::check_host()?;
    if let Some(root) = std::env::var_os("SKYPORT_GUEST_ROOTFS") {
        return Ok(PathBuf::from(root));
    }
    // Not through tests/run.sh: build (or find cached) the root file system now.
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/env/build-guest.sh");
    let out = Command::new(script).stderr(std::process::Stdio::inherit()).output().map_err(|e| format!("{e}"))?;
    if !out.status.success() {
        return Err(format!("{script} failed ({})", out.status));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// The guest root file system, or `None` when this machine cannot boot guests and
/// [`SKIP_VAR`] opts out (said on stderr). Without the opt-out such a machine fails the test:
/// a guest test that cannot boot a guest proves nothing and must not look green.
pub fn rootfs_or_skip(test: &str) -> Option<PathBuf> {
    match available() {
        Ok(root) => {
            sweep_once();
            Some(root)
        }
        Err(why) if std::env::var(SKIP_VAR).is_ok_and(|v| v == "1") => {
            eprintln!("\n!!! SKIPPED {test}: cannot boot a guest here ({why}); {SKIP_VAR}=1 opts out.\n");
            None
        }
        Err(why) => panic!("{test}: cannot boot a guest here: {why}. Run as root, or set {SKIP_VAR}=1 to skip."),
    }
}

/// Tears down, once per run, the guests of earlier runs that were cut short (their processes
/// would eat this machine's inotify instances, and later guests' servers die without them).
fn sweep_once() {
    static SWEEP: std::sync::Once = std::sync::Once::new();
    SWEEP.call_once(|| {
        for removed in Machine::sweep_left_overs(&std::env::temp_dir()) {
            eprintln!("removed a left-over guest: {removed}");
        }
    });
}

/// A guest booted by a test; dropping it powers it off and removes everything it made.
pub struct Guest {
    machine: Machine,
    child: Option<std::process::Child>,
}

impl std::ops::Deref for Guest {
    type Target = Machine;
    fn deref(&self) -> &Machine {
        &self.machine
    }
}

impl Guest {
    /// Prepares a guest of `rootfs`: its network (the host's address is up at once, so a test
    /// can serve files to the guest) and its overlay. [`Guest::boot`] starts it.
    pub fn new(rootfs: &Path) -> Guest {
        let name = format!("skt{:06x}", rand::random::<u32>() & 0xff_ffff);
        let dir = std::env::temp_dir().join(format!("skyport-guest-{name}"));
        let machine = Machine::prepare(&name, rootfs, &dir, None, &[]).unwrap_or_else(|e| panic!("guest {name}: {e}"));
        Guest { machine, child: None }
    }

    /// Boots the guest with `user_data` as its NoCloud seed.
    pub fn boot(&mut self, user_data: &str) {
        self.child = Some(self.machine.boot(user_data).expect("systemd-nspawn"));
    }

    /// `Some(status)` once the guest has powered off.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        self.machine.tear_down();
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The exit-server binary guests download: the shipped static build (`SKYPORT_GUEST_EXE`, from
/// tests/env/build-musl.sh; tests/run.sh sets it), or this build's binary where that is static.
/// A binary linked against this host's glibc may not run on the guest's Debian release.
pub fn guest_exe() -> PathBuf {
    let exe = std::env::var_os("SKYPORT_GUEST_EXE").map_or_else(crate::common::kubelet::skyport_exe, PathBuf::from);
    assert!(
        crate::common::mirror::is_static(&exe),
        "{} is not a static executable; guests run the shipped static build: \
         SKYPORT_GUEST_EXE=$(tests/env/build-musl.sh)",
        exe.display()
    );
    exe
}

/// What `ip:port` sends unasked before it closes: a VM that refused the exit-server binary serves
/// its install report on the control port, where no tunnel server runs. The report server is
/// started by `systemd-run` without waiting for it to bind, so cloud-init may finish first:
/// connections are retried for a while, as the operator's probes are.
pub async fn served_on(ip: &str, port: u16) -> String {
    use tokio::io::AsyncReadExt;
    let mut conn =
        crate::common::eventually("the control port accepting", std::time::Duration::from_secs(20), || async {
            tokio::net::TcpStream::connect((ip, port)).await.ok()
        })
        .await;
    let mut text = String::new();
    let read = conn.read_to_string(&mut text);
    tokio::time::timeout(std::time::Duration::from_secs(5), read).await.expect("closed").unwrap();
    text
}

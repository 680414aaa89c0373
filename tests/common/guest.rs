//! A real Linux guest for the exit server's user data: a Debian root file system
//! (tests/env/build-guest.sh, cached) booted with systemd-nspawn and systemd as PID 1, cloud-init
//! reading the user data from a NoCloud seed, exactly as a cloud VM reads it from its metadata
//! service. Each guest boots from a throwaway overlay of the cached root file system, in a network
//! namespace of its own joined to the host by a veth pair whose two addresses (10.213.x.1 on the
//! host, 10.213.x.2 in the guest) exist only on that pair: the guest's "public IP" is x.2.
//!
//! Two workarounds for hosts that need them: PID 1 here may not be
//! systemd, so nspawn runs with `--register=no`; and nspawn wants a tmpfs at
//! /run/systemd/nspawn, mounted once if missing.
#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Whether guests can boot here; `Err` says why not (the tests then skip, loudly).
pub fn available() -> Result<PathBuf, String> {
    if !nix_is_root() {
        return Err("not running as root (systemd-nspawn, network namespaces)".into());
    }
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

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

fn run(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0]).args(&args[1..]).output().map_err(|e| format!("{}: {e}", args[0]))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

fn ensure_nspawn_tmpfs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let mounted = std::fs::read_to_string("/proc/mounts")
            .unwrap_or_default()
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some("/run/systemd/nspawn"));
        if !mounted {
            std::fs::create_dir_all("/run/systemd/nspawn").unwrap();
            run(&["mount", "-t", "tmpfs", "tmpfs", "/run/systemd/nspawn"]).unwrap();
        }
    });
}

/// A booted (or booting) guest; dropping it powers it off and removes everything it made.
pub struct Guest {
    pub name: String,
    /// The guest's address (its "public IP").
    pub ip: Ipv4Addr,
    /// The host's end of the veth pair, reachable from the guest.
    pub host_ip: Ipv4Addr,
    dir: PathBuf,
    child: Option<std::process::Child>,
}

impl Guest {
    /// Prepares a guest of `rootfs`: its network (the host's address is up at once, so a test
    /// can serve files to the guest) and its overlay. [`Guest::boot`] starts it.
    pub fn new(rootfs: &Path) -> Guest {
        ensure_nspawn_tmpfs();
        let id: u32 = rand::random::<u32>() & 0xffffff;
        let name = format!("skg{id:06x}");
        // A /30 of 10.213.0.0/16 no interface here uses yet.
        let taken =
            String::from_utf8_lossy(&Command::new("ip").args(["-4", "addr"]).output().unwrap().stdout).into_owned();
        let (host_ip, ip) = (0..)
            .map(|_| {
                let n: u16 = rand::random::<u16>() & 0x3fff;
                let base = u32::from(Ipv4Addr::new(10, 213, 0, 0)) + u32::from(n) * 4;
                (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2))
            })
            .find(|(h, g)| !taken.contains(&format!("{h}/")) && !taken.contains(&format!("{g}/")))
            .unwrap();
        let dir = std::env::temp_dir().join(format!("skyport-guest-{name}"));
        let guest = Guest { name: name.clone(), ip, host_ip, dir: dir.clone(), child: None };
        for sub in ["upper", "work", "root"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let overlay = format!(
            "lowerdir={},upperdir={},workdir={}",
            rootfs.display(),
            dir.join("upper").display(),
            dir.join("work").display()
        );
        run(&["mount", "-t", "overlay", "overlay", "-o", &overlay, &guest.root().to_string_lossy()]).unwrap();

        let (host_if, guest_if) = (format!("{name}h"), format!("{name}g"));
        for cmd in [
            vec!["ip", "netns", "add", &name],
            vec!["ip", "link", "add", &host_if, "type", "veth", "peer", "name", &guest_if],
            vec!["ip", "link", "set", &guest_if, "netns", &name],
        ] {
            run(&cmd).unwrap();
        }
        let (host_cidr, guest_cidr) = (format!("{host_ip}/30"), format!("{ip}/30"));
        for cmd in [
            vec!["ip", "addr", "add", &host_cidr, "dev", &host_if],
            vec!["ip", "link", "set", &host_if, "up"],
            vec!["ip", "-n", &name, "addr", "add", &guest_cidr, "dev", &guest_if],
            vec!["ip", "-n", &name, "link", "set", &guest_if, "up"],
            vec!["ip", "-n", &name, "link", "set", "lo", "up"],
        ] {
            run(&cmd).unwrap();
        }
        guest
    }

    /// Boots the guest with `user_data` as its NoCloud seed, as a cloud's metadata service
    /// would hand it over.
    pub fn boot(&mut self, user_data: &str) {
        let (name, dir) = (self.name.clone(), self.dir.clone());
        let seed = self.root().join("var/lib/cloud/seed/nocloud");
        std::fs::create_dir_all(&seed).unwrap();
        std::fs::write(seed.join("user-data"), user_data).unwrap();
        std::fs::write(seed.join("meta-data"), format!("instance-id: {name}\nlocal-hostname: {name}\n")).unwrap();
        let console = std::fs::File::create(dir.join("console.log")).unwrap();
        let child = Command::new("systemd-nspawn")
            .arg("--directory")
            .arg(self.root())
            .args(["--boot", "--register=no", "--keep-unit", "--quiet"])
            // The guest owns its network namespace, as a VM owns its NIC: its firewall needs this.
            .arg("--capability=CAP_NET_ADMIN")
            .arg(format!("--machine={name}"))
            .arg(format!("--network-namespace-path=/run/netns/{name}"))
            .stdin(std::process::Stdio::null())
            .stdout(console.try_clone().unwrap())
            .stderr(console)
            .spawn()
            .expect("systemd-nspawn");
        self.child = Some(child);
    }

    /// The guest's file system as the guest sees it (the overlay's merged view).
    pub fn root(&self) -> PathBuf {
        self.dir.join("root")
    }

    /// A file of the guest, or "" while it does not exist.
    pub fn read(&self, path: &str) -> String {
        std::fs::read_to_string(self.root().join(path.trim_start_matches('/'))).unwrap_or_default()
    }

    /// What cloud-init's commands printed (`/var/log/cloud-init-output.log`).
    pub fn cloud_init_output(&self) -> String {
        self.read("/var/log/cloud-init-output.log")
    }

    /// Whether cloud-init finished its last stage (successfully or not).
    pub fn cloud_init_done(&self) -> bool {
        // Not through the guest's `instance` symlink: it is absolute, so from here it would
        // resolve on the host.
        self.root().join(format!("var/lib/cloud/instances/{}/boot-finished", self.name)).exists()
    }

    /// The console (systemd's boot messages), for failure messages.
    pub fn console(&self) -> String {
        std::fs::read_to_string(self.dir.join("console.log")).unwrap_or_default()
    }

    /// `Some(status)` once the guest has powered off.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// Everything a failing test should print.
    pub fn diagnostics(&self) -> String {
        let tail = |s: String, n: usize| {
            s.lines().rev().take(n).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
        };
        format!(
            "--- console (tail) ---\n{}\n--- cloud-init-output.log (tail) ---\n{}",
            tail(self.console(), 30),
            tail(self.cloud_init_output(), 40)
        )
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGTERM makes nspawn shut the guest down in order; SIGKILL if it takes too long.
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while child.try_wait().ok().flatten().is_none() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = run(&["umount", &self.root().to_string_lossy()]);
        let _ = run(&["ip", "netns", "del", &self.name]);
        let _ = run(&["ip", "link", "del", &format!("{}h", self.name)]);
        if std::env::var_os("SKYPORT_KEEP_GUEST").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

//! One guest machine: a throwaway overlay of the cached Debian root file system, a network
//! namespace joined to the host by a veth pair, and systemd-nspawn booting systemd in it with
//! cloud-init reading its NoCloud seed, exactly as a cloud VM reads user data from its metadata
//! service. The guest provider and the tests that boot guests by hand share this code.
//!
//! Each guest's link is a /30 of 10.213.0.0/16 that no interface here uses yet: `.1` on the
//! host's end, `.2` (the guest's "public IP") inside its namespace. Both exist only on that pair,
//! so nothing else on the machine's networks sees them.
//!
//! Two workarounds for hosts that need them: PID 1 may not be systemd, so nspawn runs with
//! `--register=no`; and nspawn wants a tmpfs at /run/systemd/nspawn, mounted once if missing.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::processes::{self, MARKER, Owner};

/// The name every guest resolves to the host's end of its own link (through its `/etc/hosts`),
/// so one URL reaches a server on the host from every guest, as `host.docker.internal` does for
/// containers: a mirror of the exit-server binary listening on the host's addresses, say.
pub const HOST_ALIAS: &str = "host.skyport.internal";

/// Where the guest's extra CA certificates go; the bundle curl reads gets them appended too.
const CA_FILE: &str = "usr/local/share/ca-certificates/skyport-guest.crt";
const CA_BUNDLE: &str = "etc/ssl/certs/ca-certificates.crt";

/// Why a guest cannot be made or booted here.
pub type MachineError = String;

/// Whether guests can boot here: root, `systemd-nspawn` and `ip` present. `Err` says what is
/// missing and how to get it.
pub fn check_host() -> Result<(), MachineError> {
    check(is_root(), std::env::var_os("PATH"))
}

fn check(root: bool, path: Option<std::ffi::OsString>) -> Result<(), MachineError> {
    if !root {
        return Err("guests need root (systemd-nspawn, network namespaces, overlay mounts)".into());
    }
    for (tool, package) in [("systemd-nspawn", "systemd-container"), ("ip", "iproute2")] {
        let found = path.as_ref().is_some_and(|path| std::env::split_paths(path).any(|dir| dir.join(tool).is_file()));
        if !found {
            return Err(format!("{tool} is not installed (apt-get install {package})"));
        }
    }
    Ok(())
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

fn run(args: &[&str]) -> Result<(), MachineError> {
    let out = Command::new(args[0]).args(&args[1..]).output().map_err(|e| format!("{}: {e}", args[0]))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

fn ensure_nspawn_tmpfs() -> Result<(), MachineError> {
    let mounted = std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some("/run/systemd/nspawn"));
    if mounted {
        return Ok(());
    }
    std::fs::create_dir_all("/run/systemd/nspawn").map_err(|e| format!("/run/systemd/nspawn: {e}"))?;
    // Two guests starting at once may both mount it; one tmpfs over another is harmless.
    run(&["mount", "-t", "tmpfs", "tmpfs", "/run/systemd/nspawn"])
}

/// A guest's name, files and link; serialised beside its files so it is found again after a
/// restart of whoever made it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Machine {
    /// Machine, network namespace and veth name prefix (at most 12 characters: `<name>h` must
    /// fit an interface name).
    pub name: String,
    /// The guest's address (its "public IP").
    pub ip: Ipv4Addr,
    /// The host's end of the link, reachable from the guest (as [`HOST_ALIAS`]).
    pub host_ip: Ipv4Addr,
    /// The guest's folder: `root` (the merged overlay), `upper`, `work`, `console.log`, `pid`.
    pub dir: PathBuf,
}

impl Machine {
    /// Makes guest `name` of `rootfs` in `dir`: its overlay and its link, up at once (so a
    /// caller can serve files to the guest before it boots). The guest gets address `ip` (one
    /// [`free_link`] gave) or a free one not in `avoid` (addresses promised elsewhere). On failure
    /// nothing is left behind.
    pub fn prepare(
        name: &str,
        rootfs: &Path,
        dir: &Path,
        ip: Option<Ipv4Addr>,
        avoid: &[Ipv4Addr],
    ) -> Result<Machine, MachineError> {
        check_host()?;
        if name.is_empty() || name.len() > 12 || !name.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(format!("{name:?} is not a guest name (1-12 letters and digits)"));
        }
        if !rootfs.join("etc/cloud").is_dir() {
            return Err(format!("{} is not a guest root file system (tests/env/build-guest.sh)", rootfs.display()));
        }
        ensure_nspawn_tmpfs()?;
        let (host_ip, ip) = match ip {
            Some(ip) => link_of(ip)?,
            None => free_link(avoid)?,
        };
        let machine = Machine { name: name.to_string(), ip, host_ip, dir: dir.to_path_buf() };
        machine.set_up(rootfs).inspect_err(|_| machine.tear_down())?;
        Ok(machine)
    }

    fn set_up(&self, rootfs: &Path) -> Result<(), MachineError> {
        for sub in ["upper", "work", "root"] {
            std::fs::create_dir_all(self.dir.join(sub)).map_err(|e| format!("{}: {e}", self.dir.display()))?;
        }
        // Who made it, for [`Machine::sweep_left_overs`]: first, so whatever follows is found.
        let owner = Owner::me().ok_or("cannot read this process's start time")?;
        std::fs::write(self.dir.join("owner"), format!("{} {}\n", owner.render(), self.name))
            .map_err(|e| format!("{}: {e}", self.dir.display()))?;
        // The seed holds the tunnel's secrets, which a cloud hands only to the VM: only root
        // (nspawn, the guest's own root) may look inside.
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("{}: {e}", self.dir.display()))?;
        let overlay = format!(
            "lowerdir={},upperdir={},workdir={}",
            rootfs.display(),
            self.dir.join("upper").display(),
            self.dir.join("work").display()
        );
        run(&["mount", "-t", "overlay", "overlay", "-o", &overlay, &self.root().to_string_lossy()])?;
        let name = &self.name;
        let (host_if, guest_if) = (format!("{name}h"), format!("{name}g"));
        let (host_cidr, guest_cidr) = (format!("{}/30", self.host_ip), format!("{}/30", self.ip));
        for cmd in [
            vec!["ip", "netns", "add", name],
            vec!["ip", "link", "add", &host_if, "type", "veth", "peer", "name", &guest_if],
            vec!["ip", "link", "set", &guest_if, "netns", name],
            vec!["ip", "addr", "add", &host_cidr, "dev", &host_if],
            vec!["ip", "link", "set", &host_if, "up"],
            vec!["ip", "-n", name, "addr", "add", &guest_cidr, "dev", &guest_if],
            vec!["ip", "-n", name, "link", "set", &guest_if, "up"],
            vec!["ip", "-n", name, "link", "set", "lo", "up"],
        ] {
            run(&cmd)?;
        }
        // The host under a fixed name, as a cloud's metadata names its own services.
        let hosts = self.read("/etc/hosts");
        let hosts = if hosts.is_empty() { "127.0.0.1\tlocalhost\n".to_string() } else { hosts };
        self.write("/etc/hosts", &format!("{hosts}{}\t{HOST_ALIAS}\n", self.host_ip))
    }

    /// Makes the guest trust the CA certificates of `pem` besides Debian's, as an image built
    /// for a private mirror would.
    pub fn trust(&self, pem: &str) -> Result<(), MachineError> {
        self.write(CA_FILE, pem)?;
        let bundle = self.read(CA_BUNDLE);
        self.write(CA_BUNDLE, &format!("{bundle}{}{pem}", if bundle.ends_with('\n') { "" } else { "\n" }))
    }

    /// Boots the guest with `user_data` as its NoCloud seed, as a cloud's metadata service would
    /// hand it over. systemd-nspawn runs in a process group of its own, so it outlives its
    /// caller as a VM outlives the operator that ordered it; its pid is kept in `pid`.
    pub fn boot(&self, user_data: &str) -> Result<std::process::Child, MachineError> {
        let name = &self.name;
        self.write("var/lib/cloud/seed/nocloud/user-data", user_data)?;
        self.write("var/lib/cloud/seed/nocloud/meta-data", &format!("instance-id: {name}\nlocal-hostname: {name}\n"))?;
        let console = std::fs::File::create(self.dir.join("console.log")).map_err(|e| format!("console.log: {e}"))?;
        let console_err = console.try_clone().map_err(|e| format!("console.log: {e}"))?;
        use std::os::unix::process::CommandExt as _;
        let child = Command::new("systemd-nspawn")
            .arg("--directory")
            .arg(self.root())
            .args(["--boot", "--register=no", "--keep-unit", "--quiet"])
            // The guest owns its network namespace, as a VM owns its NIC: its firewall needs this.
            .arg("--capability=CAP_NET_ADMIN")
            .arg(format!("--machine={name}"))
            // How the guest's systemd is found once nspawn is gone ([`processes`]).
            .arg(format!("--setenv={MARKER}={name}"))
            .arg(format!("--network-namespace-path=/run/netns/{name}"))
            .stdin(Stdio::null())
            .stdout(console)
            .stderr(console_err)
            .process_group(0)
            .spawn()
            .map_err(|e| format!("systemd-nspawn: {e}"))?;
        std::fs::write(self.dir.join("pid"), child.id().to_string()).map_err(|e| format!("pid file: {e}"))?;
        // For a moment after the spawn the kernel shows no command line yet, and a guest read in
        // that moment would look stopped: return once it is recognisably running.
        let mut child = child;
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.pid().is_none() {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("systemd-nspawn exited at once ({status}): {}", self.console().trim()));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err("systemd-nspawn did not come up within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(child)
    }

    /// systemd-nspawn's pid while the guest runs: alive, not a zombie, and its command line names
    /// this machine (a recycled pid belongs to some other program).
    pub fn pid(&self) -> Option<i32> {
        let pid: i32 = std::fs::read_to_string(self.dir.join("pid")).ok()?.trim().parse().ok()?;
        (processes::is_nspawn_of(pid, &self.name) && !processes::zombie(pid)).then_some(pid)
    }

    /// Powers the guest off in order (nspawn turns SIGTERM into a shutdown of the guest's
    /// systemd); after `grace`, or when nspawn is gone already, kills every process of the guest
    /// that is left: nspawn, the guest's systemd and everything under it.
    pub fn stop(&self, grace: Duration) {
        if let Some(pid) = self.pid() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + grace;
            while self.pid().is_some() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let left = processes::kill_guest(&self.name);
        if !left.is_empty() {
            tracing::warn!(guest = %self.name, pids = ?left, "guest processes survived SIGKILL");
        }
    }

    /// Every live process of the guest: its systemd-nspawn, its systemd and what runs under it.
    pub fn processes(&self) -> Vec<i32> {
        processes::of_guest(&self.name)
    }

    /// Stops the guest and removes everything it made: overlay, namespace, link, folder.
    pub fn tear_down(&self) {
        self.stop(Duration::from_secs(20));
        let root = self.root();
        if run(&["umount", &root.to_string_lossy()]).is_err() {
            // Still busy (a process of a killed guest on its way out): detach it now.
            let _ = run(&["umount", "-l", &root.to_string_lossy()]);
        }
        let _ = run(&["ip", "netns", "del", &self.name]);
        let _ = run(&["ip", "link", "del", &format!("{}h", self.name)]);
        if std::env::var_os("SKYPORT_KEEP_GUEST").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// The guest's file system as the guest sees it (the overlay's merged view).
    pub fn root(&self) -> PathBuf {
        self.dir.join("root")
    }

    /// A file of the guest, or "" while it does not exist.
    pub fn read(&self, path: &str) -> String {
        std::fs::read_to_string(self.root().join(path.trim_start_matches('/'))).unwrap_or_default()
    }

    fn write(&self, path: &str, text: &str) -> Result<(), MachineError> {
        let path = self.root().join(path.trim_start_matches('/'));
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
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

    /// The console (systemd's boot messages).
    pub fn console(&self) -> String {
        std::fs::read_to_string(self.dir.join("console.log")).unwrap_or_default()
    }

    /// The tails of the console and of cloud-init's output, for error messages.
    pub fn diagnostics(&self) -> String {
        let tail = |s: String, n: usize| {
            let lines: Vec<&str> = s.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        };
        format!(
            "--- console (tail) ---\n{}\n--- cloud-init-output.log (tail) ---\n{}",
            tail(self.console(), 30),
            tail(self.cloud_init_output(), 40)
        )
    }
}

pub(crate) fn addresses_in_use() -> Result<String, MachineError> {
    let out = Command::new("ip").args(["-4", "addr"]).output().map_err(|e| format!("ip: {e}"))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The link of guest address `ip` (a `.2` of a /30 of 10.213.0.0/16), if no interface has it.
fn link_of(ip: Ipv4Addr) -> Result<(Ipv4Addr, Ipv4Addr), MachineError> {
    let [a, b, _, d] = ip.octets();
    if (a, b) != (10, 213) || d % 4 != 2 {
        return Err(format!("{ip} is not a guest address (the .2 of a /30 of 10.213.0.0/16)"));
    }
    let host = Ipv4Addr::from(u32::from(ip) - 1);
    let taken = addresses_in_use()?;
    if taken.contains(&format!("{host}/")) || taken.contains(&format!("{ip}/")) {
        return Err(format!("{ip} is in use by an interface here already"));
    }
    Ok((host, ip))
}

/// A /30 of 10.213.0.0/16 (host `.1`, guest `.2`) no interface here has and not in `avoid`.
pub fn free_link(avoid: &[Ipv4Addr]) -> Result<(Ipv4Addr, Ipv4Addr), MachineError> {
    let taken = addresses_in_use()?;
    let base = u32::from(Ipv4Addr::new(10, 213, 0, 0));
    (0..1000)
        .map(|_| {
            let n = u32::from(rand::random::<u16>() & 0x3fff);
            (Ipv4Addr::from(base + n * 4 + 1), Ipv4Addr::from(base + n * 4 + 2))
        })
        .find(|(h, g)| !taken.contains(&format!("{h}/")) && !taken.contains(&format!("{g}/")) && !avoid.contains(g))
        .ok_or_else(|| "no free /30 left in 10.213.0.0/16".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_without_root_or_nspawn_is_refused_with_what_to_do() {
        let err = check(false, std::env::var_os("PATH")).unwrap_err();
        assert!(err.contains("root"), "{err}");
        let empty = std::env::temp_dir().join(format!("skyport-no-tools-{}", std::process::id()));
        std::fs::create_dir_all(&empty).unwrap();
        let err = check(true, Some(empty.clone().into_os_string())).unwrap_err();
        assert!(err.contains("systemd-nspawn") && err.contains("apt-get install systemd-container"), "{err}");
        let _ = std::fs::remove_dir(&empty);
    }

    #[test]
    fn only_the_guest_end_of_a_guest_link_is_a_guest_address() {
        for bad in ["10.213.0.1", "10.213.0.3", "10.214.0.2", "192.168.0.2"] {
            let err = link_of(bad.parse().unwrap()).unwrap_err();
            assert!(err.contains("not a guest address"), "{bad}: {err}");
        }
    }

    #[test]
    fn free_links_avoid_promised_addresses() {
        let (host, guest) = free_link(&[]).unwrap();
        assert_eq!(u32::from(guest), u32::from(host) + 1);
        assert_eq!((guest.octets()[0], guest.octets()[1], guest.octets()[3] % 4), (10, 213, 2));
        let promised: Vec<Ipv4Addr> = (0..0x4000u32).map(|n| Ipv4Addr::from(0x0ad5_0000 + n * 4 + 2)).collect();
        assert!(free_link(&promised).is_err(), "every link promised: none is free");
    }
}

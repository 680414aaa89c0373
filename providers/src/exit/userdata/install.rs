//! The install script of the user data, and the one line it prints on the VM's console when it
//! ends ([`InstallReport`]): the binary refused (download failed, digest mismatch, no binary for
//! the architecture), the service not started (which step failed), or started. A provider that
//! can read consoles hands that line to the operator, which can then say why an exit server does
//! not answer without logging in, and stop buying VMs for an artifact that cannot work. The line
//! carries no URL and nothing secret: the operator may put its words in an Event.

use super::{
    Artifact, BINARY_PATH, CONFIG_DIR, FIREWALL_PATH_NAME, FIREWALL_UNIT_NAME, NFTABLES_PATH, SERVICE_USER, UNIT_NAME,
    UserDataError,
};

/// The start of the install script's report line (`<this> <outcome> [<detail>]`).
pub const INSTALL_REPORT: &str = "skyport-exit-server-install:";

/// What the install script reported on the console.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstallReport {
    /// The binary passed its check and the service runs.
    Started,
    /// The binary was not installed: `download-failed`, `digest-mismatch`, or `architecture
    /// <uname -m>` (no binary for it).
    ArtifactRefused(String),
    /// The binary was fine but the server did not start; the step that failed: `firewall` (the
    /// ruleset did not load), `install` or `service` (the unit is not active).
    NotStarted(String),
}

impl InstallReport {
    /// The last report in `console`, if any. Only the words the script prints are accepted:
    /// whatever else a VM writes on its console is not passed on.
    pub fn find(console: &str) -> Option<InstallReport> {
        console.lines().rev().find_map(|line| {
            let rest = &line[line.find(INSTALL_REPORT)? + INSTALL_REPORT.len()..];
            let words: Vec<&str> = rest.split_whitespace().collect();
            match words.as_slice() {
                ["started"] => Some(InstallReport::Started),
                ["refused", why @ ("download-failed" | "digest-mismatch")] => {
                    Some(InstallReport::ArtifactRefused(why.to_string()))
                }
                ["refused", "architecture", arch]
                    if arch.len() <= 32 && arch.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
                {
                    Some(InstallReport::ArtifactRefused(format!("architecture {arch}")))
                }
                ["not-started", step @ ("firewall" | "install" | "service")] => {
                    Some(InstallReport::NotStarted(step.to_string()))
                }
                _ => None,
            }
        })
    }
}

/// A refused exit server's report, served on its control port (where the tunnel server would
/// listen, and which the firewall opens) to whoever connects: the operator reads it there where
/// the provider keeps no console (DigitalOcean, Hetzner). Python 3 is on every image cloud-init
/// runs on. The report is no secret: which step refused, never a token or URL.
const REPORT_SERVER: &str = "import socket, sys\n\
s = socket.socket()\n\
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
s.bind((\"0.0.0.0\", int(sys.argv[2])))\n\
s.listen(8)\n\
while True:\n    \
c = s.accept()[0]\n    \
try:\n        \
c.sendall((sys.argv[1] + \"\\n\").encode())\n    \
except OSError:\n        \
pass\n    \
c.close()\n";

/// The install script: loads the firewall, picks the artifact for the machine's architecture,
/// downloads it beside its final path, and installs it only if the digest matches; when the
/// ruleset does not load or the digest differs it fails, so the unit is never enabled (fail
/// closed). Before the server starts it runs the unit following the config as root once, enabled so every boot runs it again; either
/// failing stops the script too. Whatever the outcome, it ends by printing one [`InstallReport`]
/// line on the console (and on stderr, for cloud-init's log); a refusal is also served on
/// `control_port` ([`REPORT_SERVER`]), since nothing else will bind it. Values are validated
/// before they are quoted.
pub fn render_install(artifacts: &[Artifact], control_port: u16) -> Result<String, UserDataError> {
    if artifacts.is_empty() {
        return Err(UserDataError::NoArtifact);
    }
    let mut sorted: Vec<&Artifact> = artifacts.iter().collect();
    sorted.sort_by(|a, b| a.arch.cmp(&b.arch));
    let mut cases = String::new();
    for a in sorted {
        let arch_ok = !a.arch.is_empty() && a.arch.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        let sum_ok = a.sha256.len() == 64 && a.sha256.chars().all(|c| c.is_ascii_hexdigit());
        let url_ok = (a.url.starts_with("https://") || a.url.starts_with("http://"))
            && !a.url.chars().any(|c| c.is_whitespace() || c.is_control() || "'\"\\`$".contains(c));
        if !(arch_ok && sum_ok && url_ok) {
            return Err(UserDataError::InvalidArtifact(a.arch.clone()));
        }
        cases.push_str(&format!("  {}) url='{}'; sum='{}' ;;\n", a.arch, a.url, a.sha256.to_ascii_lowercase()));
    }
    let download = format!("{BINARY_PATH}.download");
    // `said` keeps the EXIT trap from reporting a second time after a refusal.
    Ok(format!(
        "set -eu\n\
         said=''\n\
         serve_report() {{ command -v systemd-run >/dev/null 2>&1 && command -v python3 >/dev/null 2>&1 || return 0; \
         systemd-run --quiet --unit=skyport-install-report python3 -c '{REPORT_SERVER}' \"$m\" {control_port} >/dev/null 2>&1 || true; }}\n\
         say() {{ said=1; m=\"{INSTALL_REPORT} $*\"; echo \"$m\" >&2; echo \"$m\" 2>/dev/null >/dev/console || true; \
         case \"$*\" in refused*) serve_report ;; esac; }}\n\
         step=firewall\n\
         trap '[ -n \"$said\" ] || say \"not-started $step\"' EXIT\n\
         nft -f {NFTABLES_PATH}\n\
         arch=\"$(uname -m | tr -cd 'A-Za-z0-9_')\"\n\
         case \"$arch\" in\n\
         {cases}  \
         *) echo \"skyport: no exit-server binary for architecture $arch\" >&2; say \"refused architecture $arch\"; exit 1 ;;\n\
         esac\n\
         rm -f {download}\n\
         if ! curl -fsSL --retry 5 --retry-connrefused -o {download} \"$url\"; then\n  \
         say 'refused download-failed'\n  \
         exit 1\n\
         fi\n\
         if ! echo \"$sum  {download}\" | sha256sum -c --status -; then\n  \
         rm -f {download}\n  \
         echo \"skyport: $url does not have SHA-256 $sum; refusing to run it\" >&2\n  \
         say 'refused digest-mismatch'\n  \
         exit 1\n\
         fi\n\
         step=install\n\
         chmod 0755 {download}\n\
         mv -f {download} {BINARY_PATH}\n\
         chown {SERVICE_USER}:{SERVICE_USER} {CONFIG_DIR}\n\
         chmod 0700 {CONFIG_DIR}\n\
         systemctl daemon-reload\n\
         systemctl enable --now {FIREWALL_UNIT_NAME}\n\
         systemctl enable --now {FIREWALL_PATH_NAME}\n\
         step=service\n\
         systemctl enable --now {UNIT_NAME}\n\
         # A server that exits at once is restarted: only one still active a moment later counts.\n\
         sleep 3\n\
         systemctl is-active --quiet {UNIT_NAME}\n\
         say started\n"
    ))
}

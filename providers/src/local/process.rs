//! The exit server as a process: its config file, its start and its liveness.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::forward_file::FORWARD_FILE;
use super::{LocalProvider, PROVIDER, Record, WATCHING, unavailable};
use crate::error::HostError;
use crate::exit::userdata::{ExitServer, render_server_toml_split};

impl LocalProvider {
    /// The server's pid if it runs: alive, and its command line names this host's config (a
    /// recycled pid belongs to some other program).
    pub(super) fn alive(&self, id: &str) -> Option<i32> {
        let dir = self.host_dir(id);
        let pid: i32 = std::fs::read_to_string(dir.join("pid")).ok()?.trim().parse().ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let config = dir.join("server.toml");
        let ours = String::from_utf8_lossy(&cmdline).contains(&*config.to_string_lossy());
        (ours && running(pid)).then_some(pid)
    }

    pub(super) fn write_config(&self, dir: &Path, server: &ExitServer, record: &Record) -> Result<(), HostError> {
        let text = render(server, record.address)?;
        // A rename is one event for rathole's watcher: it never reads a half-written file.
        replace_config(dir, &text)
    }

    fn spawn(&self, dir: &Path) -> Result<tokio::process::Child, HostError> {
        let log = std::fs::File::create(dir.join("server.log")).map_err(|e| unavailable(format!("log file: {e}")))?;
        let err_log = log.try_clone().map_err(|e| unavailable(format!("log file: {e}")))?;
        tokio::process::Command::new(&self.settings.exe)
            .args(["tunnel", "server", "--config"])
            .arg(dir.join("server.toml"))
            .arg("--forward-file")
            .arg(dir.join(FORWARD_FILE))
            // Plain lines at info: `create` reads the log for rathole's "watching" message, which
            // neither colour codes nor the operator's own RUST_LOG (e.g. `warn`) may hide.
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(err_log)
            // Its own process group: it outlives an operator restart, as a VM would.
            .process_group(0)
            .spawn()
            .map_err(|e| unavailable(format!("cannot start {}: {e}", self.settings.exe.display())))
    }

    /// Writes the host's folder and starts its server; on failure the caller removes both.
    pub(super) async fn start(
        &self,
        dir: &Path,
        record: &Record,
        server: &ExitServer,
        child: &mut Option<tokio::process::Child>,
    ) -> Result<(), HostError> {
        std::fs::create_dir_all(dir).map_err(|e| unavailable(format!("cannot create {}: {e}", dir.display())))?;
        self.write_config(dir, server, record)?;
        let json = serde_json::to_vec_pretty(record).map_err(|e| unavailable(e.to_string()))?;
        std::fs::write(dir.join("host.json"), json).map_err(|e| unavailable(format!("host.json: {e}")))?;
        let process = child.insert(self.spawn(dir)?);
        let pid = process.id().ok_or_else(|| unavailable("the exit server exited at once".into()))?;
        std::fs::write(dir.join("pid"), pid.to_string()).map_err(|e| unavailable(format!("pid file: {e}")))?;

        // Ready means: the control port answers (a client dialing at once must not fail) and the
        // config watcher runs (a reconfigure right after create must not be missed).
        let deadline = tokio::time::Instant::now() + self.settings.start_timeout;
        let control = (record.address, server.control_port);
        let mut listening = false;
        loop {
            listening = listening || tokio::net::TcpStream::connect(control).await.is_ok();
            let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
            if listening && log.contains(WATCHING) {
                return Ok(());
            }
            let exited = process.try_wait().ok().flatten();
            if exited.is_some() || tokio::time::Instant::now() > deadline {
                let why = match exited {
                    Some(status) => format!("exited ({status})"),
                    None if listening => "did not start watching its config (built without hot-reload?)".to_string(),
                    None => format!("did not listen on {}:{}", control.0, control.1),
                };
                return Err(unavailable(format!("exit server {why}: {}", last_line(&log, server))));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The server's config: every port on its own `address` (a reserved address moved onto it is
/// forwarded there, see [`FORWARD_FILE`]).
pub(super) fn render(server: &ExitServer, address: Ipv4Addr) -> Result<String, HostError> {
    let address = address.to_string();
    render_server_toml_split(server, &address, &address)
        .map_err(|e| HostError::Invalid { provider: PROVIDER, message: e.to_string() })
}

/// Replaces `dir`'s `server.toml` with `text` by a rename (one event for rathole's watcher).
pub(super) fn replace_config(dir: &Path, text: &str) -> Result<(), HostError> {
    let tmp = dir.join("server.toml.tmp");
    write_private(&tmp, text).map_err(|e| unavailable(format!("cannot write {}: {e}", tmp.display())))?;
    std::fs::rename(&tmp, dir.join("server.toml")).map_err(|e| unavailable(format!("cannot replace server.toml: {e}")))
}

/// What the log says last, for an error message: the error the server exited with (its
/// `Error:` line and causes, without the backtrace `RUST_BACKTRACE` adds, whose last frame says
/// nothing), else its last line; withheld if it quotes one of the server's secrets (rathole's
/// config errors may quote the offending TOML line).
fn last_line(log: &str, server: &ExitServer) -> String {
    let lines: Vec<&str> = log.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let said = match lines.iter().rposition(|l| l.starts_with("Error: ")) {
        Some(at) => {
            lines[at..].iter().take_while(|l| !l.starts_with("Stack backtrace:")).copied().collect::<Vec<_>>().join(" ")
        }
        None => lines.last().copied().unwrap_or("no output").to_string(),
    };
    let secrets = server.services.iter().map(|s| s.token.as_str()).chain([server.noise_private_key.as_str()]);
    if secrets.filter(|s| !s.is_empty()).any(|s| said.contains(s)) {
        return "<log line withheld: it contains a secret>".into();
    }
    said
}

/// Whether process `pid` exists and has not exited (a zombie awaiting its reaper has).
pub(super) fn running(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // The state is the field after the parenthesised command name; Z = exited, not yet reaped.
    !stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z'))
}

/// Signals the process group led by `pid`; a group that is already gone is not an error.
pub(super) fn signal_group(pid: i32, signal: Signal) -> Result<(), HostError> {
    match killpg(Pid::from_raw(pid), signal) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
        Err(e) => Err(unavailable(format!("cannot send {signal} to exit server process group {pid}: {e}"))),
    }
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    f.write_all(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_the_server_exited_with_is_named_not_its_backtrace() {
        let server = ExitServer { control_port: 2333, noise_private_key: "k3y".into(), services: Vec::new() };
        let log = "INFO starting\nError: cannot listen on 127.77.0.9:2333\n\nCaused by:\n    Address in use\n\n\
                   Stack backtrace:\n   0: anyhow::error\n  31: _start\n";
        assert_eq!(last_line(log, &server), "Error: cannot listen on 127.77.0.9:2333 Caused by: Address in use");
        assert_eq!(last_line("INFO a\nWARN b\n", &server), "WARN b", "no error: the last line");
        assert_eq!(last_line("", &server), "no output");
        assert!(last_line("Error: bad key k3y\n", &server).contains("withheld"));
    }
}

//! Every process of a guest, found from this host's `/proc`, and how to end them all.
//!
//! A guest is more than its systemd-nspawn: nspawn forks the guest's systemd into a PID
//! namespace of its own, in a session of its own, and a SIGKILL to nspawn does not reach it;
//! orphaned, the guest's systemd and its services run on (holding inotify instances, the guest's
//! network namespace and its overlay) with nobody left who knows them. So the guest's init
//! carries a marker in its environment ([`MARKER`]`=<name>`, set through nspawn's `--setenv`,
//! seen only by PID 1 of the guest), by which it is found after nspawn is gone; killing a PID
//! namespace's init makes the kernel kill everything else in that namespace. Processes in the
//! guest's network namespace are the guest's too, which covers guests booted without the marker.
//!
//! Whoever prepared a guest is recorded beside it ([`Owner`]: pid and start time, so a recycled
//! pid does not pass for it), so a sweep can tell the guests of a process that died without
//! cleaning up (a test run cut short) from the guests of one that still runs.

use std::net::Ipv4Addr;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::Machine;

/// The environment variable naming the guest in its init's environment.
pub const MARKER: &str = "SKYPORT_GUEST";

/// A process of this host: its pid and its start time (clock ticks after boot), which together
/// name it uniquely.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub pid: i32,
    pub start: u64,
}

impl Owner {
    /// The calling process.
    pub fn me() -> Option<Owner> {
        let pid = i32::try_from(std::process::id()).ok()?;
        Some(Owner { pid, start: start_time(pid)? })
    }

    /// Whether this very process still runs (not merely some process with its pid).
    pub fn alive(&self) -> bool {
        start_time(self.pid) == Some(self.start) && !zombie(self.pid)
    }

    /// `"<pid> <start>"`, as [`Owner::parse`] reads it.
    pub fn render(&self) -> String {
        format!("{} {}", self.pid, self.start)
    }

    pub fn parse(text: &str) -> Option<Owner> {
        let mut words = text.split_whitespace();
        Some(Owner { pid: words.next()?.parse().ok()?, start: words.next()?.parse().ok()? })
    }
}

/// Fields of `/proc/<pid>/stat` after the parenthesised command name (which may hold spaces).
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat.rsplit_once(')')?.1.split_whitespace().map(str::to_string).collect())
}

fn start_time(pid: i32) -> Option<u64> {
    // Field 22 of stat; the first after the name is field 3.
    stat_fields(pid)?.get(19)?.parse().ok()
}

/// Exited but not yet reaped (or gone): no longer a process that holds anything.
pub fn zombie(pid: i32) -> bool {
    stat_fields(pid).is_none_or(|f| f.first().is_some_and(|s| s == "Z" || s == "X"))
}

fn pids() -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect()
}

/// Whether `pid` is the init of a PID namespace below ours (`NSpid: <pid> 1`).
fn namespace_init(pid: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return false };
    status.lines().find_map(|l| l.strip_prefix("NSpid:")).is_some_and(|ids| {
        let ids: Vec<&str> = ids.split_whitespace().collect();
        ids.len() >= 2 && ids.last() == Some(&"1")
    })
}

fn environ_has(pid: i32, entry: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| env.split(|b| *b == 0).any(|e| e == entry.as_bytes()))
}

fn cmdline(pid: i32) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect()
}

/// Whether `pid` is systemd-nspawn running guest `name`.
pub fn is_nspawn_of(pid: i32, name: &str) -> bool {
    let args = cmdline(pid);
    args.first().is_some_and(|a| a.ends_with("systemd-nspawn"))
        && args.iter().any(|a| *a == format!("--machine={name}"))
}

/// The init of guest `name` (its systemd, PID 1 of its namespace), with or without its nspawn.
pub fn guest_init(name: &str) -> Option<i32> {
    let entry = format!("{MARKER}={name}");
    pids().into_iter().find(|&pid| namespace_init(pid) && environ_has(pid, &entry))
}

/// Every live process of guest `name`: its nspawn, its init, and whatever runs in its network
/// namespace (`/run/netns/<name>`, while that exists).
pub fn of_guest(name: &str) -> Vec<i32> {
    let entry = format!("{MARKER}={name}");
    let netns = std::fs::metadata(format!("/run/netns/{name}")).ok().map(|m| (m.dev(), m.ino()));
    let in_netns = |pid: i32| {
        let ns = std::fs::metadata(format!("/proc/{pid}/ns/net")).ok().map(|m| (m.dev(), m.ino()));
        netns.is_some() && ns == netns
    };
    pids()
        .into_iter()
        .filter(|&pid| !zombie(pid))
        .filter(|&pid| is_nspawn_of(pid, name) || (namespace_init(pid) && environ_has(pid, &entry)) || in_netns(pid))
        .collect()
}

/// SIGKILLs every process of guest `name` and waits (up to 10 s) until none is left; returns
/// those still there then.
pub fn kill_guest(name: &str) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = of_guest(name);
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        for pid in left {
            // Gone in between is fine; anything else shows in the next round.
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Inits of marked guests whose systemd-nspawn is gone (their parent is not an nspawn of the
/// same guest): left over, since a guest without its nspawn is powered off to its provider.
pub fn orphaned_guests() -> Vec<(i32, String)> {
    pids()
        .into_iter()
        .filter(|&pid| namespace_init(pid) && !zombie(pid))
        .filter_map(|pid| {
            let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            let prefix = format!("{MARKER}=");
            let name = env.split(|b| *b == 0).find_map(|e| e.strip_prefix(prefix.as_bytes()))?;
            let name = String::from_utf8_lossy(name).into_owned();
            let parent: i32 = stat_fields(pid)?.get(1)?.parse().ok()?;
            (!is_nspawn_of(parent, &name)).then_some((pid, name))
        })
        .collect()
}

impl Machine {
    /// Tears down, below `parent`, the guests whose maker has died without removing them (a test
    /// run cut short): folders named `skyport-*` and the guest folders in them, recognised by
    /// their `owner` file; then any guest whose systemd-nspawn is gone but whose systemd still
    /// runs. Guests of processes that still run are left alone. Returns what was removed.
    pub fn sweep_left_overs(parent: &Path) -> Vec<String> {
        let mut removed = Vec::new();
        let folders = |dir: &Path| -> Vec<PathBuf> {
            std::fs::read_dir(dir)
                .map(|e| e.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect())
                .unwrap_or_default()
        };
        let tops = folders(parent)
            .into_iter()
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("skyport-")));
        for dir in tops.flat_map(|top| {
            let mut all = folders(&top);
            all.push(top);
            all
        }) {
            let Ok(text) = std::fs::read_to_string(dir.join("owner")) else { continue };
            let (Some(owner), Some(name)) = (Owner::parse(&text), text.split_whitespace().nth(2)) else { continue };
            if owner.alive() {
                continue;
            }
            let machine =
                Machine { name: name.to_string(), ip: Ipv4Addr::UNSPECIFIED, host_ip: Ipv4Addr::UNSPECIFIED, dir };
            machine.tear_down();
            removed.push(format!("guest {name} of the exited process {}", owner.pid));
        }
        for (pid, name) in orphaned_guests() {
            kill_guest(&name);
            removed.push(format!("guest {name} (systemd pid {pid}) without its systemd-nspawn"));
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_is_this_very_process_not_its_pid() {
        let me = Owner::me().expect("this process");
        assert!(me.alive());
        assert_eq!(Owner::parse(&me.render()), Some(me));
        assert!(!Owner { start: me.start + 1, ..me }.alive(), "a recycled pid is another process");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        child.wait().unwrap();
        assert!(!Owner { pid, start: 0 }.alive());
        assert_eq!(Owner::parse("12"), None);
    }

    #[test]
    fn no_process_is_taken_for_a_guest_that_never_ran() {
        assert!(of_guest("skgnever0").is_empty());
        assert_eq!(guest_init("skgnever0"), None);
    }
}

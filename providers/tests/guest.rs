//! The guest provider with real booted guests (systemd-nspawn, the Debian root file system of
//! tests/env/build-guest.sh: `SKYPORT_GUEST_ROOTFS`, which tests/run.sh exports): the shared
//! contract, reserved addresses, a guest powered off behind the provider's back, a provider
//! started anew over the same state finding its guests again, and the moved address a highly
//! available pair's server puts on its interface at every boot (or, on EC2, the secondary
//! private address it reads from a fake of the instance metadata service). The user data here cannot install
//! a server (its download URL leads nowhere): these are about the guests as hosts; the pair's
//! address moving between guests is guest_moved.rs, the Tunnel path through them
//! tests/tunnel_guest.rs.
//!
//! Needs root. Where guests cannot boot these fail, unless `SKYPORT_SKIP_GUEST_TESTS=1` opts out.

mod contract;
mod guest_support;

use guest_support::{carried, provider, until_carried};
use std::time::Duration;

use providers::exit::userdata::{Artifact, InterfaceAddresses, render_cloud_config_on, render_cloud_config_with};
use providers::guest::processes::Owner;
use providers::guest::{GuestProvider, GuestSettings, HOST_ALIAS, Machine};
use providers::hosts::{HostProvider, HostState, TAG_TUNNEL_UID};

/// Set in the child process of the crash test: the state directory it makes a guest in.
const CRASH_CHILD: &str = "SKYPORT_GUEST_CRASH_CHILD";

fn expect() -> contract::Expect {
    // nspawn runs as soon as `create` returns: the guest is up, cloud-init on its way.
    contract::Expect {
        created_provisioning: false,
        polls_until_running: 3,
        interval: Duration::from_millis(100),
        public_address: false,
    }
}

#[tokio::test]
#[ignore = "boots Debian guests: root and tests/env/build-guest.sh (tests/run.sh)"]
async fn guest_keeps_the_host_provider_contract_and_the_reserved_address_contract() {
    let Some((p, _state)) = provider("contract") else { return };
    contract::run(&p, expect()).await;
    contract::run_addresses(&p, &contract::request("skyport-addr", contract::UID), None, &expect()).await;
}

#[tokio::test]
#[ignore = "boots Debian guests: root and tests/env/build-guest.sh (tests/run.sh)"]
async fn a_guest_stopped_behind_the_providers_back_reads_stopped_and_is_found_again_after_a_restart() {
    let Some((p, state)) = provider("stopped") else { return };
    let uid = contract::fresh_uid();
    let host = p.create(&contract::request("skyport-stopped", &uid)).await.unwrap();
    // Running from the start: read a moment too early, a fresh guest must not look stopped (the
    // controller would replace it at once).
    assert_eq!(host.state, HostState::Running);
    assert_eq!(p.get(&host.id).await.unwrap().map(|h| h.state), Some(HostState::Running));
    let machine = p.machine(&host.id).expect("the guest's files");
    // Its seed holds the tunnel's secrets: nobody but root reads the guest's folder.
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(std::fs::metadata(&machine.dir).unwrap().permissions().mode() & 0o777, 0o700);
    assert_eq!(host.public_ipv4, Some(machine.ip.to_string()));
    // Booted from the seed, with the host under its fixed name.
    for _ in 0..300 {
        if machine.cloud_init_done() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(machine.cloud_init_done(), "{}", machine.diagnostics());
    assert!(machine.read("/etc/hosts").contains(&format!("{}\t{HOST_ALIAS}", machine.host_ip)));
    let link = std::process::Command::new("ip").args(["-n", &host.id, "-4", "addr"]).output().unwrap().stdout;
    assert!(String::from_utf8_lossy(&link).contains(&format!("{}/30", machine.ip)), "the guest's end of its link");

    // The operator restarts: a new provider over the same state finds the guest by its tag.
    let restarted = GuestProvider::new(state.0.clone()).unwrap();
    let found = restarted.list_by_tag(TAG_TUNNEL_UID, &uid).await.unwrap();
    assert_eq!(
        found.iter().map(|h| (h.id.as_str(), h.state)).collect::<Vec<_>>(),
        [(host.id.as_str(), HostState::Running)]
    );

    // Powered off behind skyport's back: Stopped, until deleted; then no trace is left.
    machine.stop(Duration::from_secs(30));
    assert_eq!(restarted.get(&host.id).await.unwrap().map(|h| h.state), Some(HostState::Stopped));
    restarted.delete(&host.id).await.unwrap();
    assert_eq!(p.get(&host.id).await.unwrap(), None);
    assert!(!machine.dir.exists(), "the guest's folder is gone");
    let netns = std::process::Command::new("ip").args(["netns", "list"]).output().unwrap().stdout;
    assert!(!String::from_utf8_lossy(&netns).contains(&host.id), "the guest's network namespace is gone");
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    assert!(!mounts.contains(&machine.root().to_string_lossy().into_owned()), "the overlay is unmounted");
}

/// `pid` and every process below it, each named by pid and start time.
fn process_tree(pid: i32) -> Vec<Owner> {
    let parent_of = |p: i32| -> Option<i32> {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
    };
    let all: Vec<i32> =
        std::fs::read_dir("/proc").unwrap().flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect();
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(all.iter().filter(|&&c| parent_of(c) == Some(p)));
        i += 1;
    }
    tree.into_iter().filter_map(|p| Some(Owner { pid: p, start: start_of(p)? })).collect()
}

fn start_of(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

/// The guest's process tree once its systemd runs services (so there is a tree to leak).
async fn booted_tree(machine: &Machine) -> Vec<Owner> {
    for _ in 0..300 {
        let tree = machine.pid().map(process_tree).unwrap_or_default();
        if tree.len() >= 4 {
            return tree;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the guest did not start services: {}", machine.diagnostics());
}

fn survivors(tree: &[Owner]) -> Vec<String> {
    tree.iter()
        .filter(|p| p.alive())
        .map(|p| {
            format!(
                "{} {}",
                p.pid,
                String::from_utf8_lossy(&std::fs::read(format!("/proc/{}/cmdline", p.pid)).unwrap_or_default())
                    .replace('\0', " ")
            )
        })
        .collect()
}

#[tokio::test]
#[ignore = "boots Debian guests: root and tests/env/build-guest.sh (tests/run.sh)"]
async fn deleting_a_guest_ends_its_whole_process_tree_even_when_its_nspawn_was_killed() {
    let Some((p, _state)) = provider("leaks") else { return };
    let uid = contract::fresh_uid();
    // A guest whose systemd-nspawn was killed (an OOM kill, a crash): the guest's systemd runs on.
    let crashed = p.create(&contract::request("skyport-crashed", &uid)).await.unwrap();
    let machine = p.machine(&crashed.id).unwrap();
    let tree = booted_tree(&machine).await;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(machine.pid().unwrap()), nix::sys::signal::Signal::SIGKILL)
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(p.get(&crashed.id).await.unwrap().map(|h| h.state), Some(HostState::Stopped));
    // Usually the guest's systemd outlives its nspawn (the leak this guards against); on a busy
    // machine it sometimes goes down with it, and then the delete below has less to end.
    if survivors(&tree).is_empty() {
        eprintln!("the guest's systemd went down with its nspawn this time");
    }
    p.delete(&crashed.id).await.unwrap();
    assert_eq!(survivors(&tree), Vec::<String>::new(), "processes of the deleted guest {}", crashed.id);
    assert!(machine.processes().is_empty());

    // A guest deleted without a grace to power off (one whose shutdown outlasts it).
    let mut settings = _state.0.clone();
    settings.stop_grace = Duration::ZERO;
    let hasty = GuestProvider::new(settings).unwrap();
    let host = hasty.create(&contract::request("skyport-hasty", &uid)).await.unwrap();
    let machine = hasty.machine(&host.id).unwrap();
    let tree = booted_tree(&machine).await;
    hasty.delete(&host.id).await.unwrap();
    assert_eq!(survivors(&tree), Vec::<String>::new(), "processes of the deleted guest {}", host.id);
}

#[tokio::test]
#[ignore = "boots Debian guests: root and tests/env/build-guest.sh (tests/run.sh)"]
async fn the_guests_of_a_provider_that_crashed_are_swept_with_every_process() {
    if let Some(state) = std::env::var_os(CRASH_CHILD) {
        // The provider's process: makes a guest, says which, and waits to be killed.
        let mut settings = GuestSettings::new(state, std::env::var_os("SKYPORT_GUEST_ROOTFS").unwrap());
        settings.stop_grace = Duration::from_secs(10);
        let p = GuestProvider::new(settings).unwrap();
        let host = p.create(&contract::request("skyport-crash", &contract::fresh_uid())).await.unwrap();
        println!("host: {}", host.id);
        tokio::time::sleep(Duration::from_secs(600)).await;
        return;
    }
    let Some((p, state)) = provider("crash") else { return };
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "the_guests_of_a_provider_that_crashed_are_swept_with_every_process",
            "--include-ignored",
            "--nocapture",
        ])
        .env(CRASH_CHILD, &state.0.state_dir)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    use std::io::BufRead as _;
    let id = stdout.lines().map_while(Result::ok).find_map(|l| l.strip_prefix("host: ").map(str::to_string));
    let Some(id) = id else {
        let _ = child.kill();
        panic!("the provider's process made no guest: {:?}", child.wait());
    };
    let machine = p.machine(&id).expect("the crashed provider's guest");
    let tree = booted_tree(&machine).await;
    // The provider's process dies; its guest, like a VM, runs on.
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(p.get(&id).await.unwrap().map(|h| h.state), Some(HostState::Running));
    let removed = Machine::sweep_left_overs(&std::env::temp_dir());
    assert!(removed.iter().any(|r| r.contains(&id)), "{removed:?}");
    assert_eq!(survivors(&tree), Vec::<String>::new(), "processes of the swept guest {id}");
    assert_eq!(p.get(&id).await.unwrap(), None);
    assert!(!machine.dir.exists(), "the swept guest's folder is gone");
    let netns = std::process::Command::new("ip").args(["netns", "list"]).output().unwrap().stdout;
    assert!(!String::from_utf8_lossy(&netns).contains(&id), "the swept guest's network namespace is gone");
}

#[test]
fn a_root_file_system_without_cloud_init_is_refused_with_how_to_build_one() {
    let Err(e) =
        GuestProvider::new(GuestSettings::new(std::env::temp_dir().join("skyport-guest-none"), "/nonexistent"))
    else {
        panic!("a provider over no root file system");
    };
    let message = e.to_string();
    // Without root, that is what it says first; as root, what the root file system lacks.
    assert!(
        message.contains("root") && (message.contains("build-guest.sh") || message.contains("need root")),
        "{message}"
    );
}

/// The user data of a highly available pair's server where the cloud routes the moved address
/// unchanged (Hetzner floating IPs), booted by real cloud-init: the address is on the guest's
/// interface, and after a reboot without it (cloud-init's `runcmd` does not run twice) it is
/// there again.
#[tokio::test]
#[ignore = "boots Debian guests: root and tests/env/build-guest.sh (tests/run.sh)"]
async fn a_pair_servers_user_data_puts_its_moved_address_on_its_interface_at_every_boot() {
    let Some((p, _state)) = provider("moved") else { return };
    let moved = "203.0.113.77";
    let mut request = contract::request("skyport-moved", &contract::fresh_uid());
    let artifact =
        Artifact { arch: "x86_64".into(), url: "https://example.test/skyport-x86_64".into(), sha256: "ab".repeat(32) };
    request.user_data =
        render_cloud_config_with(&contract::exit_server(), &[artifact], &[moved.parse().unwrap()]).unwrap();
    let host = p.create(&request).await.unwrap();
    let machine = p.machine(&host.id).expect("the guest's files");
    let guest_if = format!("{}g", machine.name);
    let lines = until_carried(&machine, moved).await;
    assert!(lines.len() == 1 && lines[0].contains(&format!(" {guest_if} ")), "{lines:?}");

    machine.stop(Duration::from_secs(30));
    let del = ["-n", &machine.name, "addr", "del", &format!("{moved}/32"), "dev", &guest_if];
    assert!(std::process::Command::new("ip").args(del).status().unwrap().success());
    assert!(carried(&machine.name, moved).is_empty());
    drop(machine.boot(&request.user_data).expect("booted again"));
    let lines = until_carried(&machine, moved).await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    p.delete(&host.id).await.unwrap();
}

/// The user data of a highly available pair's EC2 server, booted by real cloud-init: its unit
/// reads the secondary private address from the instance metadata (tests/fake_imds.py, served
/// at 169.254.169.254 inside the guest's network namespace, listing the address only from its
/// third answer on) and puts it on the guest's interface.
#[tokio::test]
#[ignore = "boots Debian guests: root and tests/env/build-guest.sh (tests/run.sh)"]
async fn an_ec2_pair_servers_user_data_puts_its_secondary_address_from_the_metadata_on_its_interface() {
    let Some((p, _state)) = provider("secondary") else { return };
    let mut request = contract::request("skyport-secondary", &contract::fresh_uid());
    let artifact =
        Artifact { arch: "x86_64".into(), url: "https://example.test/skyport-x86_64".into(), sha256: "ab".repeat(32) };
    request.user_data =
        render_cloud_config_on(&contract::exit_server(), &[artifact], &InterfaceAddresses::Ec2Secondary).unwrap();
    let host = p.create(&request).await.unwrap();
    let machine = p.machine(&host.id).expect("the guest's files");
    let netns = machine.name.clone();
    let ip = |args: &[&str]| std::process::Command::new("ip").args(args).status().unwrap().success();
    assert!(ip(&["-n", &netns, "addr", "add", "169.254.169.254/32", "dev", "lo"]));
    let fake = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fake_imds.py");
    let mut imds = std::process::Command::new("ip")
        .args(["netns", "exec", &netns, "python3", fake, "169.254.169.254", "80"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let lines = until_carried(&machine, "172.31.5.77").await;
    let _ = imds.kill();
    let _ = imds.wait();
    assert!(lines.len() == 1 && lines[0].contains(&format!(" {}g ", machine.name)), "{lines:?}");
    assert!(carried(&machine.name, "172.31.5.10").is_empty(), "the primary address is not added");
    p.delete(&host.id).await.unwrap();
}

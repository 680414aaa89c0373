//! The peers benches/tunnel.rs measures the tunnel against (OpenSSH local port forwarding, a
//! plain relay), and the measurements every path gets: throughput, request/response latency,
//! connections per second.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};

/// An echo server: writes back whatever arrives, for round trips and connects.
pub async fn echo() -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let _ = conn.set_nodelay(true);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 1 << 14];
                loop {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if conn.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    }
                }
            });
        }
    });
    Ok(addr)
}

/// Microseconds of each of `count` round trips of `size` bytes on one connection (after one
/// warm-up round trip).
pub async fn round_trips(addr: &str, count: usize, size: usize) -> anyhow::Result<Vec<f64>> {
    let mut conn = TcpStream::connect(addr).await.with_context(|| format!("connect {addr}"))?;
    conn.set_nodelay(true)?;
    let request = vec![0x42u8; size];
    let mut response = vec![0u8; size];
    let mut out = Vec::with_capacity(count);
    for i in 0..=count {
        let t = Instant::now();
        conn.write_all(&request).await?;
        tokio::time::timeout(Duration::from_secs(5), conn.read_exact(&mut response))
            .await
            .context("echo timed out")??;
        if i > 0 {
            out.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    if response != request {
        bail!("the echo through {addr} came back corrupted");
    }
    Ok(out)
}

/// New connections per second (connect, 1-byte echo, close), `parallel` at a time, for `span`.
pub async fn connections_per_second(addr: &str, span: Duration, parallel: usize) -> f64 {
    let start = Instant::now();
    let workers = (0..parallel).map(|_| async {
        let mut done = 0u64;
        while start.elapsed() < span {
            let one = async {
                let mut c = TcpStream::connect(addr).await.ok()?;
                c.write_all(b"x").await.ok()?;
                let mut b = [0u8; 1];
                c.read_exact(&mut b).await.ok()
            };
            if tokio::time::timeout(Duration::from_secs(5), one).await.ok().flatten().is_some() {
                done += 1;
            }
        }
        done
    });
    let total: u64 = futures::future::join_all(workers).await.into_iter().sum();
    total as f64 / start.elapsed().as_secs_f64()
}

/// Nearest-rank percentile of unsorted `v`.
pub fn percentile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[((q * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1]
}

fn median(v: &[f64]) -> f64 {
    percentile(v, 0.5)
}

/// One way to reach the two backends, and what was measured on it, per run.
pub struct Path {
    pub name: String,
    pub bulk: String,
    pub echo: String,
    mbps: Vec<f64>,
    p50: Vec<f64>,
    p99: Vec<f64>,
    cps: Vec<f64>,
}

impl Path {
    pub fn new(name: &str, bulk: String, echo: String) -> Self {
        Path { name: name.into(), bulk, echo, mbps: vec![], p50: vec![], p99: vec![], cps: vec![] }
    }
    pub fn record(&mut self, mbps: f64, rtt_us: &[f64], cps: f64) {
        self.mbps.push(mbps);
        self.p50.push(percentile(rtt_us, 0.5));
        self.p99.push(percentile(rtt_us, 0.99));
        self.cps.push(cps);
    }
}

/// The table, and the tunnel's ratios with PASS/MISS per target.
pub fn report(paths: &[Path]) {
    println!("\n| path (medians over runs) | MB/s | p50 µs | p99 µs | connections/s |");
    println!("|---|---|---|---|---|");
    for p in paths {
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} |",
            p.name,
            median(&p.mbps),
            median(&p.p50),
            median(&p.p99),
            median(&p.cps)
        );
    }
    let mark = |ok: bool| if ok { "PASS" } else { "MISS" };
    let (Some(direct), Some(tunnel)) = (paths.first(), paths.iter().find(|p| p.name.starts_with("tunnel"))) else {
        return;
    };
    // Throughput: per-run ratios (the same run's machine state), then their median. Latency:
    // what a path adds to the direct round trip, from the medians over runs (a single run's p99
    // on a shared machine is too noisy to subtract).
    let ratio = |a: &[f64], b: &[f64]| median(&a.iter().zip(b).map(|(x, y)| x / y).collect::<Vec<_>>());
    let added = |p: &Path| (median(&p.p50) - median(&direct.p50), median(&p.p99) - median(&direct.p99));
    let (t50, t99) = added(tunnel);
    println!("\ntunnel: added latency over direct p50 {t50:.0} µs, p99 {t99:.0} µs");
    for p in paths.iter().filter(|p| p.name.starts_with("OpenSSH")) {
        let r = ratio(&tunnel.mbps, &p.mbps);
        let (a50, a99) = added(p);
        let (l50, l99) = (t50 / a50, t99 / a99);
        println!("tunnel / {}: throughput {r:.2} (target >= 1.0: {})", p.name, mark(r >= 1.0));
        println!(
            "tunnel / {}: added latency p50 {l50:.2}, p99 {l99:.2} (OpenSSH adds {a50:.0} / {a99:.0} µs; target <= 1.2: {}); connections/s {:.2}",
            p.name,
            if a50 > 0.0 && a99 > 0.0 { mark(l50 <= 1.2 && l99 <= 1.2) } else { "n/a (noise)" },
            ratio(&tunnel.cps, &p.cps)
        );
    }
    for p in paths.iter().filter(|p| p.name.starts_with("plain relay")) {
        let r = ratio(&tunnel.mbps, &p.mbps);
        println!("tunnel / {}: throughput {r:.2} (target >= 0.5: {})", p.name, mark(r >= 0.5));
    }
}

// ---- peers ---------------------------------------------------------------------------------------

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

async fn wait_listening(port: u16, what: &str) -> anyhow::Result<()> {
    for _ in 0..100 {
        if TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("{what} is not listening on 127.0.0.1:{port} after 10 s")
}

fn spawn(cmd: &mut Command, log: &std::path::Path) -> anyhow::Result<Child> {
    let f = std::fs::File::create(log)?;
    Ok(cmd.stdin(Stdio::null()).stdout(f.try_clone()?).stderr(f).kill_on_drop(true).spawn()?)
}

/// sshd on a loopback port with a throwaway host key and authorized key, and one `ssh -N -L`
/// client per cipher forwarding a local port to each target.
pub struct Ssh {
    /// cipher → local ports, in the order of the targets.
    pub forwards: Vec<(String, Vec<u16>)>,
    _children: Vec<Child>,
    dir: PathBuf,
}

pub const SSH_CIPHERS: [&str; 2] = ["aes128-gcm@openssh.com", "chacha20-poly1305@openssh.com"];

impl Ssh {
    pub async fn start(targets: &[SocketAddr]) -> anyhow::Result<Ssh> {
        let dir = std::env::temp_dir().join(format!("skyport-bench-ssh-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        for key in ["host_key", "user_key"] {
            let ok = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(dir.join(key))
                .status()
                .await
                .context("ssh-keygen")?
                .success();
            if !ok {
                bail!("ssh-keygen failed");
            }
        }
        std::fs::copy(dir.join("user_key.pub"), dir.join("authorized_keys"))?;
        // sshd insists on its privilege-separation directory.
        std::fs::create_dir_all("/run/sshd")?;
        let port = free_port()?;
        let config = format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nAuthorizedKeysFile {d}/authorized_keys\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n\
             StrictModes no\nUsePAM no\nAllowTcpForwarding yes\nPermitRootLogin prohibit-password\n\
             PidFile {d}/sshd.pid\nLogLevel ERROR\n",
            d = dir.display()
        );
        std::fs::write(dir.join("sshd_config"), config)?;
        let mut children = vec![spawn(
            Command::new("/usr/sbin/sshd").arg("-D").arg("-e").arg("-f").arg(dir.join("sshd_config")),
            &dir.join("sshd.log"),
        )?];
        wait_listening(port, "sshd").await?;
        let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
        let mut forwards = vec![];
        for cipher in SSH_CIPHERS {
            let mut cmd = Command::new("ssh");
            cmd.args(["-N", "-T", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no"])
                .args(["-o", "UserKnownHostsFile=/dev/null", "-o", "ExitOnForwardFailure=yes", "-o", "LogLevel=ERROR"])
                .args(["-o", "Compression=no", "-o", &format!("Ciphers={cipher}"), "-p", &port.to_string()])
                .arg("-i")
                .arg(dir.join("user_key"));
            let mut ports = vec![];
            for t in targets {
                let p = free_port()?;
                cmd.args(["-L", &format!("127.0.0.1:{p}:{t}")]);
                ports.push(p);
            }
            cmd.arg(format!("{user}@127.0.0.1"));
            let short = cipher.split('@').next().unwrap_or(cipher);
            children.push(spawn(&mut cmd, &dir.join(format!("ssh-{short}.log")))?);
            for p in &ports {
                wait_listening(*p, &format!("ssh -L ({short})")).await?;
            }
            forwards.push((short.to_string(), ports));
        }
        Ok(Ssh { forwards, _children: children, dir })
    }
}

impl Drop for Ssh {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// socat relays (`fork` per connection), one per target.
pub struct Socat {
    pub ports: Vec<u16>,
    _children: Vec<Child>,
}

impl Socat {
    pub async fn start(targets: &[SocketAddr]) -> anyhow::Result<Socat> {
        let (mut ports, mut children) = (vec![], vec![]);
        for t in targets {
            let p = free_port()?;
            let log = std::env::temp_dir().join(format!("skyport-bench-socat-{p}.log"));
            children.push(spawn(
                Command::new("socat")
                    .arg(format!("TCP-LISTEN:{p},bind=127.0.0.1,reuseaddr,fork,nodelay"))
                    .arg(format!("TCP:{t},nodelay")),
                &log,
            )?);
            wait_listening(p, "socat").await?;
            ports.push(p);
        }
        Ok(Socat { ports, _children: children })
    }
}

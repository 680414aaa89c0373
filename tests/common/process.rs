//! The real operator binary (`skyport run`) as a child process, its output kept line by line so
//! a test can look for panics, secrets or the metrics address.

use std::process::Stdio;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Every line the process wrote to stdout or stderr, in arrival order per stream.
pub type Lines = Arc<Mutex<Vec<String>>>;

/// Starts `skyport run` with `args` and `env`, appending its output to `lines`. Killed on drop.
pub fn spawn_operator(args: &[&str], env: &[(&str, &str)], lines: &Lines) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_skyport"))
        .arg("run")
        .args(args)
        // As the cluster admin, whom no admission policy covers (tests/rbac/startup.rs covers that).
        .env("SKYPORT_ALLOW_WITHOUT_ADMISSION_POLICIES", "true")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start target/debug/skyport");
    capture_into(&mut child, lines);
    child
}

/// Appends the child's stdout and stderr lines to `lines` until the streams close.
pub fn capture_into(child: &mut Child, lines: &Lines) {
    let out = child.stdout.take().expect("stdout");
    let err = child.stderr.take().expect("stderr");
    for stream in [Box::new(out) as Box<dyn tokio::io::AsyncRead + Send + Unpin>, Box::new(err)] {
        let sink = lines.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stream).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                sink.lock().unwrap().push(line);
            }
        });
    }
}

/// How many lines report a panic.
pub fn panics(lines: &Lines) -> usize {
    lines.lock().unwrap().iter().filter(|l| l.contains("panicked")).count()
}

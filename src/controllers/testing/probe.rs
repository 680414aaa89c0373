//! A tunnel health check that answers as told, recording what it was asked.

use std::sync::Mutex;
use std::time::Duration;

use crate::controllers::tunnel::observe::Probe;

/// Answers every check with the current answer ([`FakeProbe::answer`]); records `ip:port`.
pub struct FakeProbe {
    answered: Mutex<bool>,
    reachable: Mutex<bool>,
    checked: Mutex<Vec<String>>,
    /// The timeout of every check, in order.
    timeouts: Mutex<Vec<Duration>>,
    /// Addresses whose checks fail whatever the answer.
    refused: Mutex<std::collections::BTreeSet<String>>,
    /// What a control port says unasked ([`FakeProbe::report`]).
    report: Mutex<Option<String>>,
}

impl FakeProbe {
    /// A probe whose checks pass (`true`) or fail as a refused connection would (`false`).
    pub fn answering(answered: bool) -> Self {
        FakeProbe {
            answered: Mutex::new(answered),
            reachable: Mutex::new(true),
            checked: Mutex::default(),
            timeouts: Mutex::default(),
            refused: Mutex::default(),
            report: Mutex::default(),
        }
    }

    /// What every control port says unasked: an install report, as a VM that refused the binary
    /// serves it; `None` (the default) for silence.
    pub fn report(&self, text: Option<&str>) {
        *self.report.lock().unwrap() = text.map(str::to_string);
    }

    /// Whether the exit server's control port accepts connections (by default it does).
    pub fn reach(&self, reachable: bool) {
        *self.reachable.lock().unwrap() = reachable;
    }

    /// Checks at `ip` fail (`true`) or answer as the others do (`false`).
    pub fn refuse(&self, ip: &str, refused: bool) {
        let mut set = self.refused.lock().unwrap();
        if refused {
            set.insert(ip.to_string())
        } else {
            set.remove(ip)
        };
    }

    pub fn answer(&self, answered: bool) {
        *self.answered.lock().unwrap() = answered;
    }

    /// Every `ip:port` checked, in order.
    pub fn checked(&self) -> Vec<String> {
        self.checked.lock().unwrap().clone()
    }

    /// The timeout each check was given, in order.
    pub fn timeouts(&self) -> Vec<Duration> {
        self.timeouts.lock().unwrap().clone()
    }
}

#[async_trait::async_trait]
impl Probe for FakeProbe {
    async fn check(&self, host_ip: &str, port: u16, token: &str, timeout: Duration) -> Result<(), String> {
        assert!(!token.is_empty(), "the probe is given the tunnel's token");
        self.checked.lock().unwrap().push(format!("{host_ip}:{port}"));
        self.timeouts.lock().unwrap().push(timeout);
        if *self.answered.lock().unwrap() && !self.refused.lock().unwrap().contains(host_ip) {
            Ok(())
        } else {
            Err(format!("cannot connect to {host_ip}:{port}: Connection refused (fake)"))
        }
    }

    async fn reachable(&self, _host_ip: &str, _port: u16) -> bool {
        *self.reachable.lock().unwrap()
    }

    async fn install_report(&self, _host_ip: &str, _port: u16) -> Option<String> {
        self.report.lock().unwrap().clone()
    }
}

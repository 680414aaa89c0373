//! The command line: how many Queues over how many accounts, how many replicas, and the windows.
//! `--help` prints [`USAGE`]; `--quick` changes only the defaults.

use std::time::Duration;

use anyhow::{anyhow, bail};

#[derive(Debug, Clone)]
pub(crate) struct Opts {
    pub(crate) quick: bool,
    pub(crate) queues: usize,
    pub(crate) accounts: usize,
    /// Replicas of the second arm (the first has one).
    pub(crate) replicas: usize,
    /// Queues deleted out of band per arm.
    pub(crate) drift_k: usize,
    /// Window over which steady-state SQS calls are counted.
    pub(crate) steady: Duration,
    /// Arguments for every `skyport run` beyond the benchmark's own.
    pub(crate) skyport_args: Vec<String>,
}

pub(crate) const USAGE: &str = "\
usage: cargo bench --bench replicas -- [--quick] [options]
  Queues spread over AwsAccounts (LocalStack accounts through assumed roles), each account's SQS
  behind a proxy enforcing SQS's tagging quota; one arm with 1 replica, one with R replicas
  (`skyport run --sharding`, separate processes). Per arm: time until all Ready, steady SQS calls
  per second per account, peak RSS per replica, drift (queues deleted out of band: time until
  recreated, p50/p99), takeover after one replica is killed (-9), steals and double writes
  (must be 0: the run fails otherwise).
  --quick               500 Queues, 4 accounts, 2 replicas (one killed), --drift-k 4, --steady 70s:
                        the CI shape (tests/run.sh; 2,000 does not fit its time on 2 loaded cores)
  --queues N            Queues in each arm (default 100000)
  --accounts A          AwsAccounts they are spread over, one shard each (default 10)
  --replicas R          replicas of the second arm (default 3; 1 runs the single arm only)
  --drift-k K           queues deleted out of band in each arm (default 20)
  --steady DURATION     window counting steady-state SQS calls (default 120s); shorter than the
                        resync (60s), it sees none of the resync's calls and reads about 0
  --skyport-arg ARG     passed to every `skyport run` (repeatable), e.g. --skyport-arg=--sqs-rate=100";

fn count(flag: &str, v: &str) -> anyhow::Result<usize> {
    v.replace(',', "").parse().map_err(|_| anyhow!("{flag} takes a whole number, not {v:?}"))
}

pub(crate) fn parse_args(args: &[String]) -> anyhow::Result<Opts> {
    let quick = args.iter().any(|a| a == "--quick");
    let mut o = Opts {
        quick,
        queues: if quick { 500 } else { 100_000 },
        accounts: if quick { 4 } else { 10 },
        replicas: if quick { 2 } else { 3 },
        drift_k: if quick { 4 } else { 20 },
        // Longer than the resync, so the window sees each Queue's periodic check at least once.
        steady: Duration::from_secs(if quick { 70 } else { 120 }),
        skyport_args: vec![],
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        let mut value = || inline.clone().or_else(|| it.next().cloned()).ok_or_else(|| anyhow!("{flag} needs a value"));
        match flag {
            "--quick" | "--bench" => {}
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            "--queues" => o.queues = count(flag, &value()?)?,
            "--accounts" => o.accounts = count(flag, &value()?)?,
            "--replicas" => o.replicas = count(flag, &value()?)?,
            "--drift-k" => o.drift_k = count(flag, &value()?)?,
            "--steady" => o.steady = humantime::parse_duration(&value()?)?,
            "--skyport-arg" => o.skyport_args.push(value()?),
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    if o.queues == 0 || o.accounts == 0 || o.replicas == 0 || o.accounts > 99 {
        bail!("--queues, --accounts (at most 99) and --replicas must be positive");
    }
    if o.drift_k > o.queues {
        bail!("--drift-k {} is more than --queues {}", o.drift_k, o.queues);
    }
    Ok(o)
}

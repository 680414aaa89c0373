//! The command line: which scenarios run, at what sizes, under which governor. `--help` prints
//! [`USAGE`]; `--quick` changes only the defaults.

use std::time::Duration;

use anyhow::{anyhow, bail};
use providers::SqsSettings;
use skyport::config::QueueArgs;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Governor {
    /// skyport's defaults (`--sqs-rate 48 --sqs-burst 48 --sqs-tag-rate 24`): what a user gets.
    Default,
    /// So high that it never waits: exposes the reconcile path itself.
    Open,
}

impl Governor {
    /// (rate, burst, tagging rate).
    pub(crate) fn settings(self) -> (u32, u32, u32) {
        match self {
            Governor::Default => {
                let d = SqsSettings::default();
                (d.rate_per_second.get(), d.burst.get(), d.tag_rate_per_second.get())
            }
            Governor::Open => (100_000, 100_000, 100_000),
        }
    }
    pub(crate) fn describe(self) -> String {
        let (rate, burst, tags) = self.settings();
        match self {
            Governor::Default => format!("default governor ({rate}/s, burst {burst}, tagging {tags}/s)"),
            Governor::Open => format!("open governor ({rate}/s, burst {burst}: never waits)"),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Opts {
    pub(crate) quick: bool,
    pub(crate) scenarios: Vec<String>,
    pub(crate) runs: usize,
    pub(crate) ready_n: Vec<usize>,
    pub(crate) governors: Vec<Governor>,
    pub(crate) concurrency: u16,
    pub(crate) steady_n: usize,
    pub(crate) resync: Duration,
    pub(crate) periods: u32,
    pub(crate) drift_k: usize,
    pub(crate) budget_window: Duration,
    pub(crate) memory_n: Vec<usize>,
    pub(crate) memory_rate: u32,
    /// `spec.configMap` of the memory scenario's Queues.
    pub(crate) memory_configmap: String,
    pub(crate) profile: bool,
}

const USAGE: &str = "\
usage: cargo bench --bench queues -- [--quick] [options]
  --quick               small N, one run (CI): same as --runs 1 --ready-n 10 --governor default
                        --steady-n 10 --resync 2s --periods 3 --drift-k 2 --memory-n 10,20
  --only LIST           scenarios to run, from ready,steady,drift,memory (default: all;
                        drift needs steady's Queues and runs inside it)
  --runs N              runs of each time-to-Ready comparison (default 3)
  --ready-n LIST        Queue counts for time to Ready (default 100,1000)
  --governor LIST       governor settings for time to Ready: default,open (default both)
  --concurrency N       reconciles in parallel, skyport and baseline alike (default 8, skyport's)
  --steady-n N          Ready Queues in the steady-state scenario (default 1000)
  --resync DURATION     resync of the steady-state and drift scenarios (default 10s)
  --periods N           resync periods observed in steady state (default 6)
  --drift-k N           Queues disturbed per drift kind (default 20)
  --budget-window DUR   observation window of the restart under the default governor (default 60s)
  --memory-n LIST       Queue counts for the memory scenario (default 1000,10000)
  --memory-rate N       --sqs-rate (and burst) of the measured operator process (default 500)
  --memory-configmap P  spec.configMap of the memory scenario's Queues: Write or Skip (default Write)
  --profile             print a latency profile (per API call kind) of both time-to-Ready arms";

fn parse_list<T: std::str::FromStr>(s: &str) -> anyhow::Result<Vec<T>> {
    s.split(',').map(|x| x.trim().parse::<T>().map_err(|_| anyhow!("bad list item {x:?} in {s:?}"))).collect()
}

pub(crate) fn parse_args(args: &[String]) -> anyhow::Result<Opts> {
    let quick = args.iter().any(|a| a == "--quick");
    let mut o = Opts {
        quick,
        scenarios: vec!["ready".into(), "steady".into(), "drift".into(), "memory".into()],
        runs: if quick { 1 } else { 3 },
        ready_n: if quick { vec![10] } else { vec![100, 1000] },
        governors: if quick { vec![Governor::Default] } else { vec![Governor::Default, Governor::Open] },
        concurrency: QueueArgs::default().concurrency,
        steady_n: if quick { 10 } else { 1000 },
        resync: Duration::from_secs(if quick { 2 } else { 10 }),
        periods: if quick { 3 } else { 6 },
        drift_k: if quick { 2 } else { 20 },
        budget_window: Duration::from_secs(if quick { 5 } else { 60 }),
        memory_n: if quick { vec![10, 20] } else { vec![1000, 10000] },
        memory_rate: 500,
        memory_configmap: "Write".into(),
        profile: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().ok_or_else(|| anyhow!("{a} needs a value"));
        match a.as_str() {
            "--quick" | "--bench" => {}
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            "--only" => o.scenarios = value()?.split(',').map(str::to_string).collect(),
            "--runs" => o.runs = value()?.parse()?,
            "--ready-n" => o.ready_n = parse_list(&value()?)?,
            "--governor" => {
                o.governors = value()?
                    .split(',')
                    .map(|g| match g {
                        "default" => Ok(Governor::Default),
                        "open" => Ok(Governor::Open),
                        other => Err(anyhow!("unknown governor {other:?} (default, open)")),
                    })
                    .collect::<anyhow::Result<_>>()?
            }
            "--concurrency" => o.concurrency = value()?.parse()?,
            "--steady-n" => o.steady_n = value()?.parse()?,
            "--resync" => o.resync = humantime::parse_duration(&value()?)?,
            "--periods" => o.periods = value()?.parse()?,
            "--drift-k" => o.drift_k = value()?.parse()?,
            "--budget-window" => o.budget_window = humantime::parse_duration(&value()?)?,
            "--memory-n" => o.memory_n = parse_list(&value()?)?,
            "--memory-rate" => o.memory_rate = value()?.parse()?,
            "--memory-configmap" => {
                o.memory_configmap = value()?;
                if !["Write", "Skip"].contains(&o.memory_configmap.as_str()) {
                    bail!("--memory-configmap takes Write or Skip, not {:?}", o.memory_configmap);
                }
            }
            "--profile" => o.profile = true,
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    for s in &o.scenarios {
        if !["ready", "steady", "drift", "memory"].contains(&s.as_str()) {
            bail!("unknown scenario {s:?}\n{USAGE}");
        }
    }
    if o.runs == 0 || o.periods == 0 || o.concurrency == 0 {
        bail!("--runs, --periods and --concurrency must be positive");
    }
    Ok(o)
}

//! The command line: Queue counts, which arms, the idle window, the tagging quota. `--help`
//! prints [`USAGE`]; `--quick` changes only the defaults.

use std::time::Duration;

use anyhow::{anyhow, bail};

const USAGE: &str = "\
usage: cargo bench --bench ack -- [--quick] [options]
  --quick            N = 10, 10 s idle window, every arm once (CI)
  --n LIST           Queue counts (default 100,1000)
  --arms LIST        from skyport,skyport-open,ack,ack-c,floor (default all; ack arms need
                     SKYPORT_ACK_SRC or SKYPORT_ACK)
                     skyport = skyport at its defaults (8 workers, SQS budget 48/s, tagging 24/s);
                     skyport-open = skyport with its SQS budgets open (LocalStack has no quota);
                     ack = ACK at its defaults (1 worker, 10 h resync);
                     ack-c = ACK at skyport's settings (8 workers, 60 s resync);
                     floor = the least a controller can do: finalizer patch, CreateQueue, status
                     patch per Queue, 8 workers, no budget, no ownership proof (a yardstick)
  --idle DURATION    idle window after all are Ready (default 120s: two of skyport's resyncs)
  --sqs-quota        both operators reach SQS through a proxy that enforces SQS's tagging quota
                     (30/s per account, RequestThrottled beyond), which LocalStack does not
  --skyport-arg ARG  extra argument for `skyport run` (repeatable), e.g. --skyport-arg=--sqs-rate=500";

/// Every arm, in the order they run.
const ARMS: &[&str] = &["skyport", "skyport-open", "ack", "ack-c", "floor"];

#[derive(Debug, Clone)]
pub(crate) struct Opts {
    pub(crate) quick: bool,
    pub(crate) n: Vec<usize>,
    pub(crate) arms: Vec<String>,
    pub(crate) idle: Duration,
    pub(crate) skyport_args: Vec<String>,
    pub(crate) sqs_quota: bool,
}

pub(crate) fn parse_args(args: &[String]) -> anyhow::Result<Opts> {
    let quick = args.iter().any(|a| a == "--quick");
    let mut o = Opts {
        quick,
        n: if quick { vec![10] } else { vec![100, 1000] },
        arms: ARMS.iter().map(|a| a.to_string()).collect(),
        idle: Duration::from_secs(if quick { 10 } else { 120 }),
        skyport_args: vec![],
        sqs_quota: false,
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
            "--n" => o.n = value()?.split(',').map(|x| x.trim().parse()).collect::<Result<_, _>>()?,
            "--arms" => o.arms = value()?.split(',').map(str::to_string).collect(),
            "--idle" => o.idle = humantime::parse_duration(&value()?)?,
            "--skyport-arg" => o.skyport_args.push(value()?),
            "--sqs-quota" => o.sqs_quota = true,
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    for a in &o.arms {
        if !ARMS.contains(&a.as_str()) {
            bail!("unknown arm {a:?}\n{USAGE}");
        }
    }
    Ok(o)
}

//! What the Queue benchmarks share: the entry point that keeps `cargo test --all-targets` from
//! running them and turns their verdict into an exit code.

use std::future::Future;
use std::process::ExitCode;

/// Runs `run` with the options `parse` makes of the arguments, under `cargo bench` only
/// (`--bench`, or `--quick` by hand): under `cargo test --all-targets` building is the check.
/// Exit code: 2 for bad arguments, 1 when the benchmark fails or finds something broken.
pub fn main<O, Fut>(name: &str, parse: fn(&[String]) -> anyhow::Result<O>, run: fn(O) -> Fut) -> ExitCode
where
    Fut: Future<Output = anyhow::Result<bool>>,
{
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench" || a == "--quick") {
        println!("{name} benchmark: not run under `cargo test`; run `cargo bench --bench {name} [-- --quick]`");
        return ExitCode::SUCCESS;
    }
    let opts = match parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e:#}");
            return ExitCode::from(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    match rt.block_on(run(opts)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("benchmark failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

//! What the Queue benchmarks share: the entry point that keeps `cargo test --all-targets` from
//! running them and turns their verdict into an exit code.

use std::future::Future;
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Instant;

/// When the benchmark started, for [`progress!`].
#[allow(dead_code)] // not every benchmark prints progress
pub static START: OnceLock<Instant> = OnceLock::new();

/// Progress on stderr (figures go to stdout), with the time since the start.
#[allow(unused_macros)] // not every benchmark prints progress
macro_rules! progress {
    ($($arg:tt)*) => {
        eprintln!(
            "[{:>7.1}s] {}",
            $crate::entry::START.get_or_init(std::time::Instant::now).elapsed().as_secs_f64(),
            format!($($arg)*)
        )
    };
}

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

/// The `skyport` binary the benchmark runs as a process: `SKYPORT_BENCH_EXE` when set (the static
/// musl binary the image ships, built with `tests/env/build-musl.sh`), else the one Cargo built
/// for this benchmark.
pub fn skyport_exe() -> std::path::PathBuf {
    crate::common::kubelet::skyport_exe()
}

/// Which [`skyport_exe`] runs, for the report: path, linking and size.
pub fn skyport_build() -> String {
    let exe = skyport_exe();
    let size = std::fs::metadata(&exe).map(|m| m.len()).unwrap_or(0);
    let linking = match has_interpreter(&exe) {
        Some(false) => "static, musl",
        Some(true) => "dynamic, glibc",
        None => "not an ELF file",
    };
    format!("{} ({linking}, {:.1} MiB)", exe.display(), size as f64 / (1024.0 * 1024.0))
}

/// Whether a 64-bit little-endian ELF file names a program interpreter (PT_INTERP): a dynamically
/// linked binary does, a static one does not.
fn has_interpreter(path: &std::path::Path) -> Option<bool> {
    use std::io::Read;
    let mut head = vec![0u8; 64 * 1024];
    let n = std::fs::File::open(path).ok()?.read(&mut head).ok()?;
    let head = &head[..n];
    if head.get(..4)? != b"\x7fELF" || head.get(4) != Some(&2) {
        return None;
    }
    let u16_at = |o: usize| Some(u16::from_le_bytes(head.get(o..o + 2)?.try_into().ok()?) as usize);
    let phoff = u64::from_le_bytes(head.get(0x20..0x28)?.try_into().ok()?) as usize;
    let (size, count) = (u16_at(0x36)?, u16_at(0x38)?);
    let types = (0..count).map(|i| head.get(phoff + i * size..phoff + i * size + 4));
    let types: Option<Vec<&[u8]>> = types.collect();
    Some(types?.iter().any(|t| u32::from_le_bytes([t[0], t[1], t[2], t[3]]) == 3))
}

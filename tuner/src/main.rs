//! The `fp4tune` command line: argument parsing, progress display and printing only. Each
//! subcommand lives in `cli/`.
//!
//! Standard output is written through [`write_stdout`] (the `outln!` and `out!` macros), never
//! `println!`, so a write error is an error and not a panic. Commands save their files before
//! they print a summary. A closed pipe (`fp4tune ... | head -1`) ends the command quietly with
//! exit status 141, what a shell reports for a program ended by SIGPIPE: the output was cut
//! short, though every file written before it is complete. Any other write error (a full disk)
//! is a one-line `error: writing to standard output: ...` and exit status 1.

/// `println!` that returns write errors as an `anyhow::Result<()>` instead of panicking.
macro_rules! outln {
    () => {
        $crate::write_stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` that returns write errors as an `anyhow::Result<()>` instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::write_stdout(format_args!($($arg)*))
    };
}

/// `eprintln!("warning: ...")` that ignores a closed standard error instead of panicking.
macro_rules! warnln {
    ($($arg:tt)*) => {
        $crate::warn_stderr(format_args!($($arg)*))
    };
}

mod cli;

use anyhow::Result;
use clap::{Parser, Subcommand};
use fp4tune::compile::Compiler;

#[derive(Parser, Debug)]
#[command(name = "fp4tune", version, about = "Autotune NVFP4 block-scaled GEMM kernels per GPU")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Compile every variant of a family's search space and print registers, spills, shared memory.
    Compile(cli::compile::CompileArgs),
    /// Benchmark the family's kernels on a shape set against floors and peers (needs a GPU).
    Bench(cli::bench::BenchArgs),
    /// Measure the device's physical floors: launch floor, read bandwidth, cold read floors, tensor peak.
    Floors(cli::floors::FloorsArgs),
    /// Tune: find the best kernel per (shape, token bucket) on this GPU and write its dispatch table.
    Tune(cli::tune::TuneArgs),
    /// Validate a dispatch table (schema, configurations, template hashes) and summarize it.
    Table(cli::table::TableArgs),
    /// Merge the logs of a sharded campaign (refuses other GPU models or template versions) and
    /// optionally write the dispatch table of the merged records.
    Merge(cli::merge::MergeArgs),
    /// Replay a measurement log to compare search strategies offline (regret vs evaluations).
    Simulate(cli::simulate::SimulateArgs),
    /// (internal) Measuring worker process driven by `fp4tune tune` over stdin/stdout.
    #[command(hide = true)]
    Worker,
    /// Print a shape set (RON) derived from a Hugging Face MoE config.json.
    Shapes(cli::shapes::ShapesArgs),
    /// CI gate: re-verify and re-time a table's kernels on this GPU against a baseline; exit 0 no
    /// regression, 1 regression, 2 cannot check (needs a GPU).
    Check(cli::check::CheckArgs),
    /// Render SVG figures from tables, measurement logs and bench CSVs (no GPU).
    Report(cli::report::ReportArgs),
    /// Self-test of this GPU: probe the tensor-core instruction of its kernel family, then run a
    /// table's kernels (or the representative ones) against the CPU reference; PASS/FAIL per
    /// check, exit 0 all pass, 1 a failure, 2 cannot run (no GPU: compile-only probes).
    Selftest(cli::selftest::SelftestArgs),
}

/// Exit status after standard output was closed by its reader (128 + SIGPIPE, as a shell
/// reports a program that SIGPIPE ended).
const EXIT_BROKEN_PIPE: u8 = 141;

/// A failed write to standard output. Only this error ends quietly on a closed pipe: a broken
/// pipe elsewhere (a tuning worker that died) stays an error.
#[derive(Debug)]
struct StdoutError(std::io::Error);

impl std::fmt::Display for StdoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The OS error is in the message and deliberately not a `source` (`{:#}` would repeat it).
        write!(f, "writing to standard output: {}", self.0)
    }
}

impl std::error::Error for StdoutError {}

/// Write `args` to standard output (locked, then flushed, so the error of this write is the one
/// returned). [`main`] ends quietly when the error is a closed pipe.
pub(crate) fn write_stdout(args: std::fmt::Arguments<'_>) -> Result<()> {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    stdout.write_fmt(args).and_then(|()| stdout.flush()).map_err(|e| StdoutError(e).into())
}

/// Print `warning: <args>` on standard error. A warning that cannot be written is dropped: it must
/// not end a command whose work is otherwise done.
pub(crate) fn warn_stderr(args: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "warning: {args}");
}

/// For commands whose exit status is their result (`check`, `selftest`): a standard output that
/// could not take their report (a full disk; not a closed pipe, which is the reader's choice) is
/// said on standard error, once, and the exit status stands.
pub(crate) fn note_lost_stdout(result: std::io::Result<()>) {
    static SAID: std::sync::Once = std::sync::Once::new();
    if let Err(e) = result.and_then(|()| {
        use std::io::Write as _;
        std::io::stdout().lock().flush()
    }) {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            SAID.call_once(|| {
                warn_stderr(format_args!(
                    "writing to standard output: {e}: the report lines are lost (the exit status \
                     and the files written stand)"
                ))
            });
        }
    }
}

/// Print the compiler's cache warning (a cubin cache folder it does not use or cannot write), each
/// distinct warning at most once per process however many compilers a command makes. Called when
/// the compiler is made and again after its compiles (a store can fail later, e.g. a full disk).
pub(crate) fn warn_cache(compiler: &Compiler) {
    static PRINTED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    if let Some(w) = compiler.cache_warning() {
        let mut printed = PRINTED.lock().unwrap_or_else(|p| p.into_inner());
        if !printed.iter().any(|p| p == w) {
            warn_stderr(format_args!("{w}"));
            printed.push(w.to_string());
        }
    }
}

/// A compiler with the default cache folder; its cache warning printed once.
pub(crate) fn default_compiler() -> Result<Compiler> {
    let compiler = Compiler::with_default_cache()?;
    warn_cache(&compiler);
    Ok(compiler)
}

/// Whether `e` comes from writing to standard output after its reader went away (`| head`).
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<StdoutError>()
            .is_some_and(|s| s.0.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Parse the command line. Help and version print as clap writes them (a standard output that
/// cannot take them, e.g. a full disk, is an error and exit status 1; a closed pipe ends quietly
/// like any other output); a usage error (an unknown argument, an invalid value) is one line on
/// standard error, its parts joined, and exit status 2.
fn parse() -> Result<Cli, std::process::ExitCode> {
    use clap::error::ErrorKind;
    match Cli::try_parse() {
        Ok(cli) => Ok(cli),
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) =>
        {
            use std::io::Write as _;
            let printed = e.print().and_then(|()| std::io::stdout().lock().flush());
            match printed {
                Ok(()) => Err(std::process::ExitCode::from(e.exit_code() as u8)),
                Err(w) if w.kind() == std::io::ErrorKind::BrokenPipe => {
                    Err(std::process::ExitCode::from(EXIT_BROKEN_PIPE))
                }
                Err(w) => {
                    let _ = writeln!(
                        std::io::stderr().lock(),
                        "error: writing to standard output: {w}"
                    );
                    Err(std::process::ExitCode::FAILURE)
                }
            }
        }
        Err(e) => {
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr().lock(), "{}", one_line(&e.render().to_string()));
            Err(std::process::ExitCode::from(2))
        }
    }
}

/// clap's rendering of a usage error on one line: its non-empty lines trimmed and joined with
/// "; " (a space after a line that ends in ':'), without the closing pointer to `--help`.
fn one_line(rendered: &str) -> String {
    let mut out = String::new();
    for l in rendered.lines().map(str::trim) {
        if l.is_empty() || l.starts_with("For more information") {
            continue;
        }
        if !out.is_empty() {
            out.push_str(if out.ends_with(':') { " " } else { "; " });
        }
        out.push_str(l);
    }
    out
}

fn main() -> std::process::ExitCode {
    let cli = match parse() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => std::process::ExitCode::from(EXIT_BROKEN_PIPE),
        Err(e) => {
            // `{:#}` prints the whole context chain on one line; no backtrace noise for users.
            use std::io::Write as _;
            // one line, also when a path or a file's text holds a line break or an escape
            let message: String = format!("{e:#}")
                .chars()
                .map(|c| if c.is_control() { c.escape_default().to_string() } else { c.into() })
                .collect();
            let _ = writeln!(std::io::stderr().lock(), "error: {message}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Compile(args) => cli::compile::run(args),
        Command::Bench(args) => cli::bench::run(args),
        Command::Floors(args) => cli::floors::run(args),
        Command::Tune(args) => cli::tune::run(args),
        Command::Table(args) => cli::table::run(args),
        Command::Merge(args) => cli::merge::run(args),
        Command::Simulate(args) => cli::simulate::run(args),
        Command::Worker => {
            let compiler = Compiler::with_default_cache()?;
            fp4tune::tune::worker::serve(&compiler)
        }
        Command::Shapes(args) => cli::shapes::run(args),
        Command::Check(args) => cli::check::run(args),
        Command::Report(args) => cli::report::run(args),
        Command::Selftest(args) => cli::selftest::run(args),
    }
}

//! The `fp4tune` command line: argument parsing, progress display and printing only. Each
//! subcommand lives in `cli/`.

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
}

fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}` prints the whole context chain on one line; no backtrace noise for users.
            eprintln!("error: {e:#}");
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
    }
}

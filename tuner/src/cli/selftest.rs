//! `fp4tune selftest`: is this GPU running fp4tune's kernels right? Probes the tensor-core
//! instruction of the GPU's kernel family against the CPU model of its fragments, then runs every
//! kernel of a dispatch table (`--table`; without one, the family's representative kernels)
//! against the CPU reference (`fp4tune::selftest`). One PASS, FAIL or SKIP line per check on
//! standard output as it completes; exit 0 when every check passed, 1 when one failed, 2 when the
//! self-test cannot run (no GPU, no NVRTC, no kernel family for the GPU, an unreadable table),
//! with the one-line reason on standard error. Without a GPU both probes are still compiled and
//! their SASS read (compile-only PASS lines) before the exit 2. It exits itself, whatever happens.

use anyhow::Result;
use fp4tune::selftest::{self, Exit, Options};
use fp4tune::table::Table;
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct SelftestArgs {
    /// A dispatch table whose kernels to run (results/<sku>.ron); without it, the family's
    /// representative kernels on two GLM-5 problems.
    #[arg(long)]
    pub table: Option<PathBuf>,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
}

pub fn run(args: SelftestArgs) -> Result<()> {
    let exit = selftest(&args);
    // The exit status is the result: a closed standard output or error (`| head`) must not turn
    // it into a panic, so write errors are ignored here.
    let _ =
        writeln!(std::io::stderr().lock(), "fp4tune selftest: exit {}: {}", exit.code, exit.reason);
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    std::process::exit(exit.code.into())
}

fn selftest(a: &SelftestArgs) -> Exit {
    let table = match &a.table {
        None => None,
        Some(p) => match Table::load(p) {
            Ok(t) => Some((t, p.display().to_string())),
            Err(e) => return selftest::cannot_start(&e.to_string()),
        },
    };
    let compiler = match fp4tune::compile::Compiler::with_default_cache() {
        Ok(c) => c,
        Err(e) => return selftest::cannot_start(&e.to_string()),
    };
    crate::warn_cache(&compiler);
    let opts = Options { device: a.device, table: table.as_ref().map(|(t, o)| (t, o.as_str())) };
    let report = selftest::run(&compiler, &opts, &mut |c| {
        crate::note_lost_stdout(writeln!(std::io::stdout().lock(), "{}", c.line()));
    });
    selftest::exit_status(&report)
}

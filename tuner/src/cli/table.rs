//! `fp4tune table --check`: validate and summarize a dispatch table.

use anyhow::Result;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct TableArgs {
    /// The table to check (results/<sku>.ron).
    #[arg(long)]
    pub check: PathBuf,
    /// Also check it against this CUDA device (compute capability, template hashes).
    #[arg(long)]
    pub device: Option<usize>,
}

pub fn run(args: TableArgs) -> Result<()> {
    let TableArgs { check: path, device } = args;
    let table = fp4tune::table::Table::load(&path)?;
    out!("{}", fp4tune::table::summary(&table))?;
    if let Some(ordinal) = device {
        let gpu = fp4tune::gpu::Gpu::open(ordinal)?;
        let report = table.check_against(
            gpu.info(),
            fp4tune::table::MismatchPolicy::Warn,
            &path.display().to_string(),
        )?;
        for w in report.warnings() {
            warnln!("{w}");
        }
    }
    outln!("{}: ok", path.display())
}

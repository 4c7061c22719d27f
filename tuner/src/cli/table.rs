//! `fp4tune table --check`: validate and summarize a dispatch table.

use anyhow::Result;
use fp4tune::table::{MismatchPolicy, Table};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct TableArgs {
    /// The table to check (results/<sku>.ron): schema, configurations, and its template hashes
    /// against this build's kernel sources (no GPU needed).
    #[arg(long)]
    pub check: PathBuf,
    /// Also check it against this CUDA device (compute capability, name, SM count).
    #[arg(long)]
    pub device: Option<usize>,
    /// Any mismatch (a stale, foreign or empty template hash; with --device, another device) is
    /// an error instead of a warning.
    #[arg(long)]
    pub strict: bool,
}

pub fn run(args: TableArgs) -> Result<()> {
    let TableArgs { check: path, device, strict } = args;
    let policy = if strict { MismatchPolicy::Error } else { MismatchPolicy::Warn };
    let (table, check) = Table::check_file(&path, policy)?;
    let mut warnings = check.warnings();
    if let Some(ordinal) = device {
        let gpu = fp4tune::gpu::Gpu::open(ordinal)?;
        let report = table.check_against(gpu.info(), policy, &path.display().to_string())?;
        // The template hashes were compared already: each mismatch is said once.
        for w in report.warnings() {
            if !warnings.contains(&w) {
                warnings.push(w);
            }
        }
    }
    for w in &warnings {
        warnln!("{}: {w}", path.display());
    }
    out!("{}", fp4tune::table::summary(&table))?;
    match warnings.len() {
        0 => outln!("{}: ok", path.display()),
        n => outln!("{}: ok, {n} warning{}", path.display(), if n == 1 { "" } else { "s" }),
    }
}

//! `fp4tune simulate`: replay a measurement log to compare search strategies offline.

use anyhow::{bail, Result};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct SimulateArgs {
    #[arg(long)]
    pub log: PathBuf,
    /// Strategies: exhaustive, random, model (comma separated).
    #[arg(long, default_value = "model,random", value_delimiter = ',')]
    pub strategy: Vec<String>,
    /// Evaluation budget per key as a fraction of the logged candidates.
    #[arg(long, default_value_t = 1.0)]
    pub budget: f64,
}

pub fn run(args: SimulateArgs) -> Result<()> {
    let SimulateArgs { log, strategy: strategies, budget } = args;
    use fp4tune::search::{Budget, StrategyKind};
    use fp4tune::tune::replay::{simulate_kind, Candidates};
    let records = fp4tune::tune::log::read(&log)?;
    if records.is_empty() {
        bail!("{}: no records", log.display());
    }
    for name in strategies {
        let kind = StrategyKind::parse(&name)?;
        let report = simulate_kind(&records, &kind, Candidates::Logged, &Budget::fraction(budget));
        outln!("## {name}\n\n{}", report.to_markdown())?;
    }
    Ok(())
}

//! `fp4tune simulate`: replay a measurement log to compare search strategies offline.

use anyhow::Result;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct SimulateArgs {
    #[arg(long)]
    pub log: PathBuf,
    /// Strategies: exhaustive, random, model (comma separated).
    #[arg(long, default_value = "model,random", value_delimiter = ',')]
    pub strategy: Vec<String>,
    /// Evaluation budget per key as a fraction of the logged candidates, in (0, 1].
    #[arg(long, default_value_t = 1.0)]
    pub budget: f64,
}

pub fn run(args: SimulateArgs) -> Result<()> {
    let SimulateArgs { log, strategy: strategies, budget } = args;
    use fp4tune::search::StrategyKind;
    use fp4tune::tune::replay::{budget_fraction, load_log, simulate_kind, Candidates};
    // Arguments first: a meaningless budget is refused before the log is read.
    let budget = budget_fraction(budget)?;
    let kinds = strategies
        .iter()
        .map(|name| Ok((name, StrategyKind::parse(name)?)))
        .collect::<Result<Vec<_>>>()?;
    // One GPU model, one template version per family, every record plausible; named by line.
    let contents = load_log(&log)?;
    if let Some(torn) = &contents.torn_tail {
        warnln!("{torn}");
    }
    for (name, kind) in kinds {
        let report = simulate_kind(&contents.records, &kind, Candidates::Logged, &budget);
        outln!("## {name}\n\n{}", report.to_markdown())?;
    }
    Ok(())
}

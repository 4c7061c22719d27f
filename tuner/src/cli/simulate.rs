//! `fp4tune simulate`: replay a measurement log to compare search strategies offline.

use anyhow::Result;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct SimulateArgs {
    #[arg(long)]
    pub log: PathBuf,
    /// Strategies: exhaustive, random, model, race (comma separated). `race` replays the
    /// campaign's default racing search with its shipped options (the budget does not apply).
    #[arg(long, default_value = "model,random", value_delimiter = ',')]
    pub strategy: Vec<String>,
    /// Evaluation budget per key as a fraction of the logged candidates, in (0, 1].
    #[arg(long, default_value_t = 1.0)]
    pub budget: f64,
    /// Racing: pool size as a fraction of each key's legal configurations (default: the
    /// campaign's).
    #[arg(long)]
    pub pool_fraction: Option<f64>,
    /// Racing: finalists per key (default: the campaign's).
    #[arg(long)]
    pub finalists: Option<usize>,
    /// Racing: fastest screened configurations carried to the next bucket (default: the
    /// campaign's).
    #[arg(long)]
    pub carry: Option<usize>,
    /// Racing: refinement rounds explore around this many fastest screened configurations
    /// (default: the campaign's).
    #[arg(long)]
    pub refine_top: Option<usize>,
}

pub fn run(args: SimulateArgs) -> Result<()> {
    let SimulateArgs {
        log,
        strategy: strategies,
        budget,
        pool_fraction,
        finalists,
        carry,
        refine_top,
    } = args;
    let mut opts = fp4tune::tune::race::RaceOptions::default();
    if let Some(f) = pool_fraction {
        if !(f > 0.0 && f <= 1.0) {
            anyhow::bail!("--pool-fraction {f}: expected a fraction in (0, 1]");
        }
        opts.pool_fraction = f;
    }
    if let Some(n) = finalists {
        if n == 0 {
            anyhow::bail!("--finalists 0: at least one finalist is needed");
        }
        opts.finalists = n;
    }
    if let Some(n) = carry {
        opts.carry = n;
    }
    if let Some(n) = refine_top {
        opts.refine_top = n;
    }
    use fp4tune::search::StrategyKind;
    use fp4tune::tune::replay::{budget_fraction, load_log, simulate_kind, Candidates};
    // Arguments first: a meaningless budget is refused before the log is read.
    let budget = budget_fraction(budget)?;
    let race = strategies.iter().any(|s| s == "race");
    let kinds = strategies
        .iter()
        .filter(|s| *s != "race")
        .map(|name| {
            let kind = StrategyKind::parse(name).map_err(|_| {
                anyhow::anyhow!(
                    "unknown strategy {name:?} (expected race, exhaustive, random or model)"
                )
            })?;
            Ok((name, kind))
        })
        .collect::<Result<Vec<_>>>()?;
    // One GPU model, one template version per family, every record plausible; named by line.
    let contents = load_log(&log)?;
    if let Some(torn) = &contents.torn_tail {
        warnln!("{torn}");
    }
    if race {
        let report = fp4tune::tune::race_replay::replay(&contents.records, &opts);
        outln!("{}", report.to_markdown())?;
    }
    for (name, kind) in kinds {
        let report = simulate_kind(&contents.records, &kind, Candidates::Logged, &budget);
        outln!("## {name}\n\n{}", report.to_markdown())?;
    }
    Ok(())
}

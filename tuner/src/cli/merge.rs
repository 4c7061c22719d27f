//! `fp4tune merge`: merge the logs of a sharded campaign, optionally into a dispatch table.

use anyhow::Result;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct MergeArgs {
    /// Logs to merge (one per shard).
    #[arg(required = true)]
    pub logs: Vec<PathBuf>,
    /// The merged log.
    #[arg(long)]
    pub out: PathBuf,
    /// Also write the dispatch table here (e.g. results/nvidia-h200.ron).
    #[arg(long)]
    pub table: Option<PathBuf>,
}

pub fn run(args: MergeArgs) -> Result<()> {
    let MergeArgs { logs, out, table } = args;
    use fp4tune::tune::select::SelectRules;
    let merged = fp4tune::tune::merge::merge_logs(&logs)?;
    for w in &merged.warnings {
        warnln!("{w}");
    }
    let records = merged.records;
    // Every file is written before anything is printed: a closed standard output (`| head`)
    // must not lose the table.
    fp4tune::tune::merge::write(&out, &records)?;
    let selection = match &table {
        Some(path) => {
            let (t, sel) = fp4tune::tune::emit::dispatch_table(&records, &SelectRules::default())?;
            t.save(path)?;
            Some((path, sel))
        }
        None => None,
    };
    outln!("merged {} logs into {} ({} records)", logs.len(), out.display(), records.len())?;
    if let Some((path, sel)) = selection {
        super::tune::print_selection(&records, &sel)?;
        outln!("wrote the dispatch table {}", path.display())?;
    }
    Ok(())
}

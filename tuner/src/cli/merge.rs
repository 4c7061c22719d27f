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
    let records = fp4tune::tune::merge::merge(&logs)?;
    fp4tune::tune::merge::write(&out, &records)?;
    println!("merged {} logs into {} ({} records)", logs.len(), out.display(), records.len());
    if let Some(path) = table {
        let (t, sel) = fp4tune::tune::emit::dispatch_table(&records, &SelectRules::default())?;
        super::tune::print_selection(&records, &sel);
        t.save(&path)?;
        println!("wrote the dispatch table {}", path.display());
    }
    Ok(())
}

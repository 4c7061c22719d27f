//! `fp4tune merge`: merge the logs of a sharded campaign, optionally into a dispatch table.

use anyhow::{bail, Context, Result};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct MergeArgs {
    /// Logs to merge (one per shard), or folders: a folder stands for the shard logs in it
    /// (`*.shard-i-of-n.jsonl`, written by `tune --shard`).
    #[arg(required = true)]
    pub logs: Vec<PathBuf>,
    /// The merged log.
    #[arg(long)]
    pub out: PathBuf,
    /// Also write the dispatch table here (e.g. results/nvidia-h200.ron).
    #[arg(long)]
    pub table: Option<PathBuf>,
    /// Merge even when shards are missing or unfinished (they are named either way).
    #[arg(long)]
    pub partial: bool,
}

/// The logs named, folders replaced by the shard logs in them (sorted).
fn expand(inputs: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in inputs {
        if !p.is_dir() {
            // named before the shard check, which would see a misspelled shard log as one
            // without its manifest
            if !p.exists() {
                bail!("{}: no such file", p.display());
            }
            out.push(p.clone());
            continue;
        }
        let mut found: Vec<PathBuf> = std::fs::read_dir(p)
            .with_context(|| format!("reading the folder {}", p.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|f| {
                let name =
                    f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                (name.ends_with(".jsonl") || name.ends_with(".jsonl.gz"))
                    && fp4tune::tune::shard::Shard::of_file_name(&name).is_some()
            })
            .collect();
        if found.is_empty() {
            bail!("{}: no shard logs (*.shard-i-of-n.jsonl) in this folder", p.display());
        }
        found.sort();
        out.extend(found);
    }
    Ok(out)
}

pub fn run(args: MergeArgs) -> Result<()> {
    let MergeArgs { logs, out, table, partial } = args;
    use fp4tune::tune::select::SelectRules;
    let logs = expand(&logs)?;
    // The outputs must not land on each other nor on a log being merged (the log would be lost).
    // (its errors name the path they came from)
    let same = |a: &std::path::Path, b: &std::path::Path| fp4tune::fsio::same_file(a, b);
    if let Some(t) = &table {
        if same(&out, t)? {
            bail!("--out {} and --table {} are the same file", out.display(), t.display());
        }
    }
    // `inputs`: (path, how the error names it)
    let refuse_inputs = |inputs: &[(PathBuf, String)]| -> Result<()> {
        let outputs = std::iter::once(("--out", &out)).chain(table.iter().map(|t| ("--table", t)));
        for (flag, path) in outputs {
            for (input, what) in inputs {
                if same(path, input)? {
                    bail!("{flag} {} is {what}: write the result to another file", path.display());
                }
            }
        }
        Ok(())
    };
    let merged_logs: Vec<(PathBuf, String)> =
        logs.iter().map(|l| (l.clone(), format!("the log {} being merged", l.display()))).collect();
    refuse_inputs(&merged_logs)?;
    let shards = fp4tune::tune::merge::check_shards(&logs)?;
    // Nor on a shard's manifest or on the partial table a manifest names (inputs too).
    let partial_tables = partial_tables(&logs, &shards);
    let manifests = logs.iter().filter_map(|l| {
        let name = l.file_name()?.to_string_lossy().into_owned();
        fp4tune::tune::shard::Shard::of_file_name(&name)
            .map(|_| fp4tune::tune::shard::Manifest::path_of_log(l))
    });
    let shard_inputs: Vec<(PathBuf, String)> = manifests
        .chain(partial_tables.iter().map(|(_, p)| p.clone()))
        .map(|p| {
            let what = format!("{}, an input of the merge", p.display());
            (p, what)
        })
        .collect();
    refuse_inputs(&shard_inputs)?;
    // at most 16 shard numbers, then how many more
    let list = |v: &[u32]| {
        let shown: Vec<String> = v.iter().take(16).map(|i| i.to_string()).collect();
        match v.len() {
            n if n > 16 => format!("{} and {} more", shown.join(", "), n - 16),
            _ => shown.join(", "),
        }
    };
    if !shards.missing.is_empty()
        || !shards.unfinished.is_empty()
        || !shards.without_manifest.is_empty()
    {
        let mut why = Vec::new();
        if !shards.missing.is_empty() {
            why.push(format!("shards {} of {} are missing", list(&shards.missing), shards.count));
        }
        if !shards.unfinished.is_empty() {
            why.push(format!("shards {} did not finish", list(&shards.unfinished)));
        }
        if !shards.without_manifest.is_empty() {
            why.push(format!(
                "shards {} have no manifest next to their log (whether they finished cannot be told)",
                list(&shards.without_manifest)
            ));
        }
        if !partial {
            bail!("{}: run them (a shard resumes its log) or pass --partial", why.join("; "));
        }
        warnln!("{} (merging anyway: --partial)", why.join("; "));
        if table.is_some() && shards.without_manifest.contains(&0) {
            warnln!(
                "shard 0 has no manifest: its partial table, which holds the grouped MoE entries, \
                 is not looked up (the merged table has none)"
            );
        }
    }
    let merged = fp4tune::tune::merge::merge_logs(&logs)?;
    for w in &merged.warnings {
        warnln!("{w}");
    }
    let records = merged.records;
    // The table is built and checked before any file is written: records that make no valid
    // table leave the existing log and table as they were. Every file is written before
    // anything is printed: a closed standard output (`| head`) must not lose the table.
    let selection = match &table {
        Some(path) => {
            let (mut t, sel) =
                fp4tune::tune::emit::dispatch_table(&records, &SelectRules::default())?;
            // The grouped MoE entries of a sharded campaign are in shard 0's partial table, of
            // the merged records' GPU and templates.
            for (_, part) in partial_tables.iter().filter(|(index, _)| *index == 0) {
                if !part.exists() {
                    warnln!(
                        "{}: shard 0's partial table, which holds the campaign's grouped MoE \
                         entries if it tuned any, is missing: the merged table has none",
                        part.display()
                    );
                    continue;
                }
                let p = fp4tune::table::Table::load(part)?;
                if p.device.name != t.device.name
                    || p.device.compute_capability != t.device.compute_capability
                {
                    bail!(
                        "{}: a table of {} ({}.{}), not of the merged records' {} ({}.{}): \
                         shard 0 of another campaign? re-run shard 0, or remove the file to \
                         merge without grouped entries",
                        part.display(),
                        p.device.name,
                        p.device.compute_capability.0,
                        p.device.compute_capability.1,
                        t.device.name,
                        t.device.compute_capability.0,
                        t.device.compute_capability.1
                    );
                }
                if p.template_hashes != t.template_hashes {
                    bail!(
                        "{}: its GEMM template hashes are not the merged records': a table of \
                         another build or campaign; re-run shard 0, or remove the file to merge \
                         without grouped entries",
                        part.display()
                    );
                }
                if !p.moe.is_empty() && t.moe.is_empty() {
                    t.moe = p.moe;
                    t.moe_template_hash = p.moe_template_hash;
                }
            }
            let inputs = logs.iter().map(|l| l.display().to_string()).collect::<Vec<_>>();
            t.validate(&format!("the table merged from {}", inputs.join(", ")))?;
            Some((path, t, sel))
        }
        None => None,
    };
    // The log and the table are replaced together or not at all.
    let log_bytes = fp4tune::tune::merge::encode(&out, &records)?;
    let table_text = selection.as_ref().map(|(_, t, _)| t.to_ron_string());
    let mut files: Vec<(&std::path::Path, &[u8])> = vec![(&out, &log_bytes)];
    if let (Some((path, _, _)), Some(text)) = (&selection, &table_text) {
        files.push((path, text.as_bytes()));
    }
    for (path, _) in &files {
        fp4tune::fsio::create_parent_dir(path)
            .with_context(|| format!("creating the folder of {}", path.display()))?;
    }
    fp4tune::fsio::write_atomic_all(&files).context("writing the merged log and table")?;
    let selection = selection.map(|(path, _, sel)| (path, sel));
    outln!("merged {} logs into {} ({} records)", logs.len(), out.display(), records.len())?;
    if shards.count > 0 && !shards.present.is_empty() {
        outln!(
            "shards {} of {}",
            list(&shards.present.iter().map(|m| m.shard.index).collect::<Vec<_>>()),
            shards.count
        )?;
    }
    if let Some((path, sel)) = selection {
        super::tune::print_selection(&records, &sel)?;
        outln!("wrote the dispatch table {}", path.display())?;
    }
    Ok(())
}

/// (shard index, path) of the partial table each present shard's manifest names, next to the
/// shard's log.
fn partial_tables(
    logs: &[PathBuf],
    shards: &fp4tune::tune::merge::ShardReport,
) -> Vec<(u32, PathBuf)> {
    shards
        .present
        .iter()
        .filter_map(|m| {
            let dir = logs.iter().find_map(|l| {
                let name = l.file_name()?.to_string_lossy().into_owned();
                (fp4tune::tune::shard::Shard::of_file_name(&name) == Some(m.shard))
                    .then(|| l.parent().map(|p| p.to_path_buf()))
                    .flatten()
            })?;
            Some((m.shard.index, dir.join(&m.table)))
        })
        .collect()
}

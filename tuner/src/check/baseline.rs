//! Where a check's old times come from, per table key.
//!
//! - the dispatch table itself (the default): each entry's median and 95% interval, with `n` read
//!   from the table's timing policy ("11 samples per candidate"), as a
//!   [`Baseline::Summary`] (see `check::rule` for how it is compared);
//! - a saved check result (`*.json`, written by `fp4tune check`): every entry's samples;
//! - a measurement log (`*.jsonl`, `*.jsonl.gz`): the samples of the latest timed record of each
//!   entry's key, method and configuration;
//! - another dispatch table (`*.ron`): its entries' summaries, by key.
//!
//! Baselines are matched to the checked table by key only: a re-tuned entry (another kernel, or
//! the dequantize-then-cuBLAS method) is compared with what served the key before, which is what
//! a CI gate on serving time wants.
//!
//! Grouped MoE entries have baselines of their own, by grouped key: from a table (its `moe`
//! entries' medians and intervals, `n` from the same timing-policy line: the table records no
//! other, so a grouped phase timed with more samples is compared as if it had fewer, which only
//! widens the interval) or a saved check (their samples). A measurement log holds GEMM records
//! only: with a log, the grouped entries are compared with the checked table's own times.

use super::report::CheckReport;
use super::rule::{Baseline, SummaryBaseline};
use crate::table::{MoeKey, Table, TableKey};
use crate::tune::log::{Outcome, Record};
use std::collections::BTreeMap;
use std::path::Path;

/// Samples per candidate assumed when a table's timing policy does not say (the tuner's
/// `TimingPolicy::quick()`).
pub const ASSUMED_SAMPLES: usize = 11;

/// The baseline of every key that has one.
#[derive(Debug, Clone, PartialEq)]
pub struct Baselines {
    /// What the baseline is, in words (for the report).
    pub description: String,
    pub by_key: BTreeMap<TableKey, Baseline>,
    /// The grouped MoE entries' baselines.
    pub by_moe_key: BTreeMap<MoeKey, Baseline>,
    /// The GPU model the baseline was measured on, when the source says so.
    pub device: Option<String>,
    /// Assumptions made while reading it.
    pub notes: Vec<String>,
}

impl Baselines {
    pub fn get(&self, key: &TableKey) -> Option<&Baseline> {
        self.by_key.get(key)
    }

    pub fn get_moe(&self, key: &MoeKey) -> Option<&Baseline> {
        self.by_moe_key.get(key)
    }
}

/// Most samples per candidate a timing policy may state (a baseline is expanded into that many
/// pseudo-samples).
pub const MAX_POLICY_SAMPLES: usize = 10_000;

/// The sample count a timing-policy line states ("..., 11 samples per candidate, ..."), when it
/// is 1 to [`MAX_POLICY_SAMPLES`].
pub fn samples_per_candidate(policy: &str) -> Option<usize> {
    let words: Vec<&str> = policy.split_whitespace().collect();
    words.windows(3).find_map(|w| {
        (w[1] == "samples" && w[2].trim_end_matches(',') == "per")
            .then(|| w[0].parse::<usize>().ok())
            .flatten()
            .filter(|n| (1..=MAX_POLICY_SAMPLES).contains(n))
    })
}

/// The table's own entries as summary baselines.
pub fn from_table(table: &Table, origin: &str) -> Baselines {
    let mut notes = Vec::new();
    let n = samples_per_candidate(&table.timing_policy).unwrap_or_else(|| {
        notes.push(format!(
            "{origin}: the timing policy does not state its samples per candidate (1 to {MAX_POLICY_SAMPLES}); {ASSUMED_SAMPLES} assumed"
        ));
        ASSUMED_SAMPLES
    });
    let by_key = table
        .entries
        .iter()
        .map(|e| {
            let (lo, hi) = e.interval_us;
            (e.key.clone(), Baseline::Summary(SummaryBaseline { median: e.median_us, lo, hi, n }))
        })
        .collect();
    Baselines {
        description: format!(
            "`{origin}`: each entry's recorded median and 95% interval over {n} samples \
             (expanded into {n} pseudo-samples)"
        ),
        by_key,
        by_moe_key: moe_from_table(table, n),
        device: Some(table.device.name.clone()),
        notes,
    }
}

/// The grouped entries of `table` as summary baselines of `n` samples.
fn moe_from_table(table: &Table, n: usize) -> BTreeMap<MoeKey, Baseline> {
    table
        .moe
        .iter()
        .map(|e| {
            let (lo, hi) = e.interval_us;
            (e.key, Baseline::Summary(SummaryBaseline { median: e.median_us, lo, hi, n }))
        })
        .collect()
}

/// A saved check result's samples.
pub fn from_check(report: &CheckReport, origin: &str) -> Baselines {
    let by_key =
        report.entries.iter().filter_map(|e| e.as_baseline().map(|b| (e.key.clone(), b))).collect();
    let by_moe_key =
        report.grouped.iter().filter_map(|g| g.as_baseline().map(|b| (g.key, b))).collect();
    Baselines {
        description: format!("`{origin}`: the samples of a saved check ({})", report.date),
        by_key,
        by_moe_key,
        device: report.device.as_ref().map(|d| d.name.clone()),
        notes: Vec::new(),
    }
}

/// The samples a measurement log holds for the table's entries (latest timed record of each
/// entry's key, method and configuration; for the dequantize-then-cuBLAS method, the record
/// naming the entry's fallback).
pub fn from_log(records: &[Record], table: &Table, origin: &str) -> Baselines {
    let mut by_key = BTreeMap::new();
    let mut device = None;
    for e in &table.entries {
        let latest = records
            .iter()
            .filter(|r| r.key == e.key && r.method == e.method && r.config == e.config)
            .filter_map(|r| match &r.outcome {
                Outcome::Timed { samples, .. } if !samples.is_empty() => Some((r, samples)),
                _ => None,
            })
            .max_by_key(|(r, _)| r.at);
        if let Some((r, samples)) = latest {
            device.get_or_insert_with(|| r.device.clone());
            by_key.insert(e.key.clone(), Baseline::Samples(samples.clone()));
        }
    }
    let mut notes = Vec::new();
    let mut by_moe_key = BTreeMap::new();
    if !table.moe.is_empty() {
        let own = from_table(table, "the table");
        notes.push(format!(
            "{origin} holds no grouped MoE samples: the {} grouped entries are compared with the \
             checked table's own times",
            table.moe.len()
        ));
        notes.extend(own.notes);
        by_moe_key = own.by_moe_key;
    }
    Baselines {
        description: format!("`{origin}`: the recorded samples of each entry's kernel"),
        by_key,
        by_moe_key,
        device,
        notes,
    }
}

/// Read the baseline file `path` for `table` by its kind (extension): `.json` a saved check,
/// `.jsonl` / `.jsonl.gz` a measurement log, `.ron` another table. The error is one line.
pub fn load(path: &Path, table: &Table) -> Result<Baselines, String> {
    let name = path.display().to_string();
    let file = path.file_name().map(|f| f.to_string_lossy().to_string()).unwrap_or_default();
    if file.ends_with(".json") {
        let r = CheckReport::read_json(path).map_err(|e| e.to_string())?;
        Ok(from_check(&r, &name))
    } else if file.ends_with(".jsonl") || file.ends_with(".jsonl.gz") {
        let records = crate::tune::log::read(path).map_err(|e| e.to_string())?;
        if records.is_empty() {
            return Err(format!("{name}: no measurement records"));
        }
        Ok(from_log(&records, table, &name))
    } else if file.ends_with(".ron") {
        let t = Table::load(path).map_err(|e| e.to_string().replace('\n', " "))?;
        Ok(from_table(&t, &name))
    } else {
        Err(format!(
            "{name}: unknown baseline kind (expected a saved check .json, a measurement log \
             .jsonl or .jsonl.gz, or a dispatch table .ron)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::tests_support::sample;

    #[test]
    fn sample_count_is_read_from_the_timing_policy() {
        let committed =
            "cold L2 (operands rotated over > 4x L2), CUDA-graph replay of back-to-back \
            launches (>= 100 us per sample, <= 200 launches), 2 warm-up replays, 11 samples per \
            candidate, candidates interleaved, median with 95% order-statistic interval";
        assert_eq!(samples_per_candidate(committed), Some(11));
        assert_eq!(
            samples_per_candidate(&crate::bench::TimingPolicy::default().describe()),
            Some(25)
        );
        assert_eq!(samples_per_candidate("graph replay, median of 50"), None);
        // a count no policy takes is not believed (it would expand into that many samples)
        assert_eq!(samples_per_candidate("18446744073709551615 samples per candidate"), None);
        assert_eq!(samples_per_candidate("0 samples per candidate"), None);
        assert_eq!(samples_per_candidate("10000 samples per candidate"), Some(10_000));
    }

    #[test]
    fn table_baselines_carry_median_interval_and_n() {
        let t = sample();
        let b = from_table(&t, "t.ron");
        assert_eq!(b.by_key.len(), t.entries.len());
        // The fixture's policy has no sample count: the assumption is noted.
        assert_eq!(b.notes.len(), 1);
        let e = &t.entries[0];
        match b.get(&e.key).unwrap() {
            Baseline::Summary(s) => {
                assert_eq!(
                    (s.median, s.lo, s.hi, s.n),
                    (e.median_us, e.interval_us.0, e.interval_us.1, ASSUMED_SAMPLES)
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn grouped_entries_have_their_own_baselines() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results");
        let table = Table::load(&root.join("nvidia-h200.ron")).unwrap();
        let b = from_table(&table, "t.ron");
        assert_eq!(b.by_moe_key.len(), table.moe.len());
        let e = &table.moe[3];
        assert_eq!(
            b.get_moe(&e.key),
            Some(&Baseline::Summary(SummaryBaseline {
                median: e.median_us,
                lo: e.interval_us.0,
                hi: e.interval_us.1,
                n: 11
            }))
        );
        // A log has no grouped samples: the table's own grouped times, said in a note.
        let log = load(&root.join("h200/nvidia-h200-w4a16.jsonl.gz"), &table).unwrap();
        assert_eq!(log.by_moe_key, b.by_moe_key);
        assert!(log.notes.iter().any(|n| n.contains("no grouped MoE samples")), "{:?}", log.notes);
        // A saved check: the samples of its grouped entries.
        let mut r = crate::check::report::tests::report(vec![], vec![]);
        r.grouped = vec![crate::check::report::tests::grouped(8, 39.0, 39.2)];
        let c = from_check(&r, "c.json");
        assert_eq!(
            c.get_moe(&r.grouped[0].key),
            Some(&Baseline::Samples(r.grouped[0].samples.clone()))
        );
    }

    #[test]
    fn log_baselines_take_the_latest_timed_record_of_the_entry() {
        let t = sample();
        let e = &t.entries[1];
        let mut old = crate::tune::log::tests::record(e.key.m, Some(3.0));
        old.key = e.key.clone();
        old.config = e.config;
        let mut new = old.clone();
        new.at = 10;
        new.outcome = Outcome::Timed {
            time: crate::bench::Summary::of(&[3.3, 3.4]).unwrap(),
            samples: vec![3.3, 3.4],
        };
        let mut other_config = new.clone();
        other_config.config = crate::template::default_config(e.key.family, e.key.a_type);
        other_config.at = 20;
        let b = from_log(&[old, new, other_config], &t, "l.jsonl");
        assert_eq!(b.by_key.len(), 1);
        assert_eq!(b.get(&e.key), Some(&Baseline::Samples(vec![3.3, 3.4])));
        assert_eq!(b.device.as_deref(), Some("NVIDIA H200"));
    }

    #[test]
    fn committed_log_holds_samples_for_every_committed_table_entry() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results");
        let table = Table::load(&root.join("nvidia-h200.ron")).unwrap();
        let b = load(&root.join("h200/nvidia-h200-w4a16.jsonl.gz"), &table).unwrap();
        assert_eq!(b.by_key.len(), table.entries.len(), "{:?}", b.by_key.keys());
        assert!(load(&root.join("README.md"), &table)
            .unwrap_err()
            .contains("unknown baseline kind"));
    }
}

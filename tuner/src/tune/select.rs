//! Choosing winners from measurement records: median, a tie band with a deterministic tie-break,
//! and a default configuration that keeps its place unless beaten by a margin.
//!
//! The default configuration is what one would ship without per-shape tuning: the single
//! configuration with the best geometric-mean time over every key of the campaign (among those
//! timed on all keys; if none was, those timed on the most keys).
//!
//! Fused kernels are chosen first. A key's dequantize-then-cuBLAS record (large M) then replaces
//! the fused winner only when it is faster by more than the default margin and outside the
//! winner's interval; the fused winner stays in the entry as its fallback.

use super::log::{Outcome, Record};
use crate::bench::Summary;
use crate::table::Method;
use crate::table::TableKey;
use crate::template::GemmConfig;
use std::collections::BTreeMap;

/// Selection rules.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SelectRules {
    /// Relative median difference under which two candidates tie (intervals overlapping also tie).
    pub tie_band: f64,
    /// The default configuration is replaced only by a candidate faster by more than this
    /// (relative) and outside the default's interval.
    pub default_margin: f64,
}

impl Default for SelectRules {
    fn default() -> Self {
        Self { tie_band: 0.02, default_margin: 0.03 }
    }
}

/// The choice for one key.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub key: TableKey,
    /// `DequantCublasBf16` when the composite path won; `config` is then the fused fallback.
    pub method: Method,
    pub config: GemmConfig,
    /// The winner's time (the composite's when it won).
    pub time: Summary,
    /// The fused winner's time when the composite path won.
    pub fused_time: Option<Summary>,
    /// Other candidates tied with the winner (config, time), fastest first.
    pub runners_up: Vec<(GemmConfig, Summary)>,
    /// The default configuration's time on this key, if it was timed.
    pub default_time: Option<Summary>,
    /// Candidates timed on this key.
    pub timed: usize,
}

impl Choice {
    /// default median / winner median (1.0 when the default won or was not timed).
    pub fn speedup_over_default(&self) -> f64 {
        self.default_time.map_or(1.0, |d| d.median / self.time.median)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Selection {
    pub default: Option<GemmConfig>,
    /// Geomean of the default's medians over the keys it was timed on (us).
    pub default_geomean_us: f64,
    pub choices: Vec<Choice>,
}

/// Timed medians of fused kernels per key and config (the first record of a (key, config) pair
/// wins, so merged logs with duplicates select deterministically).
pub fn timed_table(records: &[Record]) -> BTreeMap<TableKey, BTreeMap<GemmConfig, Summary>> {
    let mut t: BTreeMap<TableKey, BTreeMap<GemmConfig, Summary>> = BTreeMap::new();
    for r in records.iter().filter(|r| r.method.is_fused()) {
        if let Outcome::Timed { time, .. } = &r.outcome {
            t.entry(r.key.clone()).or_default().entry(r.config).or_insert(*time);
        }
    }
    t
}

/// The first timed dequantize-then-cuBLAS record of each key.
pub fn composite_times(records: &[Record]) -> BTreeMap<TableKey, Summary> {
    let mut t = BTreeMap::new();
    for r in records.iter().filter(|r| r.method == Method::DequantCublasBf16) {
        if let Outcome::Timed { time, .. } = &r.outcome {
            t.entry(r.key.clone()).or_insert(*time);
        }
    }
    t
}

/// The geomean-best configuration over all keys (see the module docs).
pub fn default_config(
    table: &BTreeMap<TableKey, BTreeMap<GemmConfig, Summary>>,
) -> Option<(GemmConfig, f64)> {
    let mut coverage: BTreeMap<GemmConfig, (usize, f64)> = BTreeMap::new();
    for per_key in table.values() {
        for (c, s) in per_key {
            let e = coverage.entry(*c).or_insert((0, 0.0));
            e.0 += 1;
            e.1 += s.median.ln();
        }
    }
    let most = coverage.values().map(|(n, _)| *n).max()?;
    coverage
        .into_iter()
        .filter(|(_, (n, _))| *n == most)
        .map(|(c, (n, log_sum))| (c, (log_sum / n as f64).exp()))
        // Ties on the geomean (exactly equal) break by config order: deterministic.
        .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
}

pub fn select(records: &[Record], rules: &SelectRules) -> Selection {
    let table = timed_table(records);
    let composite = composite_times(records);
    let default = default_config(&table);
    let mut choices = Vec::new();
    for (key, per_key) in &table {
        let mut ranked: Vec<(GemmConfig, Summary)> =
            per_key.iter().map(|(c, s)| (*c, *s)).collect();
        ranked.sort_by(|a, b| a.1.median.total_cmp(&b.1.median).then(a.0.cmp(&b.0)));
        let (best_c, best_s) = ranked[0];
        let ties: Vec<(GemmConfig, Summary)> =
            ranked.iter().copied().filter(|(_, s)| s.ties_with(&best_s, rules.tie_band)).collect();
        let default_time = default.and_then(|(d, _)| per_key.get(&d).copied());
        // Tie-break: the default if it is among the ties, else the fastest median (config order
        // on equal medians).
        let mut winner = (best_c, best_s);
        if let (Some((d, _)), Some(dt)) = (default, default_time) {
            let in_ties = ties.iter().any(|(c, _)| *c == d);
            let clear_win =
                best_s.median < dt.median * (1.0 - rules.default_margin) && best_s.hi < dt.lo;
            if in_ties || !clear_win {
                winner = (d, dt);
            }
        }
        let runners_up = ties.into_iter().filter(|(c, _)| *c != winner.0).collect();
        let (method, time, fused_time) = match composite.get(key) {
            Some(ct)
                if ct.median < winner.1.median * (1.0 - rules.default_margin)
                    && ct.hi < winner.1.lo =>
            {
                (Method::DequantCublasBf16, *ct, Some(winner.1))
            }
            _ => (Method::Fused, winner.1, None),
        };
        choices.push(Choice {
            key: key.clone(),
            method,
            config: winner.0,
            time,
            fused_time,
            runners_up,
            default_time,
            timed: per_key.len(),
        });
    }
    Selection {
        default: default.map(|(c, _)| c),
        default_geomean_us: default.map_or(0.0, |(_, g)| g),
        choices,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::AType;
    use crate::template::{search_space, Family};
    use crate::tune::log::LOG_SCHEMA_VERSION;

    fn rec(m: u32, c: GemmConfig, t: f64, width: f64) -> Record {
        Record {
            schema_version: LOG_SCHEMA_VERSION,
            method: crate::table::Method::Fused,
            key: TableKey {
                experts: None,
                op: "gemm".into(),
                family: Family::Sm90,
                a_type: AType::Bf16,
                n: 512,
                k: 6144,
                m,
            },
            config: c,
            outcome: Outcome::Timed {
                time: Summary { n: 5, median: t, lo: t - width, hi: t + width, min: t, max: t },
                samples: vec![t],
            },
            device: "d".into(),
            compute_capability: (9, 0),
            template_hash: "h".into(),
            at: 0,
            context: None,
        }
    }

    #[test]
    fn default_is_geomean_best_and_keeps_its_place_unless_clearly_beaten() {
        let s = search_space(Family::Sm90, AType::Bf16);
        let (a, b, c) = (s[0], s[1], s[2]);
        // a: steady 10 (geomean 10); b: 5 on m=1 but 40 on m=2 (geomean 14.1); c: 10.3 and 9.8
        // (geomean 10.05), faster than a on m=2 but within the tie band and the margin.
        let recs = vec![
            rec(1, a, 10.0, 0.1),
            rec(2, a, 10.0, 0.1),
            rec(1, b, 5.0, 0.1),
            rec(2, b, 40.0, 0.1),
            rec(1, c, 10.3, 0.1),
            rec(2, c, 9.8, 0.5),
        ];
        let sel = select(&recs, &SelectRules::default());
        assert_eq!(sel.default, Some(a));
        assert!((sel.default_geomean_us - 10.0).abs() < 1e-9);
        let m1 = &sel.choices[0];
        assert_eq!(m1.config, b, "clearly faster than the default");
        assert!((m1.speedup_over_default() - 2.0).abs() < 1e-9);
        let m2 = &sel.choices[1];
        assert_eq!(m2.config, a, "c does not clear the margin: the default stays");
        assert_eq!(m2.speedup_over_default(), 1.0);
    }

    #[test]
    fn ties_break_deterministically_whatever_the_record_order() {
        let s = search_space(Family::Sm90, AType::Bf16);
        let (a, b, d) = (s[3], s[4], s[5]);
        let mut recs = vec![
            rec(1, a, 8.0, 0.5),
            rec(1, b, 8.1, 0.5),
            rec(1, d, 20.0, 0.1),
            rec(2, d, 20.0, 0.1),
        ];
        let first = select(&recs, &SelectRules::default());
        recs.reverse();
        let second = select(&recs, &SelectRules::default());
        assert_eq!(first.choices[0].config, second.choices[0].config);
        assert_eq!(first.choices[0].runners_up.len(), 1);
    }

    #[test]
    fn composite_replaces_the_fused_winner_only_when_clearly_faster() {
        let s = search_space(Family::Sm90, AType::Bf16);
        let (a, b) = (s[0], s[1]);
        let composite =
            |m, t: f64| Record { method: Method::DequantCublasBf16, ..rec(m, a, t, 0.2) };
        let recs = vec![
            rec(256, a, 50.0, 0.2),
            rec(256, b, 60.0, 0.2),
            composite(256, 40.0),
            rec(1024, a, 100.0, 0.2),
            composite(1024, 99.0),
        ];
        let sel = select(&recs, &SelectRules::default());
        let (m256, m1024) = (&sel.choices[0], &sel.choices[1]);
        assert_eq!(m256.method, Method::DequantCublasBf16);
        assert_eq!(m256.config, a, "the fused winner stays as the fallback");
        assert_eq!(m256.time.median, 40.0);
        assert_eq!(m256.fused_time.map(|t| t.median), Some(50.0));
        assert_eq!(m1024.method, Method::Fused, "1% faster is inside the margin");
        assert_eq!(m1024.time.median, 100.0);
        // Composite records never count as fused configurations (nor for the default).
        assert_eq!(m256.timed, 2);
        assert_eq!(sel.default, Some(a));
    }
}

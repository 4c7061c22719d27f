//! From measurement records to a dispatch table (`results/<sku>.ron`) and a summary.

use super::log::{Context, Record};
use super::select::{select, SelectRules, Selection};
use crate::problem::GemmProblem;
use crate::table::{DeviceIdentity, Entry, RunnerUp, Table, Toolchain};
use crate::template::Family;

#[derive(Debug, thiserror::Error)]
pub enum EmitError {
    #[error("no record carries its measurement context (device SM count, floors, toolchain): re-run the tune with this fp4tune")]
    NoContext,
    #[error("no candidate was timed successfully: nothing to put in a dispatch table")]
    Empty,
}

/// Roofline time of `p` under the measured bandwidth and tensor peak (us).
pub fn roofline_us(p: &GemmProblem, ctx: &Context) -> f64 {
    (p.min_bytes() as f64 / (ctx.bandwidth_gbps * 1e3))
        .max(p.flops() / (ctx.tensor_peak_tflops * 1e6))
}

/// Roofline time over the measured median. On sm120, capped at the table's bound: its roofline's
/// FP4 peak is a data sheet's or an assumed ratio to the measured bf16 peak, and a kernel measured
/// at more than twice that roofline means the peak is below the GPU's, not a wrong time, so the
/// capped fraction keeps the tune's table instead of refusing to save it. On sm90 the peak is
/// measured and a fraction past the bound (a wrong time) still stops the table at validation.
pub fn roofline_fraction(roofline_us: f64, median_us: f64, family: Family) -> f64 {
    let f = roofline_us / median_us;
    let cap = crate::table::MAX_ROOFLINE_FRACTION;
    if family == Family::Sm120 && f > cap {
        cap
    } else {
        f
    }
}

/// Select winners and build the table. All records must be of one device (the caller checks).
pub fn dispatch_table(
    records: &[Record],
    rules: &SelectRules,
) -> Result<(Table, Selection), EmitError> {
    let first = records.iter().find(|r| r.context.is_some()).ok_or(EmitError::NoContext)?;
    let ctx = first.context.clone().expect("found above");
    let sel = select(records, rules);
    if sel.choices.is_empty() {
        return Err(EmitError::Empty);
    }
    let mut table = Table::new(
        DeviceIdentity {
            name: first.device.clone(),
            compute_capability: first.compute_capability,
            sm_count: ctx.sm_count,
        },
        Toolchain { nvrtc: ctx.nvrtc_version, driver: ctx.driver_version },
        ctx.timing_policy.clone(),
    );
    for r in records {
        table.template_hashes.entry(r.key.family).or_insert_with(|| r.template_hash.clone());
    }
    for c in &sel.choices {
        let p = GemmProblem::new(c.key.m, c.key.n, c.key.k, c.key.a_type);
        table.entries.push(Entry {
            key: c.key.clone(),
            method: c.method,
            config: c.config,
            median_us: c.time.median,
            interval_us: (c.time.lo, c.time.hi),
            roofline_fraction: roofline_fraction(
                roofline_us(&p, &ctx),
                c.time.median,
                c.key.family,
            ),
            runners_up: c
                .runners_up
                .iter()
                .map(|(config, s)| RunnerUp { config: *config, median_us: s.median })
                .collect(),
        });
    }
    Ok((table, sel))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::log::tests::record;

    #[test]
    fn table_from_records_validates() {
        let ctx = Context {
            sm_count: 132,
            driver_version: (13, 0),
            nvrtc_version: (13, 0),
            nvrtc_build: None,
            bandwidth_gbps: 4000.0,
            tensor_peak_tflops: 800.0,
            launch_floor_us: 0.6,
            timing_policy: "p".into(),
        };
        let mut recs = vec![record(1, Some(5.0)), record(2, Some(6.0)), record(4, None)];
        assert!(matches!(
            dispatch_table(&recs, &SelectRules::default()),
            Err(EmitError::NoContext)
        ));
        recs[0].context = Some(ctx);
        let (t, sel) = dispatch_table(&recs, &SelectRules::default()).unwrap();
        assert_eq!(t.entries.len(), 2);
        assert_eq!(sel.choices.len(), 2);
        assert!(t.entries.iter().all(|e| e.roofline_fraction > 0.0 && e.roofline_fraction < 1.0));
        t.validate("test").unwrap();
        // a peak far below the kernels' rate (a roofline 1000x their time): on sm90 (measured
        // peak) the table refuses it; on sm120 (a sheet's or an assumed FP4 peak) the fractions
        // stop at the table's bound
        recs[0].context.as_mut().unwrap().tensor_peak_tflops = 1e-3;
        let (t, _) = dispatch_table(&recs, &SelectRules::default()).unwrap();
        assert!(t.validate("test").is_err());
        let cap = crate::table::MAX_ROOFLINE_FRACTION;
        assert_eq!(roofline_fraction(1000.0, 1.0, Family::Sm120), cap);
        assert_eq!(roofline_fraction(1.0, 2.0, Family::Sm120), 0.5);
        assert!(roofline_fraction(0.0, 0.0, Family::Sm120).is_nan(), "a NaN stays refused");
        for r in recs.iter_mut() {
            r.key.family = Family::Sm120;
        }
        let (t, _) = dispatch_table(&recs, &SelectRules::default()).unwrap();
        assert!(t.entries.iter().all(|e| e.roofline_fraction == cap));
    }
}

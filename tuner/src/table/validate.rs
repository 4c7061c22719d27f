//! The rules every dispatch table obeys (`Table::validate`), checked when a table is read and
//! before it is written: the schema's, each entry's against its configuration's constraints, and
//! the grouped entries' against their family and templates.

use super::schema::*;
use crate::problem::AType;
use crate::template::Family;
use std::collections::HashSet;

impl Table {
    /// Every rule of the schema: version; at least one entry; known ops (`experts` present exactly
    /// for grouped ops); N, K, M > 0 and K a multiple of 16; each key's family and A type equal to
    /// its configuration's; every configuration (winner and runners-up) legal for its key's problem
    /// (`GemmConfig::check_problem`); finite, positive times with lo <= hi; no duplicate keys; a
    /// template hash for every family used; every family's architecture equal to the device's
    /// compute capability.
    pub fn validate(&self, origin: &str) -> Result<(), TableError> {
        let invalid = |at: String, reason: String| TableError::Invalid {
            origin: origin.to_string(),
            at,
            reason,
        };
        if self.schema_version != TABLE_SCHEMA_VERSION {
            return Err(invalid(
                "schema_version".into(),
                format!(
                    "{} in memory: tables are held as version {TABLE_SCHEMA_VERSION} (reading converts version 1)",
                    self.schema_version
                ),
            ));
        }
        // text that summaries print on one line: no line breaks or terminal escapes
        let mut texts: Vec<(&str, &str)> =
            vec![("device.name", &self.device.name), ("timing_policy", &self.timing_policy)];
        if let Some(c) = &self.campaign {
            texts.extend([("campaign.cache", &*c.cache), ("campaign.strategy", &c.strategy)]);
            texts.push(("campaign.budget", &c.budget));
            texts.extend(c.shards.iter().map(|s| ("campaign.shards", s.as_str())));
        }
        if let Some((at, text)) = texts.iter().find(|(_, t)| t.chars().any(char::is_control)) {
            return Err(invalid(
                at.to_string(),
                format!("{text:?} holds a control character (a line break or terminal escape)"),
            ));
        }
        if self.entries.is_empty() && self.moe.is_empty() {
            return Err(TableError::Empty { origin: origin.to_string() });
        }
        if self.device.sm_count == 0 {
            return Err(invalid("device".into(), "sm_count must be positive".into()));
        }
        self.validate_moe(origin)?;
        let mut seen = HashSet::new();
        for (i, e) in self.entries.iter().enumerate() {
            let at = || format!("entry {} ({})", i + 1, e.key);
            let key = &e.key;
            if !KNOWN_OPS.contains(&key.op.as_str()) {
                return Err(invalid(
                    at(),
                    format!(
                        "unknown op {:?} (this fp4tune knows {})",
                        key.op,
                        KNOWN_OPS.join(", ")
                    ),
                ));
            }
            match (key.op.as_str(), key.experts) {
                (OP_GEMM, Some(_)) => {
                    return Err(invalid(at(), "op \"gemm\" takes no `experts` field".into()))
                }
                (OP_GROUPED_GEMM, None | Some(0)) => {
                    return Err(invalid(
                        at(),
                        "op \"grouped_gemm\" needs `experts: Some(E)`, E > 0".into(),
                    ))
                }
                _ => {}
            }
            if key.n == 0 || key.k == 0 || key.m == 0 {
                return Err(invalid(at(), "N, K and M must be positive".into()));
            }
            if key.k % 16 != 0 {
                return Err(invalid(at(), format!("K = {} is not a multiple of 16", key.k)));
            }
            if !e.method.is_fused() && key.op != OP_GEMM {
                return Err(invalid(
                    at(),
                    format!("method {:?} is only defined for op \"gemm\"", e.method),
                ));
            }
            if !seen.insert(key) {
                return Err(invalid(
                    at(),
                    "duplicate key (an earlier entry has the same key)".into(),
                ));
            }
            let problem = key.problem();
            let configs = std::iter::once((&e.config, "config"))
                .chain(e.runners_up.iter().map(|r| (&r.config, "runner-up")));
            for (c, what) in configs {
                let sizes = [
                    c.block_m, c.block_n, c.block_k, c.warps_m, c.warps_n, c.warps_k, c.stages,
                    c.split_k,
                ];
                if sizes.contains(&0) {
                    return Err(invalid(at(), format!("illegal {what}: {c}: tile sizes, warps, stages and split_k must be positive")));
                }
                if c.family != key.family || c.a_type != key.a_type {
                    return Err(invalid(
                        at(),
                        format!(
                            "{what} {c} is for {} {}, the key for {} {}",
                            c.family, c.a_type, key.family, key.a_type
                        ),
                    ));
                }
                c.check_problem(&problem)
                    .map_err(|err| invalid(at(), format!("illegal {what}: {err}")))?;
            }
            if let Some(why) = implausible_time(e.median_us, e.interval_us.0, e.interval_us.1) {
                return Err(invalid(at(), why));
            }
            if let Some(why) = bad_roofline_fraction(e.roofline_fraction) {
                return Err(invalid(at(), why));
            }
            if let Some(r) = e
                .runners_up
                .iter()
                .find(|r| implausible_time(r.median_us, r.median_us, r.median_us).is_some())
            {
                return Err(invalid(
                    at(),
                    format!("runner-up {} has median {}", r.config, r.median_us),
                ));
            }
            if !self.template_hashes.contains_key(&key.family) {
                return Err(invalid(
                    at(),
                    format!("no template hash recorded for family {}", key.family),
                ));
            }
            let cc = key.family.arch().compute_capability();
            if cc != self.device.compute_capability {
                return Err(invalid(
                    at(),
                    format!(
                        "family {} runs on compute capability {}.{}, the table's device {} is {}.{}",
                        key.family, cc.0, cc.1, self.device.name, self.device.compute_capability.0,
                        self.device.compute_capability.1
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The grouped entries' rules: a template hash; keys of the device's family (sm90: W4A16 or
    /// W4A4; sm120: W4A4), with a configuration of the key's family and activation type;
    /// the configuration's op equal to the key's and legal for the key's layer shape; finite,
    /// positive times with lo <= hi; no duplicate keys.
    fn validate_moe(&self, origin: &str) -> Result<(), TableError> {
        let invalid = |at: String, reason: String| TableError::Invalid {
            origin: origin.to_string(),
            at,
            reason,
        };
        if self.moe.is_empty() {
            return Ok(());
        }
        if self.moe_template_hash.as_deref().is_none_or(str::is_empty) {
            return Err(invalid(
                "moe_template_hash".into(),
                "grouped entries need the hash of their templates".into(),
            ));
        }
        let mut seen = HashSet::new();
        for (i, e) in self.moe.iter().enumerate() {
            let at = || format!("moe entry {} ({})", i + 1, e.key);
            let key = &e.key;
            if key.family == Family::Sm120 && key.a_type != AType::Nvfp4 {
                return Err(invalid(at(), "sm120 grouped kernels are W4A4 (a_type Nvfp4)".into()));
            }
            if (e.config.family, e.config.a_type) != (key.family, key.a_type) {
                return Err(invalid(
                    at(),
                    format!(
                        "configuration {} is a {} {} kernel",
                        e.config, e.config.family, e.config.a_type
                    ),
                ));
            }
            let (major, minor) = self.device.compute_capability;
            let device_family =
                crate::template::Arch::for_compute_capability(major, minor).map(Family::for_arch);
            if device_family != Some(key.family) {
                return Err(invalid(
                    at(),
                    format!(
                        "the {} family does not run on compute capability {:?}",
                        key.family, self.device.compute_capability
                    ),
                ));
            }
            if key.tokens == 0 {
                return Err(invalid(at(), "the token bucket must be positive".into()));
            }
            if key.top_k == 0 || key.top_k > e.routed_experts() {
                return Err(invalid(
                    at(),
                    format!(
                        "top_k {} is not in 1..={} (the routed experts)",
                        key.top_k,
                        e.routed_experts()
                    ),
                ));
            }
            // routed rows are numbered token * top_k + slot in int32
            if u64::from(key.tokens) * u64::from(key.top_k) > i32::MAX as u64 {
                return Err(invalid(
                    at(),
                    format!(
                        "{} tokens x top_k {} routed rows are past the int32 row ids",
                        key.tokens, key.top_k
                    ),
                ));
            }
            if e.config.op != key.op {
                return Err(invalid(
                    at(),
                    format!("configuration {} is for {}", e.config, e.config.op),
                ));
            }
            let shape = key.shape();
            if shape.nk(key.op) != (key.n, key.k) {
                return Err(invalid(
                    at(),
                    format!("N = {} and K = {} do not form a {} weight", key.n, key.k, key.op),
                ));
            }
            e.config
                .check(&shape)
                .map_err(|err| invalid(at(), format!("illegal config: {err}")))?;
            if let Some(why) = implausible_time(e.median_us, e.interval_us.0, e.interval_us.1)
                .or_else(|| {
                    implausible_time(e.skewed_us, e.skewed_us, e.skewed_us)
                        .map(|why| format!("skewed_us: {why}"))
                })
            {
                return Err(invalid(at(), why));
            }
            if let Some(why) = bad_roofline_fraction(e.roofline_fraction) {
                return Err(invalid(at(), why));
            }
            if e.experts_total.is_some_and(|t| t < key.experts || t > i32::MAX as u32) {
                return Err(invalid(
                    at(),
                    format!(
                        "experts_total {} is below the GPU's {} experts or past the int32 \
                         expert ids",
                        e.routed_experts(),
                        key.experts
                    ),
                ));
            }
            if !seen.insert(key) {
                return Err(invalid(
                    at(),
                    "duplicate key (an earlier moe entry has the same key)".into(),
                ));
            }
        }
        Ok(())
    }
}

/// The quickest time a measurement may claim: below it no GPU launches a kernel (the empty-kernel
/// launch floor of current GPUs under graph replay is above it), so a smaller median is a broken
/// measurement, not a fast kernel.
pub const MIN_PLAUSIBLE_US: f64 = 0.5;
/// The longest: 1000 s for one launch is a broken measurement (a hang is recorded as one long
/// before), and times beyond it break the reports' log axes.
pub const MAX_PLAUSIBLE_US: f64 = 1e9;

/// Why a measured time with its interval cannot be a measurement (finite, within
/// [`MIN_PLAUSIBLE_US`] ..= [`MAX_PLAUSIBLE_US`], the median inside its interval), if it cannot.
pub fn implausible_time(median: f64, lo: f64, hi: f64) -> Option<String> {
    // hostile values print in scientific notation, not as 300 digits
    let show = |v: f64| {
        if (1e-3..1e7).contains(&v.abs()) || v == 0.0 {
            format!("{v}")
        } else {
            format!("{v:e}")
        }
    };
    let (m, l, h) = (show(median), show(lo), show(hi));
    if ![median, lo, hi].iter().all(|x| x.is_finite()) {
        return Some(format!("times must be finite: median {m} us, interval ({l}, {h})"));
    }
    if !(lo <= median && median <= hi) {
        return Some(format!("median {m} us lies outside its own interval ({l}, {h})"));
    }
    if median < MIN_PLAUSIBLE_US {
        return Some(format!(
            "median {m} us is below the {MIN_PLAUSIBLE_US} us launch floor of any GPU"
        ));
    }
    if hi > MAX_PLAUSIBLE_US {
        return Some(format!("time {h} us is above {MAX_PLAUSIBLE_US} us (1000 s) for one launch"));
    }
    None
}

/// The smallest nonzero time a report reads (rooflines and read floors of small shapes are
/// fractions of a microsecond, none below 1 ns).
pub const MIN_REPORTED_US: f64 = 1e-3;

/// Whether a time of a benchmark CSV can be shown: 0 (not measured) or finite within
/// [`MIN_REPORTED_US`] ..= [`MAX_PLAUSIBLE_US`].
pub fn reportable_time(us: f64) -> bool {
    us == 0.0 || (MIN_REPORTED_US..=MAX_PLAUSIBLE_US).contains(&us)
}

/// The largest roofline fraction (roofline time / median) a table holds: a kernel twice as fast
/// as its roofline is a wrong roofline or a wrong time.
pub const MAX_ROOFLINE_FRACTION: f64 = 2.0;

/// Why a recorded roofline fraction is unusable, if it is: not a number in
/// 0..=[`MAX_ROOFLINE_FRACTION`] (0 is "not computed").
fn bad_roofline_fraction(f: f64) -> Option<String> {
    (!(0.0..=MAX_ROOFLINE_FRACTION).contains(&f))
        .then(|| format!("roofline_fraction {f} is not a number in 0..={MAX_ROOFLINE_FRACTION}"))
}

#[cfg(test)]
mod tests {
    use super::super::schema::tests::{err, sample, with_moe};
    use super::*;
    use crate::moe::MoeOp;

    #[test]
    fn hand_edited_illegal_config_is_refused_naming_the_entry() {
        let t = sample();
        let text = t.to_ron_string();
        // block_k 0 is illegal for every family.
        let first = format!("block_k: {}", t.entries[0].config.block_k);
        let text = text.replacen(&first, "block_k: 0", 1);
        let e = err(&text);
        assert!(e.contains("entry 1 ("), "{e}");
        assert!(e.contains("illegal config"), "{e}");
    }

    #[test]
    fn inconsistent_tables_are_refused() {
        let check = |f: &dyn Fn(&mut Table), want: &str| {
            let mut t = sample();
            f(&mut t);
            let e = t.validate("t.ron").unwrap_err().to_string();
            assert!(e.contains(want), "want {want:?} in: {e}");
        };
        check(&|t| t.entries.clear(), "has no entries");
        check(&|t| t.entries.push(t.entries[0].clone()), "duplicate key");
        check(&|t| t.entries[0].key.op = "conv".into(), "unknown op \"conv\"");
        check(&|t| t.entries[0].key.a_type = AType::Nvfp4, "the key for sm90 w4a4");
        check(&|t| t.entries[0].key.k = 100, "not a multiple of 16");
        check(&|t| t.entries[0].key.m = 0, "must be positive");
        check(&|t| t.device.sm_count = 0, "sm_count must be positive");
        check(&|t| t.entries[0].median_us = f64::NAN, "times must be finite");
        check(&|t| t.entries[0].interval_us = (5.0, 4.0), "outside its own interval");
        check(
            &|t| (t.entries[0].median_us, t.entries[0].interval_us) = (0.2, (0.1, 0.3)),
            "below the 0.5 us launch floor",
        );
        check(&|t| t.entries[0].interval_us.1 = 1e300, "above 1000000000 us");
        check(&|t| t.entries[0].runners_up[0].median_us = 1e300, "runner-up");
        check(&|t| t.template_hashes.clear(), "no template hash");
        check(&|t| t.device.compute_capability = (12, 0), "runs on compute capability 9.0");
        check(&|t| t.entries[0].runners_up[0].config.stages = 0, "illegal runner-up");
        check(&|t| t.device.name = "NVIDIA\nH200".into(), "device.name: \"NVIDIA\\nH200\" holds");
        check(&|t| t.timing_policy = "x\u{1b}[31m".into(), "timing_policy");
        check(&|t| t.entries[0].roofline_fraction = 1e300, "not a number in 0..=2");
    }

    #[test]
    fn grouped_entries_round_trip_and_need_version_3_a_hash_and_a_legal_config() {
        let mut t = with_moe();
        t.entries.sort_by(|a, b| a.key.cmp(&b.key));
        let text = t.to_ron_string();
        assert!(text.contains("moe: ["), "{text}");
        assert_eq!(Table::from_ron_str(&text, "t.ron").unwrap(), t);
        let e =
            Table::from_ron_str(&text.replace("schema_version: 5,", "schema_version: 2,"), "t.ron")
                .unwrap_err();
        assert!(e.to_string().contains("need schema_version 3"), "{e}");
        let mut bad = t.clone();
        bad.moe_template_hash = None;
        assert!(bad.validate("t.ron").unwrap_err().to_string().contains("hash of their templates"));
        let mut bad = t.clone();
        bad.moe[0].config.depth = 3;
        let e = bad.validate("t.ron").unwrap_err().to_string();
        assert!(e.contains("moe entry 1") && e.contains("multiple of depth"), "{e}");
        let mut bad = t.clone();
        bad.moe.push(bad.moe[0].clone());
        assert!(bad.validate("t.ron").unwrap_err().to_string().contains("duplicate key"));
        let mut bad = t.clone();
        bad.moe[0].key.k = 200; // no whole block_k pass
        assert!(bad.validate("t.ron").is_err());
        // the model's expert count (version 5): at least the GPU's, absent in older versions
        assert!(text.contains("experts_total: Some(256)"), "{text}");
        let mut bad = t.clone();
        let moe_err = |t: &Table| t.validate("t.ron").unwrap_err().to_string();
        bad.moe[0].key.top_k = 0;
        let e = moe_err(&bad);
        assert!(e.contains("moe entry 1") && e.contains("top_k 0 is not in 1..=256"), "{e}");
        bad.moe[0].key.top_k = 257;
        assert!(moe_err(&bad).contains("top_k 257 is not in 1..=256"));
        bad = t.clone();
        bad.moe[0].key.tokens = u32::MAX;
        assert!(moe_err(&bad).contains("past the int32 row ids"), "{}", moe_err(&bad));
        bad = t.clone();
        bad.moe[0].experts_total = Some(8);
        let e = bad.validate("t.ron").unwrap_err().to_string();
        assert!(e.contains("experts_total 8 is below the GPU's 256 experts"), "{e}");
        bad.moe[0].experts_total = Some(1 << 31);
        assert!(bad.validate("t.ron").unwrap_err().to_string().contains("int32 expert ids"));
        let v4 = text.replace("schema_version: 5,", "schema_version: 4,");
        let e = Table::from_ron_str(&v4, "v4.ron").unwrap_err().to_string();
        assert!(
            e.contains("v4.ron") && e.contains("`experts_total` needs schema_version 5"),
            "{e}"
        );
        let mut local = t;
        local.moe[0].experts_total = None;
        let v4 = local.to_ron_string().replace("schema_version: 5,", "schema_version: 4,");
        let back = Table::from_ron_str(&v4, "v4.ron").unwrap();
        assert_eq!((back.moe[0].experts_total, back.moe[0].routed_experts()), (None, 256));
    }

    #[test]
    fn w4a4_grouped_entries_need_a_w4a4_configuration_of_their_family() {
        let mut t = with_moe();
        let shape = t.moe[0].key.shape();
        let w4a4 =
            crate::moe::space::search_space_for(Family::Sm90, AType::Nvfp4, MoeOp::Down, &shape)[0];
        t.moe[0].key.a_type = AType::Nvfp4;
        t.moe[0].config = w4a4;
        t.validate("t.ron").unwrap();
        let text = t.to_ron_string();
        assert_eq!(Table::from_ron_str(&text, "t.ron").unwrap().moe, t.moe);
        // A W4A16 kernel under a W4A4 key, or a key of another family, is refused.
        let mut bad = t.clone();
        bad.moe[0].config = crate::moe::space::search_space(MoeOp::Down, &shape)[0];
        let e = bad.validate("t.ron").unwrap_err().to_string();
        assert!(e.contains("moe entry 1") && e.contains("sm90 w4a16 kernel"), "{e}");
        let mut bad = t.clone();
        bad.moe[0].key.family = Family::Sm120;
        let e = bad.validate("t.ron").unwrap_err().to_string();
        assert!(e.contains("is a sm90 w4a4 kernel"), "{e}");
        // An sm120 table (compute capability 12.0) holds sm120 W4A4 grouped entries; an sm90
        // device does not run them, and sm120 W4A16 keys do not exist.
        let sm120 =
            crate::moe::space::search_space_for(Family::Sm120, AType::Nvfp4, MoeOp::Down, &shape)
                [0];
        let mut t120 = t.clone();
        t120.device.compute_capability = (12, 0);
        t120.entries.clear();
        t120.template_hashes.clear();
        t120.moe[0].key.family = Family::Sm120;
        t120.moe[0].config = sm120;
        t120.validate("t.ron").unwrap();
        let mut bad = t120.clone();
        bad.device.compute_capability = (9, 0);
        let e = bad.validate("t.ron").unwrap_err().to_string();
        assert!(e.contains("the sm120 family does not run on compute capability (9, 0)"), "{e}");
        let mut bad = t120;
        bad.moe[0].key.a_type = AType::Bf16;
        let e = bad.validate("t.ron").unwrap_err().to_string();
        assert!(e.contains("sm120 grouped kernels are W4A4"), "{e}");
    }
}

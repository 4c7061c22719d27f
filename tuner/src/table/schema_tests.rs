//! Tests of the table schema: reading, writing, versions, errors (`schema.rs`).

use super::*;
use crate::template::{default_config, search_space};

/// A small legal table: (N=512, K=6144) at buckets 1, 16, 256 and (N=6144, K=256) at 1.
pub(crate) fn sample() -> Table {
    let space = search_space(Family::Sm90, AType::Bf16);
    let c0 = default_config(Family::Sm90, AType::Bf16);
    let c1 = *space.iter().find(|c| **c != c0).unwrap_or(&c0);
    let mut t = Table::new(
        DeviceIdentity { name: "NVIDIA H200".into(), compute_capability: (9, 0), sm_count: 132 },
        Toolchain { nvrtc: (13, 0), driver: (13, 0) },
        "graph replay, cold L2 (4x rotation), interleaved, median of 50".into(),
    );
    t.template_hashes.insert(Family::Sm90, crate::template::family_template_hash(Family::Sm90));
    let entry = |n, k, m, c: GemmConfig, us: f64| Entry {
        key: TableKey::gemm(Family::Sm90, AType::Bf16, n, k, m),
        method: Method::Fused,
        config: c,
        median_us: us,
        interval_us: (us * 0.98, us * 1.02),
        roofline_fraction: 0.25,
        runners_up: vec![RunnerUp { config: c0, median_us: us * 1.01 }],
    };
    t.entries = vec![
        entry(512, 6144, 16, c1, 4.5),
        entry(512, 6144, 1, c1, 3.25),
        entry(512, 6144, 256, c0, 9.0),
        entry(6144, 256, 1, c1, 2.0),
    ];
    t
}

pub(crate) fn err(text: &str) -> String {
    Table::from_ron_str(text, "results/h200.ron").unwrap_err().to_string()
}

/// Tables written before `GemmConfig::pipeline` existed read as the cp.async kernels they ran;
/// a streamed-pipeline entry round-trips.
#[test]
fn pipeline_field_defaults_to_cp_async_and_round_trips() {
    use crate::template::Pipeline;
    let mut t = sample();
    let streamed = search_space(Family::Sm90, AType::Bf16)
        .into_iter()
        .find(|c| c.pipeline == Pipeline::WarpRing)
        .unwrap();
    t.entries[0].config = streamed;
    let key = t.entries[0].key.clone();
    let text = t.to_ron_string();
    assert!(text.contains("pipeline: WarpRing"), "{text}");
    let back = Table::from_ron_str(&text, "mem").unwrap();
    let e = back.entries.iter().find(|e| e.key == key).unwrap();
    assert_eq!(e.config, streamed);
    // A table written before the field: the sample (cp.async only) without it.
    let old = sample().to_ron_string().replace(", pipeline: CpAsync", "");
    assert!(!old.contains("pipeline"), "{old}");
    let back = Table::from_ron_str(&old, "old").unwrap();
    assert!(back.entries.iter().all(|e| e.config.pipeline == Pipeline::CpAsync));
}

/// A shape file given where a table belongs is named as one, not as a missing field.
#[test]
fn a_shape_file_is_not_a_table() {
    let shapes = include_str!("../../../shapes/glm5.ron");
    let e = err(shapes);
    assert!(e.contains("results/h200.ron: this is a shape file") && e.contains("--shapes"), "{e}");
    assert!(!e.contains('\n'), "{e}");
}

/// The OS error of a failed read or write is printed once, also when the CLI
/// prints the whole error chain (`{:#}`), and the message names the file.
#[test]
fn os_errors_are_printed_once() {
    let dir = tempfile::tempdir().unwrap();
    let read = Table::load(dir.path()).unwrap_err();
    let text = format!("{:#}", anyhow::Error::from(read));
    assert_eq!(text.matches("is a folder").count(), 1, "{text}");
    assert!(
        text.starts_with(&format!("{}: cannot read the dispatch table: ", dir.path().display())),
        "{text}"
    );
    let missing = Table::check_file(&dir.path().join("none.ron"), Default::default());
    let text = format!("{:#}", anyhow::Error::from(missing.unwrap_err()));
    assert_eq!(text.matches("os error").count(), 1, "{text}");
    // Writing under a regular file: the folder cannot be created.
    let file = dir.path().join("file");
    std::fs::write(&file, "x").unwrap();
    let out = file.join("t.ron");
    let text = format!("{:#}", anyhow::Error::from(sample().save(&out).unwrap_err()));
    let blocked = format!("{} exists and is not a folder", file.display());
    assert_eq!(text.matches(&blocked).count(), 1, "{text}");
    assert!(
        text.starts_with(&format!("{}: cannot write the dispatch table: ", out.display())),
        "{text}"
    );
}

/// A UTF-8 byte-order mark before the table is read as `Table::check_file` reads it.
#[test]
fn load_accepts_a_utf8_byte_order_mark() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bom.ron");
    let t = sample();
    std::fs::write(&p, format!("\u{feff}{}", t.to_ron_string())).unwrap();
    let plain = Table::from_ron_str(&t.to_ron_string(), "mem").unwrap();
    assert_eq!(Table::load(&p).unwrap(), plain);
    // Only a leading mark: one inside the text is still a syntax error naming the file.
    std::fs::write(&p, format!("\u{feff}\u{feff}{}", t.to_ron_string())).unwrap();
    let e = Table::load(&p).unwrap_err().to_string();
    assert!(e.starts_with(&format!("{}:1:", p.display())), "{e}");
}

#[test]
fn round_trip_is_stable_and_sorted() {
    let t = sample();
    let text = t.to_ron_string();
    let back = Table::from_ron_str(&text, "mem").unwrap();
    let mut sorted = t.clone();
    sorted.entries.sort_by(|a, b| a.key.cmp(&b.key));
    assert_eq!(back, sorted);
    assert_eq!(back.to_ron_string(), text, "writing is stable");
    assert!(!text.contains("experts"), "absent optional key fields are not written:\n{text}");
    // Through the file system, atomically, creating the folder.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("results/h200.ron");
    t.save(&path).unwrap();
    assert_eq!(Table::load(&path).unwrap(), sorted);
}

#[test]
fn grouped_entries_fit_the_same_format() {
    let mut t = sample();
    let mut e = t.entries[0].clone();
    e.key.op = OP_GROUPED_GEMM.into();
    e.key.experts = Some(256);
    t.entries.push(e);
    let back = Table::from_ron_str(&t.to_ron_string(), "mem").unwrap();
    assert!(back.entries.iter().any(|e| e.key.experts == Some(256)));
    // A grouped entry without its expert count is refused.
    let mut bad = t.clone();
    bad.entries.last_mut().unwrap().key.experts = None;
    let e = bad.validate("x").unwrap_err().to_string();
    assert!(e.contains("experts"), "{e}");
}

#[test]
fn truncated_table_names_file_line_and_column() {
    let text = sample().to_ron_string();
    let cut = &text[..text.len() * 2 / 3];
    let e = err(cut);
    assert!(e.starts_with("results/h200.ron:"), "{e}");
    assert!(e.contains("malformed dispatch table"), "{e}");
    let line: usize = e.split(':').nth(1).unwrap().parse().unwrap();
    assert!(line > 5, "points into the file: {e}");
    assert!(
        err("").contains("results/h200.ron:1:1: malformed dispatch table (RON): the file is empty")
    );
    assert!(err(" \n").contains("the file is empty"));
    // no internal names in the message of a file that is not a table at all
    assert!(!err("[1, 2]").contains("VersionProbe"), "{}", err("[1, 2]"));
}

/// A misspelled field is an error naming it, not a field silently dropped (a renamed `moe`
/// section would drop every grouped entry, a renamed `method` turn an entry into a fused one).
#[test]
fn misspelled_fields_are_refused_not_dropped() {
    let text = with_moe().to_ron_string();
    assert!(Table::from_ron_str(&text, "t.ron").is_ok());
    for (from, to) in [
        ("moe: [", "mo: ["),
        ("runners_up: [", "runners_upx: ["),
        ("stages: ", "stagesx: "),
        ("top_k: ", "topk: "),
        ("sm_count: ", "sms: "),
    ] {
        assert!(text.contains(from), "{from}");
        let e = err(&text.replacen(from, to, 1));
        let field = to.split(':').next().unwrap();
        assert!(e.contains(&format!("Unexpected field named `{field}`")), "{from}: {e}");
    }
}

#[test]
fn unknown_schema_version_is_refused_clearly() {
    let text = sample().to_ron_string().replace("schema_version: 5,", "schema_version: 7,");
    let e = err(&text);
    assert!(e.contains("unsupported dispatch-table schema_version 7"), "{e}");
    assert!(e.contains("reads schema_version 1 and 2"), "{e}");
    // A newer schema with fields we do not know still gets the version error, not a field error.
    let text = text.replace("entries: [", "new_field: 3, entries: [");
    assert!(err(&text).contains("schema_version 7"));
}

/// Version 1 tables (no `method`) read as all-fused; a composite entry round-trips and is
/// written only where it is not `Fused`.
#[test]
fn version_1_reads_as_fused_and_methods_round_trip() {
    let v1 = sample().to_ron_string().replace("schema_version: 5,", "schema_version: 1,");
    let t = Table::from_ron_str(&v1, "old.ron").unwrap();
    assert_eq!(t.schema_version, TABLE_SCHEMA_VERSION);
    assert!(t.entries.iter().all(|e| e.method == Method::Fused));
    let mut t = sample();
    t.entries[2].method = Method::DequantCublasBf16;
    let text = t.to_ron_string();
    assert_eq!(text.matches("method: DequantCublasBf16").count(), 1, "{text}");
    assert!(!text.contains("method: Fused"), "{text}");
    let back = Table::from_ron_str(&text, "t.ron").unwrap();
    let m256 = back.entries.iter().find(|e| e.key.m == 256).unwrap();
    assert_eq!(m256.method, Method::DequantCublasBf16);
    // An unknown method is a syntax error naming the file; a method in a version 1 file is
    // refused.
    let e = err(&text.replace("DequantCublasBf16", "Magic"));
    assert!(e.contains("results/h200.ron"), "{e}");
    let e = err(&text.replace("schema_version: 5,", "schema_version: 1,"));
    assert!(e.contains("needs schema_version 2"), "{e}");
}

pub(crate) fn with_moe() -> Table {
    let mut t = sample();
    let shape = MoeShape::GLM5_TP8;
    let config = crate::moe::space::search_space(MoeOp::Down, &shape)[0];
    t.moe_template_hash = Some(crate::moe::templates::template_hash());
    t.moe.push(MoeEntry {
        key: MoeKey {
            op: MoeOp::Down,
            family: Family::Sm90,
            a_type: AType::Bf16,
            n: 6144,
            k: 256,
            experts: 256,
            top_k: 8,
            tokens: 64,
        },
        config,
        median_us: 80.0,
        interval_us: (79.0, 81.0),
        skewed_us: 70.0,
        routing_seed: 7,
        roofline_fraction: 0.58,
        experts_total: Some(256),
    });
    t
}

#[test]
fn the_campaign_block_round_trips_and_needs_version_4() {
    let mut t = sample();
    t.campaign = Some(Campaign {
        wall_s: 181.5,
        gemm_wall_s: 120.25,
        moe_wall_s: Some(61.25),
        cache: Campaign::cache_label(0, 812).into(),
        kernels_cached: 0,
        kernels_compiled: 812,
        screened: 9000,
        timed: 700,
        strategy: "race".into(),
        budget: "pool 8%".into(),
        time_budget_s: Some(300.0),
        short_keys: vec![t.entries[0].key.clone()],
        gpus: vec![0, 1],
        shards: vec!["3/8".into()],
    });
    let text = t.to_ron_string();
    let back = Table::from_ron_str(&text, "t.ron").unwrap();
    assert_eq!(back.campaign, t.campaign);
    // A one-GPU campaign's block has neither field; older tables read without them.
    let mut c = t.campaign.clone().unwrap();
    (c.gpus, c.shards) = (Vec::new(), Vec::new());
    t.campaign = Some(c);
    let plain = t.to_ron_string();
    assert!(!plain.contains("gpus") && !plain.contains("shards"), "{plain}");
    assert_eq!(Table::from_ron_str(&plain, "t.ron").unwrap().campaign, t.campaign);
    assert_eq!(Campaign::cache_label(812, 0), "warm");
    assert_eq!(Campaign::cache_label(0, 40), "cold");
    assert_eq!(Campaign::cache_label(0, 0), "not counted");
    assert_eq!(Campaign::cache_label(3, 2), "partial");
    let old = text.replace("schema_version: 5", "schema_version: 3");
    let e = Table::from_ron_str(&old, "old.ron").unwrap_err().to_string();
    assert!(e.contains("old.ron") && e.contains("campaign"), "{e}");
}

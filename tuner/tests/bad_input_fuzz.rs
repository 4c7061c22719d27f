//! Mutated real inputs against the parsers (a seeded property test, no GPU): committed dispatch
//! tables (`results/*.ron`), the GLM-5 shape file, the head of a committed measurement log and
//! the config.json fixtures, each mutated at random (bytes flipped, ranges cut or doubled, hostile
//! numbers and tokens spliced in, truncation). Every case must end in a value or an error that
//! names its file, without a panic and within a time bound.

use fp4tune::shapes::{HfMoeConfig, Parallelism, ShapeError, ShapeFile};
use fp4tune::table::{MismatchPolicy, Table};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Cases per kind of input (tables, shape files, logs, configs).
const CASES_PER_KIND: usize = 1500;
/// No single case may take longer than this (a hang, or work that grows with a hostile number).
const CASE_LIMIT: Duration = Duration::from_secs(5);

const TOKENS: &[&str] = &[
    "4294967295",
    "4294967296",
    "2147483648",
    "536870928",
    "67108866",
    "-1",
    "0",
    "0.0",
    "1e-9",
    "1e309",
    "NaN",
    "inf",
    "null",
    "99999999999999999999999",
    "\u{feff}",
    "{",
    "}",
    "[",
    "]",
    "(",
    ")",
    ",",
    ":",
    "\"",
    "\\",
    "\n",
    "Some(",
    "None",
    "Sm120",
    "Nvfp4",
    "DequantCublasBf16",
    "Registers",
    "é",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn mutate(rng: &mut StdRng, input: &[u8]) -> Vec<u8> {
    let mut b = input.to_vec();
    for _ in 0..rng.random_range(1..=4) {
        let len = b.len();
        let at = if len == 0 { 0 } else { rng.random_range(0..len) };
        match rng.random_range(0..7) {
            0 if len > 0 => b[at] = rng.random_range(0x20..0x7f),
            1 if len > 0 => b[at] = rng.random(),
            2 if len > 0 => {
                let end = (at + rng.random_range(1..32)).min(len);
                b.drain(at..end);
            }
            3 if len > 0 => {
                let end = (at + rng.random_range(1..64)).min(len);
                let part = b[at..end].to_vec();
                b.splice(at..at, part);
            }
            4 => {
                // Replace the number that starts at or after `at` with a hostile token.
                let start = (at..len).find(|&i| b[i].is_ascii_digit()).unwrap_or(at);
                let end = (start..len).find(|&i| !b[i].is_ascii_digit()).unwrap_or(len);
                let t = TOKENS[rng.random_range(0..10)];
                b.splice(start..end, t.bytes());
            }
            5 => {
                let t = TOKENS[rng.random_range(0..TOKENS.len())];
                b.splice(at..at, t.bytes());
            }
            _ => b.truncate(at),
        }
    }
    b
}

/// The first `n` records of the smallest committed measurement log (of GEMM records: other
/// logs under results/h200, the grouped MoE one, have another format).
fn log_head(n: usize) -> Vec<u8> {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(root().join("results/h200"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    logs.retain(|p| p.to_string_lossy().contains(".jsonl"));
    logs.sort_by_key(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(u64::MAX));
    let records = logs
        .iter()
        .find_map(|p| fp4tune::tune::log::read(p).ok().filter(|r| !r.is_empty()))
        .expect("a committed measurement log under results/h200");
    let mut out = Vec::new();
    for r in records.iter().take(n) {
        out.extend(serde_json::to_vec(r).unwrap());
        out.push(b'\n');
    }
    out
}

fn files(dir: &Path, ext: &str) -> Vec<Vec<u8>> {
    let mut out: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .map(|p| (p.clone(), std::fs::read(&p).unwrap()))
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no *.{ext} under {}", dir.display());
    out.into_iter().map(|(_, b)| b).collect()
}

/// Parse `bytes` as `kind`; `Err` carries the error message. Panics propagate.
fn parse(kind: usize, bytes: &[u8], origin: &str) -> Result<(), String> {
    let text = String::from_utf8_lossy(bytes);
    match kind {
        0 => {
            let t = Table::from_ron_str(&text, origin).map_err(|e| e.to_string())?;
            // Grouped MoE entries a change under templates/moe/ left stale are the Warn policy's
            // warning until they are re-tuned on a GPU; every family's hash must match.
            let check =
                t.check_templates(MismatchPolicy::Warn, origin).map_err(|e| e.to_string())?;
            if !check.disabled.is_empty() {
                return Err(format!("{origin}: stale template hashes of {:?}", check.disabled));
            }
            let _ = t.to_ron_string();
            Ok(())
        }
        1 => ShapeFile::from_ron_str(&text, origin).map(|_| ()).map_err(|e| e.to_string()),
        2 => fp4tune::tune::log::parse_log(bytes, Path::new(origin))
            .map(|_| ())
            .map_err(|e| e.to_string()),
        _ => {
            let c = HfMoeConfig::from_json(&text, origin).map_err(|e| e.to_string())?;
            // Every parallelism derives or is refused with an error; a config passes when one of
            // them derives (GLM-4.5-Air's dense layer does not split into NVFP4 blocks over 8
            // GPUs, its EP8 set derives).
            let sets: Vec<_> = [Parallelism::new(8, 1), Parallelism::new(8, 8)]
                .into_iter()
                .map(|p| c.shape_file(&[p], &[1, 8, 64]).map_err(|e| e.to_string()))
                .collect();
            if sets.iter().all(Result::is_err) {
                return Err(sets.into_iter().find_map(Result::err).unwrap_or_default());
            }
            Ok(())
        }
    }
}

/// The config.json fixtures unmutated: every one derives at TP 8 and at EP 8, except
/// GLM-4.5-Air at TP 8, refused for its dense layer (the fuzz below accepts a config when either
/// derives).
#[test]
fn config_fixtures_derive_at_tp8_and_ep8() {
    let dir = root().join("tuner/testdata");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let config = HfMoeConfig::load(&path).unwrap();
        let air = path.file_name().is_some_and(|n| n == "glm-4.5-air-config.json");
        for p in [Parallelism::new(8, 1), Parallelism::new(8, 8)] {
            match config.shape_file(&[p], &[1]) {
                Ok(_) => assert!(!(air && p.ep == 1), "{}: TP 8 derived", path.display()),
                Err(ShapeError::DenseLayers { .. }) if air && p.ep == 1 => {}
                Err(e) => panic!("{}: {p:?}: {e}", path.display()),
            }
        }
        seen += 1;
    }
    assert!(seen >= 5, "{seen} fixtures");
}

#[test]
fn mutated_tables_shapes_logs_and_configs_6000_cases_never_panic_hang_or_lose_their_file() {
    let inputs: [Vec<Vec<u8>>; 4] = [
        files(&root().join("results"), "ron"),
        vec![std::fs::read(root().join("shapes/glm5.ron")).unwrap()],
        vec![log_head(24)],
        files(&root().join("tuner/testdata"), "json"),
    ];
    let names = ["table", "shape file", "log", "config.json"];
    let origins =
        ["fuzz/table-x.ron", "fuzz/shapes-x.ron", "fuzz/log-x.jsonl", "fuzz/config-x.json"];
    let mut rng = StdRng::seed_from_u64(0x005e_edf4_2026);
    let mut total = 0;
    for kind in 0..4 {
        // The unmutated inputs parse.
        for input in &inputs[kind] {
            parse(kind, input, origins[kind]).unwrap_or_else(|e| panic!("{}: {e}", names[kind]));
        }
        let (mut ok, mut refused) = (0, 0);
        for case in 0..CASES_PER_KIND {
            let input = &inputs[kind][rng.random_range(0..inputs[kind].len())];
            let bytes = mutate(&mut rng, input);
            let t0 = Instant::now();
            let result = std::panic::catch_unwind(|| parse(kind, &bytes, origins[kind]));
            let took = t0.elapsed();
            let shown = || String::from_utf8_lossy(&bytes[..bytes.len().min(2000)]).into_owned();
            match result {
                Err(_) => panic!("{} case {case} panicked on:\n{}", names[kind], shown()),
                Ok(Ok(())) => ok += 1,
                Ok(Err(msg)) => {
                    assert!(
                        msg.contains(origins[kind]),
                        "{} case {case}: the error does not name the file: {msg}\ninput:\n{}",
                        names[kind],
                        shown()
                    );
                    refused += 1;
                }
            }
            assert!(took < CASE_LIMIT, "{} case {case} took {took:?}:\n{}", names[kind], shown());
            total += 1;
        }
        eprintln!(
            "{}: {CASES_PER_KIND} mutated cases, {ok} parsed, {refused} refused",
            names[kind]
        );
    }
    assert_eq!(total, 4 * CASES_PER_KIND);
    eprintln!("{total} mutated cases in all: no panic, no hang, every error names its file");
}

//! The command line's outputs: a failed command keeps the files it was given, writes through links
//! land in their targets, a closed or full standard output loses nothing and ends in one line, and
//! `compile --emit` writes every rendered source or none.

mod common;

use common::{assert_clean_error, fp4tune, record_line, run};
use std::path::Path;
use std::process::Command;

/// `merge --out LINK` writes the link's target and keeps the link; a log whose last record was
/// cut right after an inner `}` (no newline) still merges.
#[cfg(unix)]
#[test]
fn merge_writes_through_links_and_reads_torn_logs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let record = |m: u32| record_line(m, None);
    let last = record(2);
    let cut = last.find('}').unwrap() + 1;
    let log = d.join("shard.jsonl");
    std::fs::write(&log, format!("{}\n{}", record(1), &last[..cut])).unwrap();
    let real = d.join("real.jsonl");
    let link = d.join("link.jsonl");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let (ok, err) =
        run(&fp4tune(), &["merge", log.to_str().unwrap(), "--out", link.to_str().unwrap()], d);
    assert!(ok, "{err}");
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert_eq!(fp4tune::tune::log::read(&real).unwrap().len(), 1);
}

/// A standard output closed by its reader (`| head -1`) neither panics nor
/// loses work: merge writes its log and table before it prints, and the command ends quietly
/// with 141 (what a shell reports for a program SIGPIPE ended).
#[test]
fn a_closed_stdout_ends_quietly_after_the_files_are_written() {
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let log =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/h200/nvidia-h200-w4a16.jsonl.gz");
    let closed = |args: &[&str]| {
        let mut child = Command::new(fp4tune())
            .args(args)
            .current_dir(d)
            .env_remove("RUST_BACKTRACE")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary runs");
        // The reader goes away before the command prints anything.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) =
        closed(&["merge", log.to_str().unwrap(), "--out", "m.jsonl", "--table", "t.ron"]);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(code, Some(141), "{err}");
    assert!(err.is_empty(), "a closed pipe ends quietly: {err}");
    let table = fp4tune::table::Table::load(&d.join("t.ron")).unwrap();
    assert!(!table.entries.is_empty());
    assert!(!fp4tune::tune::log::read(&d.join("m.jsonl")).unwrap().is_empty());

    let (code, err) = closed(&["compile", "--arch", "sm_90a", "--configs", "seeds", "--emit", "e"]);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(code, Some(141), "{err}");
    assert!(std::fs::read_dir(d.join("e")).unwrap().count() > 0);
}

/// Any other write error on standard output (a full disk) is a one-line error
/// and exit status 1, not a panic.
#[test]
fn a_full_stdout_is_a_one_line_error() {
    let full = Path::new("/dev/full");
    if !full.exists() {
        eprintln!("SKIPPED: no /dev/full on this system");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.json");
    std::fs::write(
        &cfg,
        r#"{"model_type": "qwen3_moe", "hidden_size": 2048, "moe_intermediate_size": 768,
            "intermediate_size": 6144, "num_experts": 128, "num_experts_per_tok": 8,
            "num_hidden_layers": 48}"#,
    )
    .unwrap();
    // the command's output with its standard output on the full device
    let into_full = |args: &[&str]| {
        Command::new(fp4tune())
            .args(args)
            .env_remove("RUST_BACKTRACE")
            .stdout(std::fs::OpenOptions::new().write(true).open(full).unwrap())
            .output()
            .unwrap()
    };
    let out = into_full(&["shapes", "--from-config", cfg.to_str().unwrap(), "--tp", "8"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_clean_error(false, &err, &["writing to standard output", "os error 28"]);
    assert_eq!(err.lines().count(), 1, "{err}");
    // Help and version too: printed by the argument parser, checked all the same.
    for args in [&["--help"][..], &["--version"], &["tune", "--help"], &["help", "bench"]] {
        let out = into_full(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert_clean_error(false, &err, &["writing to standard output", "os error 28"]);
        assert_eq!(err.lines().count(), 1, "{err}");
        let ok = Command::new(fp4tune()).args(args).output().unwrap();
        assert!(ok.status.success() && !ok.stdout.is_empty(), "{args:?}");
    }
    // selftest and check keep their exit status (their result) and say the lines were lost
    let dir = tempfile::tempdir().unwrap();
    for args in [&["selftest"][..], &["check", "--table", "../results/nvidia-h200.ron", "--out"]] {
        let mut args = args.to_vec();
        let out_dir = dir.path().join("ck");
        if args[0] == "check" {
            args.push(out_dir.to_str().unwrap());
        }
        let out = into_full(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        let plain = Command::new(fp4tune()).args(&args).output().unwrap();
        assert_eq!(out.status.code(), plain.status.code(), "{args:?}: {err}");
        assert!(err.contains("the report lines are lost") && !err.contains("panicked"), "{err}");
    }
}

/// A command that fails keeps what it was given: merge refuses records that make no valid
/// table before it writes its log (the old `--out` stays), names a misspelled log among real
/// ones, and check refuses an `--out` that would replace its own `--baseline`.
#[test]
fn failed_commands_keep_what_they_were_given() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // a committed record with its measurement context, its N made impossible for its kernel
    let results = Path::new(env!("CARGO_MANIFEST_DIR")).join("../results");
    let logged =
        fp4tune::tune::log::read(&results.join("h200/nvidia-h200-w4a16.jsonl.gz")).unwrap();
    let mut bad = logged.into_iter().find(|r| r.context.is_some()).unwrap();
    let with_context = serde_json::to_string(&bad).unwrap() + "\n";
    bad.key.n = 4_294_967_288;
    std::fs::write(d.join("bad.jsonl"), serde_json::to_string(&bad).unwrap() + "\n").unwrap();
    std::fs::write(d.join("keep.jsonl"), "PRECIOUS\n").unwrap();
    let (ok, err) =
        run(&fp4tune(), &["merge", "bad.jsonl", "--out", "keep.jsonl", "--table", "keep.ron"], d);
    assert_clean_error(ok, &err, &["merged from bad.jsonl", "N=4294967288"]);
    assert_eq!(std::fs::read_to_string(d.join("keep.jsonl")).unwrap(), "PRECIOUS\n");
    assert!(!d.join("keep.ron").exists());
    std::fs::write(d.join("good.jsonl"), format!("{}\n", record_line(1, None))).unwrap();
    let (ok, err) = run(&fp4tune(), &["merge", "good.jsonl", "typo.jsonl", "--out", "m.jsonl"], d);
    assert_clean_error(ok, &err, &["typo.jsonl", "no such file"]);
    assert!(!d.join("m.jsonl").exists());
    let ck = d.join("ck");
    std::fs::create_dir(&ck).unwrap();
    let base =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/h200/check-aa.json"))
            .unwrap();
    std::fs::write(ck.join("check.json"), &base).unwrap();
    let table = Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/nvidia-h200.ron");
    let out = Command::new(fp4tune())
        .args(["check", "--table", table.to_str().unwrap(), "--baseline", "ck/check.json"])
        .args(["--out", "ck"])
        .current_dir(d)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("would replace the baseline ck/check.json"), "{err}");
    assert_eq!(std::fs::read(ck.join("check.json")).unwrap(), base);
    assert!(!ck.join("check.md").exists());
    // A check that cannot run (no GPU here; on a GPU machine, the dispatch table of another
    // GPU) keeps the earlier report of its folder.
    let out = Command::new(fp4tune())
        .args(["check", "--table", table.to_str().unwrap(), "--out", "ck"])
        .env("FP4TUNE_CACHE", d.join("cubin"))
        .current_dir(d)
        .output()
        .unwrap();
    let (stdout, err) =
        (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.code() == Some(2) {
        assert!(stdout.contains("kept the earlier report in ck"), "{stdout}{err}");
        assert_eq!(std::fs::read(ck.join("check.json")).unwrap(), base);
        assert!(!ck.join("check.md").exists());
    } else {
        eprintln!("SKIPPED (this machine can check the H200 table): the kept report");
    }

    // merge: a table that cannot be written leaves the old log; outputs that name one file, or
    // a log being merged, are refused before anything is written.
    std::fs::create_dir(d.join("folder.ron")).unwrap();
    std::fs::write(d.join("ctx.jsonl"), &with_context).unwrap();
    let (ok, err) =
        run(&fp4tune(), &["merge", "ctx.jsonl", "--out", "keep.jsonl", "--table", "folder.ron"], d);
    assert_clean_error(ok, &err, &["folder.ron is not a regular file"]);
    assert_eq!(std::fs::read_to_string(d.join("keep.jsonl")).unwrap(), "PRECIOUS\n");
    let (ok, err) =
        run(&fp4tune(), &["merge", "good.jsonl", "--out", "same.x", "--table", "./same.x"], d);
    assert_clean_error(ok, &err, &["are the same file"]);
    assert!(!d.join("same.x").exists());
    let good = std::fs::read(d.join("good.jsonl")).unwrap();
    for flag in ["--out", "--table"] {
        let mut args = vec!["merge", "good.jsonl", "--out", "m2.jsonl"];
        if flag == "--out" {
            args[3] = "sub/../good.jsonl";
            std::fs::create_dir_all(d.join("sub")).unwrap();
        } else {
            args.extend(["--table", "good.jsonl"]);
        }
        let (ok, err) = run(&fp4tune(), &args, d);
        assert_clean_error(ok, &err, &[flag, "is the log good.jsonl being merged"]);
        assert_eq!(std::fs::read(d.join("good.jsonl")).unwrap(), good);
    }
    // a hard link to the log
    std::fs::hard_link(d.join("good.jsonl"), d.join("hard.jsonl")).unwrap();
    let (ok, err) = run(&fp4tune(), &["merge", "good.jsonl", "--out", "hard.jsonl"], d);
    assert_clean_error(ok, &err, &["--out hard.jsonl is the log good.jsonl being merged"]);
    assert_eq!(std::fs::read(d.join("good.jsonl")).unwrap(), good);
    // through a folder the merge would create
    let (ok, err) = run(
        &fp4tune(),
        &["merge", "good.jsonl", "--out", "m3.jsonl", "--table", "missing/../good.jsonl"],
        d,
    );
    assert_clean_error(ok, &err, &["--table", "is the log good.jsonl being merged"]);
    assert_eq!(std::fs::read(d.join("good.jsonl")).unwrap(), good);
    assert!(!d.join("missing").exists());

    // bench --moe --render of a CSV without rows keeps the report it would replace.
    std::fs::create_dir(d.join("bench")).unwrap();
    let md = std::fs::read(results.join("h200/bench-moe.md")).unwrap();
    std::fs::write(d.join("bench/bench-moe.md"), &md).unwrap();
    std::fs::write(d.join("header.csv"), format!("{}\n", fp4tune::bench::moe_report::CSV_HEADER))
        .unwrap();
    let (ok, err) =
        run(&fp4tune(), &["bench", "--moe", "--render", "header.csv", "--out", "bench"], d);
    assert_clean_error(ok, &err, &["header.csv", "holds no fp4tune rows"]);
    assert_eq!(std::fs::read(d.join("bench/bench-moe.md")).unwrap(), md);
}

/// `compile --emit DIR` writes the rendered source of each chosen configuration, byte for byte
/// what the library renders, without NVRTC.
#[test]
fn compile_emit_writes_the_rendered_sources() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("emit");
    let (ok, err) = run(
        &fp4tune(),
        &["compile", "--arch", "sm_90a", "--configs", "seeds", "--emit", out.to_str().unwrap()],
        dir.path(),
    );
    assert!(ok, "{err}");
    let mut expected = std::collections::HashSet::new();
    let family = fp4tune::template::Family::Sm90;
    let layer = fp4tune::moe::MoeShape::GLM5_TP8;
    for a_type in [fp4tune::problem::AType::Bf16, fp4tune::problem::AType::Nvfp4] {
        let mut configs = vec![fp4tune::template::default_config(family, a_type)];
        configs.extend(fp4tune::template::measured_seeds(family, a_type));
        let mut sources: Vec<_> = configs.iter().map(|c| c.render().unwrap()).collect();
        // the grouped seeds of the embedded GLM-5 TP8 layer
        for op in fp4tune::moe::MoeOp::ALL {
            for c in fp4tune::moe::seeds::measured_seeds(family, a_type, op) {
                if c.check(&layer).is_ok() {
                    sources.push(c.source());
                }
            }
        }
        for src in sources {
            let written = std::fs::read_to_string(out.join(format!("{}.cu", src.kernel_name)))
                .unwrap_or_else(|e| panic!("{}: {e}", src.kernel_name));
            assert_eq!(written, src.code);
            expected.insert(src.kernel_name);
        }
    }
    assert!(expected.iter().any(|k| k.contains("moe_gate_up")), "{expected:?}");
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), expected.len());
    // --ops gemm: the GEMM kernels alone
    let gemm_only = dir.path().join("gemm");
    let (ok, err) = run(
        &fp4tune(),
        &[
            "compile",
            "--arch",
            "sm_90a",
            "--configs",
            "seeds",
            "--ops",
            "gemm",
            "--emit",
            gemm_only.to_str().unwrap(),
        ],
        dir.path(),
    );
    assert!(ok, "{err}");
    let names: Vec<String> = std::fs::read_dir(&gemm_only)
        .unwrap()
        .map(|f| f.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.is_empty() && names.iter().all(|n| !n.contains("moe")), "{names:?}");
}

/// `compile --emit` writes every kernel source or none: a folder in the way of one of them is a
/// one-line error naming it, and no other source is written.
#[test]
fn compile_emit_is_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let args = |out: &str| {
        ["compile", "--arch", "sm_90a", "--configs", "seeds", "--emit", out].map(String::from)
    };
    let out = Command::new(fp4tune()).args(args("all")).current_dir(d).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let names: Vec<_> =
        std::fs::read_dir(d.join("all")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(names.len() > 10, "{names:?}");
    std::fs::create_dir_all(d.join("some").join(&names[names.len() / 2])).unwrap();
    let (ok, err) = run(&fp4tune(), &args("some").each_ref().map(String::as_str), d);
    assert_clean_error(ok, &err, &["writing the kernel sources into", "is not a regular file"]);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(std::fs::read_dir(d.join("some")).unwrap().count(), 1, "nothing else written");
}

/// `report` never writes a figure over one of its inputs, and two inputs that would make one
/// figure are named, not merged or overwritten.
#[test]
fn report_keeps_its_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let results = Path::new(env!("CARGO_MANIFEST_DIR")).join("../results");
    std::fs::create_dir(d.join("f")).unwrap();
    let csv = std::fs::read(results.join("h200/bench-w4a16.csv")).unwrap();
    let disguised = d.join("f/time-vs-m-n512-k6144-w4a16.svg");
    std::fs::write(&disguised, &csv).unwrap();
    let (ok, err) = run(
        &fp4tune(),
        &["report", "--out", "f", "--bench", "f/time-vs-m-n512-k6144-w4a16.svg"],
        d,
    );
    assert_clean_error(ok, &err, &["would replace the input", "time-vs-m-n512-k6144-w4a16.svg"]);
    assert_eq!(std::fs::read(&disguised).unwrap(), csv, "the input is intact");
    // one input twice
    let bench = results.join("h200/bench-w4a16.csv");
    let b = bench.to_str().unwrap();
    let (ok, err) = run(&fp4tune(), &["report", "--out", "t", "--bench", b, "--bench", b], d);
    assert_clean_error(ok, &err, &["given twice"]);
    // two bench-moe CSVs of different layers under one set name
    let glm = results.join("h200/bench-moe.csv");
    let qwen = results.join("h200/heldout-qwen3-30b-a3b-tp8/bench-moe.csv");
    let (ok, err) = run(
        &fp4tune(),
        &["report", "--out", "g", "--bench", glm.to_str().unwrap(), qwen.to_str().unwrap()],
        d,
    );
    assert_clean_error(ok, &err, &["for different layers", "heldout-qwen3-30b-a3b-tp8"]);
    assert!(!d.join("g").exists() || std::fs::read_dir(d.join("g")).unwrap().count() == 0);
    // two logs of one name
    let log = results.join("h200/nvidia-h200-w4a16.jsonl.gz");
    let other = results.join("h200/heldout-qwen3-30b-a3b-tp8/nvidia-h200-w4a16.jsonl.gz");
    assert!(other.exists(), "{}", other.display());
    {
        let (ok, err) = run(
            &fp4tune(),
            &[
                "report",
                "--out",
                "h",
                "--log",
                log.to_str().unwrap(),
                "--log",
                other.to_str().unwrap(),
            ],
            d,
        );
        assert_clean_error(ok, &err, &["both make the figure search-nvidia-h200-w4a16"]);
    }
}

/// `merge` of a sharded campaign writes neither over a shard's manifest nor over the partial
/// table a manifest names; that table missing is said, and one of another GPU is refused.
#[test]
fn merge_keeps_the_campaigns_manifests_and_partial_tables() {
    use fp4tune::tune::shard::{Manifest, Shard, MANIFEST_SCHEMA_VERSION};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let results = Path::new(env!("CARGO_MANIFEST_DIR")).join("../results");
    let table = fp4tune::table::Table::load(&results.join("nvidia-h200.ron")).unwrap();
    // two timed records of the committed tune, with their measurement context
    let log = fp4tune::tune::log::read(&results.join("h200/nvidia-h200-w4a16.jsonl.gz")).unwrap();
    let mut records: Vec<fp4tune::tune::log::Record> = Vec::new();
    for r in log.into_iter().filter(|r| r.context.is_some() && r.method.is_fused()) {
        if matches!(r.outcome, fp4tune::tune::log::Outcome::Timed { .. })
            && !records.iter().any(|x| x.key == r.key)
        {
            records.push(r);
        }
        if records.len() == 2 {
            break;
        }
    }
    let keys: Vec<_> = records.iter().map(|r| r.key.clone()).collect();
    let camp = d.join("camp");
    for (i, r) in records.iter().enumerate() {
        let s = Shard { index: i as u32, count: 2 };
        let log = camp.join(s.file_name("nvidia-h200-w4a16", "jsonl"));
        fp4tune::fsio::create_parent_dir(&log).unwrap();
        std::fs::write(&log, format!("{}\n", serde_json::to_string(r).unwrap())).unwrap();
        Manifest {
            schema_version: MANIFEST_SCHEMA_VERSION,
            shard: s,
            device: r.device.clone(),
            compute_capability: r.compute_capability,
            template_hash: r.template_hash.clone(),
            campaign_keys: keys.clone(),
            keys: vec![r.key.clone()],
            finished: true,
            table: s.file_name("nvidia-h200", "ron"),
        }
        .save(&Manifest::path_of_log(&log))
        .unwrap();
    }
    let manifest = camp.join("nvidia-h200-w4a16.shard-1-of-2.manifest.json");
    let partial = camp.join("nvidia-h200.shard-0-of-2.ron");
    let kept = std::fs::read(&manifest).unwrap();
    for (flag, target) in [("--out", &manifest), ("--table", &partial)] {
        std::fs::write(&partial, table.to_ron_string()).unwrap();
        let before = std::fs::read(&partial).unwrap();
        let mut args = vec!["merge", "camp", "--out", "o.jsonl", "--table", "o.ron"];
        let at = if flag == "--out" { 3 } else { 5 };
        args[at] = target.to_str().unwrap();
        let (ok, err) = run(&fp4tune(), &args, d);
        assert_clean_error(ok, &err, &["an input of the merge", flag]);
        assert_eq!(std::fs::read(&manifest).unwrap(), kept);
        assert_eq!(std::fs::read(&partial).unwrap(), before);
    }
    // shard 0's partial table of another GPU is refused; missing, it is said
    let h100 = std::fs::read_to_string(results.join("nvidia-h100-80gb-hbm3.ron")).unwrap();
    std::fs::write(&partial, h100).unwrap();
    let (ok, err) = run(&fp4tune(), &["merge", "camp", "--out", "o.jsonl", "--table", "o.ron"], d);
    assert_clean_error(ok, &err, &["nvidia-h200.shard-0-of-2.ron", "H100", "not of the merged"]);
    assert!(!d.join("o.ron").exists());
    // shard 0's own partial table: its grouped entries join the merged table
    let (mut own, _) = fp4tune::tune::emit::dispatch_table(
        &records,
        &fp4tune::tune::select::SelectRules::default(),
    )
    .unwrap();
    own.moe = table.moe.clone();
    own.moe_template_hash = table.moe_template_hash.clone();
    own.save(&partial).unwrap();
    let (ok, err) = run(&fp4tune(), &["merge", "camp", "--out", "o.jsonl", "--table", "o.ron"], d);
    assert!(ok, "{err}");
    let merged = fp4tune::table::Table::load(&d.join("o.ron")).unwrap();
    assert_eq!(merged.moe.len(), table.moe.len());
    assert!(!merged.moe.is_empty());
    std::fs::remove_file(&partial).unwrap();
    let out = Command::new(fp4tune())
        .args(["merge", "camp", "--out", "o.jsonl", "--table", "o.ron"])
        .current_dir(d)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("shard 0's partial table") && err.contains("is missing"), "{err}");
}

//! The command line on bad input: every failure names the file (or what is missing) and exits
//! non-zero with one clear message, never a panic.

mod common;

use common::{assert_clean_error, fp4tune, record_line, run};
use std::path::Path;
use std::process::Command;

#[test]
fn malformed_shape_file_table_and_config_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.ron");
    std::fs::write(&bad, "(schema_version: 1, model: ").unwrap();
    let b = bad.to_str().unwrap();
    let (ok, err) = run(&fp4tune(), &["tune", "--shapes", b], dir.path());
    assert_clean_error(ok, &err, &["bad.ron"]);
    let (ok, err) = run(&fp4tune(), &["bench", "--shapes", b], dir.path());
    assert_clean_error(ok, &err, &["bad.ron"]);
    let (ok, err) = run(&fp4tune(), &["table", "--check", b], dir.path());
    assert_clean_error(ok, &err, &["bad.ron"]);
    let (ok, err) = run(
        &fp4tune(),
        &["shapes", "--from-config", "missing-config.json", "--tp", "8"],
        dir.path(),
    );
    assert_clean_error(ok, &err, &["missing-config.json"]);
    let cfg = dir.path().join("config.json");
    std::fs::write(&cfg, r#"{"model_type": "not_a_moe"}"#).unwrap();
    let (ok, err) = run(
        &fp4tune(),
        &["shapes", "--from-config", cfg.to_str().unwrap(), "--tp", "8"],
        dir.path(),
    );
    assert_clean_error(ok, &err, &["config.json", "not_a_moe"]);
    let (ok, err) = run(&fp4tune(), &["merge", "nope.jsonl", "--out", "m.jsonl"], dir.path());
    assert_clean_error(ok, &err, &["nope.jsonl"]);
}

#[test]
fn a_missing_nvrtc_says_what_it_looked_for_and_how_to_install_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no/libnvrtc.so.13");
    let out = Command::new(fp4tune())
        .args(["compile", "--arch", "sm_120a"])
        .current_dir(dir.path())
        .env("FP4TUNE_NVRTC", &missing)
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_clean_error(
        out.status.success(),
        &err,
        &["NVRTC", "FP4TUNE_NVRTC", "no/libnvrtc.so.13", "fix:", "nvidia-cuda-nvrtc"],
    );
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");

    // A library that is not NVRTC (this process's C library) is named, not passed over for
    // another NVRTC.
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let Some(libc) = maps.split_whitespace().find(|w| w.contains("/libc.so")) else {
        eprintln!("SKIPPED: no C library path in /proc/self/maps");
        return;
    };
    let out = Command::new(fp4tune())
        .args(["compile", "--arch", "sm_90a", "--configs", "seeds"])
        .current_dir(dir.path())
        .env("FP4TUNE_NVRTC", libc)
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_clean_error(out.status.success(), &err, &[libc, "not NVRTC", "fix:"]);
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
}

#[test]
fn gpu_commands_without_a_gpu_fail_cleanly() {
    if Path::new("/dev/nvidiactl").exists() {
        eprintln!("SKIPPED: this machine has an NVIDIA GPU");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for args in [&["floors"][..], &["bench", "--m", "1"][..], &["tune", "--max-m", "1"][..]] {
        let (ok, err) = run(&fp4tune(), args, dir.path());
        assert_clean_error(ok, &err, &["CUDA driver"]);
    }
}

/// `compile --configs pools --ops moe` renders the grouped phase's first screens of the embedded
/// GLM-5 TP8 layer (what `tune` compiles ahead): sm120 W4A4 here, every kernel once.
#[test]
fn compile_pools_take_the_grouped_phase_first_screens() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pools");
    let (ok, err) = run(
        &fp4tune(),
        &[
            "compile",
            "--arch",
            "sm_120a",
            "--ops",
            "moe",
            "--configs",
            "pools",
            "--emit",
            out.to_str().unwrap(),
        ],
        dir.path(),
    );
    assert!(ok, "{err}");
    // the SMs of the sm120 data-sheet GPU, as `compile` takes them without a GPU
    let sms = fp4tune::search::DeviceModel::rtx_pro_6000_ws().sm_count;
    let spec = fp4tune::tune::moe::MoeTuneSpec::for_layer(
        fp4tune::moe::MoeShape::GLM5_TP8,
        fp4tune::problem::AType::Nvfp4,
        256,
        &[],
        sms,
    );
    let kernels: std::collections::HashSet<String> =
        fp4tune::tune::moe::first_pools(fp4tune::template::Family::Sm120, &spec)
            .iter()
            .map(|c| c.kernel_name())
            .collect();
    let written: std::collections::HashSet<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|f| f.unwrap().file_name().to_string_lossy().trim_end_matches(".cu").to_string())
        .collect();
    assert!(!kernels.is_empty());
    assert_eq!(written, kernels);
}

/// Bad input that could pass, hang, print an OS error twice or replace an output's link ends in
/// one clear error naming the file, or does the right thing.
#[test]
fn wrapping_configs_links_and_os_errors_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let results = Path::new(env!("CARGO_MANIFEST_DIR")).join("../results");

    // A table entry whose thread count and shared memory wrap in u32 is refused by `table --check`.
    let table = std::fs::read_to_string(results.join("nvidia-h200.ron")).unwrap();
    let start = table.find("config: (").unwrap();
    let end = start + table[start..].find("),").unwrap() + 1;
    let wrapped = "config: (family: Sm90, a_type: Bf16, block_m: 536870928, block_n: 16, \
                   block_k: 128, warps_m: 67108866, warps_n: 1, warps_k: 2, stages: 2, \
                   split_k: 1, swap_ab: false)";
    let bad = d.join("wrapped.ron");
    std::fs::write(&bad, format!("{}{wrapped}{}", &table[..start], &table[end..])).unwrap();
    let (ok, err) = run(&fp4tune(), &["table", "--check", bad.to_str().unwrap()], d);
    assert_clean_error(ok, &err, &["wrapped.ron", "block_m 536870928 is out of range"]);

    // num_hidden_layers 4294967295 with a long mlp_only_layers hung; now a bound, at once.
    let layers: Vec<String> = (0..100_000).map(|i| i.to_string()).collect();
    let cfg = d.join("config.json");
    std::fs::write(
        &cfg,
        format!(
            r#"{{"model_type": "qwen3_moe", "hidden_size": 2048, "moe_intermediate_size": 768,
                "intermediate_size": 6144, "num_experts": 128, "num_experts_per_tok": 8,
                "num_hidden_layers": 4294967295, "mlp_only_layers": [{}]}}"#,
            layers.join(",")
        ),
    )
    .unwrap();
    let t0 = std::time::Instant::now();
    let (ok, err) =
        run(&fp4tune(), &["shapes", "--from-config", cfg.to_str().unwrap(), "--tp", "8"], d);
    assert_clean_error(ok, &err, &["config.json", "num_hidden_layers", "at most 10000"]);
    assert!(t0.elapsed() < std::time::Duration::from_secs(20));

    // A folder where a file belongs: said once.
    let (ok, err) =
        run(&fp4tune(), &["shapes", "--from-config", d.to_str().unwrap(), "--tp", "8"], d);
    assert_clean_error(ok, &err, &["is a folder, not a file to read"]);
    assert_eq!(err.matches("is a folder").count(), 1, "{err}");

    // A dispatch table given as a shape file says so.
    let table_path = results.join("nvidia-h200.ron");
    let (ok, err) = run(&fp4tune(), &["tune", "--shapes", table_path.to_str().unwrap()], d);
    assert_clean_error(ok, &err, &["this is a dispatch table, not a shape file"]);
}

/// Inputs that could panic, hang or be read for ever: a template hash that is not ASCII, a time
/// budget no `Duration` holds, a bootstrap of 2^32 resamples, a device given as a table, a time of
/// 1e308 us (a log axis that never ends), a config key given twice, `--render` with options it
/// would ignore.
#[test]
fn hostile_hashes_budgets_devices_and_fields_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let table = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/nvidia-h200.ron"),
    )
    .unwrap();
    let hash_start = table.find("template_hashes: {Sm90: \"").unwrap() + 25;
    let hash_end = hash_start + table[hash_start..].find('"').unwrap();
    let euro = d.join("euro.ron");
    std::fs::write(
        &euro,
        format!(
            "{}aa\u{20ac}\u{20ac}\u{20ac}\u{20ac}\u{20ac}{}",
            &table[..hash_start],
            &table[hash_end..]
        ),
    )
    .unwrap();
    let out = Command::new(fp4tune())
        .args(["table", "--check", euro.to_str().unwrap()])
        .current_dir(d)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !err.contains("panicked"), "{err}");
    assert!(err.contains("table aa\u{20ac}\u{20ac}\u{20ac}\u{20ac}\u{20ac}"), "{err}");
    let status = Command::new(fp4tune())
        .args(["check", "--table", euro.to_str().unwrap(), "--out", "chk"])
        .current_dir(d)
        .output()
        .unwrap();
    assert_eq!(status.status.code(), Some(2), "{}", String::from_utf8_lossy(&status.stderr));
    assert!(d.join("chk/check.md").exists());

    let (ok, err) = run(&fp4tune(), &["tune", "--time-budget", "99999999999999999999m"], d);
    assert_clean_error(ok, &err, &["--time-budget", "at most a week"]);
    let (ok, err) = run(
        &fp4tune(),
        &["check", "--table", euro.to_str().unwrap(), "--resamples", "4294967296"],
        d,
    );
    assert_clean_error(ok, &err, &["--resamples", "100..=1000000"]);

    let (ok, err) = run(&fp4tune(), &["table", "--check", "/dev/zero"], d);
    assert_clean_error(ok, &err, &["/dev/zero", "is a device, not a file to read"]);

    let huge = d.join("huge.ron");
    let first = table.find("median_us: ").unwrap() + 11;
    let first_end = first + table[first..].find(',').unwrap();
    std::fs::write(&huge, format!("{}1e308{}", &table[..first], &table[first_end..])).unwrap();
    let (ok, err) =
        run(&fp4tune(), &["report", "--out", "figs", "--table", huge.to_str().unwrap()], d);
    assert_clean_error(ok, &err, &["huge.ron", "median 1e308 us"]);
    let csv = d.join("bench-w4a16.csv");
    std::fs::write(
        &csv,
        "shape,N,K,M,a_type,impl,median_us,roofline_us,read_floor_us\n\
         s,512,6144,1,w4a16,k,1e300,1,1\n",
    )
    .unwrap();
    let (ok, err) =
        run(&fp4tune(), &["report", "--out", "figs", "--bench", csv.to_str().unwrap()], d);
    assert_clean_error(ok, &err, &["bench-w4a16.csv:2", "`1e300` is not a time"]);

    let cfg = d.join("config.json");
    std::fs::write(&cfg, r#"{"model_type": "mixtral", "hidden_size": 6144, "hidden_size": 4096}"#)
        .unwrap();
    let (ok, err) =
        run(&fp4tune(), &["shapes", "--from-config", cfg.to_str().unwrap(), "--tp", "8"], d);
    assert_clean_error(ok, &err, &["config.json:1:", "key `hidden_size` appears twice"]);

    let (ok, err) = run(
        &fp4tune(),
        &["bench", "--moe", "--render", "x.csv", "--peers", "p.csv", "--out", "o"],
        d,
    );
    assert_clean_error(ok, &err, &["--render", "cannot be used with", "--peers"]);
}

/// `table --check` compares the template hashes with this build's without a
/// device: a foreign hash is a warning on standard error (and the entries' family named), an
/// error with `--strict`; a family listed twice is refused.
#[test]
fn table_check_compares_template_hashes_without_a_device() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let results = Path::new(env!("CARGO_MANIFEST_DIR")).join("../results");
    let table = std::fs::read_to_string(results.join("nvidia-h200.ron")).unwrap();
    let current = fp4tune::template::family_template_hash(fp4tune::template::Family::Sm90);
    assert!(table.contains(&current), "the committed table is stale: re-tune or update it");
    let foreign = d.join("foreign.ron");
    std::fs::write(&foreign, table.replace(&current, &"ab".repeat(32))).unwrap();
    let f = foreign.to_str().unwrap();

    let out = Command::new(fp4tune())
        .args(["table", "--check", f])
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    let (stdout, err) =
        (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{err}");
    let warning =
        err.lines().find(|l| l.starts_with("warning: ")).unwrap_or_else(|| panic!("{err}"));
    assert!(warning.contains("foreign.ron") && warning.contains("abababab"), "{warning}");
    // A change under templates/moe/ leaves the committed grouped entries stale until they are
    // re-tuned on a GPU: one more warning, and --strict refuses the committed table for it.
    let stale_moe = !table.contains(&fp4tune::moe::templates::template_hash());
    let warnings = if stale_moe { "2 warnings" } else { "1 warning" };
    assert!(stdout.contains(&format!("foreign.ron: ok, {warnings}")), "{stdout}");

    let (ok, err) = run(&fp4tune(), &["table", "--check", f, "--strict"], d);
    assert_clean_error(ok, &err, &["foreign.ron", "abababab"]);

    // The committed table itself is clean, strict or not (but for stale grouped entries).
    let committed = results.join("nvidia-h200.ron");
    let c = committed.to_str().unwrap();
    let (ok, err) = run(&fp4tune(), &["table", "--check", c, "--strict"], d);
    if stale_moe {
        assert_clean_error(ok, &err, &["nvidia-h200.ron", "grouped MoE template sources changed"]);
        let (ok, err) = run(&fp4tune(), &["table", "--check", c], d);
        assert!(ok && err.lines().all(|l| l.starts_with("warning: ")), "{err}");
    } else {
        assert!(ok && err.is_empty(), "{err}");
    }

    let twice = d.join("twice.ron");
    let line = format!("{{Sm90: \"{current}\"}}");
    std::fs::write(
        &twice,
        table.replace(&line, &format!("{{Sm90: \"{current}\", Sm90: \"{current}\"}}")),
    )
    .unwrap();
    let (ok, err) = run(&fp4tune(), &["table", "--check", twice.to_str().unwrap()], d);
    assert_clean_error(ok, &err, &["twice.ron", "listed twice"]);
}

/// `simulate` refuses a meaningless budget and a log it cannot replay
/// as one GPU model's measurements, naming the file and line; a torn last line is a warning.
#[test]
fn simulate_validates_its_budget_and_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let log = d.join("one.jsonl");
    std::fs::write(&log, format!("{}\n{}\n", record_line(1, None), record_line(2, None))).unwrap();
    let l = log.to_str().unwrap();
    for budget in ["0", "nan", "-0.5", "2"] {
        let budget = format!("--budget={budget}");
        let (ok, err) = run(&fp4tune(), &["simulate", "--log", l, &budget], d);
        assert_clean_error(ok, &err, &["budget"]);
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    let (ok, err) = run(&fp4tune(), &["simulate", "--log", l, "--budget", "0.5"], d);
    assert!(ok, "{err}");

    let mixed = d.join("mixed.jsonl");
    std::fs::write(
        &mixed,
        format!("{}\n{}\n", record_line(1, None), record_line(2, Some("NVIDIA B200"))),
    )
    .unwrap();
    let (ok, err) = run(&fp4tune(), &["simulate", "--log", mixed.to_str().unwrap()], d);
    assert_clean_error(ok, &err, &["mixed.jsonl:2", "NVIDIA B200"]);

    let torn = d.join("torn.jsonl");
    let last = record_line(2, None);
    std::fs::write(&torn, format!("{}\n{}", record_line(1, None), &last[..last.len() / 2]))
        .unwrap();
    let out = Command::new(fp4tune())
        .args(["simulate", "--log", torn.to_str().unwrap()])
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.starts_with("warning: ") && err.contains("torn.jsonl:2"), "{err}");
}

/// `compile` with nothing to compile says in words which filter left nothing and what the family
/// computes (not `the sm120 family has no variants for All`).
#[test]
fn compile_says_which_filter_left_no_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let shapes = d.join("tiny.ron");
    std::fs::write(
        &shapes,
        r#"(schema_version: 1, model: "tiny", source: "test", sets: [(name: "tp8",
            parallelism: (tp: 8, ep: 1), routing: (routed_experts: 8, experts_per_token: 2),
            shapes: [(name: "routed_gate_up", op: RoutedGateUp, n: 8, k: 16, count_per_layer: 1,
            layers: 1)], token_buckets: [1])])"#,
    )
    .unwrap();
    let s = shapes.to_str().unwrap();
    // K = 16 (one NVFP4 block): only the K-tail form runs it.
    let tail = d.join("tail");
    let t = tail.to_str().unwrap();
    let (ok, err) =
        run(&fp4tune(), &["compile", "--arch", "sm_120a", "--shapes", s, "--emit", t], d);
    assert!(ok, "{err}");
    let emitted: Vec<String> = std::fs::read_dir(&tail)
        .unwrap()
        .map(|f| f.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!emitted.is_empty() && emitted.iter().all(|n| n.contains("_kt")), "{emitted:?}");
    // A whole-tile kernel by name, then the shapes: the shapes leave none.
    let whole = fp4tune::template::default_config(
        fp4tune::template::Family::Sm120,
        fp4tune::problem::AType::Nvfp4,
    )
    .name();
    let e = d.join("emit");
    let e = e.to_str().unwrap();
    let (ok, err) = run(
        &fp4tune(),
        &["compile", "--arch", "sm_120a", "--names", &whole, "--shapes", s, "--emit", e],
        d,
    );
    assert_clean_error(
        ok,
        &err,
        &[
            "no sm120 kernel fits these filters (activations: all, --names ",
            "tiny.ron left none of the 1 variant",
            "sm120 computes W4A4 (nvfp4 activations) only",
        ],
    );
    assert!(!err.contains("All"), "{err}");
    let (ok, err) =
        run(&fp4tune(), &["compile", "--arch", "sm_120a", "--a-type", "w4a16", "--emit", e], d);
    assert_clean_error(
        ok,
        &err,
        &["no sm120 kernel computes W4A16 (bf16 activations): sm120 computes W4A4 (nvfp4 activations) only"],
    );
    // a name list with a typo among real names
    let seed = fp4tune::template::default_config(
        fp4tune::template::Family::Sm90,
        fp4tune::problem::AType::Bf16,
    )
    .name();
    let list = format!("{seed},bogus");
    let (ok, err) =
        run(&fp4tune(), &["compile", "--arch", "sm_90a", "--names", &list, "--emit", e], d);
    assert_clean_error(ok, &err, &["--names: no sm90 variant", "is named bogus"]);
    // tiny.ron has a routed gate_up but no down: no grouped layer
    let (ok, err) = run(
        &fp4tune(),
        &["compile", "--arch", "sm_120a", "--ops", "moe", "--shapes", s, "--emit", e],
        d,
    );
    assert_clean_error(ok, &err, &["no set of", "tiny.ron has a routed expert layer"]);
    let (ok, err) =
        run(&fp4tune(), &["compile", "--arch", "sm_90a", "--names", "nope", "--emit", e], d);
    assert_clean_error(ok, &err, &["(activations: all, --names nope): --names nope left none"]);
    assert!(!err.contains("computes"), "sm90 computes both: {err}");
    assert!(!Path::new(e).exists());
}

/// `compile` with a cache folder others can write says once that it is not
/// used, and compiles in memory.
#[cfg(unix)]
#[test]
fn compile_warns_once_about_a_shared_cache_folder() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let name = fp4tune::template::default_config(
        fp4tune::template::Family::Sm90,
        fp4tune::problem::AType::Bf16,
    )
    .name();
    let out = Command::new(fp4tune())
        .args(["compile", "--arch", "sm_90a", "--configs", "seeds", "--names", &name, "--cache"])
        .arg(&shared)
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let warnings: Vec<&str> = err.lines().filter(|l| l.starts_with("warning: ")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(warnings[0].contains("world-writable"), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("not used"));
    assert_eq!(std::fs::read_dir(&shared).unwrap().count(), 0);
}

/// `tune --shard auto` outside a scheduler, or with a bad variable, and a bad `--gpus` stop
/// with one line naming what is wrong, before any GPU is looked for.
#[test]
fn bad_shard_and_gpu_selections_are_one_line_errors() {
    let d = tempfile::tempdir().unwrap();
    let tune = |env: &[(&str, &str)], args: &[&str]| {
        let mut c = Command::new(fp4tune());
        c.arg("tune").args(args).current_dir(d.path()).env_remove("RUST_BACKTRACE");
        for v in [
            "SLURM_ARRAY_TASK_ID",
            "SLURM_ARRAY_TASK_COUNT",
            "SLURM_ARRAY_TASK_MIN",
            "SLURM_ARRAY_TASK_MAX",
            "JOB_COMPLETION_INDEX",
            "FP4TUNE_SHARD_COUNT",
        ] {
            c.env_remove(v);
        }
        c.envs(env.iter().copied());
        let out = c.output().expect("the binary runs");
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (ok, err) = tune(&[], &["--shard", "auto"]);
    assert_clean_error(ok, &err, &["SLURM_ARRAY_TASK_ID", "JOB_COMPLETION_INDEX"]);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    let (ok, err) = tune(
        &[("SLURM_ARRAY_TASK_ID", "9"), ("SLURM_ARRAY_TASK_COUNT", "8")],
        &["--shard", "auto"],
    );
    assert_clean_error(ok, &err, &["SLURM_ARRAY_TASK_ID=9", "not in 0..8"]);
    let (ok, err) = tune(&[("JOB_COMPLETION_INDEX", "1")], &["--shard", "auto"]);
    assert_clean_error(ok, &err, &["FP4TUNE_SHARD_COUNT is not set"]);
    let (ok, err) = tune(&[], &["--gpus", "0,0"]);
    assert!(!ok && err.contains("named twice"), "{err}");
}

/// A usage error (an unknown argument or subcommand, a value clap refuses, a missing value) is one
/// line with exit status 2; help and version still print in full on standard output.
#[test]
fn usage_errors_are_one_line() {
    let d = tempfile::tempdir().unwrap();
    for args in [
        &["tune", "--a-type", "foo"][..],
        &["tune", "--bogus"],
        &["bench", "--m"],
        &["nosuchcommand"],
        &["tune", "--gpus", "0,0"],
    ] {
        let out = Command::new(fp4tune())
            .args(args)
            .current_dir(d.path())
            .env_remove("RUST_BACKTRACE")
            .output()
            .expect("the binary runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(!err.contains("For more information"), "{err}");
    }
    let out = Command::new(fp4tune())
        .args(["tune", "--a-type", "foo"])
        .output()
        .expect("the binary runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("'foo'") && err.contains("w4a16"), "{err}");
    for args in [&["--help"][..], &["tune", "--help"], &["--version"]] {
        let out = Command::new(fp4tune()).args(args).output().expect("the binary runs");
        assert!(out.status.success(), "{args:?}");
        assert!(!out.stdout.is_empty() && out.stderr.is_empty(), "{args:?}");
    }
}

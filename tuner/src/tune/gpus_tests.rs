//! Several GPUs against scripted stand-ins for the GPU worker (no GPU needed): two fake GPUs
//! write one log in the one-GPU format and the same keys a one-GPU run tunes; a GPU whose worker
//! cannot come back costs its in-flight candidate and the other GPU finishes its keys; GPUs of
//! two models are refused; shards cover the campaign and merge into a one-run key set.
use super::*;
use crate::tune::fake_worker::install;
use crate::tune::planner::Planner;
use crate::tune::run::run;
use crate::tune::select::{select, SelectRules};

/// A worker per device: `NAMES` per ordinal; device `DIES` exits on its first candidate with
/// `stages == 3` and leaves `MARKER`, after which it cannot be opened again (a GPU gone).
const FAKE: &str = r#"
NAMES = {0: "Fake H200", 1: "Fake H200"}
DIES, MARKER = -1, "/nonexistent"
device = None
for line in sys.stdin:
    req = json.loads(line)
    if req == "Devices":
        send({"Devices": len(NAMES)})
    elif "Hello" in req:
        device = req["Hello"]["device"]
        if device == DIES and os.path.exists(MARKER):
            send({"Fatal": "GPU %d fell off the bus" % device})
            continue
        send(device_info(NAMES[device]))
    elif "Floors" in req:
        send({"Floors": {"bandwidth_gbps": 4400.0 + device, "tensor_peak_tflops": 880.0, "launch_floor_us": 0.6}})
    else:
        ev = req["Evaluate"]
        for c in ev["configs"]:
            send({"Running": {"config": c}})
            if device == DIES and c["stages"] == 3:
                open(MARKER, "w").close()
                sys.exit(3)
            t = 1.0 + c["block_n"] / 64.0 + c["split_k"] / 10.0 + ev["problem"]["m"] / 100.0
            s = {"n": 3, "median": t, "lo": t * 0.99, "hi": t * 1.01, "min": t * 0.98, "max": t * 1.02}
            send({"Result": {"config": c, "outcome": {"Timed": {"time": s, "samples": [t, t, t]}}}})
        send("Done")
"#;

fn configs() -> Vec<GemmConfig> {
    let base = template::default_config(Family::Sm90, AType::Bf16);
    [(64, 2, 1), (128, 2, 1), (64, 4, 1), (64, 3, 2), (64, 6, 1), (256, 2, 1)]
        .into_iter()
        .map(|(block_n, stages, split_k)| GemmConfig { block_n, stages, split_k, ..base })
        .collect()
}

/// Two weight shapes at two buckets each, every key the six `configs()`.
fn spec(exe: PathBuf, out: PathBuf) -> TuneSpec {
    TuneSpec {
        shapes: vec![(512, 6144), (6144, 256)],
        buckets: vec![1, 16],
        a_type: Some(AType::Bf16),
        policy: TimingPolicy::quick(),
        shard: Shard::all(),
        out_dir: out,
        exe,
        device: 0,
        candidate_timeout: Duration::from_secs(5),
        planner: Box::new(|_, _, _, _| Planner::exhaustive(configs())),
        batch: 16,
        precompile: false,
        composite_min_m: None,
        race: None,
        time_budget: None,
        ahead: Vec::new(),
    }
}

fn racing(exe: PathBuf, out: PathBuf) -> TuneSpec {
    let mut r = RaceSpec::default();
    r.options.min_pool = 24;
    r.options.pool_fraction = 0.005;
    TuneSpec { race: Some(r), ..spec(exe, out) }
}

/// What a log holds, without when or on which GPU's floors: (key, config, outcome label).
fn content(records: &[Record]) -> Vec<(TableKey, GemmConfig, &'static str)> {
    let mut v: Vec<_> =
        records.iter().map(|r| (r.key.clone(), r.config, r.outcome.label())).collect();
    v.sort();
    v
}

#[test]
fn two_gpus_write_one_log_like_one_gpu_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    let exe = install(dir.path(), FAKE);
    let compiler = Compiler::new(None).unwrap_or_else(|e| panic!("{e}"));
    let one = run(&racing(exe.clone(), dir.path().join("one")), &compiler, &|_| {}).unwrap();
    let shapes_of = std::cell::RefCell::new(std::collections::BTreeMap::new());
    let two = gpus::run(
        &racing(exe.clone(), dir.path().join("two")),
        &gpus::GpuSelection::All,
        &compiler,
        &|gpu, e| {
            if let Event::KeyDone { key, .. } = e {
                shapes_of.borrow_mut().entry((key.n, key.k)).or_insert_with(Vec::new).push(gpu);
            }
        },
    )
    .unwrap();
    // The same file, the same records (the fake times a configuration the same on both GPUs).
    assert_eq!(two.output.log_path.file_name(), one.log_path.file_name());
    assert_eq!(content(&two.output.records), content(&one.records));
    assert_eq!(two.output.new_records, one.new_records);
    assert_eq!(log::read(&two.output.log_path).unwrap().len(), one.records.len());
    // Each GPU tuned one whole shape (its bucket chain), and both worked.
    let shapes_of = shapes_of.into_inner();
    assert_eq!(shapes_of.len(), 2);
    for gpus in shapes_of.values() {
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[0], gpus[1], "a shape's buckets on one GPU: {shapes_of:?}");
    }
    assert_eq!(two.gpus.iter().map(|g| g.ordinal).collect::<Vec<_>>(), vec![0, 1]);
    assert!(two.gpus.iter().all(|g| g.keys_done == 2 && g.failure.is_none()), "{:?}", two.gpus);
    // Every record is stamped with the floors of the GPU that measured it.
    let bw: HashSet<u64> = two
        .output
        .records
        .iter()
        .map(|r| r.context.as_ref().unwrap().bandwidth_gbps as u64)
        .collect();
    assert_eq!(bw, [4400, 4401].into_iter().collect());
    // One table, the same choices.
    let rules = SelectRules { tie_band: 0.0, default_margin: 0.0 };
    let (a, b) = (select(&one.records, &rules), select(&two.output.records, &rules));
    let choice = |s: &crate::tune::select::Selection| {
        s.choices.iter().map(|c| (c.key.clone(), c.config)).collect::<Vec<_>>()
    };
    assert_eq!(choice(&a), choice(&b));
    // Run again on both GPUs: everything is in the log.
    let again = gpus::run(
        &racing(exe, dir.path().join("two")),
        &gpus::GpuSelection::List(vec![0, 1]),
        &compiler,
        &|_, _| {},
    )
    .unwrap();
    assert_eq!(again.output.new_records, 0);
}

#[test]
fn a_gpu_that_fails_hands_its_keys_to_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("gpu1-gone");
    let script = FAKE.replace(
        r#"DIES, MARKER = -1, "/nonexistent""#,
        &format!("DIES, MARKER = 1, {:?}", marker.display().to_string()),
    );
    let exe = install(dir.path(), &script);
    let compiler = Compiler::new(None).unwrap_or_else(|e| panic!("{e}"));
    let events = std::cell::RefCell::new(Vec::new());
    let out = gpus::run(
        &spec(exe.clone(), dir.path().join("r")),
        &gpus::GpuSelection::List(vec![0, 1]),
        &compiler,
        &|gpu, e| match e {
            Event::GpuFailed { keys_left, .. } => {
                events.borrow_mut().push((gpu, "failed", keys_left))
            }
            Event::Adopted { keys } => events.borrow_mut().push((gpu, "adopted", keys)),
            _ => {}
        },
    )
    .unwrap();
    assert!(marker.exists());
    // GPU 1 died on its first key's fourth candidate: its keys (that one included) went to
    // GPU 0, a weight shape's run at a time.
    let events = events.into_inner();
    assert_eq!(events[0].0, 1);
    assert_eq!(events[0].1, "failed");
    let handed = events[0].2;
    assert!(handed >= 1);
    assert!(events[1..].iter().all(|e| e.0 == 0 && e.1 == "adopted"), "{events:?}");
    assert_eq!(events[1..].iter().map(|e| e.2).sum::<usize>(), handed, "{events:?}");
    assert!(out.gpus[1].failure.as_deref().is_some_and(|f| f.contains("fell off the bus")));
    assert_eq!((out.gpus[0].keys_done, out.gpus[1].keys_done), (4, 0));
    // Every candidate of every key once; only the one in flight failed.
    let recs = &out.output.records;
    assert_eq!(recs.len(), 4 * 6, "{:?}", content(recs));
    let failed: Vec<&Record> = recs.iter().filter(|r| r.outcome.label() != "ok").collect();
    assert_eq!(failed.len(), 1);
    assert_eq!((failed[0].config.stages, failed[0].outcome.label()), (3, "launch_error"));
    let mut seen = HashSet::new();
    assert!(recs.iter().all(|r| seen.insert((r.key.clone(), r.config))), "no candidate twice");
    // Both GPUs die mid-run: a clear error naming each, the log kept for a resume.
    let gone = dir.path().join("all-gone");
    let both = FAKE
        .replace(
            r#"DIES, MARKER = -1, "/nonexistent""#,
            &format!("DIES, MARKER = 1, {:?}", gone.display().to_string()),
        )
        .replace("device == DIES and ", "");
    let exe = install(dir.path(), &both);
    let e = gpus::run(
        &spec(exe, dir.path().join("s")),
        &gpus::GpuSelection::List(vec![0, 1]),
        &compiler,
        &|_, _| {},
    )
    .unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, TuneError::AllGpusFailed(_)), "{text}");
    assert!(text.contains("GPU 0: worker: GPU 0 fell off the bus"), "{text}");
    assert!(text.contains("GPU 1: worker: GPU 1 fell off the bus"), "{text}");
    assert!(text.contains("run again to resume") && !text.contains('\n'), "{text}");
    let kept = log::read(&dir.path().join("s/fake-h200-w4a16.jsonl")).unwrap();
    assert_eq!(kept.iter().filter(|r| r.outcome.label() == "launch_error").count(), 2);
}

#[test]
fn gpus_of_two_models_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let exe = install(dir.path(), &FAKE.replace(r#"1: "Fake H200""#, r#"1: "Fake H100""#));
    let compiler = Compiler::new(None).unwrap_or_else(|e| panic!("{e}"));
    let e = gpus::run(
        &spec(exe.clone(), dir.path().join("r")),
        &gpus::GpuSelection::All,
        &compiler,
        &|_, _| {},
    )
    .unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, TuneError::MixedModels(_)), "{text}");
    assert!(text.contains("GPU 0 is Fake H200") && text.contains("GPU 1 is Fake H100"), "{text}");
    assert!(text.contains("--gpus 0") && !text.contains('\n'), "{text}");
    assert!(!dir.path().join("r").exists(), "nothing measured or written");
    // One model picked with --gpus: runs.
    let one = gpus::run(
        &spec(exe, dir.path().join("r")),
        &gpus::GpuSelection::List(vec![1]),
        &compiler,
        &|_, _| {},
    )
    .unwrap();
    assert_eq!(one.output.device.name, "Fake H100");
    assert_eq!(gpus::GpuSelection::parse("0,1").unwrap(), gpus::GpuSelection::List(vec![0, 1]));
    assert!(gpus::GpuSelection::parse("0,0").is_err());
    assert!(gpus::GpuSelection::parse("x").is_err());
}

/// Shards in one folder do not collide, each writes a manifest, and their logs merge into the
/// key set of one run of the whole campaign.
#[test]
fn shards_merge_into_the_key_set_of_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let exe = install(dir.path(), FAKE);
    let compiler = Compiler::new(None).unwrap_or_else(|e| panic!("{e}"));
    let whole = run(&spec(exe.clone(), dir.path().join("whole")), &compiler, &|_| {}).unwrap();
    let out = dir.path().join("shards");
    let mut logs = Vec::new();
    for index in 0..3 {
        let s = TuneSpec { shard: Shard { index, count: 3 }, ..spec(exe.clone(), out.clone()) };
        let o = run(&s, &compiler, &|_| {}).unwrap();
        assert!(
            o.log_path.ends_with(format!("fake-h200-w4a16.shard-{index}-of-3.jsonl")),
            "{}",
            o.log_path.display()
        );
        let m = crate::tune::shard::Manifest::load(&crate::tune::shard::Manifest::path_of_log(
            &o.log_path,
        ))
        .unwrap()
        .unwrap();
        assert!(m.finished && m.campaign_keys.len() == 4, "{m:?}");
        assert_eq!(m.table, format!("fake-h200.shard-{index}-of-3.ron"));
        logs.push(o.log_path);
    }
    let merged = crate::tune::merge::merge(&logs).unwrap();
    assert_eq!(content(&merged), content(&whole.records));
}

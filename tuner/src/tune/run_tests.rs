//! The campaign driven against a scripted stand-in for the GPU worker (no GPU needed): a worker
//! that crashes on one candidate (as an illegal address does) and hangs on another must cost
//! exactly those candidates, every other result must land in the log, and a second run must
//! resume without measuring anything again.
use super::*;
use crate::tune::fake_worker::install;
use crate::tune::planner::Planner;
use crate::tune::select::{select, SelectRules};

const FAKE: &str = r#"
for line in sys.stdin:
    req = json.loads(line)
    if "Hello" in req:
        send(device_info("Fake H200"))
    elif "Floors" in req:
        send({"Floors": {"bandwidth_gbps": 4400.0, "tensor_peak_tflops": 880.0, "launch_floor_us": 0.6}})
    else:
        ev = req["Evaluate"]
        for c in ev["configs"]:
            send({"Running": {"config": c}})
            if c["stages"] == 7:      # the crashing candidate: die like a poisoned context
                sys.exit(3)
            if c["stages"] == 5:      # the hanging candidate
                time.sleep(3600)
            t = 1.0 + c["block_n"] / 64.0 + c["split_k"] / 10.0
            s = {"n": 3, "median": t, "lo": t * 0.99, "hi": t * 1.01, "min": t * 0.98, "max": t * 1.02}
            send({"Result": {"config": c, "outcome": {"Timed": {"time": s, "samples": [t, t, t]}}}})
        send("Done")
"#;

fn configs() -> Vec<GemmConfig> {
    let base = template::default_config(Family::Sm90, AType::Bf16);
    let mut v = Vec::new();
    for (block_n, stages, split_k) in
        [(64, 2, 1), (128, 2, 1), (64, 7, 1), (64, 3, 2), (64, 5, 1), (256, 2, 1)]
    {
        v.push(GemmConfig { block_n, stages, split_k, ..base });
    }
    v
}

fn spec(exe: PathBuf, out: PathBuf) -> TuneSpec {
    TuneSpec {
        shapes: vec![(512, 6144)],
        buckets: vec![1, 16],
        a_type: Some(AType::Bf16),
        policy: TimingPolicy::quick(),
        shard: Shard::all(),
        out_dir: out,
        exe,
        device: 0,
        candidate_timeout: Duration::from_secs(3),
        planner: Box::new(|_, _, _, _| Planner::exhaustive(configs())),
        batch: 16,
        precompile: false,
        composite_min_m: None,
        race: None,
        time_budget: None,
        ahead: Vec::new(),
    }
}

#[test]
fn crashes_and_hangs_cost_one_candidate_each_and_runs_resume() {
    let dir = tempfile::tempdir().unwrap();
    let exe = install(dir.path(), FAKE);
    let compiler = Compiler::new(None).unwrap_or_else(|e| panic!("{e}"));
    let out = dir.path().join("results");
    let restarts = std::cell::Cell::new(0);
    let bests = std::cell::RefCell::new(Vec::new());
    let first = run(&spec(exe.clone(), out.clone()), &compiler, &|e| match e {
        Event::WorkerRestart(_) => restarts.set(restarts.get() + 1),
        // a finished key names its fastest verified kernel (the non-racing strategies too)
        Event::KeyDone { best, .. } => bests.borrow_mut().push(best),
        _ => {}
    })
    .unwrap();
    let bests = bests.into_inner();
    assert_eq!(bests.len(), 2);
    assert!(
        bests.iter().all(|b| b.is_some_and(|(c, us)| c.block_n == 64 && us > 0.0)),
        "{bests:?}"
    );
    // 2 keys x 6 candidates, each recorded once.
    assert_eq!(first.new_records, 12);
    assert_eq!(first.records.len(), 12);
    assert_eq!(restarts.get(), 4, "one restart per crash and per hang, per key");
    let labels: Vec<&str> = first.records.iter().map(|r| r.outcome.label()).collect();
    assert_eq!(labels.iter().filter(|l| **l == "ok").count(), 8);
    assert_eq!(labels.iter().filter(|l| **l == "launch_error").count(), 2);
    assert_eq!(labels.iter().filter(|l| **l == "timeout").count(), 2);
    for r in &first.records {
        match r.config.stages {
            7 => assert_eq!(r.outcome.label(), "launch_error"),
            5 => assert_eq!(r.outcome.label(), "timeout"),
            _ => assert_eq!(r.outcome.label(), "ok"),
        }
        assert!(r.context.as_ref().is_some_and(|c| c.bandwidth_gbps == 4400.0));
    }
    assert!(first.log_path.ends_with("fake-h200-w4a16.jsonl"), "{}", first.log_path.display());
    // The fastest timed candidate wins each key.
    let sel = select(&first.records, &SelectRules { tie_band: 0.0, default_margin: 0.0 });
    assert!(sel.choices.iter().all(|c| c.config.block_n == 64 && c.config.split_k == 1));
    // Run again: everything is in the log, nothing is measured twice.
    let second = run(&spec(exe, out), &compiler, &|_| {}).unwrap();
    assert_eq!(second.new_records, 0);
    assert_eq!(second.records.len(), 12);
}

/// A run killed in the middle of a record leaves a last line without its newline: the next
/// run reports it (an event the CLI prints), measures that candidate again and resumes.
#[test]
fn a_torn_last_record_is_reported_and_the_run_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let exe = install(dir.path(), FAKE);
    let compiler = Compiler::new(None).unwrap_or_else(|e| panic!("{e}"));
    let out = dir.path().join("results");
    let first = run(&spec(exe.clone(), out.clone()), &compiler, &|_| {}).unwrap();
    assert_eq!(first.new_records, 12);
    // Cut the last record right after an inner `}` (no newline): what a kill leaves.
    let text = std::fs::read_to_string(&first.log_path).unwrap();
    let last_start = text.trim_end().rfind('\n').unwrap() + 1;
    let cut = last_start + text[last_start..].find('}').unwrap() + 1;
    std::fs::write(&first.log_path, &text[..cut]).unwrap();
    let torn = std::cell::RefCell::new(Vec::new());
    let second = run(&spec(exe, out), &compiler, &|e| {
        if let Event::TornTail(t) = e {
            torn.borrow_mut().push(t);
        }
    })
    .unwrap();
    let torn = torn.into_inner();
    assert_eq!(torn.len(), 1, "{torn:?}");
    assert_eq!(torn[0].path, first.log_path);
    assert_eq!(torn[0].line, 12);
    assert_eq!(second.new_records, 1, "only the torn candidate is measured again");
    assert_eq!(second.records.len(), 12);
}
/// Racing against the scripted worker: each key's pool is screened (recorded as screened),
/// its finalists and anchors timed under the full policy, the table's selection sees only
/// full-policy times, keys run in increasing M, and a second run measures nothing again.
#[test]
fn racing_screens_then_times_finalists_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    // No crashing or hanging candidates here: the pools come from the whole space.
    let fake = FAKE.replace(r#"c["stages"] == 7"#, "False").replace(r#"c["stages"] == 5"#, "False");
    let exe = install(dir.path(), &fake);
    let compiler = Compiler::new(None).unwrap_or_else(|e| panic!("{e}"));
    let out = dir.path().join("results");
    let race_spec = || {
        let mut r = RaceSpec::default();
        r.options.min_pool = 24;
        r.options.pool_fraction = 0.005;
        r
    };
    let mk = |exe: PathBuf, out: PathBuf| TuneSpec {
        buckets: vec![16, 1],
        race: Some(race_spec()),
        ..spec(exe, out)
    };
    let order = std::cell::RefCell::new(Vec::new());
    let first = run(&mk(exe.clone(), out.clone()), &compiler, &|e| {
        if let Event::KeyDone { key, screened, timed, best, .. } = e {
            assert!(screened >= 24 && timed >= 1 && best.is_some(), "{screened} {timed}");
            order.borrow_mut().push(key.m);
        }
    })
    .unwrap();
    assert_eq!(order.into_inner(), vec![1, 16], "decode buckets first");
    let screened = first.records.iter().filter(|r| r.outcome.label() == "screened").count();
    let timed: Vec<&Record> = first.records.iter().filter(|r| r.outcome.label() == "ok").collect();
    assert_eq!(screened, first.stats.screened);
    assert_eq!(timed.len(), first.stats.timed);
    assert!(screened > timed.len() && !timed.is_empty());
    // Every full-policy record of a key was screened first, and the screening policy's
    // samples are fewer.
    for t in &timed {
        assert!(first.records.iter().any(|r| r.key == t.key
            && r.config == t.config
            && matches!(&r.outcome, Outcome::Screened { samples, .. } if samples.len() == 3)));
    }
    let sel = select(&first.records, &SelectRules { tie_band: 0.0, default_margin: 0.0 });
    assert_eq!(sel.choices.len(), 2);
    for c in &sel.choices {
        assert!(timed.iter().any(|t| t.key == c.key && t.config == c.config));
    }
    let second = run(&mk(exe, out), &compiler, &|_| {}).unwrap();
    let extra: Vec<String> = second.records[first.records.len()..]
        .iter()
        .map(|r| format!("{} {} {}", r.key.m, r.config.name(), r.outcome.label()))
        .collect();
    assert_eq!(second.new_records, 0, "resumed from the log: {extra:?}");
}

//! The GPU side of a check: the tuner's measuring worker (`fp4tune worker`, [`crate::tune::worker`])
//! verifies each entry's kernel against the CPU reference and times it interleaved with the
//! family default (one `Evaluate` request: the worker's verification and batch timing), and times
//! the dequantize-then-cuBLAS path for entries that take it (`Composite`). A kernel that kills or
//! hangs the worker is that entry's failure; a new worker serves the rest.
//!
//! Without a GPU the protocol is tested against a fake worker (a script speaking the worker's
//! JSON lines): a slowed kernel is named as a regression, a crashing one as a failure, and the
//! rest is measured on a new worker.

use super::Measurement;
use crate::bench::TimingPolicy;
use crate::gpu::DeviceInfo;
use crate::problem::GemmProblem;
use crate::table::{Entry, Method};
use crate::template::{default_config, GemmConfig};
use crate::tune::log::Outcome;
use crate::tune::worker::{Reply, Request, WorkerError, WorkerHandle};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A measuring worker on one GPU.
#[derive(Debug)]
pub struct Session {
    worker: Option<WorkerHandle>,
    exe: PathBuf,
    device: usize,
    info: DeviceInfo,
    /// Longest wait for one reply (compiling a kernel on a cold cache included).
    pub timeout: Duration,
    /// Worker restarts so far (each after a crash or a hang).
    pub restarts: usize,
}

fn start(
    exe: &Path,
    device: usize,
    timeout: Duration,
) -> Result<(WorkerHandle, DeviceInfo), String> {
    let mut w = WorkerHandle::spawn(exe, &[]).map_err(|e| e.to_string())?;
    w.send(&Request::Hello { device }).map_err(|e| e.to_string())?;
    match w.recv(timeout) {
        Ok(Reply::Device(info)) => Ok((w, info)),
        Ok(Reply::Fatal(e)) => Err(e),
        Ok(other) => Err(format!("unexpected worker reply {other:?}")),
        Err(WorkerError::Died) => {
            Err("the measuring worker exited before opening the GPU (its error is above)".into())
        }
        Err(e) => Err(e.to_string()),
    }
}

/// The operands of an entry's problem (any fixed seed: the check times, the values only have
/// to be verifiable).
pub(crate) fn operand_seed(p: &GemmProblem) -> u64 {
    0xC4EC ^ ((p.m as u64) << 40) ^ ((p.n as u64) << 20) ^ p.k as u64
}

impl Session {
    /// Start a worker on CUDA device `device` (`exe` is the fp4tune binary). Without a CUDA
    /// driver no worker is started; the error is the one-line reason.
    pub fn open(exe: &Path, device: usize, timeout: Duration) -> Result<Self, String> {
        if !crate::gpu::loader::driver_present() {
            return Err(crate::gpu::GpuError::NoDriver.to_string());
        }
        Self::with_worker(exe, device, timeout)
    }

    /// Start the worker `exe worker` without looking for a CUDA driver first (what [`open`]
    /// does after it; tests drive a fake worker through it).
    ///
    /// [`open`]: Session::open
    pub fn with_worker(exe: &Path, device: usize, timeout: Duration) -> Result<Self, String> {
        let (w, info) = start(exe, device, timeout)?;
        Ok(Self { worker: Some(w), exe: exe.to_path_buf(), device, info, timeout, restarts: 0 })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn worker(&mut self) -> Result<&mut WorkerHandle, String> {
        if self.worker.is_none() {
            let (w, _) = start(&self.exe, self.device, self.timeout)?;
            self.worker = Some(w);
            self.restarts += 1;
        }
        Ok(self.worker.as_mut().expect("just set"))
    }

    fn restart(&mut self) {
        if let Some(w) = self.worker.take() {
            w.kill();
        }
    }

    /// Verify, then time interleaved, `configs` on `problem`: one outcome per configuration. A
    /// configuration that crashes or hangs the worker gets that as its outcome; the others are
    /// measured again on a new worker.
    pub fn evaluate(
        &mut self,
        problem: GemmProblem,
        configs: &[GemmConfig],
        policy: &TimingPolicy,
    ) -> Result<HashMap<GemmConfig, Outcome>, String> {
        let mut out = HashMap::new();
        let mut todo: Vec<GemmConfig> = configs.to_vec();
        while !todo.is_empty() {
            let timeout = self.timeout;
            let w = self.worker()?;
            w.send(&Request::Evaluate {
                problem,
                configs: todo.clone(),
                policy: *policy,
                seed: operand_seed(&problem),
            })
            .map_err(|e| e.to_string())?;
            let mut running = None;
            let failure = loop {
                match w.recv(timeout) {
                    Ok(Reply::Running { config }) => running = Some(config),
                    Ok(Reply::Result { config, outcome }) => {
                        todo.retain(|c| *c != config);
                        out.insert(config, outcome);
                    }
                    Ok(Reply::Done) => break None,
                    Ok(Reply::Fatal(e)) => break Some(Outcome::LaunchError { reason: e }),
                    Ok(_) => {}
                    Err(WorkerError::Timeout(seconds)) => break Some(Outcome::Timeout { seconds }),
                    Err(e) => {
                        break Some(Outcome::LaunchError { reason: format!("worker died: {e}") })
                    }
                }
            };
            match failure {
                None => {
                    for c in todo.drain(..) {
                        out.insert(
                            c,
                            Outcome::LaunchError { reason: "the worker did not answer".into() },
                        );
                    }
                }
                Some(outcome) => {
                    self.restart();
                    let blamed = running.filter(|c| todo.contains(c)).or(todo.first().copied());
                    if let Some(c) = blamed {
                        todo.retain(|x| *x != c);
                        out.insert(c, outcome);
                    }
                }
            }
        }
        Ok(out)
    }

    /// The dequantize-then-cuBLAS path on `problem` (verified, then timed).
    pub fn composite(
        &mut self,
        problem: GemmProblem,
        fallback: GemmConfig,
        policy: &TimingPolicy,
    ) -> Result<Outcome, String> {
        let timeout = self.timeout;
        let w = self.worker()?;
        w.send(&Request::Composite {
            problem,
            fallback,
            policy: *policy,
            seed: operand_seed(&problem),
        })
        .map_err(|e| e.to_string())?;
        let mut outcome = None;
        let failure = loop {
            match w.recv(timeout) {
                Ok(Reply::Result { outcome: o, .. }) => outcome = Some(o),
                Ok(Reply::Done) => break None,
                Ok(Reply::Fatal(e)) => break Some(Outcome::LaunchError { reason: e }),
                Ok(_) => {}
                Err(WorkerError::Timeout(seconds)) => break Some(Outcome::Timeout { seconds }),
                Err(e) => break Some(Outcome::LaunchError { reason: format!("worker died: {e}") }),
            }
        };
        if failure.is_some() {
            self.restart();
        }
        Ok(failure.or(outcome).unwrap_or(Outcome::LaunchError {
            reason: "the worker gave no result for the dequantize-then-cuBLAS path".into(),
        }))
    }

    /// Measure one table entry: its fused kernel (or fallback) and the family default,
    /// interleaved; then, for `DequantCublasBf16` entries, the composite path.
    pub fn measure(&mut self, entry: &Entry, policy: &TimingPolicy) -> Result<Measurement, String> {
        let problem = entry.key.problem();
        let default = default_config(entry.key.family, entry.key.a_type);
        let mut configs = vec![entry.config];
        if default != entry.config && default.check_problem(&problem).is_ok() {
            configs.push(default);
        }
        let mut fused = self.evaluate(problem, &configs, policy)?;
        let own = fused
            .remove(&entry.config)
            .unwrap_or(Outcome::LaunchError { reason: "not measured".into() });
        let default_outcome =
            if default == entry.config { Some(own.clone()) } else { fused.remove(&default) };
        Ok(match entry.method {
            Method::Fused => Measurement { outcome: own, fallback: None, default: default_outcome },
            Method::DequantCublasBf16 => Measurement {
                outcome: self.composite(problem, entry.config, policy)?,
                fallback: Some(own),
                default: default_outcome,
            },
        })
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.restart();
    }
}

#[cfg(test)]
mod fake_worker_tests {
    use super::*;
    use crate::check::{self, exit_status, Baseline, Baselines, EntryStatus, RuleConfig, Verdict};

    /// Answers like `fp4tune worker` on an H200: every configuration of problem M gets 9 samples
    /// around 1 + M/100 us (the default configuration 0.5 us more); the configuration with
    /// `stages == 7` kills the worker when it runs on N = 6144.
    const FAKE: &str = r#"
for line in sys.stdin:
    req = json.loads(line)
    if "Hello" in req:
        send(device_info("NVIDIA H200"))
    elif "Evaluate" in req:
        ev = req["Evaluate"]
        p = ev["problem"]
        for i, c in enumerate(ev["configs"]):
            send({"Running": {"config": c}})
            if c["stages"] == 7 and p["n"] == 6144:
                sys.exit(3)
            t = 1.0 + p["m"] / 100.0 + (0.5 if c == json.loads('DEFAULT_CONFIG') else 0.0)
            us = [t * (1.0 + 0.002 * (j % 5 - 2)) for j in range(9)]
            s = {"n": 9, "median": t, "lo": us[1], "hi": us[3], "min": min(us), "max": max(us)}
            send({"Result": {"config": c, "outcome": {"Timed": {"time": s, "samples": us}}}})
        send("Done")
"#;

    fn samples(t: f64) -> Vec<f64> {
        (0..9).map(|j| t * (1.0 + 0.002 * ((j % 5) as f64 - 2.0))).collect()
    }

    #[test]
    fn slowed_kernel_is_named_crash_fails_and_the_rest_is_measured_on_a_new_worker() {
        let mut table = crate::table::tests_support::sample();
        let default = default_config(table.entries[0].key.family, table.entries[0].key.a_type);
        // The last entry (N 6144, M 1) gets a kernel that crashes the worker.
        let crashing = GemmConfig { stages: 7, ..table.entries[3].config };
        table.entries[3].config = crashing;
        let script = FAKE.replace("DEFAULT_CONFIG", &serde_json::to_string(&default).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let exe = crate::tune::fake_worker::install(dir.path(), &script);
        let mut session = Session::with_worker(&exe, 0, Duration::from_secs(20)).unwrap();
        assert_eq!(session.info().name, "NVIDIA H200");
        // Baselines: what the fake measures now, except M = 16, which was 20% faster.
        let by_key = table
            .entries
            .iter()
            .map(|e| {
                let t = 1.0 + e.key.m as f64 / 100.0 + if e.config == default { 0.5 } else { 0.0 };
                let old = if e.key.m == 16 { t / 1.2 } else { t };
                (e.key.clone(), Baseline::Samples(samples(old)))
            })
            .collect();
        let baselines = Baselines {
            description: "fake".into(),
            by_key,
            by_moe_key: Default::default(),
            device: None,
            notes: vec![],
        };
        let rule = RuleConfig::default();
        let policy = TimingPolicy::quick();
        let entries: Vec<_> = table
            .entries
            .iter()
            .map(|e| {
                let m = session.measure(e, &policy).unwrap();
                check::assess(e, baselines.get(&e.key), &m, &rule)
            })
            .collect();
        assert_eq!(session.restarts, 1, "one new worker after the crash");
        let status: Vec<&EntryStatus> = entries.iter().map(|e| &e.status).collect();
        assert_eq!(status[0], &EntryStatus::Compared(Verdict::Regression), "{status:?}");
        assert_eq!(status[1], &EntryStatus::Compared(Verdict::Within), "{status:?}");
        assert_eq!(status[2], &EntryStatus::Compared(Verdict::Within), "{status:?}");
        assert!(matches!(status[3], EntryStatus::Failed(w) if w.contains("worker died")));
        // The family default was timed next to the entries (0.5 us slower in the fake), and on
        // the new worker after the crash.
        assert!((entries[0].default.unwrap().median - 1.66).abs() < 1e-9);
        assert!((entries[3].default.unwrap().median - 1.51).abs() < 1e-9);
        let setup = check::Setup {
            table: &table,
            origin: "t.ron",
            baselines: &baselines,
            rule,
            timing_policy: policy.describe(),
        };
        let blockers = check::preflight(&table, Ok(session.info()), None);
        assert!(blockers.is_empty(), "{blockers:?}");
        let report = check::report(&setup, Some(session.info().clone()), blockers, entries, vec![]);
        let exit = exit_status(&report);
        assert_eq!(exit.code, 1, "{exit:?}");
        assert!(exit.reason.contains("M=16 0.97 -> 1.16 us (x1.200"), "{exit:?}");
        assert!(exit.reason.contains("M=1 failed: worker died"), "{exit:?}");
    }
}

//! The measuring worker: a child process that owns the GPU context, so that a candidate which
//! poisons the context (illegal address) or hangs costs one replaceable process, not the run.
//!
//! Protocol: JSON lines. The parent writes one [`Request`] per line to the child's stdin; the
//! child answers each with [`Reply`] lines and ends a request with [`Reply::Done`]. Before it runs
//! a candidate on the GPU the child announces it ([`Reply::Running`]), so when the child dies or
//! stops answering the parent knows which candidate to blame.

use crate::bench::gemm::{time_candidates, verify, Candidate, DeviceProblem, HostProblem};
use crate::bench::{Summary, TimingPolicy};
use crate::compile::Compiler;
use crate::gpu::{DeviceInfo, Gpu, GpuError};
use crate::problem::GemmProblem;
use crate::template::GemmConfig;
use crate::tune::log::Outcome;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    /// Open the device and report what it is.
    Hello { device: usize },
    /// How many GPUs the driver reports (`tune --gpus all`).
    Devices,
    /// Measure read bandwidth (GB/s) and the data path's tensor peak (TFLOP/s) for roofline
    /// fractions.
    Floors { policy: TimingPolicy },
    /// Verify every config on `problem` (random operands from `seed`), then time the correct ones.
    Evaluate { problem: GemmProblem, configs: Vec<GemmConfig>, policy: TimingPolicy, seed: u64 },
    /// Verify, then time, the dequantize-then-cuBLAS path on `problem`; the reply's `config` is
    /// `fallback` (the key's best fused kernel, which the record names).
    Composite { problem: GemmProblem, fallback: GemmConfig, policy: TimingPolicy, seed: u64 },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Reply {
    Device(DeviceInfo),
    /// The number of GPUs ([`Request::Devices`]).
    Devices(usize),
    Floors {
        bandwidth_gbps: f64,
        tensor_peak_tflops: f64,
        launch_floor_us: f64,
    },
    /// About to run `config` on the GPU (verification or timing batch).
    Running {
        config: GemmConfig,
    },
    Result {
        config: GemmConfig,
        outcome: Outcome,
    },
    Done,
    /// The request failed as a whole (no GPU, problem construction failed...).
    Fatal(String),
}

/// Serve requests from stdin until it closes. Exits the process on a CUDA error that poisons the
/// context: the parent blames the announced candidate and starts a new worker.
pub fn serve(compiler: &Compiler) -> ! {
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    let mut gpu: Option<Gpu> = None;
    let mut host_cache: Option<HostProblem> = None;
    // The operands of the last problem on the device, reused by the next request for it (a
    // key's screening, refinement and final batches).
    let mut device_cache: Option<(GemmProblem, u64, DeviceProblem)> = None;
    let mut send = |r: &Reply| {
        let line = serde_json::to_string(r).expect("replies serialize");
        // The parent went away: nothing left to do.
        if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
            std::process::exit(0);
        }
    };
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let req: Request = match serde_json::from_str(&line) {
            Ok(r) => r,
            Err(e) => {
                send(&Reply::Fatal(format!("bad request: {e}")));
                continue;
            }
        };
        match req {
            Request::Hello { device } => match Gpu::open(device) {
                Ok(g) => {
                    send(&Reply::Device(g.info().clone()));
                    gpu = Some(g);
                }
                Err(e) => send(&Reply::Fatal(e.to_string())),
            },
            Request::Devices => match crate::gpu::device::device_count() {
                Ok(n) => send(&Reply::Devices(n)),
                Err(e) => send(&Reply::Fatal(e.to_string())),
            },
            Request::Floors { policy } => {
                let Some(g) = gpu.as_ref() else {
                    send(&Reply::Fatal("Floors before Hello".into()));
                    continue;
                };
                let measured = (|| -> Result<Reply, String> {
                    let f = crate::bench::floors::Floors::new(g, compiler)
                        .map_err(|e| e.to_string())?;
                    Ok(Reply::Floors {
                        bandwidth_gbps: f
                            .read_bandwidth(&policy, 1 << 30)
                            .map_err(|e| e.to_string())?,
                        tensor_peak_tflops: crate::bench::run::data_path_peak_tflops(g)
                            .map_err(|e| e.to_string())?,
                        launch_floor_us: f
                            .launch_floor(&policy, g.info().sm_count)
                            .map_err(|e| e.to_string())?
                            .median,
                    })
                })();
                match measured {
                    Ok(r) => send(&r),
                    Err(e) => send(&Reply::Fatal(e)),
                }
            }
            Request::Evaluate { problem, configs, policy, seed } => {
                let Some(g) = gpu.as_ref() else {
                    send(&Reply::Fatal("Evaluate before Hello".into()));
                    continue;
                };
                let host = match host_for(&mut host_cache, problem, seed) {
                    Ok(h) => h,
                    Err(e) => {
                        send(&Reply::Fatal(e));
                        continue;
                    }
                };
                let stale = device_cache.as_ref().is_none_or(|(p, s, d)| {
                    *p != problem || *s != seed || d.l2_multiple != policy.l2_multiple
                });
                if stale {
                    // The old operands are freed before the new ones are uploaded.
                    drop(device_cache.take());
                    match DeviceProblem::upload(g, host, &policy, &[]) {
                        Ok(mut d) => {
                            // Verification on the GPU: large outputs are not copied back per
                            // candidate. If it cannot be set up, the CPU checks as before.
                            let _ = d.check_on_gpu(g, compiler, host);
                            device_cache = Some((problem, seed, d))
                        }
                        Err(e) => {
                            send(&Reply::Fatal(format!("CUDA error, worker exits: {e}")));
                            std::process::exit(3);
                        }
                    }
                }
                let dp = &mut device_cache.as_mut().expect("just set").2;
                if let Err(e) = evaluate(g, compiler, host, dp, &configs, &policy, &mut send) {
                    // A context-poisoning error: report and die; the parent respawns.
                    send(&Reply::Fatal(format!("CUDA error, worker exits: {e}")));
                    std::process::exit(3);
                }
                send(&Reply::Done);
            }
            Request::Composite { problem, fallback, policy, seed } => {
                let Some(g) = gpu.as_ref() else {
                    send(&Reply::Fatal("Composite before Hello".into()));
                    continue;
                };
                let host = match host_for(&mut host_cache, problem, seed) {
                    Ok(h) => h,
                    Err(e) => {
                        send(&Reply::Fatal(e));
                        continue;
                    }
                };
                send(&Reply::Running { config: fallback });
                match evaluate_composite(g, compiler, host, &policy) {
                    Ok(outcome) => send(&Reply::Result { config: fallback, outcome }),
                    Err(e) => {
                        send(&Reply::Fatal(format!("CUDA error, worker exits: {e}")));
                        std::process::exit(3);
                    }
                }
                send(&Reply::Done);
            }
        }
    }
    std::process::exit(0)
}

/// The host operands of `problem` from `seed`, kept across requests for the same problem (a
/// key's batches and its composite measurement).
fn host_for(
    cache: &mut Option<HostProblem>,
    problem: GemmProblem,
    seed: u64,
) -> Result<&HostProblem, String> {
    if cache.as_ref().is_none_or(|h| h.problem != problem) {
        *cache = Some(
            HostProblem::random(problem, seed).map_err(|e| format!("building {problem}: {e}"))?,
        );
    }
    Ok(cache.as_ref().expect("just set"))
}

/// The dequantize-then-cuBLAS path on `host`'s problem: set-up failures (no cuBLAS, K not a
/// multiple of 16) and wrong answers are outcomes; a CUDA error during the runs is returned.
fn evaluate_composite(
    gpu: &Gpu,
    compiler: &Compiler,
    host: &HostProblem,
    policy: &TimingPolicy,
) -> Result<Outcome, GpuError> {
    use crate::bench::composite::Composite;
    let setup = Composite::new(gpu, compiler).and_then(|c| {
        let s = c.scratch(host.problem)?;
        Ok((c, s))
    });
    let (c, s) = match setup {
        Ok(x) => x,
        Err(e) => return Ok(Outcome::ResourceLimit { reason: e.to_string() }),
    };
    let mut dp = DeviceProblem::upload(gpu, host, policy, &[])?;
    if let Err(why) = c.verify(&s, host, &mut dp)? {
        return Ok(Outcome::WrongAnswer { reason: why });
    }
    let samples = c.time(&s, policy, &dp)?;
    Ok(Outcome::Timed { time: Summary::of(&samples.us).expect("samples"), samples: samples.us })
}

fn evaluate(
    gpu: &Gpu,
    compiler: &Compiler,
    host: &HostProblem,
    dp: &mut DeviceProblem,
    configs: &[GemmConfig],
    policy: &TimingPolicy,
    send: &mut dyn FnMut(&Reply),
) -> Result<(), GpuError> {
    let p = host.problem;
    let mut runnable = Vec::new();
    for c in configs {
        if let Err(e) = c.check_problem(&p) {
            send(&Reply::Result { config: *c, outcome: Outcome::Illegal { reason: e.reason } });
            continue;
        }
        runnable.push(*c);
    }
    let sources: Vec<_> = runnable.iter().map(|c| c.render()).collect();
    let ok_sources: Vec<_> = sources.iter().filter_map(|s| s.as_ref().ok().cloned()).collect();
    let mut compiled = compiler.compile_many(&ok_sources).into_iter();
    dp.ensure_scratch(gpu, &runnable)?;
    let mut verified: Vec<Candidate> = Vec::new();
    for (c, s) in runnable.iter().zip(&sources) {
        let outcome = match s {
            Err(e) => Some(Outcome::Illegal { reason: e.reason.clone() }),
            Ok(_) => match compiled.next().expect("one result per source") {
                Err(e) => Some(Outcome::CompileError { log: e.to_string() }),
                Ok(k) => match Candidate::load(gpu, *c, &k) {
                    Err(e) => Some(Outcome::ResourceLimit { reason: e.to_string() }),
                    Ok(cand) => {
                        send(&Reply::Running { config: *c });
                        match verify(gpu, host, dp, &cand)? {
                            Ok(()) => {
                                verified.push(cand);
                                None
                            }
                            Err(why) => Some(Outcome::WrongAnswer { reason: why }),
                        }
                    }
                },
            },
        };
        if let Some(outcome) = outcome {
            send(&Reply::Result { config: *c, outcome });
        }
    }
    // Time in batches so one slow candidate does not dominate; candidates interleave within a batch.
    for batch in verified.chunks(64) {
        for c in batch {
            send(&Reply::Running { config: c.config });
        }
        let refs: Vec<&Candidate> = batch.iter().collect();
        for (c, r) in batch.iter().zip(time_candidates(gpu, policy, dp, &refs)) {
            let outcome = match r {
                Ok(s) => {
                    Outcome::Timed { time: Summary::of(&s.us).expect("samples"), samples: s.us }
                }
                Err(e) => return Err(e),
            };
            send(&Reply::Result { config: c.config, outcome });
        }
    }
    Ok(())
}

/// The parent's handle on one worker process.
#[derive(Debug)]
pub struct WorkerHandle {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    replies: std::sync::mpsc::Receiver<Reply>,
}

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    // The OS error is part of the message, not a chained source (printed once).
    #[error("starting the worker `{exe}`: {error}")]
    Spawn { exe: String, error: std::io::Error },
    #[error("the worker exited")]
    Died,
    #[error("the worker did not answer within {0:.0} s")]
    Timeout(f64),
    #[error("worker: {0}")]
    Fatal(String),
}

impl WorkerHandle {
    /// Start `exe worker` (the fp4tune binary itself) with `extra` arguments.
    pub fn spawn(exe: &std::path::Path, extra: &[String]) -> Result<Self, WorkerError> {
        let mut child = std::process::Command::new(exe)
            .arg("worker")
            .args(extra)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .map_err(|source| WorkerError::Spawn {
                exe: exe.display().to_string(),
                error: source,
            })?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let (tx, replies) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                match serde_json::from_str::<Reply>(&line) {
                    Ok(r) => {
                        if tx.send(r).is_err() {
                            break;
                        }
                    }
                    // Not a reply (a stray print): ignore rather than desynchronise.
                    Err(_) => continue,
                }
            }
        });
        Ok(Self { child, stdin, replies })
    }

    pub fn send(&mut self, r: &Request) -> Result<(), WorkerError> {
        let line = serde_json::to_string(r).expect("requests serialize");
        writeln!(self.stdin, "{line}")
            .and_then(|_| self.stdin.flush())
            .map_err(|_| WorkerError::Died)
    }

    /// The next reply, waiting at most `timeout`.
    pub fn recv(&mut self, timeout: std::time::Duration) -> Result<Reply, WorkerError> {
        match self.replies.recv_timeout(timeout) {
            Ok(r) => Ok(r),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                Err(WorkerError::Timeout(timeout.as_secs_f64()))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(WorkerError::Died),
        }
    }

    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    /// The OS error of a failed start is in the message once, not chained again as its source
    /// (anyhow's `{:#}` prints a source after the message).
    #[test]
    fn a_worker_that_cannot_start_names_the_os_error_once() {
        let e = super::WorkerHandle::spawn(std::path::Path::new("/nonexistent/fp4tune"), &[])
            .unwrap_err();
        let text = e.to_string();
        assert!(text.contains("/nonexistent/fp4tune"), "{text}");
        assert!(std::error::Error::source(&e).is_none(), "{text}");
    }
}

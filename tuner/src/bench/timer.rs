//! Interleaved CUDA-graph timing of launch sequences: the core every measurement goes through.

use super::policy::TimingPolicy;
use crate::gpu::{Gpu, GpuError, Graph};

/// Something that can enqueue one launch on the Gpu's stream; `i` is the launch's index within
/// a graph (candidates use it to rotate operand copies).
pub type LaunchFn<'a> = Box<dyn FnMut(usize) -> Result<(), GpuError> + 'a>;

/// Per-launch microseconds of one candidate, every sample kept.
#[derive(Debug, Clone)]
pub struct Samples {
    pub launches_per_sample: usize,
    pub us: Vec<f64>,
}

/// Time every candidate under `policy`: each gets its own graph of back-to-back launches, sized to
/// reach `min_sample_us`; samples are taken round-robin across candidates. A candidate whose capture
/// or launch fails gets its error and is dropped from further sampling; the others go on.
pub fn measure(
    gpu: &Gpu,
    policy: &TimingPolicy,
    mut launches: Vec<LaunchFn<'_>>,
) -> Vec<Result<Samples, GpuError>> {
    let mut graphs: Vec<Result<(Graph, usize), GpuError>> =
        launches.iter_mut().map(|f| build_graph(gpu, policy, f)).collect();
    let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(policy.samples); graphs.len()];
    let rounds = if policy.interleaved { policy.samples } else { 1 };
    let per_round = if policy.interleaved { 1 } else { policy.samples };
    for _ in 0..rounds {
        for (g, out) in graphs.iter_mut().zip(samples.iter_mut()) {
            let Ok((graph, n)) = g else { continue };
            for _ in 0..per_round {
                match gpu.time_ms(|| graph.launch()) {
                    Ok(ms) => out.push(ms as f64 * 1e3 / *n as f64),
                    Err(e) => {
                        *g = Err(e);
                        break;
                    }
                }
            }
        }
    }
    graphs
        .into_iter()
        .zip(samples)
        .map(|(g, us)| g.map(|(_, n)| Samples { launches_per_sample: n, us }))
        .collect()
}

/// Estimate one launch's time, capture the real graph, warm it up. A single launch is timed
/// first: a kernel that alone fills a large part of a sample needs no multi-launch probe (and a
/// real graph of few launches); shorter ones are timed again over `PROBE` back-to-back launches,
/// which hides the graph launch's own cost.
fn build_graph(
    gpu: &Gpu,
    policy: &TimingPolicy,
    f: &mut LaunchFn<'_>,
) -> Result<(Graph, usize), GpuError> {
    const PROBE: usize = 8;
    /// Fewest launches per sample of a long kernel (operand copies still alternate).
    const MIN_LONG: usize = 2;
    let one = gpu.capture(|| f(0))?;
    one.launch()?;
    let single_us = gpu.time_ms(|| one.launch())? as f64 * 1e3;
    drop(one);
    let n = if single_us * 2.0 >= policy.min_sample_us {
        ((policy.min_sample_us / single_us).ceil() as usize).clamp(MIN_LONG, policy.max_launches)
    } else {
        let probe = gpu.capture(|| (0..PROBE).try_for_each(&mut *f))?;
        probe.launch()?;
        let ms = gpu.time_ms(|| probe.launch())?;
        let per_launch_us = (ms as f64 * 1e3 / PROBE as f64).max(0.5);
        ((policy.min_sample_us / per_launch_us).ceil() as usize).clamp(PROBE, policy.max_launches)
    };
    let graph = gpu.capture(|| (0..n).try_for_each(&mut *f))?;
    for _ in 0..policy.warmup_replays {
        graph.launch()?;
    }
    gpu.synchronize()?;
    Ok((graph, n))
}

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

/// Most launches one graph walks to complete its rotation: a problem that needs more operand copies
/// than this to exceed the policy's L2 multiple reads under about 60 KB per launch, where the launch
/// itself, not where the bytes come from, sets the time.
pub const MAX_ROTATION_LAUNCHES: usize = 4096;

/// Launches captured in one graph for a kernel of `per_launch_us`: enough to fill
/// `policy.min_sample_us` (at least `fewest`, at most `policy.max_launches`), and never fewer
/// than the `copies` the launches rotate through (at most [`MAX_ROTATION_LAUNCHES`]). A graph
/// replays the same launches, so launch i reads copy i % copies on every replay: only a graph
/// that walks all copies reads each copy after the whole rotation (more than the policy's L2
/// multiple of operand bytes) has streamed past it, on the next replay of the same graph as on
/// the replays of other candidates of the problem in between. A graph of fewer launches would
/// read the same few copies on every replay, from L2 when they fit in it.
pub fn launches_per_graph(
    per_launch_us: f64,
    fewest: usize,
    policy: &TimingPolicy,
    copies: usize,
) -> usize {
    let fill = (policy.min_sample_us / per_launch_us).ceil() as usize;
    fill.clamp(fewest, policy.max_launches.max(fewest)).max(copies.min(MAX_ROTATION_LAUNCHES))
}

/// Time every candidate under `policy`: each gets its own graph of back-to-back launches, sized to
/// reach `min_sample_us` and to walk all `copies` the launches rotate through (launch i reads
/// operand copy i % copies; 1 when nothing rotates: [`launches_per_graph`]); samples are taken
/// round-robin across candidates. A candidate whose capture or launch fails gets its error and is
/// dropped from further sampling; the others go on.
pub fn measure(
    gpu: &Gpu,
    policy: &TimingPolicy,
    copies: usize,
    mut launches: Vec<LaunchFn<'_>>,
) -> Vec<Result<Samples, GpuError>> {
    let mut graphs: Vec<Result<(Graph, usize), GpuError>> =
        launches.iter_mut().map(|f| build_graph(gpu, policy, copies, f)).collect();
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
    copies: usize,
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
        launches_per_graph(single_us, MIN_LONG, policy, copies)
    } else {
        let probe = gpu.capture(|| (0..PROBE).try_for_each(&mut *f))?;
        probe.launch()?;
        let ms = gpu.time_ms(|| probe.launch())?;
        let per_launch_us = (ms as f64 * 1e3 / PROBE as f64).max(0.5);
        launches_per_graph(per_launch_us, PROBE, policy, copies)
    };
    let graph = gpu.capture(|| (0..n).try_for_each(&mut *f))?;
    for _ in 0..policy.warmup_replays {
        graph.launch()?;
    }
    gpu.synchronize()?;
    Ok((graph, n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::policy::rotation_copies;

    /// Every graph walks the whole rotation: the copies one replay reads exceed the policy's L2
    /// multiple (a GLM-5 TP8 expert's 1.8 MB under a 3.5 us kernel fills a 100 us sample with 29
    /// launches, 52 MB, which a 60 MiB L2 holds from one replay to the next), and still fills
    /// the sample where the rotation is short.
    #[test]
    fn a_graph_walks_every_copy_and_fills_its_sample() {
        let l2 = 60u64 << 20;
        for policy in [TimingPolicy::default(), TimingPolicy::quick(), TimingPolicy::screen()] {
            for (bytes, us) in
                [(1_780_000u64, 3.5), (800_000, 2.1), (14_200_000, 9.0), (450_000_000, 700.0)]
            {
                let copies = rotation_copies(bytes, l2, policy.l2_multiple);
                let fewest = if us * 2.0 >= policy.min_sample_us { 2 } else { 8 };
                let n = launches_per_graph(us, fewest, &policy, copies);
                assert!(n >= copies, "{bytes} B: {n} launches, {copies} copies");
                assert!(
                    n as u64 * bytes > (policy.l2_multiple * l2 as f64) as u64,
                    "{bytes} B x {n} launches stay within {}x L2",
                    policy.l2_multiple
                );
                assert!(n as f64 * us >= policy.min_sample_us || n == policy.max_launches);
                assert!(n >= fewest);
            }
        }
        // nothing to rotate: the sample's fill alone, within the policy's bounds
        let p = TimingPolicy::quick();
        assert_eq!(launches_per_graph(3.5, 8, &p, 1), 29);
        assert_eq!(launches_per_graph(0.5, 8, &p, 1), 200);
        assert_eq!(launches_per_graph(700.0, 2, &p, 1), 2);
        // tiny problems: the rotation is capped
        assert_eq!(launches_per_graph(2.0, 8, &p, 50_000), MAX_ROTATION_LAUNCHES);
    }
}

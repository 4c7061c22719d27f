//! GPU tests of the grouped MoE layer (need a CUDA GPU and NVRTC; `--features gpu`): the GPU
//! schedule against the CPU one, every sampled grouped variant against the CPU reference, and the
//! whole layer run twice (bit-identical) with finalize checked exactly, over routings that cover
//! decode and prefill sizes, both GLM-5 layouts, top_k 8 and 1, skew, and a layer whose experts
//! get nothing (expert parallelism with ids of other GPUs).

use super::*;
use crate::moe::config::search_space;

fn quick() -> TimingPolicy {
    TimingPolicy {
        samples: 3,
        min_sample_us: 20.0,
        max_launches: 8,
        warmup_replays: 1,
        l2_multiple: 0.5,
        interleaved: true,
    }
}

fn run_step(
    gpu: &Gpu,
    compiler: &Compiler,
    launcher: &MoeLauncher<'_>,
    step: MoeStep,
    per_op: usize,
) -> usize {
    let policy = quick();
    let d = StepData::new(gpu, step, &policy).unwrap();
    d.check_schedule(gpu, launcher).unwrap_or_else(|e| panic!("{step:?}: {e}"));
    if d.schedule.rows() == 0 {
        return 0;
    }
    let mut chosen: Vec<GroupedKernel> = Vec::new();
    let mut checked = 0;
    for op in MoeOp::ALL {
        let space = spread(search_space(op, &step.shape), per_op);
        let measured =
            measure_op(gpu, compiler, &policy, launcher, &d, op, &space, chosen.first()).unwrap();
        for m in &measured {
            assert!(m.median().is_some(), "{step:?} {}: {:?}", m.config, m.outcome);
        }
        checked += measured.len();
        chosen.push(GroupedKernel::load(gpu, compiler, best(&measured).unwrap().config).unwrap());
    }
    // the whole layer, twice: bit-identical outputs (no atomics, fixed orders)
    measure_layer(gpu, &policy, launcher, &d, &chosen[0], &chosen[1]).unwrap();
    let first = gpu.download(&d.y).unwrap();
    // SAFETY: the step's buffers, the Gpu's own stream.
    unsafe { launcher.layer(&chosen[0], &chosen[1], &d.args(1, 1), &d.ws, gpu.own_stream()) }
        .unwrap();
    gpu.synchronize().unwrap();
    assert_eq!(first, gpu.download(&d.y).unwrap(), "{step:?}: the layer is not deterministic");
    checked
}

#[test]
#[cfg_attr(
    not(feature = "gpu"),
    ignore = "GPU test: run with --features gpu on a machine with a CUDA GPU"
)]
fn grouped_moe_matches_the_cpu_reference_over_routings_and_sizes() {
    let gpu = Gpu::open(0).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let compiler = Compiler::new(Some(dir.path().to_path_buf())).unwrap();
    let kernels = MoeKernels::load(&gpu, &compiler).unwrap();
    let launcher = MoeLauncher { gpu: &gpu, kernels: &kernels };
    let tp8 = MoeShape::GLM5_TP8;
    let ep8 = MoeShape::GLM5_EP8;
    let step = |shape: MoeShape, begin: i32, tokens: u32, routing: Routing, seed: u64| MoeStep {
        shape,
        experts_total: 256,
        expert_begin: begin,
        tokens,
        routing,
        seed,
    };
    let mut checked = 0;
    for (s, per_op) in [
        (step(tp8, 0, 1, Routing::Uniform, 1), 12),
        (step(tp8, 0, 2, Routing::Uniform, 2), 6),
        (step(tp8, 0, 8, Routing::Uniform, 3), 12),
        (step(tp8, 0, 64, Routing::Uniform, 4), 12),
        (step(tp8, 0, 64, Routing::Skewed, 5), 6),
        (step(tp8, 0, 256, Routing::Uniform, 6), 8),
        (step(tp8, 0, 1024, Routing::Skewed, 7), 4),
        (step(MoeShape { top_k: 1, ..tp8 }, 0, 33, Routing::Uniform, 8), 4),
        (step(ep8, 32, 64, Routing::Uniform, 9), 6),
        (step(ep8, 224, 3, Routing::Skewed, 10), 4),
    ] {
        checked += run_step(&gpu, &compiler, &launcher, s, per_op);
    }
    // every row to experts 0..2, none of them on this GPU (local 64..95): align alone, empty lists
    assert_eq!(
        run_step(
            &gpu,
            &compiler,
            &launcher,
            step(MoeShape { top_k: 3, ..ep8 }, 64, 16, Routing::Skewed, 11),
            2
        ),
        0
    );
    assert!(checked >= 120, "{checked} verified variant runs");
    println!("{checked} grouped variant runs verified");
}

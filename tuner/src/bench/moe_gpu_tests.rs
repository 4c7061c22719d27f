//! GPU tests of the grouped MoE layer (need a CUDA GPU and NVRTC; `--features gpu`): the GPU
//! schedule against the CPU one, every sampled grouped variant against the CPU reference, and the
//! whole layer run twice (bit-identical) with finalize checked exactly, over routings that cover
//! decode and prefill sizes, both GLM-5 layouts, top_k 8 and 1, skew, a shared expert joined as
//! one more expert in every token's last slot, and a layer whose experts get nothing (expert
//! parallelism with ids of other GPUs), the family default of each step's layer and token count
//! among the variants, and a layer of another model; for W4A16 and for W4A4 (NVFP4 X and H: the X the layer
//! quantizes and the NVFP4 H of gate_up checked byte for byte against the CPU quantizer, each
//! chosen kernel run twice bit-identical, the layer with X quantized on the GPU equal to the layer
//! with X quantized on the CPU).

use super::*;
use crate::moe::space::search_space_for;

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
    a_type: AType,
    per_op: usize,
) -> usize {
    let policy = quick();
    let d = StepData::new_for(gpu, step, a_type, &policy).unwrap();
    d.check_schedule(gpu, launcher).unwrap_or_else(|e| panic!("{step:?}: {e}"));
    if d.schedule.rows() == 0 {
        return 0;
    }
    let mut chosen: Vec<GroupedKernel> = Vec::new();
    let mut checked = 0;
    for op in MoeOp::ALL {
        // The device's family: sm90 here, sm120 (W4A4, native MMA) on an SM120 GPU.
        let family = crate::runtime::family_for(gpu.info()).unwrap();
        // an even spread of the streamed kernels and of the tiled ones (W4A16)
        let (tiled, streamed): (Vec<_>, Vec<_>) =
            search_space_for(family, a_type, op, &step.shape).into_iter().partition(|c| c.tiled);
        let (wgmma, tiled): (Vec<_>, Vec<_>) = tiled.into_iter().partition(|c| c.wgmma);
        let mut space = spread(streamed, per_op);
        space.extend(spread(tiled.clone(), per_op.div_ceil(3)));
        // and the largest tile (128 rows)
        space.extend(tiled.last().filter(|c| !space.contains(c)));
        // and a spread of the wgmma kernels (W4A16), their 128-row tile included
        space.extend(spread(wgmma.clone(), per_op.div_ceil(3)));
        space.extend(wgmma.last().filter(|c| !space.contains(c)));
        // and (sm120) a spread of the gate_up kernels that split K on this step: their partial
        // slots, arrival counters and ordered sums
        let split = search_space_for(family, a_type, op, &step.shape)
            .into_iter()
            .filter(|c| c.split_k > 1 && crate::moe::sm120::splits_on(c, &step.shape, &d.schedule));
        for c in spread(split.collect(), per_op.div_ceil(3)) {
            if !space.contains(&c) {
                space.push(c);
            }
        }
        // and every measured seed with the activations in the warp ring (W4A16): their zero-filled
        // rows past a tile, their L1 copies and (flow) their ring across tiles on every routing
        let a_smem = crate::moe::seeds::measured_seeds(family, a_type, op)
            .into_iter()
            .filter(|c| c.a_smem && c.check(&step.shape).is_ok());
        for c in a_smem {
            if !space.contains(&c) {
                space.push(c);
            }
        }
        // and the family default the runtime launches for this layer and token count when the
        // table has no entry for the layer
        let layer = (&step.shape, step.experts_total);
        let defaults = super::FamilyDefaults::new(family, a_type, layer, gpu.info().sm_count);
        let space = super::with_default(space, defaults.at(op, step.tokens));
        assert!(!space.is_empty(), "{step:?} {op}: empty {a_type} space");
        let measured =
            measure_op(gpu, compiler, &policy, launcher, &d, op, &space, chosen.first()).unwrap();
        for m in &measured {
            // A warp-ring kernel that spills at its register cap is refused before it runs.
            let refused = m.config.warp_ring
                && matches!(&m.outcome, Outcome::Failed(e) if e.contains("spills registers"));
            assert!(
                m.median().is_some() || refused,
                "{step:?} {a_type} {}: {:?}",
                m.config,
                m.outcome
            );
        }
        checked += measured.len();
        chosen.push(GroupedKernel::load(gpu, compiler, best(&measured).unwrap().config).unwrap());
    }
    // the whole layer, twice: bit-identical outputs (no atomics, fixed orders)
    measure_layer(gpu, &policy, launcher, &d, &chosen[0], &chosen[1]).unwrap();
    let first = d.y(gpu).unwrap();
    let layer = |args: MoeArgs| {
        // SAFETY: the step's buffers, the Gpu's own stream.
        unsafe { launcher.layer(&chosen[0], &chosen[1], &args, &d.ws, gpu.own_stream()) }.unwrap();
        gpu.synchronize().unwrap();
        (d.y(gpu).unwrap(), gpu.download(d.ws.buffer()).unwrap())
    };
    let (again, ws_a) = layer(d.args_for(a_type, 1, 1, true).unwrap());
    assert_eq!(first, again, "{step:?} {a_type}: the layer is not deterministic");
    let (third, ws_b) = layer(d.args_for(a_type, 2, 2, true).unwrap());
    assert_eq!(first, third, "{step:?} {a_type}: the layer is not deterministic");
    let l = &d.ws.layout;
    let rows = d.schedule.rows() as usize;
    let (inter, hidden) = (step.shape.inter as usize, step.shape.hidden as usize);
    let h_fp4 = l.h_codes..l.h_codes + rows * inter / 2;
    let y_rows = l.y_rows..l.y_rows + rows * hidden * 2;
    assert!(ws_a[y_rows.clone()] == ws_b[y_rows], "{step:?}: per-row outputs differ between runs");
    // the split-K arrival counters (sm120) are back at zero after every launch
    let counters = l.split_counters..l.split_counters + l.split_counter_words * 4;
    assert!(ws_b[counters].iter().all(|&b| b == 0), "{step:?}: split-K counters left non-zero");
    if a_type == AType::Nvfp4 {
        assert!(ws_a[h_fp4.clone()] == ws_b[h_fp4], "{step:?}: H codes differ between runs");
        // X quantized by the CPU and handed over: the same output as the layer's own quantizer
        let (given, _) = layer(d.args_for(a_type, 0, 0, false).unwrap());
        assert_eq!(first, given, "{step:?}: X quantized on the GPU differs from the CPU's");
        // a W4A4 kernel refuses a W4A16 call (and the other way round)
        // SAFETY: refused before any launch.
        let wrong = unsafe { launcher.grouped(&chosen[0], &d.args(0, 0), &d.ws, gpu.own_stream()) };
        assert!(wrong.is_err(), "a W4A4 kernel ran a W4A16 call");
    }
    checked
}

/// The GPU, a compiler over a fresh cubin cache (kept alive by the returned folder) and the
/// layer's fixed kernels; `None`, said on standard error, when `w4a16` asks for the W4A16 grouped
/// kernels and the device's family has none (they are sm90 only).
fn setup(w4a16: bool) -> Option<(Gpu, Compiler, MoeKernels, tempfile::TempDir)> {
    let (gpu, dir) = (Gpu::open(0).unwrap(), tempfile::tempdir().unwrap());
    if w4a16 && crate::runtime::family_for(gpu.info()).unwrap() != crate::template::Family::Sm90 {
        eprintln!("skipped: W4A16 grouped kernels are sm90 only ({})", gpu.info().name);
        return None;
    }
    let compiler = Compiler::new(Some(dir.path().to_path_buf())).unwrap();
    let kernels = MoeKernels::load(&gpu, &compiler).unwrap();
    Some((gpu, compiler, kernels, dir))
}

/// The order kernels put codes into the layout `moe::order` computes on the CPU (the bytes the
/// bench uploads and the grouped kernels are verified on) and back, in place: both projections,
/// K with whole blocks, a 32-byte tail (K = 192) and an 8-byte one (K = 176), and a stack over
/// the scratch's 64 MiB (two passes); misaligned ranges and rows the layout cannot take are
/// refused.
#[test]
#[cfg_attr(
    not(feature = "gpu"),
    ignore = "GPU test: run with --features gpu on a machine with a CUDA GPU"
)]
fn the_order_kernels_match_the_cpu_layout_and_restore() {
    use crate::moe::order::{apply, CodeStack, WeightOrder};
    let Some((gpu, _compiler, kernels, _dir)) = setup(false) else { return };
    let launcher = MoeLauncher { gpu: &gpu, kernels: &kernels };
    let order = WeightOrder::of(crate::runtime::family_for(gpu.info()).unwrap());
    let mut rng = crate::moe::schedule::SplitMix64(0x0D0E);
    let stream = gpu.own_stream();
    let stacks = [
        CodeStack { op: MoeOp::GateUp, n: 64, k: 256, experts: 3 },
        CodeStack { op: MoeOp::Down, n: 48, k: 192, experts: 2 },
        CodeStack { op: MoeOp::GateUp, n: 32, k: 176, experts: 5 },
        CodeStack { op: MoeOp::Down, n: 6144, k: 256, experts: 3 },
        CodeStack { op: MoeOp::GateUp, n: 512, k: 6144, experts: 48 },
    ];
    for stack in stacks {
        let codes: Vec<u8> = (0..stack.bytes()).map(|_| rng.below(256) as u8).collect();
        let buf = gpu.upload(&codes).unwrap();
        // SAFETY: buf holds the stack's bytes on this device, used by nothing else meanwhile.
        unsafe { launcher.order_weights(buf.ptr(), stack, false, stream) }.unwrap();
        let want = apply(order, stack.op, stack.n as usize, stack.k as usize, &codes);
        assert!(gpu.download(&buf).unwrap() == want, "{stack:?}: into the layout");
        // SAFETY: as above.
        unsafe { launcher.order_weights(buf.ptr(), stack, true, stream) }.unwrap();
        assert!(gpu.download(&buf).unwrap() == codes, "{stack:?}: back to the ModelOpt layout");
    }
    let buf = gpu.upload(&vec![0u8; 1 << 16]).unwrap();
    let stack = CodeStack { op: MoeOp::Down, n: 16, k: 256, experts: 1 };
    for at in [buf.ptr() + 4, 0] {
        // SAFETY: refused before any launch.
        let e = unsafe { launcher.order_weights(at, stack, false, stream) }.unwrap_err();
        assert!(e.to_string().contains("16-byte aligned"), "{e}");
    }
    for bad in [
        CodeStack { n: 24, ..stack },
        CodeStack { k: 200, ..stack },
        CodeStack { experts: 0, ..stack },
    ] {
        // SAFETY: as above.
        let e = unsafe { launcher.order_weights(buf.ptr(), bad, false, stream) }.unwrap_err();
        assert!(e.to_string().contains("multiples of 16"), "{bad:?}: {e}");
    }
}

fn step(shape: MoeShape, begin: i32, tokens: u32, routing: Routing, seed: u64) -> MoeStep {
    MoeStep { shape, experts_total: 256, expert_begin: begin, tokens, routing, seed }
}

/// A step of a layer whose experts are all on this GPU (tensor parallelism).
fn whole_layer(shape: MoeShape, tokens: u32, routing: Routing, seed: u64) -> MoeStep {
    MoeStep { experts_total: shape.experts, ..step(shape, 0, tokens, routing, seed) }
}

/// Both routing forms (one CTA; chunked) write the CPU's schedule, on routings with a partial
/// last chunk, uniform and skewed, top_k 8, 3 and 1, expert parallelism (ids of other GPUs
/// skipped; decode steps with a few local ids), decode steps of 1 to 256 routed ids, and the 512
/// local experts moe_align takes at most; each form on a poisoned schedule
/// (`StepData::check_schedule`).
#[test]
#[cfg_attr(
    not(feature = "gpu"),
    ignore = "GPU test: run with --features gpu on a machine with a CUDA GPU"
)]
fn both_routing_forms_write_the_cpu_schedule() {
    let Some((gpu, _compiler, kernels, _dir)) = setup(false) else { return };
    let launcher = MoeLauncher { gpu: &gpu, kernels: &kernels };
    let tp8 = MoeShape::GLM5_TP8;
    let ep8 = MoeShape::GLM5_EP8;
    let wide = MoeShape { experts: 512, ..tp8 };
    let steps = [
        step(tp8, 0, 1000, Routing::Uniform, 31),
        step(tp8, 0, 515, Routing::Skewed, 32),
        step(MoeShape { top_k: 3, ..tp8 }, 0, 1501, Routing::Uniform, 33),
        step(MoeShape { top_k: 1, ..tp8 }, 0, 4097, Routing::Skewed, 34),
        step(ep8, 96, 700, Routing::Uniform, 35),
        step(ep8, 224, 2048, Routing::Skewed, 36),
        MoeStep { experts_total: 512, ..step(wide, 0, 640, Routing::Uniform, 37) },
        // decode steps
        step(tp8, 0, 1, Routing::Uniform, 38),
        step(MoeShape { top_k: 1, ..tp8 }, 0, 1, Routing::Uniform, 39),
        step(tp8, 0, 32, Routing::Skewed, 40),
        step(MoeShape { top_k: 3, ..tp8 }, 0, 29, Routing::Uniform, 41),
        step(ep8, 96, 8, Routing::Skewed, 42),
        step(ep8, 64, 2, Routing::Skewed, 43),
        MoeStep { experts_total: 512, ..step(wide, 0, 5, Routing::Uniform, 44) },
    ];
    for s in steps {
        let d = StepData::new_for(&gpu, s, AType::Bf16, &quick()).unwrap();
        d.check_schedule(&gpu, &launcher).unwrap_or_else(|e| panic!("{s:?}: {e}"));
    }
}

#[test]
#[cfg_attr(
    not(feature = "gpu"),
    ignore = "GPU test: run with --features gpu on a machine with a CUDA GPU"
)]
fn grouped_moe_matches_the_cpu_reference_over_routings_and_sizes() {
    let Some((gpu, compiler, kernels, _dir)) = setup(true) else { return };
    let launcher = MoeLauncher { gpu: &gpu, kernels: &kernels };
    let tp8 = MoeShape::GLM5_TP8;
    let ep8 = MoeShape::GLM5_EP8;
    let bf16 = AType::Bf16;
    let shared = MoeShape { experts: 257, top_k: 9, ..tp8 };
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
        // the shared expert joined as expert 256 of 257, in every token's ninth slot
        (whole_layer(shared, 8, Routing::SharedLast, 12), 4),
        // a layer of another model (Qwen3-30B-A3B over 8 GPUs: down's K of 96 on the K-tail form)
        (
            whole_layer(
                MoeShape { hidden: 2048, inter: 96, experts: 128, top_k: 8 },
                24,
                Routing::Uniform,
                13,
            ),
            2,
        ),
    ] {
        checked += run_step(&gpu, &compiler, &launcher, s, bf16, per_op);
    }
    // every row to experts 0..2, none of them on this GPU (local 64..95): align alone, empty lists
    let nothing = step(MoeShape { top_k: 3, ..ep8 }, 64, 16, Routing::Skewed, 11);
    assert_eq!(run_step(&gpu, &compiler, &launcher, nothing, bf16, 2), 0);
    assert!(checked >= 120, "{checked} verified variant runs");
    println!("{checked} grouped variant runs verified");
}

/// W4A4 (exact emulation of the NVFP4 x NVFP4 product): B = 1, 8, 64, 256 on uniform and skewed
/// routings, top_k 8 and 1, the EP8 layer on two expert ranges, a layer whose experts get nothing.
#[test]
#[cfg_attr(
    not(feature = "gpu"),
    ignore = "GPU test: run with --features gpu on a machine with a CUDA GPU"
)]
fn grouped_moe_w4a4_matches_the_cpu_reference_over_routings_and_sizes() {
    let Some((gpu, compiler, kernels, _dir)) = setup(false) else { return };
    let launcher = MoeLauncher { gpu: &gpu, kernels: &kernels };
    let tp8 = MoeShape::GLM5_TP8;
    let ep8 = MoeShape::GLM5_EP8;
    let top1 = MoeShape { top_k: 1, ..tp8 };
    let w4a4 = AType::Nvfp4;
    let mut checked = 0;
    for (s, per_op) in [
        (step(tp8, 0, 1, Routing::Uniform, 21), 12),
        (step(tp8, 0, 1, Routing::Skewed, 22), 6),
        (step(tp8, 0, 8, Routing::Uniform, 23), 12),
        (step(tp8, 0, 8, Routing::Skewed, 24), 6),
        (step(tp8, 0, 64, Routing::Uniform, 25), 12),
        (step(tp8, 0, 64, Routing::Skewed, 26), 8),
        (step(tp8, 0, 256, Routing::Uniform, 27), 8),
        (step(tp8, 0, 256, Routing::Skewed, 28), 6),
        (step(top1, 0, 1, Routing::Uniform, 29), 4),
        (step(top1, 0, 64, Routing::Uniform, 30), 6),
        (step(top1, 0, 256, Routing::Skewed, 31), 4),
        (step(ep8, 32, 8, Routing::Uniform, 32), 4),
        (step(ep8, 32, 64, Routing::Uniform, 33), 6),
        (step(ep8, 0, 256, Routing::Skewed, 34), 4),
        (step(ep8, 224, 3, Routing::Skewed, 35), 4),
        (whole_layer(MoeShape { experts: 257, top_k: 9, ..tp8 }, 1, Routing::SharedLast, 39), 4),
    ] {
        checked += run_step(&gpu, &compiler, &launcher, s, w4a4, per_op);
    }
    let nothing = step(MoeShape { top_k: 3, ..ep8 }, 64, 16, Routing::Skewed, 36);
    assert_eq!(run_step(&gpu, &compiler, &launcher, nothing, w4a4, 2), 0);
    // Family sm120 also runs a down K of 176 (GLM-4.5-Air over 8 GPUs) in its K-tail form, whose
    // NVFP4 H rows are 88 bytes; the sm90 W4A4 kernels (streamed only) refuse that layer.
    let air = MoeShape { hidden: 4096, inter: 176, experts: 128, top_k: 8 };
    let family = crate::runtime::family_for(gpu.info()).unwrap();
    let runs_air = crate::moe::space::check_layer(family, w4a4, &air).is_ok();
    assert_eq!(runs_air, family == crate::template::Family::Sm120, "{family}");
    if runs_air {
        for (tokens, routing, seed) in [(1, Routing::Uniform, 37), (64, Routing::Skewed, 38)] {
            let s = whole_layer(air, tokens, routing, seed);
            checked += run_step(&gpu, &compiler, &launcher, s, w4a4, 6);
        }
    }
    assert!(checked >= 150, "{checked} verified W4A4 variant runs");
    println!("{checked} grouped W4A4 variant runs verified");
}

/// Layers whose down projection no streamed kernel takes: Qwen3-235B-A22B over 8 GPUs (128
/// experts, top-8, hidden 4096, 192 of the 1536 intermediate columns: down K = 192, 64-k stages of
/// the tiled kernel and the wgmma kernel), a K = 320 layer of 40 experts, top-3, and two whose K
/// 64 does not split (the tiled kernel's K-tail form alone): GLM-4.5-Air (176 of 1408 columns,
/// K = 176) and Qwen3-30B-A3B (96 of 768 columns, hidden 2048, K = 96) over 8 GPUs, at decode and
/// prefill sizes, uniform and skewed, with NaN in the weights' padding scale columns: every
/// sampled variant against the CPU reference, the layer twice bit-identical.
#[test]
#[cfg_attr(
    not(feature = "gpu"),
    ignore = "GPU test: run with --features gpu on a machine with a CUDA GPU"
)]
fn grouped_moe_takes_a_down_k_of_16_multiples() {
    let Some((gpu, compiler, kernels, _dir)) = setup(true) else { return };
    let launcher = MoeLauncher { gpu: &gpu, kernels: &kernels };
    let qwen = MoeShape { hidden: 4096, inter: 192, experts: 128, top_k: 8 };
    let odd = MoeShape { hidden: 2048, inter: 320, experts: 40, top_k: 3 };
    let air = MoeShape { hidden: 4096, inter: 176, experts: 128, top_k: 8 };
    let a3b = MoeShape { hidden: 2048, inter: 96, experts: 128, top_k: 8 };
    let at = whole_layer;
    let mut checked = 0;
    for (s, per_op) in [
        (at(qwen, 1, Routing::Uniform, 41), 8),
        (at(qwen, 8, Routing::Skewed, 42), 6),
        (at(qwen, 64, Routing::Uniform, 43), 8),
        (at(qwen, 1024, Routing::Uniform, 44), 4),
        (at(odd, 5, Routing::Uniform, 45), 6),
        (at(odd, 300, Routing::Skewed, 46), 4),
        (at(air, 1, Routing::Uniform, 47), 6),
        (at(air, 16, Routing::Skewed, 48), 6),
        (at(air, 64, Routing::Uniform, 49), 6),
        (at(air, 1024, Routing::Uniform, 50), 4),
        (at(a3b, 3, Routing::Uniform, 51), 6),
        (at(a3b, 700, Routing::Skewed, 52), 4),
    ] {
        for op in MoeOp::ALL {
            let (_, k) = s.shape.nk(op);
            let space = search_space_for(crate::template::Family::Sm90, AType::Bf16, op, &s.shape);
            assert!(k % 128 == 0 || space.iter().all(|c| c.tiled), "{op} K = {k}");
            assert!(k % 64 == 0 || space.iter().all(|c| c.k_tail), "{op} K = {k}");
        }
        checked += run_step(&gpu, &compiler, &launcher, s, AType::Bf16, per_op);
    }
    assert!(checked >= 100, "{checked} verified variant runs");
    println!("{checked} grouped variant runs with a 16-multiple K verified");
}

//! GPU tests of the dispatcher (need a CUDA GPU and NVRTC; `--features gpu`).

use super::*;
use crate::format::{quantize_activations, quantize_weight, reference_gemm, GemmA, Nvfp4Matrix};
use crate::gpu::{DeviceBuf, Gpu};
use crate::problem::{AType, GemmProblem};
use crate::table::{DeviceIdentity, Entry, Method, Table, TableKey, Toolchain};
use crate::template::{
    default_config, fallback_configs, family_template_hash, search_space, GemmConfig,
};
use half::bf16;
use rand::{Rng, SeedableRng};
use std::path::Path;

struct Operands {
    w: Nvfp4Matrix,
    a_bf16: Vec<bf16>,
    a_fp4: Option<Nvfp4Matrix>,
}

fn operands(p: &GemmProblem, seed: u64) -> Operands {
    let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let wf: Vec<f32> = (0..n * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let w = quantize_weight(&wf, n, k).unwrap();
    let a_bf16: Vec<bf16> =
        (0..m * k).map(|_| bf16::from_f32(rng.random_range(-2.0f32..2.0))).collect();
    let a_fp4 = (p.a_type == AType::Nvfp4).then(|| {
        let amax = a_bf16.iter().fold(0f32, |acc, v| acc.max(v.to_f32().abs()));
        quantize_activations(&a_bf16, m, k, amax / (6.0 * 448.0)).unwrap()
    });
    Operands { w, a_bf16, a_fp4 }
}

/// Run `p` through the dispatcher on stream 0 and compare with the CPU reference; returns the
/// route taken.
fn run(gpu: &Gpu, d: &Dispatcher, p: GemmProblem, seed: u64) -> Route {
    let o = operands(&p, seed);
    let reference = match &o.a_fp4 {
        Some(a) => reference_gemm(GemmA::Nvfp4(a), &o.w).unwrap(),
        None => reference_gemm(
            GemmA::Bf16 { data: &o.a_bf16, rows: p.m as usize, cols: p.k as usize },
            &o.w,
        )
        .unwrap(),
    };
    let dw = gpu.upload(&o.w.codes).unwrap();
    let dwsf = gpu.upload(&o.w.scales_swizzled()).unwrap();
    let (da, dasf): (DeviceBuf<u8>, Option<DeviceBuf<u8>>) = match &o.a_fp4 {
        Some(a) => (gpu.upload(&a.codes).unwrap(), Some(gpu.upload(&a.scales_swizzled()).unwrap())),
        None => (
            gpu.upload(
                &o.a_bf16.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect::<Vec<u8>>(),
            )
            .unwrap(),
            None,
        ),
    };
    let dy = gpu.alloc_zeros::<u16>((p.m * p.n) as usize).unwrap();
    gpu.synchronize().unwrap();
    let args = GemmArgs {
        a: da.ptr(),
        a_sf: dasf.as_ref().map_or(0, |b| b.ptr()),
        w: dw.ptr(),
        w_sf: dwsf.ptr(),
        y: dy.ptr(),
        m: p.m,
        n: p.n,
        k: p.k,
        a_type: p.a_type,
        alpha: reference.alpha,
    };
    // SAFETY: the buffers are live device allocations of the layout's sizes for p, kept until
    // after the synchronization; stream 0 is the legacy default stream.
    let route = unsafe { d.gemm(&args, 0) }.unwrap();
    // SAFETY: as above.
    unsafe { d.synchronize(0) }.unwrap();
    let y = gpu.download(&dy).unwrap();
    let max_ref = reference.y_f32.iter().fold(0f32, |a, v| a.max(v.abs()));
    let max_err = y
        .iter()
        .zip(&reference.y_f32)
        .map(|(g, r)| (bf16::from_bits(*g).to_f32() - r).abs())
        .fold(0f32, f32::max);
    assert!(
        max_err <= max_ref * 2f32.powi(-7),
        "{p} with {} ({:?}): max |err| {max_err} vs max |ref| {max_ref}",
        route.config,
        route.kind
    );
    route
}

/// A table for this device with (512, 6144) W4A16 at buckets 1 and 16; bucket 16 uses a split-K
/// configuration when the family has one.
fn table_for(gpu: &Gpu) -> (Table, GemmConfig, GemmConfig) {
    let info = gpu.info();
    let family = super::plan::family_for(info).unwrap();
    let d = default_config(family, AType::Bf16);
    let p16 = GemmProblem::new(16, 512, 6144, AType::Bf16);
    let split = search_space(family, AType::Bf16)
        .into_iter()
        .find(|c| c.split_k > 1 && c.check_problem(&p16).is_ok())
        .unwrap_or(d);
    let mut t = Table::new(
        DeviceIdentity {
            name: info.name.clone(),
            compute_capability: info.compute_capability,
            sm_count: info.sm_count,
        },
        Toolchain { nvrtc: (13, 0), driver: info.driver_version },
        "test".into(),
    );
    t.template_hashes.insert(family, family_template_hash(family));
    let entry = |m, config| Entry {
        key: TableKey::gemm(family, AType::Bf16, 512, 6144, m),
        method: Method::Fused,
        config,
        median_us: 5.0,
        interval_us: (4.9, 5.1),
        roofline_fraction: 0.3,
        runners_up: vec![],
    };
    t.entries = vec![entry(1, d), entry(16, split)];
    t.validate("test").unwrap();
    (t, d, split)
}

#[test]
#[cfg_attr(
    not(feature = "gpu"),
    ignore = "GPU test: run with --features gpu on a machine with a CUDA GPU"
)]
fn gemm_through_the_table_matches_the_reference() {
    let gpu = Gpu::open(0).unwrap();
    let (table, d, split) = table_for(&gpu);
    let cache = tempfile::tempdir().unwrap();
    // Workspace sized for M <= 16 only, so M = 200 on the split-K route must grow it.
    let options =
        Options { cache_dir: Some(cache.path().join("cubin")), max_m: 16, ..Options::default() };
    let disp = Dispatcher::open_with(Some((&table, Path::new("test.ron"))), &options).unwrap();
    let r = disp.report();
    assert!(r.compiled >= 1 && r.from_disk_cache == 0, "{r}");
    assert_eq!(r.shapes, 1);
    let bf = |m| GemmProblem::new(m, 512, 6144, AType::Bf16);
    let route = run(&gpu, &disp, bf(1), 1);
    assert_eq!((route.config, route.kind), (d, RouteKind::Exact));
    let route = run(&gpu, &disp, bf(5), 2);
    assert_eq!((route.config, route.kind), (split, RouteKind::NearestBucket { bucket: 16 }));
    run(&gpu, &disp, bf(16), 3);
    let before = disp.workspace_bytes();
    run(&gpu, &disp, bf(200), 4);
    if split.split_k > 1 {
        assert!(disp.workspace_bytes() > before, "the workspace grew");
    }
    run(&gpu, &disp, bf(200), 5); // again, on the grown workspace (counters left zeroed)
                                  // A shape the table does not know: the common configuration or the default, recorded.
    let route = run(&gpu, &disp, GemmProblem::new(3, 6144, 256, AType::Bf16), 6);
    assert!(matches!(route.kind, RouteKind::Common | RouteKind::Default), "{route:?}");
    assert_eq!(disp.fallbacks().len(), 1, "{:?}", disp.fallbacks());
    drop(disp);
    // A second open finds every kernel in the disk cache.
    let disp = Dispatcher::open_with(Some((&table, Path::new("test.ron"))), &options).unwrap();
    assert_eq!(disp.report().compiled, 0, "{}", disp.report());
}

#[test]
#[cfg_attr(
    not(feature = "gpu"),
    ignore = "GPU test: run with --features gpu on a machine with a CUDA GPU"
)]
fn dequantize_then_cublas_entries_run_through_the_table() {
    let gpu = Gpu::open(0).unwrap();
    let (mut table, d, _) = table_for(&gpu);
    // W4A16 and W4A4 entries that chose the composite path at M = 64 (fallback: the default).
    let family = d.family;
    for a_type in [AType::Bf16, AType::Nvfp4] {
        let fallback = default_config(family, a_type);
        table.entries.push(Entry {
            key: TableKey::gemm(family, a_type, 200, 512, 64),
            method: Method::DequantCublasBf16,
            config: fallback,
            median_us: 9.0,
            interval_us: (8.9, 9.1),
            roofline_fraction: 0.2,
            runners_up: vec![],
        });
    }
    table.validate("test").unwrap();
    let cache = tempfile::tempdir().unwrap();
    let options =
        Options { cache_dir: Some(cache.path().to_path_buf()), max_m: 64, ..Options::default() };
    let disp = Dispatcher::open_with(Some((&table, Path::new("test.ron"))), &options).unwrap();
    assert!(disp.report().composite_bytes >= 200 * 512 * 2, "{}", disp.report());
    for (a_type, m, seed) in [(AType::Bf16, 64, 21), (AType::Nvfp4, 64, 22), (AType::Bf16, 100, 23)]
    {
        let route = run(&gpu, &disp, GemmProblem::new(m, 200, 512, a_type), seed);
        assert_eq!(route.method, Method::DequantCublasBf16, "{route:?}");
        assert_eq!(route.name(), "dequant_cublas_bf16");
    }
    // (M = 100 above took the nearest bucket, 64.) Other shapes still run fused kernels.
    let route = run(&gpu, &disp, GemmProblem::new(1, 512, 6144, AType::Bf16), 24);
    assert_eq!(route.method, Method::Fused);
}

#[test]
#[cfg_attr(
    not(feature = "gpu"),
    ignore = "GPU test: run with --features gpu on a machine with a CUDA GPU"
)]
fn untuned_dispatcher_runs_both_activation_types_with_defaults() {
    let gpu = Gpu::open(0).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let options = Options { cache_dir: Some(cache.path().to_path_buf()), ..Options::default() };
    let disp = Dispatcher::open_untuned(&options).unwrap();
    let family = disp.family();
    for a_type in [AType::Bf16, AType::Nvfp4] {
        if default_config(family, a_type)
            .check_problem(&GemmProblem::new(7, 512, 6144, a_type))
            .is_err()
        {
            continue; // the family has no kernel for this activation type
        }
        // each decode default (1024-k ring, 256-k stages, 32-row tiles), then the generic one
        for (m, n, k) in [(1, 512, 6144), (3, 4096, 1792), (5, 2048, 384), (70, 512, 6144)] {
            let p = GemmProblem::new(m, n, k, a_type);
            let route = run(&gpu, &disp, p, 11 + u64::from(m));
            assert_eq!(route.kind, RouteKind::Default, "{p}");
            let expected = fallback_configs(family, a_type, m, n, k)
                .into_iter()
                .find(|c| c.check_problem(&p).is_ok())
                .unwrap();
            assert_eq!(route.config, expected, "{p}");
        }
    }
    // Bad arguments are refused, not launched.
    let args = GemmArgs {
        a: 0,
        a_sf: 0,
        w: 1,
        w_sf: 1,
        y: 1,
        m: 1,
        n: 512,
        k: 6144,
        a_type: AType::Bf16,
        alpha: 1.0,
    };
    // SAFETY: refused before any launch (null `a`).
    let e = unsafe { disp.gemm(&args, 0) }.unwrap_err();
    assert!(e.to_string().contains("null device pointer `a`"), "{e}");
}

/// One GEMM's operands on the device, its output buffer and its CPU reference.
struct Uploaded {
    p: GemmProblem,
    _keep: Vec<DeviceBuf<u8>>,
    args: GemmArgs,
    y: DeviceBuf<u16>,
    reference: Vec<f32>,
}

fn upload(gpu: &Gpu, p: GemmProblem, seed: u64) -> Uploaded {
    let o = operands(&p, seed);
    let reference = match &o.a_fp4 {
        Some(a) => reference_gemm(GemmA::Nvfp4(a), &o.w).unwrap(),
        None => reference_gemm(
            GemmA::Bf16 { data: &o.a_bf16, rows: p.m as usize, cols: p.k as usize },
            &o.w,
        )
        .unwrap(),
    };
    let dw = gpu.upload(&o.w.codes).unwrap();
    let dwsf = gpu.upload(&o.w.scales_swizzled()).unwrap();
    let (da, dasf) = match &o.a_fp4 {
        Some(a) => (gpu.upload(&a.codes).unwrap(), Some(gpu.upload(&a.scales_swizzled()).unwrap())),
        None => {
            let bytes: Vec<u8> = o.a_bf16.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect();
            (gpu.upload(&bytes).unwrap(), None)
        }
    };
    let y = gpu.alloc_zeros::<u16>((p.m * p.n) as usize).unwrap();
    let args = GemmArgs {
        a: da.ptr(),
        a_sf: dasf.as_ref().map_or(0, |b| b.ptr()),
        w: dw.ptr(),
        w_sf: dwsf.ptr(),
        y: y.ptr(),
        m: p.m,
        n: p.n,
        k: p.k,
        a_type: p.a_type,
        alpha: reference.alpha,
    };
    let mut keep = vec![da, dw, dwsf];
    keep.extend(dasf);
    Uploaded { p, _keep: keep, args, y, reference: reference.y_f32 }
}

impl Uploaded {
    /// The output, checked against the CPU reference with the bound of `run`.
    fn checked(&self, gpu: &Gpu, what: &str) -> Vec<u16> {
        let y = gpu.download(&self.y).unwrap();
        let max_ref = self.reference.iter().fold(0f32, |a, v| a.max(v.abs()));
        let max_err = y
            .iter()
            .zip(&self.reference)
            .map(|(g, r)| (bf16::from_bits(*g).to_f32() - r).abs())
            .fold(0f32, f32::max);
        assert!(
            max_err <= max_ref * 2f32.powi(-7),
            "{} ({what}): max |err| {max_err} vs max |ref| {max_ref}",
            self.p
        );
        y
    }
}

/// Split-K launches of one entry on two streams at once, each stream with its own workspace and
/// its own weights and activations (the two micro-batches of a serving engine): every output
/// equals, bit for bit, the output of the same launch on one stream alone (split-K sums in a
/// fixed order), and matches the CPU reference. The second stream's launches are also captured
/// into a CUDA graph and replayed against direct launches on the first: a workspace sized at
/// creation allocates and synchronizes nothing. A launch the workspace cannot hold and a
/// workspace of another dispatcher are refused.
#[test]
#[cfg_attr(
    not(feature = "gpu"),
    ignore = "GPU test: run with --features gpu on a machine with a CUDA GPU"
)]
fn split_k_launches_on_two_streams_with_their_own_workspaces_match_one_stream() {
    let gpu = Gpu::open(0).unwrap();
    // A second handle: its own stream in the same primary context.
    let other = Gpu::open(0).unwrap();
    let streams = [gpu.own_stream(), other.own_stream()];
    assert_ne!(streams[0], streams[1]);
    let (table, _, split) = table_for(&gpu);
    assert!(split.split_k > 1, "the family has a split-K configuration for M = 16: {split}");
    let cache = tempfile::tempdir().unwrap();
    let options =
        Options { cache_dir: Some(cache.path().join("cubin")), max_m: 16, ..Options::default() };
    let disp = Dispatcher::open_with(Some((&table, Path::new("test.ron"))), &options).unwrap();
    let p = GemmProblem::new(16, 512, 6144, AType::Bf16);
    let route = disp.route(16, 512, 6144, AType::Bf16).unwrap();
    assert_eq!((route.config, route.kind), (split, RouteKind::Exact));
    let ws = [disp.gemm_workspace(16).unwrap(), disp.gemm_workspace(16).unwrap()];
    assert!(ws[0].capacity().split_k_floats >= split.workspace_floats(&p), "{:?}", ws[0]);
    const ROUNDS: usize = 12;
    // sets[s][r]: stream s, round r; different weights per stream, activations per launch.
    let mut sets: Vec<Vec<Uploaded>> = (0..2)
        .map(|s| (0..ROUNDS).map(|r| upload(&gpu, p, 100 + 37 * s as u64 + r as u64)).collect())
        .collect();
    gpu.synchronize().unwrap();
    // One stream alone, one launch at a time.
    let mut alone: Vec<Vec<Vec<u16>>> = Vec::new();
    for set in &mut sets {
        let mut outs = Vec::new();
        for u in set {
            // SAFETY: live buffers of the layout's sizes for p, kept until the synchronization;
            // the Gpu's own stream; ws[0] is used by this stream only.
            unsafe { disp.gemm_in(&u.args, &ws[0], streams[0]) }.unwrap();
            // SAFETY: as above.
            unsafe { disp.synchronize(streams[0]) }.unwrap();
            outs.push(u.checked(&gpu, "one stream"));
            gpu.zero(&mut u.y).unwrap();
        }
        alone.push(outs);
    }
    gpu.synchronize().unwrap();
    // Every output equals the one-stream output, then is zeroed again (a launch that did not run
    // cannot pass the next comparison).
    let compare = |sets: &mut [Vec<Uploaded>], what: &str| {
        for (s, set) in sets.iter_mut().enumerate() {
            for (r, u) in set.iter_mut().enumerate() {
                let y = u.checked(&gpu, what);
                assert!(y == alone[s][r], "{what}: stream {s} round {r} differs from one stream");
                gpu.zero(&mut u.y).unwrap();
            }
        }
        gpu.synchronize().unwrap();
    };
    // Both streams at once, launches interleaved, no synchronization in between.
    for (u0, u1) in sets[0].iter().zip(&sets[1]) {
        for (s, u) in [u0, u1].into_iter().enumerate() {
            // SAFETY: as above; stream s uses workspace s only.
            unsafe { disp.gemm_in(&u.args, &ws[s], streams[s]) }.unwrap();
        }
    }
    for s in streams {
        // SAFETY: live streams of the primary context.
        unsafe { disp.synchronize(s) }.unwrap();
    }
    compare(&mut sets, "two streams");
    // The second stream's launches captured into a graph, replayed next to direct launches on the
    // first stream.
    let graph = other
        .capture(|| {
            for u in &sets[1] {
                // SAFETY: as above; the capturing stream is `other`'s own.
                unsafe { disp.gemm_in(&u.args, &ws[1], streams[1]) }.map_err(|e| {
                    crate::gpu::GpuError::Kernel {
                        kernel: "gemm_in".into(),
                        message: e.to_string(),
                    }
                })?;
            }
            Ok(())
        })
        .unwrap();
    graph.launch().unwrap();
    for u in &sets[0] {
        // SAFETY: as above.
        unsafe { disp.gemm_in(&u.args, &ws[0], streams[0]) }.unwrap();
    }
    other.synchronize().unwrap();
    gpu.synchronize().unwrap();
    compare(&mut sets, "a captured graph on the second stream");
    // M = 200 takes the split-K bucket 16 and needs more than a workspace for M <= 16 holds.
    let big = upload(&gpu, GemmProblem::new(200, 512, 6144, AType::Bf16), 9);
    gpu.synchronize().unwrap();
    // SAFETY: refused before anything is enqueued.
    let e = unsafe { disp.gemm_in(&big.args, &ws[0], streams[0]) }.unwrap_err();
    assert!(matches!(e, RuntimeError::WorkspaceTooSmall { max_m: 16, .. }), "{e}");
    let ws200 = disp.gemm_workspace(200).unwrap();
    // SAFETY: as above.
    unsafe { disp.gemm_in(&big.args, &ws200, streams[0]) }.unwrap();
    gpu.synchronize().unwrap();
    big.checked(&gpu, "a workspace for M <= 200");
    // A workspace of another dispatcher is refused.
    let disp2 = Dispatcher::open_with(Some((&table, Path::new("test.ron"))), &options).unwrap();
    let foreign = disp2.gemm_workspace(16).unwrap();
    // SAFETY: refused before anything is enqueued.
    let e = unsafe { disp.gemm_in(&sets[0][0].args, &foreign, streams[0]) }.unwrap_err();
    assert!(matches!(e, RuntimeError::ForeignWorkspace), "{e}");
}

/// Dequantize-then-cuBLAS entries on two streams at once, each with its own workspace (the bf16
/// expansion of W and cuBLAS's workspace) and its own weights: every output matches the CPU
/// reference (a shared expansion would multiply by the other stream's weights).
#[test]
#[cfg_attr(
    not(feature = "gpu"),
    ignore = "GPU test: run with --features gpu on a machine with a CUDA GPU"
)]
fn dequantize_then_cublas_on_two_streams_with_their_own_workspaces_is_correct() {
    let gpu = Gpu::open(0).unwrap();
    let other = Gpu::open(0).unwrap();
    let streams = [gpu.own_stream(), other.own_stream()];
    let (mut table, d, _) = table_for(&gpu);
    table.entries.push(Entry {
        key: TableKey::gemm(d.family, AType::Bf16, 1024, 2048, 64),
        method: Method::DequantCublasBf16,
        config: default_config(d.family, AType::Bf16),
        median_us: 9.0,
        interval_us: (8.9, 9.1),
        roofline_fraction: 0.2,
        runners_up: vec![],
    });
    table.validate("test").unwrap();
    let cache = tempfile::tempdir().unwrap();
    let options =
        Options { cache_dir: Some(cache.path().to_path_buf()), max_m: 64, ..Options::default() };
    let disp = Dispatcher::open_with(Some((&table, Path::new("test.ron"))), &options).unwrap();
    let p = GemmProblem::new(64, 1024, 2048, AType::Bf16);
    assert_eq!(disp.route(64, 1024, 2048, AType::Bf16).unwrap().method, Method::DequantCublasBf16);
    let ws = [disp.gemm_workspace(64).unwrap(), disp.gemm_workspace(64).unwrap()];
    assert!(ws[0].capacity().composite_elems >= 1024 * 2048, "{:?}", ws[0].capacity());
    assert!(ws[0].capacity().blas_bytes > 0);
    const ROUNDS: usize = 8;
    let sets: Vec<Vec<Uploaded>> = (0..2)
        .map(|s| (0..ROUNDS).map(|r| upload(&gpu, p, 500 + 41 * s as u64 + r as u64)).collect())
        .collect();
    gpu.synchronize().unwrap();
    for (u0, u1) in sets[0].iter().zip(&sets[1]) {
        for (s, u) in [u0, u1].into_iter().enumerate() {
            // SAFETY: live buffers of the layout's sizes, kept until the synchronization below;
            // stream s uses workspace s only.
            unsafe { disp.gemm_in(&u.args, &ws[s], streams[s]) }.unwrap();
        }
    }
    other.synchronize().unwrap();
    gpu.synchronize().unwrap();
    for (s, set) in sets.iter().enumerate() {
        for (r, u) in set.iter().enumerate() {
            u.checked(&gpu, &format!("stream {s} round {r}"));
        }
    }
}

/// The grouped route a dispatcher reports is the kernel its grouped launches pick, at every
/// token count (inside, between and beyond the tuned buckets), for the committed H200 table's
/// grouped entries and for the family defaults of a layer outside the table.
#[test]
#[cfg_attr(
    not(feature = "gpu"),
    ignore = "GPU test: run with --features gpu on a machine with a CUDA GPU"
)]
fn grouped_routes_name_the_kernels_the_grouped_launches_run() {
    let gpu = Gpu::open(0).unwrap();
    if gpu.info().compute_capability != (9, 0) {
        eprintln!("skipped: the grouped kernels run on the sm90 family");
        return;
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/nvidia-h200.ron");
    let mut table = Table::load(&path).unwrap();
    table.entries.clear(); // the grouped entries only
    let cache = tempfile::tempdir().unwrap();
    let options = Options { cache_dir: Some(cache.path().to_path_buf()), ..Options::default() };
    let disp = Dispatcher::open_with(Some((&table, path.as_path())), &options).unwrap();
    let shape = crate::moe::MoeShape::GLM5_TP8;
    let mut layers = disp.moe_layers();
    layers.sort_by_key(|&(_, a)| a != AType::Bf16);
    assert_eq!(layers, vec![(shape, AType::Bf16), (shape, AType::Nvfp4)]);
    let summary = disp.report().moe_layers.join("\n");
    assert!(
        summary.contains(&format!("grouped MoE w4a16 {shape}: gate_up at B = 1, 2")),
        "{summary}"
    );
    for a_type in [AType::Bf16, AType::Nvfp4] {
        for tokens in [1, 2, 3, 5, 8, 20, 23, 100, 700, 1024, 4096, 100_000] {
            let r = disp.moe_route(&shape, 256, a_type, tokens).unwrap();
            let (gate_up, down) = disp.moe().unwrap().route_for(&shape, a_type, tokens).unwrap();
            let at = format!("{a_type:?} B={tokens}: {r}");
            assert_eq!((r.gate_up.config, r.down.config), (gate_up, down), "{at}");
            let entry = |op, b| {
                let e = table
                    .moe
                    .iter()
                    .find(|e| e.key.op == op && e.key.tokens == b && e.key.a_type == a_type);
                e.unwrap_or_else(|| panic!("{at}: no {op:?} entry of bucket {b}")).config
            };
            assert_eq!(entry(crate::moe::MoeOp::GateUp, r.gate_up.bucket), gate_up, "{at}");
            assert_eq!(entry(crate::moe::MoeOp::Down, r.down.bucket), down, "{at}");
        }
    }
    // A layer outside the table runs the family defaults, loaded by its first workspace; the
    // route names the kernel the launches pick there too.
    let ep8 = crate::moe::MoeShape::GLM5_EP8;
    // (GLM-5 over 8 GPUs by experts: 32 of the model's 256 routed experts)
    let _ep8_ws = disp.moe().unwrap().workspace(ep8, 256, 8192).unwrap();
    for a_type in [AType::Bf16, AType::Nvfp4] {
        for tokens in [1, 3, 8, 64, 700, 5000, 8192] {
            let r = disp.moe_route(&ep8, 256, a_type, tokens).unwrap();
            assert!(r.gate_up.family_default && r.to_string().contains("family default"), "{r}");
            let picked = disp.moe().unwrap().route_for(&ep8, a_type, tokens).unwrap();
            assert_eq!((r.gate_up.config, r.down.config), picked, "EP8 {a_type} B={tokens}: {r}");
        }
    }
    assert!(disp.moe().unwrap().warnings().is_empty(), "{:?}", disp.moe().unwrap().warnings());
    // its defaults were chosen for 256 routed experts: another count is refused by workspaces
    // and routes alike (the launches would not run what the route says)
    let e = disp.moe().unwrap().workspace(ep8, 32, 8).unwrap_err().to_string();
    assert!(e.contains("for a model of 256 routed experts; this call names 32"), "{e}");
    let e = disp.moe_route(&ep8, 32, AType::Bf16, 8).unwrap_err().to_string();
    assert!(e.contains("this call names 32"), "{e}");
    // Weight codes: launches refuse codes that were not prepared for their projection and shape
    // (before anything is enqueued); preparing overlapping codes is refused, restoring and
    // forgetting take exactly a prepared projection.
    let ops = disp.moe().unwrap();
    let ws = ops.workspace(shape, 256, 4).unwrap();
    let mut rng = crate::moe::schedule::SplitMix64(0x5A5A);
    let host: Vec<u8> = (0..1 << 20).map(|_| rng.below(256) as u8).collect();
    let codes = gpu.upload(&host).unwrap();
    let stream = gpu.own_stream();
    let args = crate::runtime::moe::MoeArgs {
        x: 256,
        topk_ids: 256,
        topk_weights: 256,
        w13: codes.ptr(),
        w13_sf: 256,
        alpha13: 256,
        w2: codes.ptr(),
        w2_sf: 256,
        alpha2: 256,
        y: 256,
        tokens: 1,
        ..Default::default()
    };
    for e in [
        // SAFETY: refused before any launch (the codes are not prepared).
        unsafe { ops.layer(&args, &ws, stream) }.unwrap_err(),
        // SAFETY: as above.
        unsafe { ops.down(&args, &ws, stream) }.unwrap_err(),
    ] {
        assert!(e.to_string().contains("not prepared"), "{e}");
    }
    // a small layer's gate_up codes (4 experts of 128 x 256: 64 KiB) at the start of `codes`
    let small = crate::moe::MoeShape { hidden: 256, inter: 64, experts: 4, top_k: 8 };
    let gate_up = crate::moe::MoeOp::GateUp;
    let down = crate::moe::MoeOp::Down;
    let bytes = crate::moe::order::CodeStack::of(&small, gate_up).bytes() as usize;
    // SAFETY: `codes` holds 1 MiB on this device, used by nothing else.
    unsafe { ops.prepare_weights(&small, gate_up, codes.ptr(), stream) }.unwrap();
    let family = crate::runtime::family_for(gpu.info()).unwrap();
    let order = crate::moe::order::WeightOrder::of(family);
    let mut want = crate::moe::order::apply(order, gate_up, 128, 256, &host[..bytes]);
    want.extend_from_slice(&host[bytes..]);
    assert!(gpu.download(&codes).unwrap() == want, "prepared codes vs moe::order::apply");
    // SAFETY: refused before any launch (overlap; not the prepared projection).
    let e = unsafe { ops.prepare_weights(&small, down, codes.ptr() + 4096, stream) }.unwrap_err();
    assert!(e.to_string().contains("overlap"), "{e}");
    // SAFETY: as above.
    let e = unsafe { ops.restore_weights(&small, down, codes.ptr(), stream) }.unwrap_err();
    assert!(e.to_string().contains("not prepared"), "{e}");
    // the prepared codes are another shape's: the layer's w13 and w2 are not prepared
    for e in [
        // SAFETY: refused before any launch.
        unsafe { ops.layer(&args, &ws, stream) }.unwrap_err(),
        // SAFETY: as above.
        unsafe { ops.down(&args, &ws, stream) }.unwrap_err(),
    ] {
        assert!(e.to_string().contains("not prepared"), "{e}");
    }
    // a GEMM on prepared codes is refused (they are not in the ModelOpt layout)
    let gemm = GemmArgs {
        a: 256,
        a_sf: 0,
        w: codes.ptr() + 1024,
        w_sf: 256,
        y: 256,
        m: 1,
        n: 64,
        k: 256,
        a_type: AType::Bf16,
        alpha: 1.0,
    };
    // SAFETY: refused before any launch.
    let e = unsafe { disp.gemm(&gemm, stream) }.unwrap_err();
    assert!(e.to_string().contains("prepared for the grouped MoE kernels"), "{e}");
    // SAFETY: the prepared codes, as above.
    unsafe { ops.restore_weights(&small, gate_up, codes.ptr(), stream) }.unwrap();
    assert!(gpu.download(&codes).unwrap() == host, "restored bytes");
    // forgetting drops a prepared projection without touching the codes
    // SAFETY: `codes` as above.
    unsafe { ops.prepare_weights(&small, gate_up, codes.ptr(), stream) }.unwrap();
    assert!(ops.forget_weights(&small, down, codes.ptr()).is_err());
    ops.forget_weights(&small, gate_up, codes.ptr()).unwrap();
    assert!(gpu.download(&codes).unwrap() == want, "forget leaves the layout");
    // SAFETY: `codes` as above (forgotten, so preparing again is allowed).
    unsafe { ops.prepare_weights(&small, down, codes.ptr(), stream) }.unwrap();
    // The workspace's schedule: gate_up and down alone take only the routing its last align was
    // enqueued for; an align reads only topk_ids (aligned, non-null).
    let ids = gpu.upload(&[0i32, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]).unwrap();
    let routed = crate::runtime::moe::MoeArgs { topk_ids: ids.ptr(), tokens: 2, ..args };
    assert!(ws.check_aligned(&routed).unwrap_err().to_string().contains("no complete schedule"));
    for bad in [
        crate::runtime::moe::MoeArgs { topk_ids: ids.ptr() + 2, ..routed },
        crate::runtime::moe::MoeArgs { topk_ids: 0, ..routed },
        crate::runtime::moe::MoeArgs { tokens: 5, ..routed },
        crate::runtime::moe::MoeArgs { w4a4: 2, ..routed },
    ] {
        // SAFETY: refused before any launch.
        let e = unsafe { ops.align(&bad, &ws, stream) }.unwrap_err();
        assert!(matches!(e, RuntimeError::InvalidArgument(_)), "{e}");
    }
    // SAFETY: `ids` holds 2 tokens x top_k 8 ids on this device; `ws` is this stream's.
    unsafe { ops.align(&routed, &ws, stream) }.unwrap();
    ws.check_aligned(&routed).unwrap();
    for other in [
        crate::runtime::moe::MoeArgs { tokens: 1, ..routed },
        crate::runtime::moe::MoeArgs { topk_ids: ids.ptr() + 16, ..routed },
        crate::runtime::moe::MoeArgs { expert_begin: 8, ..routed },
    ] {
        let e = ws.check_aligned(&other).unwrap_err().to_string();
        assert!(e.contains("another routing"), "{e}");
    }
    // SAFETY: the dispatcher's own stream.
    unsafe { gpu.synchronize_stream(stream) }.unwrap();
    // A workspace is launched in only by the dispatcher that created it, and its tile grid bounds
    // the tokens it takes.
    let other = Dispatcher::open_with(Some((&table, path.as_path())), &options).unwrap();
    // SAFETY: refused before any launch.
    let e = unsafe { other.moe().unwrap().align(&routed, &ws, stream) }.unwrap_err();
    assert!(matches!(e, RuntimeError::ForeignWorkspace), "{e}");
    // SAFETY: as above.
    let e = unsafe { other.moe().unwrap().layer(&args, &ws, stream) }.unwrap_err();
    assert!(matches!(e, RuntimeError::ForeignWorkspace), "{e}");
    let most = crate::runtime::moe::max_tokens_of(&shape);
    let e = ops.workspace(shape, 256, most + 1).unwrap_err().to_string();
    assert!(e.contains(&format!("1..={most}")), "{e}");
    // Without grouped entries: the family defaults, loaded by the first workspace.
    let (gemm_only, _, _) = table_for(&gpu);
    let disp = Dispatcher::open_with(Some((&gemm_only, Path::new("t.ron"))), &options).unwrap();
    let r = disp.moe_route(&shape, 256, AType::Bf16, 8).unwrap();
    assert!(r.gate_up.family_default && r.down.family_default, "{r}");
    let e = disp.moe().unwrap().route_for(&shape, AType::Bf16, 8).unwrap_err().to_string();
    assert!(e.contains("its first workspace loads it"), "{e}");
    let _ws = disp.moe().unwrap().workspace(shape, 256, 8).unwrap();
    let picked = disp.moe().unwrap().route_for(&shape, AType::Bf16, 8).unwrap();
    assert_eq!((r.gate_up.config, r.down.config), picked);
}

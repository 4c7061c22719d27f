//! GPU correctness suite: every variant of the device's kernel family against the CPU reference,
//! on GLM-5 shapes and awkward ones, W4A4 and W4A16. Runs only with `--features gpu`; without it
//! the tests are listed as ignored with the reason, never silently passed.

use fp4tune::bench::gemm::{verify, Candidate, DeviceProblem, HostProblem};
use fp4tune::bench::TimingPolicy;
use fp4tune::compile::Compiler;
use fp4tune::gpu::Gpu;
use fp4tune::problem::{AType, GemmProblem};
use fp4tune::template::{self, Arch, Family, GemmConfig};
use std::collections::HashMap;

fn open() -> (Gpu, Family, Compiler) {
    let gpu = Gpu::open(0).unwrap_or_else(|e| panic!("the gpu feature is on but: {e}"));
    let (ma, mi) = gpu.info().compute_capability;
    let arch = Arch::for_compute_capability(ma, mi)
        .unwrap_or_else(|| panic!("{} (cc {ma}.{mi}) has no kernel family", gpu.info().name));
    let compiler = Compiler::with_default_cache().unwrap_or_else(|e| panic!("{e}"));
    (gpu, Family::for_arch(arch), compiler)
}

/// (N, K, token counts): GLM-5 routed experts (TP8, TP4, EP) at decode sizes, and awkward shapes
/// (small N and K, N and K that are not powers of two, K not a multiple of 64, M not a multiple
/// of any tile). The operands' padding scale columns hold E4M3 NaN (`DeviceProblem::upload`).
fn problems(a_type: AType) -> Vec<(u32, u32, Vec<u32>)> {
    let awkward_m = match a_type {
        AType::Bf16 => vec![1, 7, 33, 130],
        AType::Nvfp4 => vec![1, 3, 40, 129],
    };
    vec![
        (512, 6144, vec![1, 16]),
        (6144, 256, vec![1, 16]),
        (1024, 6144, vec![5]),
        (4096, 6144, vec![1, 16]),
        (6144, 2048, vec![9]),
        (16, 256, awkward_m.clone()),
        (48, 768, awkward_m.clone()),
        (200, 512, awkward_m.clone()),
        // K that 64 does not divide (the K-tail form): a routed down projection split 8 ways
        // (Qwen3-30B-A3B: 96, GLM-4.5-Air: 176), and one K of a single 16-k block
        (2048, 96, vec![1, 8]),
        (4096, 176, vec![1, 16, 130]),
        (48, 16, awkward_m),
    ]
}

fn run_suite(a_type: AType) {
    let (gpu, family, compiler) = open();
    let mut space = template::search_space(family, a_type);
    // The family defaults (what a shape outside a table runs: the decode and prefill defaults,
    // the generic one and its K-tail form).
    for d in template::family_defaults(family, a_type) {
        if d.check().is_ok() && !space.contains(&d) {
            space.push(d);
        }
    }
    // FP4TUNE_SUITE_ONLY=<text>: only the variants whose name contains it (said, not silent).
    if let Ok(only) = std::env::var("FP4TUNE_SUITE_ONLY") {
        let before = space.len();
        space.retain(|c| c.name().contains(&only));
        eprintln!("FP4TUNE_SUITE_ONLY={only}: {} of {before} variants", space.len());
        assert!(
            before == 0 || !space.is_empty(),
            "FP4TUNE_SUITE_ONLY={only} matches no {a_type} variant"
        );
    }
    if space.is_empty() {
        // The SM120 family is W4A4 only: there is nothing of this activation type to verify.
        eprintln!("SKIPPED: the {family} family has no {a_type} variants");
        return;
    }
    let sources: Vec<_> = space.iter().map(|c| c.render().expect("space configs render")).collect();
    let compiled: Vec<_> = compiler.compile_many(&sources);
    let mut loaded: HashMap<String, Candidate> = HashMap::new();
    let mut failures: Vec<String> = Vec::new();
    for (c, k) in space.iter().zip(&compiled) {
        match k {
            Ok(k) => match Candidate::load(&gpu, *c, k) {
                Ok(cand) => {
                    loaded.insert(c.name(), cand);
                }
                Err(e) => failures.push(format!("{c}: load: {e}")),
            },
            Err(e) => failures.push(format!("{c}: compile: {e}")),
        }
    }
    let policy = TimingPolicy { l2_multiple: 0.0, ..TimingPolicy::quick() };
    let mut runs = 0usize;
    let mut legal_problems = 0usize;
    for (n, k, ms) in problems(a_type) {
        for m in ms {
            let p = GemmProblem::new(m, n, k, a_type);
            let legal: Vec<GemmConfig> =
                space.iter().copied().filter(|c| c.check_problem(&p).is_ok()).collect();
            if legal.is_empty() {
                continue;
            }
            legal_problems += 1;
            let host = HostProblem::random(p, 7 + m as u64 * 131 + n as u64 * 17 + k as u64)
                .expect("host problem");
            let mut dp = DeviceProblem::upload(&gpu, &host, &policy, &legal).expect("upload");
            for c in &legal {
                let Some(cand) = loaded.get(&c.name()) else { continue };
                runs += 1;
                match verify(&gpu, &host, &mut dp, cand) {
                    Ok(Ok(())) => {}
                    Ok(Err(why)) => failures.push(format!("{c} on {p}: {why}")),
                    Err(e) => panic!("{c} on {p}: CUDA error (context is now unusable): {e}"),
                }
            }
        }
    }
    eprintln!(
        "{family} {a_type}: {} variants, {legal_problems} problems, {runs} verified runs, {} failures",
        space.len(),
        failures.len()
    );
    assert!(legal_problems >= 8, "too few problems were legal for the space");
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

#[test]
#[cfg_attr(
    not(feature = "gpu"),
    ignore = "GPU test: run with --features gpu on a machine with a CUDA GPU"
)]
fn every_variant_matches_the_cpu_reference_w4a16() {
    run_suite(AType::Bf16);
}

#[test]
#[cfg_attr(
    not(feature = "gpu"),
    ignore = "GPU test: run with --features gpu on a machine with a CUDA GPU"
)]
fn every_variant_matches_the_cpu_reference_w4a4() {
    run_suite(AType::Nvfp4);
}

//! Compile-time evidence for the SM120 family without a GPU: every variant compiled for `sm_120a`,
//! its ptxas resources and its SASS inspected (block-scaled `OMMA.SF` present, no local memory),
//! and a markdown report of registers, shared memory and MMA counts per variant.

use super::Sm120Layout;
use crate::compile::sass::{self, SassError};
use crate::compile::{CompileError, CompiledKernel, Compiler};
use crate::template::{sm120, ConstraintError, GemmConfig};
use rayon::prelude::*;

/// The SASS opcode of `mma.sync.m16n8k64 ... kind::mxf4nvf4.block_scale.scale_vec::4X` with
/// e2m1 operands and ue4m3 scales.
pub const OMMA_SF_NVFP4: &str = "OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X";

/// What one compiled variant uses, read from ptxas and from its SASS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VariantResources {
    pub config: GemmConfig,
    pub registers: u32,
    /// Spill stores + spill loads reported by ptxas, in bytes.
    pub spill_bytes: u32,
    pub stack_frame: u32,
    /// Dynamic shared memory per CTA (the template's `SMEM_BYTES`, asserted equal to Rust's).
    pub smem_bytes: u32,
    pub threads: u32,
    /// `OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X` instructions in the SASS.
    pub omma_sf: usize,
    /// Any `OMMA` instruction (a different type signature would show up as omma > omma_sf).
    pub omma: usize,
    /// STL/LDL present in the SASS.
    pub local_memory: bool,
    /// MMAs per k-tile the configuration implies (per warp: MMA_P x MMA_Q x k-steps per warp);
    /// the mainloop body is unrolled once per k-tile, so the SASS count should equal it.
    pub expected_mma_per_k_tile: u32,
}

impl VariantResources {
    /// Whether the variant is what the family promises: native block-scaled MMA, the expected
    /// number of them, no spills, no local memory.
    pub fn is_clean(&self) -> bool {
        self.omma_sf > 0
            && self.omma == self.omma_sf
            && self.omma_sf as u32 == self.expected_mma_per_k_tile
            && self.spill_bytes == 0
            && !self.local_memory
    }
}

/// Why a variant could not be inspected; each names the variant and keeps the log.
#[derive(Debug, Clone, thiserror::Error)]
pub enum VariantError {
    #[error("render: {0}")]
    Render(#[from] ConstraintError),
    // The cause is part of the message, not a chained source (printed once).
    #[error("{config}: {error}")]
    Compile { config: String, error: CompileError },
    #[error("{config}: {error}")]
    Sass { config: String, error: SassError },
    #[error("{config}: no ptxas statistics in the NVRTC log:\n{log}")]
    NoStats { config: String, log: String },
}

/// Read the resources of one compiled variant from its ptxas statistics and its SASS text.
pub fn resources(
    config: &GemmConfig,
    kernel: &CompiledKernel,
    sass_text: &str,
) -> Result<VariantResources, VariantError> {
    let stats = kernel
        .stats
        .ok_or_else(|| VariantError::NoStats { config: config.name(), log: kernel.log.clone() })?;
    let l = Sm120Layout::of(config);
    Ok(VariantResources {
        config: *config,
        registers: stats.registers,
        spill_bytes: stats.spill_stores + stats.spill_loads,
        stack_frame: stats.stack_frame,
        smem_bytes: sm120::smem_bytes(config),
        threads: config.threads(),
        omma_sf: sass::count_opcode(sass_text, OMMA_SF_NVFP4),
        omma: sass::count_opcode(sass_text, "OMMA"),
        local_memory: sass::uses_local_memory(sass_text),
        expected_mma_per_k_tile: l.map_or(0, |l| l.mma_p * l.mma_q * l.k_steps_per_warp),
    })
}

/// Render, compile (in parallel, through `compiler`'s caches) and inspect every configuration.
/// Results come back in input order, failures included.
pub fn inspect_variants(
    compiler: &Compiler,
    configs: &[GemmConfig],
) -> Vec<Result<VariantResources, VariantError>> {
    configs
        .par_iter()
        .map(|c| {
            let src = c.render()?;
            let kernel = compiler
                .compile(&src)
                .map_err(|error| VariantError::Compile { config: c.name(), error })?;
            let text = sass::dump_sass(&kernel.kernel_name, &kernel.cubin)
                .map_err(|error| VariantError::Sass { config: c.name(), error })?;
            resources(c, &kernel, &text)
        })
        .collect()
}

/// The summary lines of a variant report: how many of `total` variants compiled (one register
/// count each in `registers`), how many are clean, how many failed, and the register range.
pub(crate) fn counts_line(
    total: usize,
    clean: usize,
    registers: impl Iterator<Item = u32> + Clone,
) -> String {
    let compiled = registers.clone().count();
    let mut out = format!(
        "{total} variants: {compiled} compiled, {clean} clean (native block-scaled MMA in the \
         expected count, no spills, no local memory), {} failed.\n",
        total - compiled
    );
    if let (Some(lo), Some(hi)) = (registers.clone().min(), registers.max()) {
        out.push_str(&format!("Registers per thread: {lo}..{hi}.\n"));
    }
    out
}

/// Markdown report (for `results/sm120-variants.md`): a summary, then one row per variant with
/// threads, shared memory, registers, spills, OMMA.SF count (and the count the tile implies),
/// then the failures with their messages.
pub fn variant_report(
    results: &[Result<VariantResources, VariantError>],
    toolchain: &str,
) -> String {
    let ok: Vec<&VariantResources> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    let clean = ok.iter().filter(|v| v.is_clean()).count();
    let mut out = String::new();
    out.push_str("# SM120 variants: registers, shared memory, MMAs\n\n");
    out.push_str(&format!(
        "Every configuration of `search_space(Nvfp4)` compiled for sm_120a ({toolchain}); SASS read \
         with cuobjdump. `OMMA.SF` counts `{OMMA_SF_NVFP4}` instructions; `expected` is MMA tiles \
         per warp x 64-wide k-steps per warp of one k-tile (the mainloop body).\n\n"
    ));
    out.push_str(&counts_line(results.len(), clean, ok.iter().map(|v| v.registers)));
    out.push_str(
        "\n| variant | threads | smem B | regs | spill B | OMMA.SF | expected | local mem |\n\
         |---|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for v in &ok {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            v.config.name(),
            v.threads,
            v.smem_bytes,
            v.registers,
            v.spill_bytes,
            v.omma_sf,
            v.expected_mma_per_k_tile,
            if v.local_memory { "yes" } else { "no" }
        ));
    }
    let failures: Vec<&VariantError> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    if !failures.is_empty() {
        out.push_str("\n## Failures\n\n");
        for e in failures {
            out.push_str(&format!("- {}\n", e.to_string().lines().next().unwrap_or_default()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::{Origin, PtxasStats};
    use crate::problem::AType;

    fn fake(config: GemmConfig, registers: u32, spills: u32) -> CompiledKernel {
        CompiledKernel {
            kernel_name: config.kernel_name(),
            arch: config.family.arch(),
            cubin: Vec::new(),
            stats: Some(PtxasStats {
                registers,
                spill_stores: spills,
                spill_loads: spills,
                ..Default::default()
            }),
            log: String::new(),
            compile_ms: 0.0,
            origin: Origin::Compiled,
            key: String::new(),
        }
    }

    fn sass_with(n: usize, extra: &str) -> String {
        let mut s = String::new();
        for i in 0..n {
            s.push_str(&format!(
                "        /*{:04x}*/                   {OMMA_SF_NVFP4} R8, R8, R6, RZ, R0, R13, UR6 ;  /* 0x0 */\n",
                i * 16
            ));
        }
        s.push_str(extra);
        s
    }

    #[test]
    fn resources_and_report_flag_spills_and_wrong_mma_counts() {
        let c = sm120::default_config(AType::Nvfp4);
        // Default: 1 x 2 MMA tiles per warp, 4 k-steps per k-tile -> 8 MMAs.
        let good = resources(&c, &fake(c, 72, 0), &sass_with(8, "")).unwrap();
        assert_eq!(good.expected_mma_per_k_tile, 8);
        assert!(good.is_clean(), "{good:?}");
        let spilled = resources(&c, &fake(c, 255, 8), &sass_with(8, "")).unwrap();
        assert!(!spilled.is_clean());
        let few = resources(&c, &fake(c, 72, 0), &sass_with(4, "")).unwrap();
        assert!(!few.is_clean());
        let local = resources(
            &c,
            &fake(c, 72, 0),
            &sass_with(8, "        /*0900*/                   STL [R1], R9 ;  /* 0x0 */\n"),
        )
        .unwrap();
        assert!(local.local_memory && !local.is_clean());
        let mut no_stats = fake(c, 0, 0);
        no_stats.stats = None;
        assert!(matches!(resources(&c, &no_stats, ""), Err(VariantError::NoStats { .. })));

        let report = variant_report(&[Ok(good), Ok(spilled)], "NVRTC 13.0");
        assert!(report.contains("2 variants: 2 compiled, 1 clean"), "{report}");
        assert!(report.contains(&format!("| {} | 128 |", c.name())), "{report}");
        assert!(report.contains("Registers per thread: 72..255."), "{report}");
    }

    /// The CI check: every variant of the search space (and the family defaults) compiles for sm_120a,
    /// uses the native block-scaled MMA as many times as its tile implies, and neither spills nor
    /// touches local memory. Needs NVRTC and cuobjdump/nvdisasm (scripts/cuda-tools.sh).
    #[test]
    fn every_sm120_variant_compiles_with_omma_sf_and_no_spills() {
        let compiler = Compiler::with_default_cache().unwrap_or_else(|e| panic!("{e}"));
        let mut configs = sm120::search_space(AType::Nvfp4);
        for default in
            crate::template::default_configs(crate::template::Family::Sm120, AType::Nvfp4)
        {
            if !configs.contains(&default) {
                configs.push(default);
            }
        }
        let results = inspect_variants(&compiler, &configs);
        let mut problems = Vec::new();
        for (c, r) in configs.iter().zip(&results) {
            match r {
                Err(e) => problems.push(format!("{c}: {e}")),
                Ok(v) if !v.is_clean() => problems.push(format!(
                    "{c}: OMMA.SF {} (expected {}, any OMMA {}), regs {}, spill {} B, local memory {}",
                    v.omma_sf, v.expected_mma_per_k_tile, v.omma, v.registers, v.spill_bytes,
                    v.local_memory
                )),
                Ok(_) => {}
            }
        }
        assert!(
            problems.is_empty(),
            "{} of {} variants failed:\n{}",
            problems.len(),
            configs.len(),
            problems.join("\n")
        );
        // a relative path is taken from the repository root (tests run in tuner/)
        if let Ok(path) = std::env::var("FP4TUNE_SM120_REPORT") {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
            let report = variant_report(&results, &format!("NVRTC {}", compiler.nvrtc_build()));
            crate::fsio::write_atomic(&path, report.as_bytes())
                .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        }
    }
}

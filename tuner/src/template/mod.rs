//! Kernel configurations and rendering of `templates/` into self-contained NVRTC sources.
//!
//! A [`GemmConfig`] is the typed description of one kernel variant (tile shape, warp layout,
//! stages, split-K, swap-AB). Its family module (`sm90`, `sm120`) checks resource and divisibility
//! constraints and writes a tiny instantiation unit; this module inlines the `#include "..."` lines of
//! that unit against the embedded template tree, so the result compiles with an NVRTC that has no
//! headers at all, and hashes it.

pub mod quantize;
pub mod source;

use crate::problem::{AType, GemmProblem};
use serde::{Deserialize, Serialize};
use std::fmt;

pub use crate::gpu::LaunchDims;
pub use source::{short_hash, template_tree_hash, KernelSource, TEMPLATE_FILES};

/// GPU architectures we compile for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Arch {
    /// Hopper (H100/H200) with arch-specific features (wgmma, setmaxnreg).
    Sm90a,
    /// Blackwell GeForce/workstation (RTX 5090, RTX PRO 6000): block-scaled FP4 mma.sync.
    Sm120a,
}

impl Arch {
    /// The NVRTC `--gpu-architecture` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Arch::Sm90a => "sm_90a",
            Arch::Sm120a => "sm_120a",
        }
    }

    /// Compute capability (major, minor) the architecture runs on.
    pub fn compute_capability(self) -> (u32, u32) {
        match self {
            Arch::Sm90a => (9, 0),
            Arch::Sm120a => (12, 0),
        }
    }

    /// The arch-specific target for a device of this compute capability, if we have a family for it.
    pub fn for_compute_capability(major: u32, minor: u32) -> Option<Arch> {
        match (major, minor) {
            (9, 0) => Some(Arch::Sm90a),
            (12, 0) => Some(Arch::Sm120a),
            _ => None,
        }
    }

    pub fn parse(s: &str) -> Option<Arch> {
        match s {
            "sm_90a" | "sm90a" | "sm_90" | "sm90" => Some(Arch::Sm90a),
            "sm_120a" | "sm120a" | "sm_120" | "sm120" => Some(Arch::Sm120a),
            _ => None,
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A kernel family: one template tree and its instantiation rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Family {
    /// SM80/SM90: exact dequantization of NVFP4 to bf16 in registers, bf16 tensor-core MMA.
    Sm90,
    /// SM120: native block-scaled `mma.sync ... kind::mxf4nvf4` (W4A4 only).
    Sm120,
}

impl Family {
    pub fn arch(self) -> Arch {
        match self {
            Family::Sm90 => Arch::Sm90a,
            Family::Sm120 => Arch::Sm120a,
        }
    }

    pub fn for_arch(arch: Arch) -> Family {
        match arch {
            Arch::Sm90a => Family::Sm90,
            Arch::Sm120a => Family::Sm120,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Family::Sm90 => "sm90",
            Family::Sm120 => "sm120",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One kernel variant. The same vocabulary serves every family, so one dispatch-table format and
/// one launch path serve them all; each family decides which values are legal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GemmConfig {
    pub family: Family,
    pub a_type: AType,
    /// Tokens (rows of A and Y) per CTA.
    pub block_m: u32,
    /// Weight rows (columns of Y) per CTA.
    pub block_n: u32,
    /// K elements per pipeline stage.
    pub block_k: u32,
    /// Warp layout inside the CTA: warps along M, along N and along K (in-CTA split-K).
    pub warps_m: u32,
    pub warps_n: u32,
    pub warps_k: u32,
    /// cp.async pipeline depth (shared-memory stages).
    pub stages: u32,
    /// CTAs along K; partial sums are reduced deterministically by the last CTA of each tile.
    pub split_k: u32,
    /// Weights on the MMA's 16-row side and tokens on its 8-wide side (Y^T = W * A^T).
    pub swap_ab: bool,
    /// How the weights travel to the tensor cores (absent in tables written before it existed:
    /// those kernels are all [`Pipeline::CpAsync`]).
    #[serde(default)]
    pub pipeline: Pipeline,
    /// CTAs per SM the kernel is compiled for (`__launch_bounds__(threads, min_ctas)`): caps the
    /// registers per lane at 65536 / (threads * min_ctas), so that many small CTAs (many warps
    /// per SM) fit at once. 1 = no cap beyond one CTA (tables written before it existed).
    #[serde(default = "one")]
    pub min_ctas: u32,
}

fn one() -> u32 {
    1
}

/// How a kernel stages the weights between global memory and the tensor cores.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub enum Pipeline {
    /// A cp.async ring of `stages` shared-memory stages that every operand goes through
    /// (`templates/sm90/gemm.cuh`, `templates/sm120/`). Named `s<stages>`.
    #[default]
    CpAsync,
    /// Weights streamed from global memory into a per-warp register ring `stages` chunks (128 k)
    /// deep, no barrier in the main loop; only the activations go through shared memory, one
    /// `block_k` slice per pass (`templates/sm90/direct.cuh`; small M, swap_ab). Named `r<stages>`.
    Registers,
    /// The warp ring: as [`Pipeline::Registers`], but each warp's ring is `stages` stages (2..16)
    /// of shared memory of its own, filled by the lanes' own cp.async copies: deep prefetch
    /// without registers and without a barrier (`direct.cuh`, where the CUDA flag is
    /// `SMEM_RING`). Named `p<stages>` (`--pipeline warp-ring`).
    WarpRing,
    /// As [`Pipeline::Registers`], with the activations in the same register ring: each lane
    /// loads its own run of every token row per chunk straight from global memory, so no
    /// activation slice, no pass barrier and no wait before the first chunk; shared memory only
    /// holds the split-K partials (`direct.cuh`, `A_GLOBAL`). Named `g<stages>`.
    Global,
    /// The cp.async ring of [`Pipeline::CpAsync`] with 64-k stages whose last one is cut at K:
    /// the K-tail form, for a K that is a multiple of 16 (the NVFP4 block) but not of 64 (a
    /// weight split 8 ways, e.g. 96 or 176 columns). Codes go in 8-byte copies and scales word by
    /// word, zero-filled past K (`templates/sm90/load.cuh`, `K_TAIL`). Only such a K takes it.
    /// Named `kt<stages>`.
    KTail,
}

impl Pipeline {
    /// Every pipeline; its index here is the value of `search::Param::Pipeline`.
    pub const ALL: [Pipeline; 5] = [
        Pipeline::CpAsync,
        Pipeline::Registers,
        Pipeline::WarpRing,
        Pipeline::Global,
        Pipeline::KTail,
    ];

    /// The letter before the depth in kernel names.
    pub fn letter(self) -> &'static str {
        match self {
            Pipeline::CpAsync => "s",
            Pipeline::Registers => "r",
            Pipeline::WarpRing => "p",
            Pipeline::Global => "g",
            Pipeline::KTail => "kt",
        }
    }

    /// The register, warp-ring and global pipelines share `templates/sm90/direct.cuh`.
    pub fn is_direct(self) -> bool {
        matches!(self, Pipeline::Registers | Pipeline::WarpRing | Pipeline::Global)
    }
}

/// Upper bounds on the parameters of any [`GemmConfig`] ([`GemmConfig::check_bounds`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// `block_m`, `block_n`.
    pub block: u32,
    /// `block_k` (the streamed kernels take a whole K per CTA: 6144 on GLM-5).
    pub block_k: u32,
    /// Each of `warps_m`, `warps_n`, `warps_k`, and their product (32 warps = 1024 threads).
    pub warps: u32,
    pub stages: u32,
    pub split_k: u32,
    pub min_ctas: u32,
}

/// The bounds every configuration read from a table or a log must keep (the search spaces
/// stay well inside them; a test checks it).
pub const BOUNDS: Bounds =
    Bounds { block: 1024, block_k: 65_536, warps: 32, stages: 16, split_k: 64, min_ctas: 16 };

/// Why a configuration cannot run a problem (or cannot exist at all).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{config}: {reason}")]
pub struct ConstraintError {
    pub config: String,
    pub reason: String,
}

impl GemmConfig {
    /// The tile, warp, stage, split and swap parameters every family's configuration type takes
    /// first, in its template order: `block_m, block_n, block_k, warps_m, warps_n, warps_k,
    /// stages, split_k, swap_ab`.
    pub(crate) fn template_args(&self) -> String {
        format!(
            "{}, {}, {}, {}, {}, {}, {}, {}, {}",
            self.block_m,
            self.block_n,
            self.block_k,
            self.warps_m,
            self.warps_n,
            self.warps_k,
            self.stages,
            self.split_k,
            self.swap_ab
        )
    }

    /// A cp.async-pipeline configuration (`Pipeline::CpAsync`, one CTA per SM) from its tile
    /// (block_m, block_n, block_k), its warp layout (warps_m, warps_n, warps_k), stages, split-K and
    /// swap-AB: the shape every family's cp.async space and seed list is written in.
    pub fn cp_async(
        family: Family,
        a_type: AType,
        [block_m, block_n, block_k]: [u32; 3],
        [warps_m, warps_n, warps_k]: [u32; 3],
        stages: u32,
        split_k: u32,
        swap_ab: bool,
    ) -> GemmConfig {
        GemmConfig {
            family,
            a_type,
            block_m,
            block_n,
            block_k,
            warps_m,
            warps_n,
            warps_k,
            stages,
            split_k,
            swap_ab,
            pipeline: Pipeline::CpAsync,
            min_ctas: 1,
        }
    }

    /// Stable, human-readable identity; also the suffix of the kernel's symbol name.
    pub fn name(&self) -> String {
        let occupancy =
            if self.min_ctas > 1 { format!("_o{}", self.min_ctas) } else { String::new() };
        format!(
            "{}_{}_m{}n{}k{}_w{}x{}x{}_{}{}_sk{}{}{occupancy}",
            self.family,
            self.a_type,
            self.block_m,
            self.block_n,
            self.block_k,
            self.warps_m,
            self.warps_n,
            self.warps_k,
            self.pipeline.letter(),
            self.stages,
            self.split_k,
            if self.swap_ab { "_swap" } else { "" }
        )
    }

    /// The `extern "C"` symbol of the rendered kernel.
    pub fn kernel_name(&self) -> String {
        format!("fp4tune_{}", self.name())
    }

    /// CTA rows on the MMA's 16-row side (P) and on its 8-wide side (Q): weights and tokens under
    /// swap-AB, tokens and weights otherwise. Both families assign roles this way.
    pub fn pq_rows(&self) -> (u32, u32) {
        if self.swap_ab {
            (self.block_n, self.block_m)
        } else {
            (self.block_m, self.block_n)
        }
    }

    /// Warps along P and along Q (see [`GemmConfig::pq_rows`]).
    pub fn pq_warps(&self) -> (u32, u32) {
        if self.swap_ab {
            (self.warps_n, self.warps_m)
        } else {
            (self.warps_m, self.warps_n)
        }
    }

    /// Threads per CTA, 32 per warp (saturating at `u32::MAX` for a configuration outside
    /// [`GemmConfig::check_bounds`], so it can never wrap into a legal-looking count).
    pub fn threads(&self) -> u32 {
        let t = 32u64 * self.warps_m as u64 * self.warps_n as u64 * self.warps_k as u64;
        u32::try_from(t).unwrap_or(u32::MAX)
    }

    /// The most registers per lane the kernel may use: 65536 per SM over `min_ctas` CTAs, in
    /// the allocation granule of 8, at most 255.
    pub fn register_cap(&self) -> u32 {
        (65_536 / self.threads().saturating_mul(self.min_ctas.max(1)).max(1) / 8 * 8).min(255)
    }

    /// Sane upper bounds on every parameter, whatever the family: what a table or a log may
    /// name at all ([`BOUNDS`]). Everything derived from a configuration inside them (threads,
    /// shared-memory bytes, register budgets) fits in `u32` without wrapping; the family checks
    /// then decide what is legal. Checked first by [`GemmConfig::check`] and
    /// [`GemmConfig::check_problem`].
    pub fn check_bounds(&self) -> Result<(), ConstraintError> {
        for (name, value, max) in [
            ("block_m", self.block_m, BOUNDS.block),
            ("block_n", self.block_n, BOUNDS.block),
            ("block_k", self.block_k, BOUNDS.block_k),
            ("warps_m", self.warps_m, BOUNDS.warps),
            ("warps_n", self.warps_n, BOUNDS.warps),
            ("warps_k", self.warps_k, BOUNDS.warps),
            ("stages", self.stages, BOUNDS.stages),
            ("split_k", self.split_k, BOUNDS.split_k),
            ("min_ctas", self.min_ctas, BOUNDS.min_ctas),
        ] {
            if value > max {
                return Err(
                    self.violation(format!("{name} {value} is out of range (at most {max})"))
                );
            }
        }
        let warps = self.warps_m as u64 * self.warps_n as u64 * self.warps_k as u64;
        if warps > BOUNDS.warps as u64 {
            return Err(self.violation(format!(
                "{} x {} x {} = {warps} warps per CTA, at most {} (1024 threads)",
                self.warps_m, self.warps_n, self.warps_k, BOUNDS.warps
            )));
        }
        Ok(())
    }

    pub(crate) fn violation(&self, reason: impl Into<String>) -> ConstraintError {
        ConstraintError { config: self.name(), reason: reason.into() }
    }
}

impl fmt::Display for GemmConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl GemmConfig {
    /// Grid: (N tiles, M tiles, split_k); one CTA of `threads()` threads each.
    pub fn launch_dims(&self, p: &GemmProblem) -> LaunchDims {
        LaunchDims {
            grid: (p.n.div_ceil(self.block_n), p.m.div_ceil(self.block_m), self.split_k),
            block: (self.threads(), 1, 1),
            smem_bytes: self.smem_bytes(),
        }
    }

    /// f32 elements of split-K workspace a launch on `p` needs (0 without split-K).
    pub fn workspace_floats(&self, p: &GemmProblem) -> usize {
        if self.split_k > 1 {
            self.split_k as usize * p.m as usize * p.n as usize
        } else {
            0
        }
    }

    /// u32 tile semaphores a launch on `p` needs (0 without split-K); must start zeroed, and the
    /// kernel leaves them zeroed.
    pub fn counter_words(&self, p: &GemmProblem) -> usize {
        if self.split_k > 1 {
            p.n.div_ceil(self.block_n.max(1)) as usize * p.m.div_ceil(self.block_m.max(1)) as usize
        } else {
            0
        }
    }
}

pub mod sm120;
pub mod sm90;

impl GemmConfig {
    /// Dynamic shared memory of one CTA, in bytes (`u32::MAX` for a configuration outside
    /// [`GemmConfig::check_bounds`]: more than any GPU has, never a wrapped small number).
    pub fn smem_bytes(&self) -> u32 {
        if self.check_bounds().is_err() {
            return u32::MAX;
        }
        match self.family {
            Family::Sm90 => sm90::smem_bytes(self),
            Family::Sm120 => sm120::smem_bytes(self),
        }
    }

    /// Constraints of the configuration alone (tile divisibility, threads, shared memory).
    pub fn check(&self) -> Result<(), ConstraintError> {
        self.check_bounds()?;
        match self.family {
            Family::Sm90 => sm90::check(self),
            Family::Sm120 => sm120::check(self),
        }
    }

    /// Constraints of running this configuration on `p` (config constraints included).
    pub fn check_problem(&self, p: &GemmProblem) -> Result<(), ConstraintError> {
        self.check_bounds()?;
        self.check()?;
        if p.a_type != self.a_type {
            return Err(
                self.violation(format!("built for {}, problem is {}", self.a_type, p.a_type))
            );
        }
        if p.m == 0 || p.n == 0 || p.k == 0 {
            return Err(self.violation(format!("empty problem {p}")));
        }
        match self.family {
            Family::Sm90 => sm90::check_problem(self, p),
            Family::Sm120 => sm120::check_problem(self, p),
        }
    }

    /// Render the configuration into a self-contained NVRTC source.
    pub fn render(&self) -> Result<KernelSource, ConstraintError> {
        self.check()?;
        let unit = match self.family {
            Family::Sm90 => sm90::instantiation(self),
            Family::Sm120 => sm120::instantiation(self),
        };
        KernelSource::from_unit(self.kernel_name(), self.family.arch(), &unit)
            .map_err(|e| self.violation(e))
    }
}

/// The line of every GEMM instantiation unit (both families) that ties the parameter block Rust
/// passes (`gpu::GemmParams`) to the C struct it is read as (templates/common/params.cuh).
pub(crate) fn gemm_params_assert() -> String {
    format!(
        "static_assert(sizeof(fp4tune::GemmParams) == {}, \"gpu::GemmParams (Rust) and templates/common/params.cuh disagree\");",
        std::mem::size_of::<crate::gpu::params::GemmParams>()
    )
}

/// Every configuration of a family's search space for one activation type.
pub fn search_space(family: Family, a_type: AType) -> Vec<GemmConfig> {
    match family {
        Family::Sm90 => sm90::search_space(a_type),
        Family::Sm120 => sm120::search_space(a_type),
    }
}

/// The activation type a family runs when none is asked for: W4A16 on sm90 (its serving case;
/// W4A4 runs by exact emulation), W4A4 on sm120 (the native FP4 MMA, W4A4 only).
pub fn family_a_type(family: Family) -> AType {
    match family {
        Family::Sm90 => AType::Bf16,
        Family::Sm120 => AType::Nvfp4,
    }
}

/// Configurations measured fastest on real hardware by the family's authors (the seeds every
/// tuning run measures on every key where they are legal, next to the model's picks). Empty for a
/// family nobody could run yet (SM120).
pub fn measured_seeds(family: Family, a_type: AType) -> Vec<GemmConfig> {
    match family {
        Family::Sm90 => sm90::measured_winners(a_type),
        Family::Sm120 => Vec::new(),
    }
}

/// A few configurations that cover the family's kernels (small-M streaming, mid-M, large-M) for
/// compile checks and `fp4tune compile --configs representative`; the default for SM120.
pub fn representative_configs(family: Family, a_type: AType) -> Vec<GemmConfig> {
    match family {
        Family::Sm90 => sm90::representative_configs(a_type),
        Family::Sm120 if sm120::search_space(a_type).is_empty() => Vec::new(),
        Family::Sm120 => vec![sm120::default_config(a_type)],
    }
}

/// The family's default configuration for an activation type.
pub fn default_config(family: Family, a_type: AType) -> GemmConfig {
    match family {
        Family::Sm90 => sm90::default_config(a_type),
        Family::Sm120 => sm120::default_config(a_type),
    }
}

/// Token counts up to which a shape outside the table (and without a legal common configuration)
/// tries the family's decode defaults before the generic one; above it, the prefill defaults.
pub const DECODE_DEFAULT_MAX_M: u32 = 64;

/// Every decode default of the family (legal for both activation types: the sm90 tests hold
/// them to the search space); none for SM120, whose kernels have not run on a GPU yet (its
/// generic default serves every M).
pub fn decode_default_configs(family: Family, a_type: AType) -> Vec<GemmConfig> {
    match family {
        Family::Sm90 => sm90::decode_defaults(a_type).to_vec(),
        Family::Sm120 => Vec::new(),
    }
}

/// Every prefill default of the family: what a shape outside the table tries above
/// [`DECODE_DEFAULT_MAX_M`] rows before the generic one (`sm90::prefill_defaults`; none for
/// SM120).
pub fn prefill_default_configs(family: Family, a_type: AType) -> Vec<GemmConfig> {
    match family {
        Family::Sm90 => sm90::prefill_defaults(a_type),
        Family::Sm120 => Vec::new(),
    }
}

/// Every family default: the decode defaults, the prefill defaults, then [`default_configs`].
/// The runtime loads them for shapes outside its table; `bench --configs default` measures them.
pub fn family_defaults(family: Family, a_type: AType) -> Vec<GemmConfig> {
    let mut out = decode_default_configs(family, a_type);
    out.extend(prefill_default_configs(family, a_type));
    out.extend(default_configs(family, a_type));
    out
}

/// What a shape outside the table runs at M x N x K, in lookup order: up to
/// [`DECODE_DEFAULT_MAX_M`] rows the decode defaults in their order for the problem, more rows the
/// prefill defaults in theirs, then [`default_configs`]; the first legal for the problem is taken.
pub fn fallback_configs(family: Family, a_type: AType, m: u32, n: u32, k: u32) -> Vec<GemmConfig> {
    let mut out = Vec::new();
    if family == Family::Sm90 && m <= DECODE_DEFAULT_MAX_M {
        let decode = sm90::decode_defaults(a_type);
        out.extend(sm90::decode_default_order(m, k).iter().map(|&i| decode[i]));
    } else if family == Family::Sm90 {
        let prefill = sm90::prefill_defaults(a_type);
        let order = sm90::prefill_default_order(m, n);
        out.extend(order.iter().filter_map(|&i| prefill.get(i).copied()));
    }
    out.extend(default_configs(family, a_type));
    out
}

/// The family's defaults in lookup order: the generic configuration; where its stages are deeper
/// than 64 k (sm120's 256), the same tile with 64-k stages, which runs a K that is a multiple of
/// 64 but not of the generic stage (K = 192, the down projection of a 1536-wide expert over 8
/// GPUs); then the K-tail form (64-k stages), which runs a K that is a multiple of 16 but not of
/// 64 (shapes outside a table).
pub fn default_configs(family: Family, a_type: AType) -> Vec<GemmConfig> {
    let d = default_config(family, a_type);
    let k64 = GemmConfig { block_k: 64, warps_k: 1, ..d };
    let tail = GemmConfig { pipeline: Pipeline::KTail, ..k64 };
    let mut out = vec![d];
    out.extend(Some(k64).filter(|c| d.block_k != 64 && c.check().is_ok()));
    out.extend(Some(tail).filter(|c| c.check().is_ok()));
    out
}

/// Template-source hash of a family (its own folder plus `common/`).
pub fn family_template_hash(family: Family) -> String {
    template_tree_hash(&["common/", &format!("{}/", family.as_str())])
}

#[cfg(test)]
mod bounds_tests {
    use super::*;

    /// A table entry whose `32 * warps` wraps to 128 threads in u32, and its shared memory too,
    /// would pass every check that computes in u32. It is refused by its bounds, and nothing
    /// derived from it wraps into a small number.
    #[test]
    fn wrapping_configuration_is_refused_not_wrapped() {
        let mut c = default_config(Family::Sm90, AType::Bf16);
        c.pipeline = Pipeline::CpAsync;
        c.min_ctas = 1;
        c.swap_ab = false;
        (c.block_m, c.block_n, c.block_k) = (536_870_928, 16, 128);
        (c.warps_m, c.warps_n, c.warps_k) = (67_108_866, 1, 2);
        assert_eq!(c.threads(), u32::MAX);
        assert_eq!(c.smem_bytes(), u32::MAX);
        assert!(c.register_cap() <= 8, "{}", c.register_cap());
        let e = c.check_problem(&GemmProblem::new(1, 512, 6144, AType::Bf16)).unwrap_err();
        assert!(e.to_string().contains("block_m 536870928 is out of range (at most 1024)"), "{e}");
        assert!(c.check().is_err() && c.render().is_err());
        // The family's arithmetic saturates even when called without the bounds check.
        assert_eq!(sm90::smem_bytes(&c), u32::MAX);
    }

    #[test]
    fn every_bound_is_named_and_the_spaces_keep_them() {
        for family in [Family::Sm90, Family::Sm120] {
            for a in [AType::Bf16, AType::Nvfp4] {
                for c in search_space(family, a) {
                    c.check_bounds().unwrap_or_else(|e| panic!("{e}"));
                }
            }
        }
        let base = default_config(Family::Sm90, AType::Bf16);
        type Edit = fn(&mut GemmConfig);
        let cases: [(&str, Edit); 9] = [
            ("block_m 1025", |c| c.block_m = 1025),
            ("block_n 4096", |c| c.block_n = 4096),
            ("block_k 65537", |c| c.block_k = 65_537),
            ("warps_m 33", |c| c.warps_m = 33),
            ("warps_n 64", |c| c.warps_n = 64),
            ("warps_k 4294967295", |c| c.warps_k = u32::MAX),
            ("stages 17", |c| c.stages = 17),
            ("split_k 65", |c| c.split_k = 65),
            ("min_ctas 17", |c| c.min_ctas = 17),
        ];
        for (what, edit) in cases {
            let mut c = base;
            edit(&mut c);
            let e = c.check_bounds().unwrap_err().to_string();
            assert!(e.contains(what), "{what}: {e}");
        }
        let mut c = base;
        (c.warps_m, c.warps_n, c.warps_k) = (8, 8, 1);
        assert!(c.check_bounds().unwrap_err().to_string().contains("64 warps per CTA"));
    }
}

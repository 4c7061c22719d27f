//! Shape sets: the per-GPU GEMMs of a model under one parallelism, and the token counts to tune for.
//!
//! A shape file (`shapes/*.ron`, schema [`SCHEMA_VERSION`]) holds one model's [`ShapeSet`]s, one per
//! parallelism (TP1, TP2, ..., EP8). Each set lists the weight GEMMs a GPU runs per layer
//! ([`GemmShape`]: N x K, how many per layer, in how many layers) and the token buckets M to tune.
//! GLM-5's file is embedded ([`ShapeFile::glm5`]); other MoE models are derived from their Hugging
//! Face `config.json` ([`hf`]).
//!
//! Sharding model (the same in the RON files and in the derivation), following SGLang:
//! - `tp` is the number of GPUs serving one replica (SGLang `--tp-size`), `ep` the expert-parallel
//!   degree (SGLang `--ep-size`), `ep` divides `tp`. Inside the MLPs every weight is split
//!   `moe_tp = tp / ep` ways: gate_up (the fused `[gate; up]` projection) has N = 2 * I / moe_tp and
//!   K = hidden, down has N = hidden and K = I / moe_tp.
//! - Routed experts are distributed over the `ep` groups: `routed_experts / ep` experts per GPU.
//! - The shared expert and the dense MLP are sharded by `moe_tp` as well and replicated across EP
//!   groups. For EP8 (tp=8, ep=8) that means TP1 shapes, which is what SGLang's DeepEP mode does for
//!   the shared expert. (SGLang without DeepEP shards them over all 8 GPUs instead; those shapes are
//!   exactly the TP8 set's, so tuning both sets covers both deployments.)
//!
//! M is the token count of one GEMM: for routed experts the rows routed to one expert (about
//! `tokens * experts_per_token / routed_experts` in decode), for the shared expert and the dense MLP
//! the tokens of the batch.

pub mod error;
pub mod hf;
mod io;

pub use error::{InvalidReason, ParallelismReason, ShapeError};
pub use hf::{derive_from_hf_config, shapes_ron_from_config_file, HfMoeConfig};

use crate::problem::{AType, GemmProblem};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The shape-file schema this crate reads and writes.
pub const SCHEMA_VERSION: u32 = 1;

/// Largest N, K and token bucket a shape file or a derived set may hold (2^20; GLM-5's largest
/// MLP dimension is 12288). Keeps every derived size and product far from `u32` overflow.
pub const MAX_DIM: u32 = 1 << 20;
/// Largest layer count (GLM-5 has 78 layers).
pub const MAX_LAYERS: u32 = 10_000;
/// Largest number of routed experts and of GEMMs of one shape per layer.
pub const MAX_EXPERTS: u32 = 65_536;
/// Largest number of experts a token is routed to (top_k; models route 1 to 16). With
/// [`MAX_DIM`] tokens the routed ids of a step stay far below `i32::MAX`.
pub const MAX_EXPERTS_PER_TOKEN: u32 = 256;

/// Name of the shape set `fp4tune tune` uses when none is given (in the embedded GLM-5 file).
pub const DEFAULT_SET: &str = "tp8";

/// GLM-5's shape file, embedded at build time.
pub const GLM5_RON: &str = include_str!("../../../shapes/glm5.ron");

/// The origin label of the embedded GLM-5 file in error messages.
pub const GLM5_ORIGIN: &str = "<embedded shapes/glm5.ron>";

/// Token buckets used by default: the powers of two 1, 2, 4, ..., 8192.
pub fn default_token_buckets() -> Vec<u32> {
    (0..=13).map(|e| 1u32 << e).collect()
}

/// One model's shape sets (a `shapes/*.ron` file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShapeFile {
    /// Always [`SCHEMA_VERSION`]; files with another value are refused.
    pub schema_version: u32,
    /// The model, e.g. "GLM-5".
    pub model: String,
    /// Where the numbers came from (config, checkpoint, paper).
    pub source: String,
    pub sets: Vec<ShapeSet>,
}

/// The GEMMs one GPU runs under one parallelism, and the token counts to tune them for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShapeSet {
    /// Short name, e.g. "tp8" or "ep8" (see [`Parallelism::set_name`]).
    pub name: String,
    pub parallelism: Parallelism,
    /// The model's expert routing (the same in every set of a file; here so a set stands alone).
    pub routing: Routing,
    pub shapes: Vec<GemmShape>,
    /// The M values to tune for, strictly increasing.
    pub token_buckets: Vec<u32>,
}

/// How the GPUs of one model replica are split (SGLang semantics, see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Parallelism {
    /// Tensor-parallel size: the GPUs of one replica.
    pub tp: u32,
    /// Expert-parallel size: routed experts are split into `ep` groups; divides `tp`.
    pub ep: u32,
}

impl Parallelism {
    pub fn new(tp: u32, ep: u32) -> Self {
        Self { tp, ep }
    }

    /// Both sizes positive and `ep` dividing `tp`.
    pub fn is_valid(&self) -> bool {
        self.tp > 0 && self.ep > 0 && self.tp % self.ep == 0
    }

    /// How many ways each MLP weight (routed expert, shared expert, dense MLP) is split: tp / ep.
    /// Returns 0 for an invalid parallelism.
    pub fn moe_tp(&self) -> u32 {
        if self.is_valid() {
            self.tp / self.ep
        } else {
            0
        }
    }

    /// Conventional set name: "tp8" (ep = 1), "ep8" (ep = tp), otherwise "tp8ep2".
    pub fn set_name(&self) -> String {
        match (self.tp, self.ep) {
            (tp, 1) => format!("tp{tp}"),
            (tp, ep) if tp == ep => format!("ep{ep}"),
            (tp, ep) => format!("tp{tp}ep{ep}"),
        }
    }
}

impl fmt::Display for Parallelism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tp={} ep={}", self.tp, self.ep)
    }
}

/// The model's expert routing, what a decode-step model needs to turn a batch into rows per expert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Routing {
    /// Routed experts in each MoE layer (whole model, all GPUs).
    pub routed_experts: u32,
    /// Routed experts each token goes to (top-k).
    pub experts_per_token: u32,
}

impl Routing {
    /// Expected rows per routed expert for `tokens` tokens under uniform routing.
    pub fn rows_per_expert(&self, tokens: u32) -> f64 {
        if self.routed_experts == 0 {
            return 0.0;
        }
        tokens as f64 * self.experts_per_token as f64 / self.routed_experts as f64
    }
}

/// Which weight of the transformer a GEMM multiplies by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Op {
    /// A routed expert's fused gate and up projection: N = 2 * I / moe_tp, K = hidden.
    RoutedGateUp,
    /// A routed expert's down projection: N = hidden, K = I / moe_tp.
    RoutedDown,
    /// The shared expert's fused gate and up projection.
    SharedGateUp,
    /// The shared expert's down projection.
    SharedDown,
    /// The dense MLP's fused gate and up projection (layers without MoE).
    DenseGateUp,
    /// The dense MLP's down projection.
    DenseDown,
}

impl Op {
    pub const ALL: [Op; 6] = [
        Op::RoutedGateUp,
        Op::RoutedDown,
        Op::SharedGateUp,
        Op::SharedDown,
        Op::DenseGateUp,
        Op::DenseDown,
    ];

    /// The snake_case name used as the default [`GemmShape::name`].
    pub fn as_str(self) -> &'static str {
        match self {
            Op::RoutedGateUp => "routed_gate_up",
            Op::RoutedDown => "routed_down",
            Op::SharedGateUp => "shared_gate_up",
            Op::SharedDown => "shared_down",
            Op::DenseGateUp => "dense_gate_up",
            Op::DenseDown => "dense_down",
        }
    }

    /// Whether M for this GEMM is the rows routed to one expert (rather than the batch's tokens).
    pub fn is_routed(self) -> bool {
        matches!(self, Op::RoutedGateUp | Op::RoutedDown)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One weight GEMM Y[M, N] = X[M, K] * W[N, K]^T as a GPU runs it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GemmShape {
    /// Unique within its set, e.g. "routed_gate_up".
    pub name: String,
    pub op: Op,
    pub n: u32,
    /// A multiple of 16 (the NVFP4 scale block).
    pub k: u32,
    /// How many such GEMMs one GPU holds per layer: routed experts per GPU, or 1.
    pub count_per_layer: u32,
    /// How many layers of the model contain this GEMM.
    pub layers: u32,
}

impl GemmShape {
    /// The GEMM problem for `m` tokens with activations of type `a_type`.
    pub fn problem(&self, m: u32, a_type: AType) -> GemmProblem {
        GemmProblem::new(m, self.n, self.k, a_type)
    }

    /// Weight bytes of all these GEMMs on one GPU, one layer (NVFP4 codes + UE4M3 scales, unpadded).
    pub fn weight_bytes_per_layer(&self) -> u64 {
        let (n, k) = (self.n as u64, self.k as u64);
        (n * k / 2 + n * k / 16) * self.count_per_layer as u64
    }
}

impl ShapeSet {
    /// Every (shape, problem) pair of this set: each shape at each token bucket, shapes outermost.
    pub fn problems(&self, a_type: AType) -> impl Iterator<Item = (&GemmShape, GemmProblem)> + '_ {
        self.shapes
            .iter()
            .flat_map(move |s| self.token_buckets.iter().map(move |&m| (s, s.problem(m, a_type))))
    }

    /// The distinct (N, K) pairs of the set, sorted: several ops often share a shape.
    pub fn unique_nk(&self) -> Vec<(u32, u32)> {
        let mut nk: Vec<(u32, u32)> = self.shapes.iter().map(|s| (s.n, s.k)).collect();
        nk.sort_unstable();
        nk.dedup();
        nk
    }

    /// The shape of an op, if the set has one.
    pub fn shape(&self, op: Op) -> Option<&GemmShape> {
        self.shapes.iter().find(|s| s.op == op)
    }
}

impl ShapeFile {
    /// The embedded GLM-5 shape file (`shapes/glm5.ron`).
    pub fn glm5() -> Result<ShapeFile, ShapeError> {
        ShapeFile::from_ron_str(GLM5_RON, GLM5_ORIGIN)
    }

    /// The embedded GLM-5 TP8 set, the default of `fp4tune tune`.
    pub fn glm5_tp8() -> Result<ShapeSet, ShapeError> {
        ShapeFile::glm5()?.into_set(DEFAULT_SET, GLM5_ORIGIN)
    }

    /// The set called `name`.
    pub fn set(&self, name: &str) -> Option<&ShapeSet> {
        self.sets.iter().find(|s| s.name == name)
    }

    /// The set called `name`, or an error naming `origin` and the available sets.
    pub fn into_set(self, name: &str, origin: &str) -> Result<ShapeSet, ShapeError> {
        let available = self.set_names();
        self.sets.into_iter().find(|s| s.name == name).ok_or_else(|| ShapeError::UnknownSet {
            origin: origin.to_string(),
            name: name.to_string(),
            available,
        })
    }

    /// Names of all sets, in file order.
    pub fn set_names(&self) -> Vec<String> {
        self.sets.iter().map(|s| s.name.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_buckets_are_powers_of_two_to_8192() {
        let b = default_token_buckets();
        assert_eq!(b.len(), 14);
        assert_eq!(b[0], 1);
        assert_eq!(*b.last().unwrap(), 8192);
        assert!(b.windows(2).all(|w| w[1] == 2 * w[0]));
    }

    #[test]
    fn parallelism_names_and_moe_tp() {
        assert_eq!(Parallelism::new(8, 1).set_name(), "tp8");
        assert_eq!(Parallelism::new(8, 8).set_name(), "ep8");
        assert_eq!(Parallelism::new(8, 2).set_name(), "tp8ep2");
        assert_eq!(Parallelism::new(8, 2).moe_tp(), 4);
        assert_eq!(Parallelism::new(8, 8).moe_tp(), 1);
        assert_eq!(Parallelism::new(8, 3).moe_tp(), 0);
        assert!(!Parallelism::new(0, 1).is_valid());
        assert!(!Parallelism::new(4, 8).is_valid());
    }

    #[test]
    fn glm5_tp8_is_the_default_and_has_the_reference_shapes() {
        let set = ShapeFile::glm5_tp8().unwrap();
        assert_eq!(set.name, "tp8");
        assert_eq!(set.parallelism, Parallelism::new(8, 1));
        let gu = set.shape(Op::RoutedGateUp).unwrap();
        assert_eq!((gu.n, gu.k, gu.count_per_layer, gu.layers), (512, 6144, 256, 75));
        let down = set.shape(Op::RoutedDown).unwrap();
        assert_eq!((down.n, down.k), (6144, 256));
        let dense = set.shape(Op::DenseGateUp).unwrap();
        assert_eq!((dense.n, dense.k, dense.layers), (3072, 6144, 3));
        assert_eq!(set.shape(Op::DenseDown).map(|s| (s.n, s.k)), Some((6144, 1536)));
        assert_eq!(set.token_buckets, default_token_buckets());
        // 2.65 MB of NVFP4 weights per expert (both GEMMs), 256 experts: the reference's 679 MB.
        let per_layer = gu.weight_bytes_per_layer() + down.weight_bytes_per_layer();
        assert_eq!(per_layer, 256 * 2_654_208);
    }

    #[test]
    fn glm5_has_all_sets_and_ep8_keeps_experts_whole() {
        let file = ShapeFile::glm5().unwrap();
        assert_eq!(file.set_names(), ["tp1", "tp2", "tp4", "tp8", "ep8"]);
        let ep8 = file.set("ep8").unwrap();
        assert_eq!(ep8.parallelism, Parallelism::new(8, 8));
        let gu = ep8.shape(Op::RoutedGateUp).unwrap();
        assert_eq!((gu.n, gu.k, gu.count_per_layer), (4096, 6144, 32));
        // Shared expert and dense MLP replicated across EP groups: TP1 shapes.
        let tp1 = file.set("tp1").unwrap();
        for op in [Op::SharedGateUp, Op::SharedDown, Op::DenseGateUp, Op::DenseDown] {
            assert_eq!(ep8.shape(op), tp1.shape(op), "{op}");
        }
        for set in &file.sets {
            assert_eq!(set.routing, Routing { routed_experts: 256, experts_per_token: 8 });
            assert_eq!(set.shapes.len(), 6, "{}", set.name);
        }
    }

    #[test]
    fn unknown_set_names_the_available_ones() {
        let err = ShapeFile::glm5().unwrap().into_set("tp16", "x.ron").unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, ShapeError::UnknownSet { .. }));
        assert!(msg.contains("x.ron") && msg.contains("tp16") && msg.contains("tp1, tp2"), "{msg}");
    }

    #[test]
    fn problems_cover_shapes_times_buckets() {
        let set = ShapeFile::glm5_tp8().unwrap();
        let all: Vec<_> = set.problems(AType::Nvfp4).collect();
        assert_eq!(all.len(), 6 * 14);
        assert_eq!(all[0].1, GemmProblem::new(1, 512, 6144, AType::Nvfp4));
        assert_eq!(all[13].1, GemmProblem::new(8192, 512, 6144, AType::Nvfp4));
        assert_eq!(all[14].0.op, Op::RoutedDown);
        // TP8: routed and shared share both shapes; dense adds two more.
        assert_eq!(set.unique_nk(), [(512, 6144), (3072, 6144), (6144, 256), (6144, 1536)]);
    }

    #[test]
    fn rows_per_expert_under_uniform_routing() {
        let r = Routing { routed_experts: 256, experts_per_token: 8 };
        assert_eq!(r.rows_per_expert(64), 2.0);
        assert_eq!(r.rows_per_expert(8192), 256.0);
    }
}

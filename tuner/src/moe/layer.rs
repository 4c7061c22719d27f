//! The fused decode layer (family sm90, W4A16; `templates/moe/layer.cuh`): routing, gate_up,
//! down and the router-weighted sum of a small decode step in one launch. Every CTA builds the
//! step's schedule in shared memory (`routing` is its CPU mirror), then takes work items from a
//! counter: all gate_up tiles first, then the down tiles, whose weights stream while gate_up
//! still runs; the CTA whose down rows complete a token's slots writes the token's output.
//!
//! A layer's fused kernel is a pair of the grouped configurations it runs chunk for chunk (the
//! gate_up warp ring with the activations, the down register ring), so its H, per-row outputs
//! and Y are bit for bit those of the four-launch layer of the same pair.

use super::config::IllegalConfig;
use super::{GroupedConfig, MoeOp, MoeShape};
use crate::problem::AType;
use crate::template::{Family, KernelSource};
use std::fmt;

/// Routed ids (tokens x top_k) a fused step takes (templates/moe/layer.cuh LAYER_MAX_IDS).
pub const LAYER_MAX_IDS: u32 = 64;
/// The narrowest down column block (the arrival counters' bound; LAYER_MIN_BLOCK_N).
pub const LAYER_MIN_BLOCK_N: u32 = 64;

/// int32 counter words of a fused layer of width `hidden` (layer.cuh `layer_counter_words`):
/// the item counter, per tile the gate_up and the down blocks done, then arrivals per token and
/// down column block.
pub fn counter_words(hidden: u32) -> u32 {
    1 + 2 * LAYER_MAX_IDS + LAYER_MAX_IDS * hidden.div_ceil(LAYER_MIN_BLOCK_N)
}

/// The two projections' configurations of one fused layer kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LayerConfig {
    pub gate_up: GroupedConfig,
    pub down: GroupedConfig,
}

impl LayerConfig {
    /// The pairs the benchmark screens for a layer of `shape` (those its checks pass), the
    /// runtime's pick (`default_for`) first. gate_up: 16 weight rows per CTA, 4 warps along K
    /// through a 4-stage warp ring with the activations (the B = 1 pick's tile); down: 64 to 192
    /// output columns over 4 warps, each warp's first 256 k copied into its 3-stage warp ring
    /// before H is ready.
    pub fn candidates(shape: &MoeShape) -> Vec<LayerConfig> {
        let gate_up = |n, depth| {
            GroupedConfig::streamed(
                Family::Sm90,
                (
                    MoeOp::GateUp,
                    AType::Bf16,
                    [8, n, 512],
                    [1, 4],
                    (true, true, false),
                    depth,
                    1,
                    4,
                    0,
                ),
            )
        };
        let down = |n, min_ctas| {
            GroupedConfig::streamed(
                Family::Sm90,
                (
                    MoeOp::Down,
                    AType::Bf16,
                    [8, n, 256],
                    [4, 1],
                    (true, false, false),
                    3,
                    1,
                    min_ctas,
                    0,
                ),
            )
        };
        [
            (gate_up(16, 4), down(192, 4)),
            (gate_up(16, 4), down(128, 4)),
            (gate_up(16, 4), down(64, 4)),
            (gate_up(16, 4), down(192, 3)),
        ]
        .into_iter()
        .map(|(gate_up, down)| LayerConfig { gate_up, down })
        .filter(|c| c.check(shape).is_ok())
        .collect()
    }

    /// The pair a layer of `shape` runs fused (the first of `candidates`), or `None` when the
    /// shape takes none (a hidden size that 512 does not divide, an intermediate size that 256
    /// does not divide).
    pub fn default_for(shape: &MoeShape) -> Option<LayerConfig> {
        Self::candidates(shape).into_iter().next()
    }

    /// The grouped configurations whose four-launch layer gives this kernel's bits: its gate_up,
    /// and its down with a 2-stage ring at 2 CTAs per SM (the stand-alone down holds one chunk of
    /// H per stage in registers and its walk's state; the depth and the CTAs per SM set how far
    /// the copies run ahead and the register budget, not the arithmetic).
    pub fn four_launch_pair(&self) -> (GroupedConfig, GroupedConfig) {
        (self.gate_up, GroupedConfig { depth: 2, min_ctas: 2, ..self.down })
    }

    pub fn threads(&self) -> u32 {
        self.gate_up.threads()
    }

    /// CTAs per SM the kernel is compiled for (the smaller of the two tiles').
    pub fn min_ctas(&self) -> u32 {
        self.gate_up.min_ctas.min(self.down.min_ctas)
    }

    /// Dynamic shared memory: the larger of the two tiles'.
    pub fn smem_bytes(&self) -> u32 {
        self.gate_up.smem_bytes().max(self.down.smem_bytes())
    }

    /// `name()` of both tiles, without the walk (a fused kernel walks its items).
    pub fn name(&self) -> String {
        let strip = |c: &GroupedConfig| {
            let n = c.name();
            n.rsplit_once("_walk").map_or(n.clone(), |(head, _)| head.to_string())
        };
        let op_less = |c: &GroupedConfig| strip(c).trim_start_matches("moe_").to_string();
        format!("moe_layer_{}__{}", op_less(&self.gate_up), op_less(&self.down))
    }

    pub fn kernel_name(&self) -> String {
        format!("fp4tune_sm90_{}", self.name())
    }

    /// Whether a step of `tokens` tokens of `shape` runs fused: at most `LAYER_MAX_IDS` routed
    /// ids.
    pub fn takes(shape: &MoeShape, tokens: u32) -> bool {
        tokens >= 1 && tokens.saturating_mul(shape.top_k) <= LAYER_MAX_IDS
    }

    /// The template's static_asserts and run-time guards, for one shape.
    pub fn check(&self, shape: &MoeShape) -> Result<(), IllegalConfig> {
        let err = |reason: &str| Err(IllegalConfig { config: self.name(), reason: reason.into() });
        let (gu, dn) = (&self.gate_up, &self.down);
        // both tiles are legal stand-alone tiles (their four-launch layer is the fused kernel's
        // reference); the fused kernel's own registers are its compile's (a spill refuses it)
        let (gu_alone, dn_alone) = self.four_launch_pair();
        gu_alone.check(shape)?;
        dn_alone.check(shape)?;
        if !(2..=8).contains(&dn.depth) {
            return err("a down warp ring of 2 to 8 stages");
        }
        if gu.op != MoeOp::GateUp || dn.op != MoeOp::Down {
            return err("a gate_up tile, then a down tile");
        }
        let sm90_bf16 = |c: &GroupedConfig| {
            c.family == Family::Sm90 && c.a_type == AType::Bf16 && !c.tiled && c.split_k == 1
        };
        if !sm90_bf16(gu) || !sm90_bf16(dn) {
            return err("streamed sm90 W4A16 tiles without split-K");
        }
        if gu.block_m != 8 || dn.block_m != 8 {
            return err("tiles of 8 routed rows");
        }
        if !gu.a_smem || gu.flow {
            return err("gate_up runs the warp ring with the activations (pa)");
        }
        if !dn.warp_ring || dn.a_smem {
            return err("down runs the warp ring of weights (copied before H is ready)");
        }
        if gu.threads() != dn.threads() || gu.threads() < LAYER_MAX_IDS {
            return err("both tiles have one CTA size of at least 64 threads");
        }
        if dn.block_n < LAYER_MIN_BLOCK_N {
            return err("down column blocks of 64 or more");
        }
        if shape.hidden % gu.block_k != 0 || shape.inter % dn.block_k != 0 {
            return err("K of both projections a multiple of their tiles' block_k");
        }
        let fits = self.min_ctas() * (self.smem_bytes() + STATIC_SMEM + 1024) <= 233_472;
        if !fits {
            return err("its CTAs per SM do not fit the shared memory of an SM");
        }
        Ok(())
    }

    /// The instantiation unit: both tiles' configurations, the asserts tying them and the
    /// parameter block to Rust, and the kernel.
    pub fn instantiation(&self) -> String {
        let cfg = |c: &GroupedConfig| {
            let unit = c.instantiation();
            let line = unit
                .lines()
                .find_map(|l| l.strip_prefix("using Cfg = "))
                .expect("a streamed unit names its configuration")
                .trim_end_matches(';')
                .to_string();
            line
        };
        format!(
            "// fp4tune fused decode layer {kernel}\n\
             #include \"moe/layer.cuh\"\n\
             using Layer = fp4tune::moe::DecodeLayer<{gu}, {dn}>;\n\
             static_assert(Layer::SMEM_BYTES == {smem}, \"Rust (moe/layer.rs smem_bytes) and templates/moe/layer.cuh disagree on shared memory\");\n\
             static_assert(Layer::THREADS == {threads} && Layer::MIN_CTAS == {min_ctas}, \"Rust (moe/layer.rs) and templates/moe/layer.cuh disagree on threads or CTAs per SM\");\n\
             static_assert(sizeof(fp4tune::moe::LayerParams) == {params}, \"gpu::MoeLayerParams (Rust) and fp4tune::moe::LayerParams disagree\");\n\
             static_assert(fp4tune::moe::LAYER_MAX_IDS == {max_ids} && fp4tune::moe::layer_counter_words({hidden_probe}) == {words_probe}, \"Rust (moe/layer.rs) and templates/moe/layer.cuh disagree on the routed ids or the counters\");\n\
             static_assert(sizeof(fp4tune::moe::LayerRouting) <= {static_smem}, \"the routing's shared memory over what Rust (moe/layer.rs STATIC_SMEM) budgets\");\n\
             extern \"C\" __global__ void __launch_bounds__({threads}, {min_ctas}) {kernel}(const fp4tune::moe::LayerParams p) {{\n\
             \x20   Layer::run(p);\n\
             }}\n",
            kernel = self.kernel_name(),
            gu = cfg(&self.gate_up),
            dn = cfg(&self.down),
            smem = self.smem_bytes(),
            threads = self.threads(),
            min_ctas = self.min_ctas(),
            params = std::mem::size_of::<crate::gpu::moe_params::MoeLayerParams>(),
            max_ids = LAYER_MAX_IDS,
            hidden_probe = 6144,
            words_probe = counter_words(6144),
            static_smem = STATIC_SMEM,
        )
    }

    pub fn source(&self) -> KernelSource {
        KernelSource::from_unit(self.kernel_name(), Family::Sm90.arch(), &self.instantiation())
            .expect("moe/layer.cuh is embedded")
    }

    /// The persistent grid: `min_ctas` CTAs on every SM (the launch bounds make them resident
    /// together; the item order needs no residency for progress).
    pub fn grid(&self, sm_count: u32) -> (u32, u32, u32) {
        (1, (self.min_ctas() * sm_count).max(1), 1)
    }
}

/// Static shared memory the kernel's routing takes at most (asserted in the unit).
pub const STATIC_SMEM: u32 = 3072;

impl fmt::Display for LayerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// The schedule a fused step builds in shared memory (layer.cuh `DecodeLayer::route`), on the
/// CPU: `flat[r]` the flat id of sorted row r, `pos[f]` the sorted row of flat id f (-1 when not
/// local), `tiles` (local expert, first row, rows) of at most 8 rows per tile in expert order,
/// `local[t]` the local slots of token t.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerRouting {
    pub flat: Vec<i32>,
    pub pos: Vec<i32>,
    pub tiles: Vec<(u32, u32, u32)>,
    pub local: Vec<u32>,
}

/// The CPU mirror of the kernel's routing, computed the kernel's way (per id: the ids of smaller
/// experts, then those of its expert before it; a tile at every eighth row of an expert).
pub fn routing(topk_ids: &[i32], top_k: u32, expert_begin: i32, experts: u32) -> LayerRouting {
    let local_expert = |id: i32| {
        let e = i64::from(id) - i64::from(expert_begin);
        (0..i64::from(experts)).contains(&e).then_some(e as i32)
    };
    let expert: Vec<Option<i32>> = topk_ids.iter().map(|&id| local_expert(id)).collect();
    let mut pos = vec![-1i32; topk_ids.len()];
    let mut in_expert = vec![0u32; topk_ids.len()];
    for (f, e) in expert.iter().enumerate() {
        if let Some(e) = *e {
            let before = expert.iter().filter(|x| x.is_some_and(|x| x < e)).count();
            let same = expert[..f].iter().filter(|x| **x == Some(e)).count();
            pos[f] = (before + same) as i32;
            in_expert[f] = same as u32;
        }
    }
    let rows = pos.iter().filter(|&&p| p >= 0).count();
    let mut flat = vec![0i32; rows];
    for (f, &p) in pos.iter().enumerate() {
        if p >= 0 {
            flat[p as usize] = f as i32;
        }
    }
    let mut tiles = Vec::new();
    for r in 0..rows {
        let f = flat[r] as usize;
        if in_expert[f] % 8 == 0 {
            let e = expert[f].expect("a sorted row is local");
            let n =
                (r..rows.min(r + 8)).take_while(|&q| expert[flat[q] as usize] == Some(e)).count();
            tiles.push((e as u32, r as u32, n as u32));
        }
    }
    let tokens = topk_ids.len() / top_k.max(1) as usize;
    let local = (0..tokens)
        .map(|t| {
            (0..top_k as usize).filter(|&s| expert[t * top_k as usize + s].is_some()).count() as u32
        })
        .collect();
    LayerRouting { flat, pos, tiles, local }
}

#[cfg(test)]
#[path = "layer_tests.rs"]
mod tests;

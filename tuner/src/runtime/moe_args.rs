//! The grouped layer's arguments and per-stream workspace: the regions of the workspace (sized
//! at creation for a maximum token count) and the caller's buffers with their checks.

use super::*;
use crate::moe::max_tiles;
use crate::moe::templates::align_chunks;

/// Byte offsets of one workspace's regions (each 256-byte aligned).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkspaceLayout {
    pub max_tokens: u32,
    pub max_tiles: u32,
    pub offsets: usize,
    pub sorted_ids: usize,
    pub inverse: usize,
    pub tiles: usize,
    pub tile_count: usize,
    /// The chunked routing form's `[chunks][experts]` row counts (`moe::templates::align_chunks`).
    pub chunk_base: usize,
    pub h: usize,
    pub y_rows: usize,
    /// W4A4: X quantized by the layer (codes `[tokens, hidden/2]`, swizzled scales).
    pub x_codes: usize,
    pub x_sf: usize,
    /// W4A4: H as NVFP4 (codes `[rows, inter/2]`, swizzled scales over the sorted rows).
    pub h_codes: usize,
    pub h_sf: usize,
    /// Family sm120: the split-K partials (f32) and arrival counters (u32, zero between
    /// launches) of gate_up kernels split along K (`moe::sm120::split_tiles`); empty on sm90.
    pub split_partials: usize,
    pub split_partial_floats: usize,
    pub split_counters: usize,
    pub split_counter_words: usize,
    pub bytes: usize,
}

impl WorkspaceLayout {
    pub fn new(shape: &MoeShape, max_tokens: u32, family: Family) -> Self {
        let align = |x: usize| x.div_ceil(256) * 256;
        let rows = max_tokens as usize * shape.top_k as usize;
        let max_tiles = max_tiles(max_tokens, shape.top_k, shape.experts);
        let mut at = 0usize;
        let mut region = |bytes: usize| {
            let start = at;
            at = align(at + bytes.max(1));
            start
        };
        let offsets = region((shape.experts as usize + 1) * 4);
        let sorted_ids = region(rows * 4);
        let inverse = region(rows * 4);
        let tiles = region(TILE_BLOCK_M.len() * max_tiles as usize * 16);
        let tile_count = region(TILE_BLOCK_M.len() * 4);
        let chunks = align_chunks(rows as u32) as usize;
        let chunk_base = region(chunks * shape.experts as usize * 4);
        let h = region(rows * shape.inter as usize * 2);
        let y_rows = region(rows * shape.hidden as usize * 2);
        let (tokens, hidden, inter) =
            (max_tokens as usize, shape.hidden as usize, shape.inter as usize);
        let x_codes = region(tokens * hidden / 2);
        let x_sf = region(crate::format::swizzled_len(tokens, hidden / 16));
        let h_codes = region(rows * inter / 2);
        let h_sf = region(crate::format::swizzled_len(rows, inter / 16));
        let (split_partial_floats, split_counter_words) = match family {
            Family::Sm120 => (
                crate::moe::sm120::split_partial_floats(shape),
                crate::moe::sm120::split_counter_words(shape),
            ),
            Family::Sm90 => (0, 0),
        };
        let split_partials = region(split_partial_floats * 4);
        let split_counters = region(split_counter_words * 4);
        WorkspaceLayout {
            max_tokens,
            max_tiles,
            offsets,
            sorted_ids,
            inverse,
            tiles,
            tile_count,
            chunk_base,
            h,
            y_rows,
            x_codes,
            x_sf,
            h_codes,
            h_sf,
            split_partials,
            split_partial_floats,
            split_counters,
            split_counter_words,
            bytes: at,
        }
    }
}

/// Scratch memory of one stream's MoE launches.
#[derive(Debug)]
pub struct MoeWorkspace {
    pub shape: MoeShape,
    pub layout: WorkspaceLayout,
    buf: DeviceBuf<u8>,
    /// The dispatcher that created it (`MoeOps::workspace`), 0 for one made directly.
    pub(in crate::runtime) owner: u64,
    /// The routing whose schedule the last align enqueued into it wrote (host side, in the
    /// order of the calls), so gate_up and down alone refuse another routing's tokens.
    aligned: std::sync::Mutex<Option<Routed>>,
}

/// What a schedule in a workspace was built from: the routing's ids buffer, tokens and expert
/// range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Routed {
    topk_ids: u64,
    tokens: u32,
    expert_begin: i32,
}

impl Routed {
    fn of(args: &MoeArgs) -> Self {
        Routed { topk_ids: args.topk_ids, tokens: args.tokens, expert_begin: args.expert_begin }
    }
}

/// The most tokens a workspace of `shape` takes: the kernels index the `tokens * top_k` routed
/// rows with int32 (flat id = token * top_k + slot).
pub fn max_tokens_of(shape: &MoeShape) -> u32 {
    i32::MAX as u32 / shape.top_k.max(1)
}

impl MoeWorkspace {
    pub fn new(gpu: &Gpu, shape: MoeShape, max_tokens: u32) -> Result<Self, RuntimeError> {
        let most = max_tokens_of(&shape);
        if max_tokens == 0 || max_tokens > most {
            return Err(RuntimeError::InvalidArgument(format!(
                "a MoE workspace of the layer {shape} takes max_tokens 1..={most} (tokens x \
                 top_k routed rows are int32 indices), not {max_tokens}"
            )));
        }
        let layout =
            WorkspaceLayout::new(&shape, max_tokens, crate::runtime::family_for(gpu.info())?);
        let buf = gpu.alloc_zeros::<u8>(layout.bytes)?;
        // The zeroing runs on the dispatcher's own stream: finish it before the caller's stream
        // can launch into the workspace.
        gpu.synchronize()?;
        Ok(Self { shape, layout, buf, owner: 0, aligned: std::sync::Mutex::new(None) })
    }

    /// Record that an align of `args`' routing was enqueued into this workspace (`Some`), or
    /// that its schedule is unknown (`None`: set before the launches of an align, which may
    /// write part of a schedule and then fail).
    pub(in crate::runtime) fn set_aligned(&self, args: Option<&MoeArgs>) {
        *self.aligned.lock().unwrap_or_else(|e| e.into_inner()) = args.map(Routed::of);
    }

    /// `Ok` when the last align enqueued into this workspace was of `args`' routing (the same
    /// ids buffer, tokens and expert range): gate_up and down read its schedule.
    pub(in crate::runtime) fn check_aligned(&self, args: &MoeArgs) -> Result<(), RuntimeError> {
        let last = *self.aligned.lock().unwrap_or_else(|e| e.into_inner());
        match last {
            Some(r) if r == Routed::of(args) => Ok(()),
            Some(r) => Err(RuntimeError::InvalidArgument(format!(
                "the workspace holds the schedule of another routing ({} tokens, topk_ids {:#x}, \
                 expert_begin {}) than this call's ({} tokens, topk_ids {:#x}, expert_begin {}): \
                 align this routing first",
                r.tokens, r.topk_ids, r.expert_begin, args.tokens, args.topk_ids, args.expert_begin
            ))),
            None => Err(RuntimeError::InvalidArgument(
                "the workspace holds no complete schedule (none enqueued yet, or the last align \
                 failed): align the routing first (or launch the whole layer)"
                    .into(),
            )),
        }
    }

    /// The whole scratch buffer (for verification downloads).
    pub fn buffer(&self) -> &DeviceBuf<u8> {
        &self.buf
    }

    fn at(&self, offset: usize) -> u64 {
        self.buf.ptr() + offset as u64
    }

    /// Device address of the sorted-order `H` rows (`[rows, inter]` bf16).
    pub fn h(&self) -> u64 {
        self.at(self.layout.h)
    }

    /// Device address of the per-row down outputs (`[rows, hidden]` bf16, sorted order).
    pub fn y_rows(&self) -> u64 {
        self.at(self.layout.y_rows)
    }

    /// Device addresses of X quantized by a W4A4 layer (codes, swizzled scales).
    pub fn x_fp4(&self) -> (u64, u64) {
        (self.at(self.layout.x_codes), self.at(self.layout.x_sf))
    }

    /// Device addresses of H as NVFP4 (codes `[rows, inter/2]`, swizzled scales), W4A4.
    pub fn h_fp4(&self) -> (u64, u64) {
        (self.at(self.layout.h_codes), self.at(self.layout.h_sf))
    }

    /// Device address of the inverse map (`[tokens * top_k]` i32).
    pub fn inverse(&self) -> u64 {
        self.at(self.layout.inverse)
    }

    /// Device address of the offsets (`[experts + 1]` i32).
    pub fn offsets(&self) -> u64 {
        self.at(self.layout.offsets)
    }

    /// Device address of the sorted ids (`[tokens * top_k]` i32).
    pub fn sorted_ids(&self) -> u64 {
        self.at(self.layout.sorted_ids)
    }

    /// Device address of the chunked routing form's row counts.
    pub fn chunk_base(&self) -> u64 {
        self.at(self.layout.chunk_base)
    }

    /// Device addresses of the split-K partials and counters, and their sizes (floats, words).
    pub fn split(&self) -> (u64, u64, usize, usize) {
        let l = &self.layout;
        (
            self.at(l.split_partials),
            self.at(l.split_counters),
            l.split_partial_floats,
            l.split_counter_words,
        )
    }

    /// Device address of tile list `list` and of its count.
    pub fn tiles(&self, list: usize) -> (u64, u64) {
        (
            self.at(self.layout.tiles + list * self.layout.max_tiles as usize * 16),
            self.at(self.layout.tile_count + list * 4),
        )
    }
}

/// Device addresses of one MoE layer call (see ARCHITECTURE.md "Data layout" per expert); also
/// the C ABI's `fp4tune_moe_args` (include/fp4tune.h), field for field. The fields after
/// `expert_begin` extend the struct for W4A4: all zero is the W4A16 layer.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MoeArgs {
    /// bf16 `[tokens, hidden]`, 16-byte aligned (W4A4 with `x_fp4` set: unused, may be 0).
    pub x: u64,
    /// i32 `[tokens, top_k]` global expert ids.
    pub topk_ids: u64,
    /// f32 `[tokens, top_k]` router weights.
    pub topk_weights: u64,
    /// gate_up weights `[experts][2 inter, hidden/2]`, scales one swizzled block per expert,
    /// alphas f32 `[experts]` (W4A16: weight_scale_2; W4A4: x_scale * weight_scale_2).
    pub w13: u64,
    pub w13_sf: u64,
    pub alpha13: u64,
    /// down weights `[experts][hidden, inter/2]`, scales, alphas (W4A4: h_scale *
    /// weight_scale_2).
    pub w2: u64,
    pub w2_sf: u64,
    pub alpha2: u64,
    /// bf16 `[tokens, hidden]` output, 16-byte aligned.
    pub y: u64,
    pub tokens: u32,
    /// Global id of local expert 0 (expert parallelism), 0 otherwise.
    pub expert_begin: i32,
    /// Nonzero: W4A4 (NVFP4 activations for both projections); 0: W4A16 (bf16 activations, the
    /// fields below unused).
    pub w4a4: u32,
    /// W4A4: the input scale of X (gate_up's activation global scale) `x` is quantized with
    /// when `x_fp4` is 0.
    pub x_scale: f32,
    /// W4A4: the input scale of H (down's activation global scale) gate_up quantizes H with.
    pub h_scale: f32,
    /// Must be 0.
    pub reserved: u32,
    /// W4A4: X already in NVFP4, codes `[tokens, hidden/2]` (16-byte aligned) and swizzled
    /// scales (`fp4tune_scale_bytes(tokens, hidden)` bytes, 4-byte aligned); 0: the layer
    /// quantizes `x` into the workspace first.
    pub x_fp4: u64,
    pub x_sf: u64,
}

impl MoeArgs {
    /// The activation type the call asks for.
    pub fn a_type(&self) -> AType {
        if self.w4a4 != 0 {
            AType::Nvfp4
        } else {
            AType::Bf16
        }
    }

    /// Whether a W4A4 call hands over bf16 X for the layer to quantize.
    pub fn quantizes_x(&self) -> bool {
        self.w4a4 != 0 && self.x_fp4 == 0
    }

    /// Null pointers, alignment, scales and sizes against `ws`.
    pub fn validate(&self, ws: &MoeWorkspace) -> Result<(), RuntimeError> {
        self.check(ws.layout.max_tokens)
    }

    /// What an align alone reads: `topk_ids` (non-null, 4-byte aligned), the token count, the
    /// activation type and `reserved`.
    pub fn check_routing(&self, max_tokens: u32) -> Result<(), RuntimeError> {
        crate::runtime::error::check_pointer(
            "topk_ids",
            self.topk_ids,
            4,
            "the router ids are int32",
        )?;
        self.check_scalars(max_tokens)
    }

    fn check_scalars(&self, max_tokens: u32) -> Result<(), RuntimeError> {
        if self.tokens == 0 || self.tokens > max_tokens {
            return Err(RuntimeError::InvalidArgument(format!(
                "{} tokens: the workspace holds 1..={max_tokens}",
                self.tokens
            )));
        }
        if self.reserved != 0 {
            return Err(RuntimeError::InvalidArgument("`reserved` must be 0".into()));
        }
        if self.w4a4 > 1 {
            return Err(RuntimeError::InvalidArgument(format!(
                "w4a4 {}: 0 (W4A16) or 1 (W4A4)",
                self.w4a4
            )));
        }
        Ok(())
    }

    /// Null pointers, alignment, scales and sizes for a workspace of `max_tokens` tokens.
    pub fn check(&self, max_tokens: u32) -> Result<(), RuntimeError> {
        let rule = "x, y, the weight codes and x_fp4 16-byte aligned, ids, router weights, scales \
                    and alphas 4-byte";
        let mut pointers = vec![
            ("topk_ids", self.topk_ids, 4),
            ("topk_weights", self.topk_weights, 4),
            ("w13", self.w13, 16),
            ("w13_sf", self.w13_sf, 4),
            ("alpha13", self.alpha13, 4),
            ("w2", self.w2, 16),
            ("w2_sf", self.w2_sf, 4),
            ("alpha2", self.alpha2, 4),
            ("y", self.y, 16),
        ];
        if self.w4a4 != 0 && self.x_fp4 != 0 {
            pointers.push(("x_fp4", self.x_fp4, 16));
            pointers.push(("x_sf", self.x_sf, 4));
        } else {
            pointers.push(("x", self.x, 16));
        }
        for (what, p, a) in pointers {
            crate::runtime::error::check_pointer(what, p, a, rule)?;
        }
        self.check_scalars(max_tokens)?;
        if self.w4a4 != 0 {
            let good = |s: f32| s.is_finite() && s > 0.0;
            if !good(self.h_scale) || (self.x_fp4 == 0 && !good(self.x_scale)) {
                return Err(RuntimeError::InvalidArgument(format!(
                    "W4A4 needs positive finite input scales: h_scale {}, x_scale {} (used when \
                     x_fp4 is 0)",
                    self.h_scale, self.x_scale
                )));
            }
            if (self.x_fp4 == 0) != (self.x_sf == 0) {
                return Err(RuntimeError::InvalidArgument(
                    "W4A4: x_fp4 and x_sf are given together (or both 0: x is quantized)".into(),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_regions_are_aligned_disjoint_and_sized_for_max_tokens() {
        let shape = MoeShape::GLM5_TP8;
        let l = WorkspaceLayout::new(&shape, 256, Family::Sm90);
        let regions = [
            (l.offsets, 257 * 4),
            (l.sorted_ids, 2048 * 4),
            (l.inverse, 2048 * 4),
            (l.tiles, TILE_BLOCK_M.len() * l.max_tiles as usize * 16),
            (l.tile_count, TILE_BLOCK_M.len() * 4),
            (l.chunk_base, 2 * 256 * 4),
            (l.h, 2048 * 256 * 2),
            (l.y_rows, 2048 * 6144 * 2),
            (l.x_codes, 256 * 3072),
            (l.x_sf, 256 * 384),
            (l.h_codes, 2048 * 128),
            (l.h_sf, 2048 * 16),
        ];
        for w in regions.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "{regions:?}");
        }
        assert!(regions.iter().all(|(o, _)| o % 256 == 0));
        assert!(l.h_sf + 2048 * 16 <= l.bytes);
        // scale regions are padded to 128 rows: 3 tokens still take 128 rows of X scales
        let small = WorkspaceLayout::new(&shape, 3, Family::Sm90);
        assert!(small.x_sf + 128 * 384 <= small.h_codes);
        assert_eq!(l.max_tiles, 256 + 256);
        // sm90 splits K in clusters: no split-K scratch, the other regions where they were
        assert_eq!((l.split_partial_floats, l.split_counter_words), (0, 0));
        let sm120 = WorkspaceLayout::new(&shape, 256, Family::Sm120);
        assert_eq!(sm120.h_sf, l.h_sf);
        assert!(sm120.h_sf + 2048 * 16 <= sm120.split_partials);
        assert_eq!(sm120.split_partial_floats, 128 * 4 * 512);
        assert!(sm120.split_partials + 128 * 4 * 512 * 4 <= sm120.split_counters);
        assert_eq!(sm120.split_counter_words, 128 * 4 * 512 / 256);
        assert!(sm120.split_counters + sm120.split_counter_words * 4 <= sm120.bytes);
        assert!(sm120.split_partials % 256 == 0 && sm120.split_counters % 256 == 0);
    }

    #[test]
    fn workspaces_stop_where_routed_rows_would_pass_int32() {
        assert_eq!(max_tokens_of(&MoeShape::GLM5_TP8), i32::MAX as u32 / 8);
        let top10 = MoeShape { top_k: 10, ..MoeShape::GLM5_TP8 };
        let t = u64::from(max_tokens_of(&top10));
        assert!(t * 10 <= i32::MAX as u64 && (t + 1) * 10 > i32::MAX as u64);
    }

    #[test]
    fn moe_args_have_the_layout_of_the_c_struct() {
        use std::mem::{offset_of, size_of};
        // the W4A16 fields keep their offsets; the W4A4 ones follow
        assert_eq!(size_of::<MoeArgs>(), 120);
        assert_eq!(offset_of!(MoeArgs, y), 72);
        assert_eq!(offset_of!(MoeArgs, tokens), 80);
        assert_eq!(offset_of!(MoeArgs, expert_begin), 84);
        assert_eq!(offset_of!(MoeArgs, w4a4), 88);
        assert_eq!(offset_of!(MoeArgs, x_scale), 92);
        assert_eq!(offset_of!(MoeArgs, h_scale), 96);
        assert_eq!(offset_of!(MoeArgs, reserved), 100);
        assert_eq!(offset_of!(MoeArgs, x_fp4), 104);
        assert_eq!(offset_of!(MoeArgs, x_sf), 112);
        let header = include_str!("../../../include/fp4tune.h");
        let body = &header[header.find("typedef struct fp4tune_moe_args {").unwrap()..];
        let body = &body[..body.find("} fp4tune_moe_args;").unwrap()];
        let fields: Vec<&str> = body
            .lines()
            .skip(1)
            .filter_map(|l| l.split(';').next()?.split_whitespace().last())
            .collect();
        assert_eq!(
            fields,
            [
                "x",
                "topk_ids",
                "topk_weights",
                "w13",
                "w13_sf",
                "alpha13",
                "w2",
                "w2_sf",
                "alpha2",
                "y",
                "tokens",
                "expert_begin",
                "w4a4",
                "x_scale",
                "h_scale",
                "reserved",
                "x_fp4",
                "x_sf"
            ]
        );
    }

    #[test]
    fn w4a4_arguments_need_their_scales_and_either_x_or_its_nvfp4_form() {
        let base = MoeArgs {
            x: 0x1000,
            topk_ids: 0x2000,
            topk_weights: 0x3000,
            w13: 0x4000,
            w13_sf: 0x5000,
            alpha13: 0x6000,
            w2: 0x7000,
            w2_sf: 0x8000,
            alpha2: 0x9000,
            y: 0xa000,
            tokens: 4,
            ..MoeArgs::default()
        };
        base.check(8).unwrap();
        assert_eq!((base.a_type(), base.quantizes_x()), (AType::Bf16, false));
        let err = |a: MoeArgs| a.check(8).unwrap_err().to_string();
        assert!(err(MoeArgs { tokens: 9, ..base }).contains("1..=8"));
        assert!(err(MoeArgs { reserved: 1, ..base }).contains("reserved"));
        assert!(err(MoeArgs { w4a4: 2, ..base }).contains("w4a4 2"));
        // an align reads the ids only: they must be there and aligned, the other pointers not
        let ids = MoeArgs { topk_ids: 0x2000, tokens: 4, ..MoeArgs::default() };
        ids.check_routing(8).unwrap();
        let e = MoeArgs { topk_ids: 0x2002, ..ids }.check_routing(8).unwrap_err().to_string();
        assert!(e.contains("not 4-byte aligned: the router ids are int32"), "{e}");
        assert!(e.contains("`topk_ids`"), "{e}");
        assert!(MoeArgs { topk_ids: 0, ..ids }.check_routing(8).is_err());
        assert!(MoeArgs { tokens: 9, ..ids }.check_routing(8).is_err());
        assert!(MoeArgs { reserved: 1, ..ids }.check_routing(8).is_err());
        let w4a4 = MoeArgs { w4a4: 1, x_scale: 0.01, h_scale: 0.5, ..base };
        w4a4.check(8).unwrap();
        assert_eq!((w4a4.a_type(), w4a4.quantizes_x()), (AType::Nvfp4, true));
        assert!(err(MoeArgs { h_scale: 0.0, ..w4a4 }).contains("h_scale"));
        assert!(err(MoeArgs { x_scale: f32::NAN, ..w4a4 }).contains("x_scale"));
        // X already quantized: x may be 0 and x_scale is not used; codes and scales together
        let given = MoeArgs { x: 0, x_scale: 0.0, x_fp4: 0xb000, x_sf: 0xc000, ..w4a4 };
        given.check(8).unwrap();
        assert!(!given.quantizes_x());
        assert!(err(MoeArgs { x_fp4: 0xb008, ..given }).contains("`x_fp4`"));
        assert!(err(MoeArgs { x_sf: 0, ..given }).contains("null device pointer `x_sf`"));
        assert!(err(MoeArgs { x_fp4: 0, x_scale: 0.01, x: 0x1000, ..given }).contains("together"));
        // W4A16 ignores the W4A4 fields but needs x
        assert!(err(MoeArgs { x: 0, ..base }).contains("`x`"));
    }
}

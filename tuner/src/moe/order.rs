//! The layout of a layer's weight codes that the grouped kernels read.
//!
//! Engines load expert weights in the ModelOpt layout (rows of K/2 bytes; nibble i of each
//! little-endian 32-bit word is element i, element 0 in the low nibble). The sm90 family's
//! grouped kernels decode codes to bf16 in registers and read the *grouped layout*
//! (`templates/moe/layout.cuh`):
//! - every word in the *decode order*: its 32 bits permuted so that pair `s` (elements `s` and
//!   `s + 4`, one bf16x2 register) sits on the raw bf16x2 bit positions rotated left by 22, 0 and
//!   3 bits for `s` = 0, 1, 2, and pair 3 on the bits left, from where one multiply moves it there
//!   (`templates/common/nvfp4.cuh` `dequant_word_ordered`: 8 integer instructions per word of 8
//!   codes instead of 13);
//! - the rows of each expert paired as the kernels' m16 tiles hold them ([`paired_row`]: gate_up
//!   puts gate row 8T + g and up row I + 8T + g in rows g and 8 + g of group T) and stored in
//!   blocks of 16 paired rows x 128 k ([`code_offset`]: 1 KB, in the order a warp's 16-byte copies
//!   of an m16 tile read it, 512 contiguous bytes per copy instruction).
//!
//! The family sm120 MMA reads ModelOpt codes as they are.
//!
//! A layer's codes are put into the layout once at load (`templates/moe/order.cuh`, launched by
//! the runtime's `prepare_weights`); benchmarks upload them in it from the CPU (`apply`). This is
//! the one table both use; the tests mirror the device decodes of the ordered words and the
//! kernels' reads of the layout.

use super::MoeOp;
use crate::template::{Arch, Family, KernelSource};

/// How a family's grouped kernels read a layer's weight codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightOrder {
    /// The ModelOpt layout, as loaded (family sm120).
    ModelOpt,
    /// The grouped layout: the decode order, rows paired, 16-row blocks of 128 k (family sm90).
    Grouped,
}

impl WeightOrder {
    pub fn of(family: Family) -> Self {
        match family {
            Family::Sm90 => WeightOrder::Grouped,
            Family::Sm120 => WeightOrder::ModelOpt,
        }
    }
}

/// One projection's stacked expert codes (`experts` blocks of `n` rows of `k / 2` bytes): what
/// the runtime prepares in place and what a grouped launch reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeStack {
    pub op: MoeOp,
    pub n: u32,
    pub k: u32,
    pub experts: u32,
}

impl CodeStack {
    /// op's codes of every local expert of `shape`.
    pub fn of(shape: &super::MoeShape, op: MoeOp) -> Self {
        let (n, k) = shape.nk(op);
        CodeStack { op, n, k, experts: shape.experts }
    }

    pub fn expert_bytes(&self) -> u64 {
        u64::from(self.n) * u64::from(self.k) / 2
    }

    /// The whole stack's bytes (saturated: `check` refuses stacks that large).
    pub fn bytes(&self) -> u64 {
        u64::from(self.experts).saturating_mul(self.expert_bytes())
    }

    /// Whether the grouped layout takes the stack: whole groups of 16 rows and whole 16-k
    /// blocks (the grouped kernels' own limits).
    pub fn check(&self) -> Result<(), String> {
        if self.n == 0 || self.k == 0 || self.experts == 0 || self.n % 16 != 0 || self.k % 16 != 0 {
            return Err(format!(
                "{} codes of {} experts of {} x {}: the grouped layout needs rows and k that are \
                 positive multiples of 16",
                self.op, self.experts, self.n, self.k
            ));
        }
        let max = 2 * crate::shapes::MAX_DIM;
        if self.n > max || self.k > max || self.experts > crate::shapes::MAX_EXPERTS {
            return Err(format!(
                "{} codes of {} experts of {} x {}: at most {max} rows and k and {} experts",
                self.op,
                self.experts,
                self.n,
                self.k,
                crate::shapes::MAX_EXPERTS
            ));
        }
        Ok(())
    }
}

/// Paired rows per row group and bytes per block of the grouped layout (`moe/layout.cuh`).
pub const CODE_GROUP_ROWS: usize = 16;
pub const CODE_BLOCK_BYTES: usize = 1024;
const CODE_BLOCK_ROW_BYTES: usize = 64;

/// The paired row of weight row `row` of an expert with `n` rows (gate_up: gate rows 0..n/2, up
/// rows n/2..n; a gate row and its up row are rows g and 8 + g of one group of 16).
pub fn paired_row(op: MoeOp, n: usize, row: usize) -> usize {
    match op {
        MoeOp::Down => row,
        MoeOp::GateUp => {
            let half = n / 2;
            let (h, j) = if row >= half { (1, row - half) } else { (0, row) };
            (j >> 3) * 16 + h * 8 + (j & 7)
        }
    }
}

/// The byte offset in its expert's codes of byte `b` of paired row `rho` (`row_bytes` = K/2 per
/// row): the row group of 16 paired rows at `16 * row_bytes` each, in it one 1 KB block per
/// 128 k (row `rho % 16` at 64 bytes each), then the rest of the rows one after another.
pub fn code_offset(rho: usize, b: usize, row_bytes: usize) -> usize {
    let full = row_bytes & !(CODE_BLOCK_ROW_BYTES - 1);
    let r16 = rho % CODE_GROUP_ROWS;
    let in_group = if b < full {
        (b / CODE_BLOCK_ROW_BYTES) * CODE_BLOCK_BYTES
            + r16 * CODE_BLOCK_ROW_BYTES
            + b % CODE_BLOCK_ROW_BYTES
    } else {
        full * CODE_GROUP_ROWS + r16 * (row_bytes - full) + (b - full)
    };
    (rho / CODE_GROUP_ROWS) * CODE_GROUP_ROWS * row_bytes + in_group
}

/// Where bit n of a ModelOpt word goes in the decode order: pair s at the raw bf16x2 positions
/// (6, 7, 8, 15, 22, 23, 24, 31: magnitude bits e1 e0 m and the sign of element s, then of
/// element s + 4) rotated left by 22, 0 and 3 for s = 0, 1, 2; pair 3 on the bits of 0x001B001B,
/// placed so that one multiply by 2^3 + 2^8 + 2^14 lands them on the raw positions. Of the
/// orders with three rotations and one multiply, these rotations also give the wgmma kernel's lane
/// t its elements 2t (one rotation) and 2t + 1 (one masked multiply).
pub const DECODE_ORDER: [u8; 32] = [
    28, 29, 30, 5, 6, 7, 8, 15, 9, 10, 11, 18, 3, 4, 0, 1, 12, 13, 14, 21, 22, 23, 24, 31, 25, 26,
    27, 2, 19, 20, 16, 17,
];

/// Left rotation of the raw positions that holds pair s = 0, 1, 2 (nvfp4.cuh ORDER_ROTATION).
pub const ORDER_ROTATION: [u32; 3] = [22, 0, 3];
/// Pair 3's bits and the multiplier that lands them on the raw positions (nvfp4.cuh).
pub const ORDER_PAIR3_MASK: u32 = 0x001B_001B;
pub const ORDER_PAIR3_MUL: u32 = 0x4108;

/// The inverse permutation (decode order back to ModelOpt).
pub fn restore_order() -> [u8; 32] {
    let mut back = [0u8; 32];
    for (n, &d) in DECODE_ORDER.iter().enumerate() {
        back[d as usize] = n as u8;
    }
    back
}

fn permute(w: u32, dst: &[u8; 32]) -> u32 {
    (0..32).fold(0, |o, n| o | (((w >> n) & 1) << dst[n]))
}

/// One ModelOpt word in the decode order.
pub fn decode_order_word(w: u32) -> u32 {
    permute(w, &DECODE_ORDER)
}

/// One projection's stacked expert codes (`n` rows of `k / 2` bytes per expert, ModelOpt) in
/// `order`; `codes.len()` must be a whole number of experts, `n % 16 == 0` and `k % 16 == 0`.
pub fn apply(order: WeightOrder, op: MoeOp, n: usize, k: usize, codes: &[u8]) -> Vec<u8> {
    let (row_bytes, expert) = (k / 2, n * k / 2);
    assert!(
        n % CODE_GROUP_ROWS == 0 && k % 16 == 0 && expert > 0 && codes.len() % expert == 0,
        "whole experts of 16-row groups and 16-k blocks"
    );
    match order {
        WeightOrder::ModelOpt => codes.to_vec(),
        WeightOrder::Grouped => {
            let mut out = vec![0u8; codes.len()];
            for (src, dst) in codes.chunks_exact(expert).zip(out.chunks_exact_mut(expert)) {
                for row in 0..n {
                    let rho = paired_row(op, n, row);
                    for b in (0..row_bytes).step_by(4) {
                        let at = row * row_bytes + b;
                        let w =
                            u32::from_le_bytes([src[at], src[at + 1], src[at + 2], src[at + 3]]);
                        let to = code_offset(rho, b, row_bytes);
                        dst[to..to + 4].copy_from_slice(&decode_order_word(w).to_le_bytes());
                    }
                }
            }
            out
        }
    }
}

/// The projection's constant in the templates (`OP_GATE_UP`, `OP_DOWN` of `moe/params.cuh`), as
/// the order kernels take it.
pub fn op_code(op: MoeOp) -> i32 {
    match op {
        MoeOp::GateUp => 0,
        MoeOp::Down => 1,
    }
}

/// Threads per CTA of the order kernels (templates/moe/order.cuh).
pub const ORDER_THREADS: u32 = 256;

/// The kernel that puts codes into the grouped layout (`back` false) or back into the ModelOpt
/// layout (`back` true), from a copy of them, for the device's `arch`.
pub fn order_source(arch: Arch, back: bool) -> KernelSource {
    let dst = if back { restore_order() } else { DECODE_ORDER };
    let name = if back { "fp4tune_moe_order_back" } else { "fp4tune_moe_order" };
    let table = dst.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ");
    KernelSource::from_unit(
        name.to_string(),
        arch,
        &format!(
            "#include \"moe/order.cuh\"\n\
             #include \"common/nvfp4.cuh\"\n\
             static_assert(fp4tune::nvfp4::ORDER_ROTATION[0] == {r0} && fp4tune::nvfp4::ORDER_ROTATION[1] == {r1} && fp4tune::nvfp4::ORDER_ROTATION[2] == {r2} && fp4tune::nvfp4::ORDER_PAIR3_MASK == {mask}u && fp4tune::nvfp4::ORDER_PAIR3_MUL == {mul}u, \"Rust (moe::order) and templates/common/nvfp4.cuh disagree on the decode order\");\n\
             static_assert(fp4tune::moe::ORDER_THREADS == {ORDER_THREADS}, \"Rust (moe::order::ORDER_THREADS) and templates/moe/order.cuh disagree on threads\");\n\
             static_assert(sizeof(fp4tune::moe::OrderParams) == {size}, \"gpu::MoeOrderParams (Rust) and the C struct disagree\");\n\
             static_assert(fp4tune::moe::CODE_GROUP_ROWS == {CODE_GROUP_ROWS} && fp4tune::moe::CODE_BLOCK_BYTES == {CODE_BLOCK_BYTES} && fp4tune::moe::CODE_BLOCK_ROW_BYTES == {CODE_BLOCK_ROW_BYTES}, \"Rust (moe::order) and templates/moe/layout.cuh disagree on the grouped layout\");\n\
             static_assert(fp4tune::moe::OP_GATE_UP == {gate_up} && fp4tune::moe::OP_DOWN == {down}, \"Rust (moe::order::op_code) and templates/moe/params.cuh disagree on the projections\");\n\
             struct Perm {{ static constexpr uint8_t DST[32] = {{{table}}}; }};\n\
             extern \"C\" __global__ void __launch_bounds__(fp4tune::moe::ORDER_THREADS) {name}(const fp4tune::moe::OrderParams p) {{\n\
             \x20   fp4tune::moe::moe_order<Perm, {back}>(p);\n\
             }}\n",
            size = std::mem::size_of::<crate::gpu::moe_params::MoeOrderParams>(),
            gate_up = op_code(MoeOp::GateUp),
            down = op_code(MoeOp::Down),
            r0 = ORDER_ROTATION[0],
            r1 = ORDER_ROTATION[1],
            r2 = ORDER_ROTATION[2],
            mask = ORDER_PAIR3_MASK,
            mul = ORDER_PAIR3_MUL,
        ),
    )
    .expect("moe/order.cuh is embedded")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The natural decode's integer part (nvfp4.cuh `e2m1_pair_raw<S>`): pair S of a ModelOpt
    /// word as raw bf16x2.
    fn natural_pair(w: u32, s: u32) -> u32 {
        let src = if s >= 2 { w >> 8 } else { w };
        let x = src & if s % 2 == 0 { 0x000F_000F } else { 0x00F0_00F0 };
        x.wrapping_mul(if s % 2 == 0 { 0x1040 } else { 0x0104 }) & 0x81C0_81C0
    }

    /// nvfp4.cuh `ordered_pair_raw<S>` on a word in the decode order.
    fn ordered_pair(p: u32, s: u32) -> u32 {
        if s == 3 {
            (p & ORDER_PAIR3_MASK).wrapping_mul(ORDER_PAIR3_MUL) & 0x81C0_81C0
        } else {
            p.rotate_right(ORDER_ROTATION[s as usize]) & 0x81C0_81C0
        }
    }

    /// moe/sm90_wgmma.cuh `LanePick::raw` for lane t.
    fn lane_pick(p: u32, t: usize) -> u32 {
        let odd = t & 1 == 1;
        let lo_rot = (ORDER_ROTATION[if odd { 2 } else { 0 }] + 16 * (t as u32 >> 1)) % 32;
        let half = if t < 2 { 0x0000_FFFF } else { 0xFFFF_0000 };
        let hi_mask = if odd { ORDER_PAIR3_MASK } else { 0x81C0_81C0 } & half;
        let hi_mul = (if odd { ORDER_PAIR3_MUL } else { 1 }) << if t < 2 { 16 } else { 0 };
        assert_eq!(ORDER_ROTATION[1], 0, "pair 1 on the raw positions");
        let hi = (p & hi_mask).wrapping_mul(hi_mul) & 0x81C0_0000;
        (p.rotate_right(lo_rot) & 0x81C0) | hi
    }

    /// Raw bf16 bits of one E2M1 code (nvfp4.cuh: magnitude on 8..6, sign on 15).
    fn raw_code(c: u32) -> u32 {
        ((c & 7) << 6) | ((c >> 3) << 15)
    }

    fn words() -> impl Iterator<Item = u32> {
        let mut w = 0x9E37_79B9u32;
        (0..100_000).map(move |_| {
            w = w.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            w
        })
    }

    #[test]
    fn the_order_is_a_permutation_and_restores() {
        let mut sorted = DECODE_ORDER;
        sorted.sort_unstable();
        assert!(sorted.iter().enumerate().all(|(i, &p)| p as usize == i));
        let back = restore_order();
        for w in words().take(1000).chain([0, !0, 0x8000_0001]) {
            assert_eq!(permute(decode_order_word(w), &back), w, "{w:#x}");
        }
        let bytes: Vec<u8> = (0..256u16).map(|i| (i as u8).wrapping_mul(37)).collect();
        assert_eq!(apply(WeightOrder::ModelOpt, MoeOp::Down, 16, 32, &bytes), bytes);
        assert_ne!(apply(WeightOrder::Grouped, MoeOp::Down, 16, 32, &bytes), bytes);
    }

    /// Shapes (n, k) with whole blocks, a tail of 32 bytes (K = 192: 64-k stages only), tails of
    /// 8 to 56 bytes (the K-tail form), rows in 1 to 4 groups.
    const SHAPES: [(usize, usize); 8] =
        [(16, 16), (32, 128), (48, 192), (64, 176), (32, 256), (16, 96), (64, 1024), (32, 400)];

    /// Every 8-byte unit of every row lands on its own 8 bytes of the expert, in order inside the
    /// unit (the order kernels move 8-byte units), and paired rows are a permutation of rows.
    #[test]
    fn the_grouped_layout_maps_each_expert_onto_itself() {
        for (n, k) in SHAPES {
            let rb = k / 2;
            for op in [MoeOp::GateUp, MoeOp::Down] {
                let mut rows: Vec<usize> = (0..n).map(|r| paired_row(op, n, r)).collect();
                rows.sort_unstable();
                assert!(rows.iter().enumerate().all(|(i, &r)| i == r), "{op:?} {n}x{k}");
                let mut seen = vec![false; n * rb];
                for row in 0..n {
                    let rho = paired_row(op, n, row);
                    for b in (0..rb).step_by(8) {
                        let at = code_offset(rho, b, rb);
                        assert_eq!(at % 8, 0, "{n}x{k} row {row} byte {b}");
                        for j in 0..8 {
                            assert_eq!(code_offset(rho, b + j, rb), at + j);
                            assert!(!std::mem::replace(&mut seen[at + j], true), "{n}x{k} {at}");
                        }
                    }
                }
                assert!(seen.iter().all(|&s| s), "{op:?} {n}x{k}");
            }
        }
    }

    /// A stack the layout cannot take (rows or k not multiples of 16, nothing in it) is refused
    /// with its shape in the message; the GLM-5 projections are taken, their sizes whole experts.
    #[test]
    fn code_stacks_say_what_the_layout_cannot_take() {
        let down = CodeStack { op: MoeOp::Down, n: 6144, k: 256, experts: 256 };
        assert!(down.check().is_ok());
        assert_eq!((down.expert_bytes(), down.bytes()), (6144 * 128, 256 * 6144 * 128));
        let gate_up = CodeStack::of(&super::super::MoeShape::GLM5_EP8, MoeOp::GateUp);
        assert_eq!((gate_up.n, gate_up.k, gate_up.experts), (4096, 6144, 32));
        for bad in [
            CodeStack { n: 24, ..down },
            CodeStack { k: 200, ..down },
            CodeStack { experts: 0, ..down },
            CodeStack { n: 0, ..down },
        ] {
            let e = bad.check().unwrap_err();
            assert!(
                e.contains("multiples of 16") && e.contains(&format!("{} x {}", bad.n, bad.k)),
                "{e}"
            );
        }
    }

    /// gate_up's paired rows: rows g and 8 + g of group T are gate row 8T + g and up row
    /// I + 8T + g (the streamed and wgmma kernels' m16 tiles and the tiled kernel's pairs).
    #[test]
    fn gate_up_pairs_each_gate_row_with_its_up_row() {
        let n = 96;
        for j in 0..n / 2 {
            let (gate, up) =
                (paired_row(MoeOp::GateUp, n, j), paired_row(MoeOp::GateUp, n, n / 2 + j));
            assert_eq!((gate / 16, gate % 16), (j / 8, j % 8));
            assert_eq!(up, gate + 8);
        }
    }

    /// The streamed kernels' lane reads (`moe/sm90.cuh` `TilePointers::point`, `chunk_codes`):
    /// lane g * 4 + t of m16 tile rho0 (a multiple of 16), row half h, chunk c reads the 16 bytes
    /// at group(rho0) + h * 512 + lane * 16 + c * 1024, and after `apply` they are the decode
    /// order of bytes [64c + 16t, + 16) of the weight row the kernel multiplies there (gate_up:
    /// gate row rho0 / 2 + g, or its up row; down: row rho0 + 8h + g).
    #[test]
    fn the_streamed_kernels_read_the_rows_they_multiply() {
        for (n, k) in [(32, 256), (64, 512), (48, 1024)] {
            let rb = k / 2;
            let codes: Vec<u8> = (0..2 * n * rb).map(|i| (i * 131 % 251) as u8).collect();
            for op in [MoeOp::GateUp, MoeOp::Down] {
                let laid = apply(WeightOrder::Grouped, op, n, k, &codes);
                for e in 0..2 {
                    for rho0 in (0..n).step_by(16) {
                        for h in 0..2 {
                            for lane in 0..32 {
                                let (g, t) = (lane / 4, lane % 4);
                                let row = match op {
                                    MoeOp::GateUp => rho0 / 2 + g + h * (n / 2),
                                    MoeOp::Down => rho0 + 8 * h + g,
                                };
                                for c in 0..k / 128 {
                                    let at = e * n * rb
                                        + (rho0 / 16) * 16 * rb
                                        + h * 512
                                        + lane * 16
                                        + c * CODE_BLOCK_BYTES;
                                    let from = e * n * rb + row * rb + 64 * c + 16 * t;
                                    for w in 0..4 {
                                        let word = |v: &[u8], i: usize| {
                                            u32::from_le_bytes(v[i..i + 4].try_into().unwrap())
                                        };
                                        assert_eq!(
                                            word(&laid, at + 4 * w),
                                            decode_order_word(word(&codes, from + 4 * w)),
                                            "{op:?} {n}x{k} e{e} rho0 {rho0} h{h} lane {lane} c{c}"
                                        );
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// `moe/code_copy.cuh` `CodeCopyPlan`: the address copy (rho, b0) reads in the stage whose
    /// first byte is `stage`, as `plan` and `issue` compute it.
    fn copy_plan_address(rho: usize, b0: usize, stage: usize, row_bytes: usize) -> usize {
        let blocks = |b: usize| ((b >> 6) << 10) + (b & 63);
        let full = row_bytes & !63;
        let r16 = rho % 16;
        let src = (rho / 16) * 16 * row_bytes + r16 * 64 + blocks(b0);
        let tail =
            (full * 16 + r16 * (row_bytes - full) + b0) as i64 - (r16 * 64 + blocks(b0)) as i64;
        if stage < full {
            src + blocks(stage)
        } else {
            (src as i64 + (stage - full) as i64 + tail) as usize
        }
    }

    /// The tiled and wgmma kernels' copies read, for every stage size they take (128 and 256 k
    /// for a K that 128 divides, 64 k for any K of 16-k blocks, with 16-byte or, in the K-tail
    /// form, 8-byte copies), the bytes `code_offset` puts there, stage by stage into the tail.
    #[test]
    fn the_tile_copies_read_the_layouts_bytes() {
        for k in (16..=1024).step_by(16) {
            let rb = k / 2;
            let mut forms = vec![(64, if k % 64 == 0 { 16 } else { 8 })];
            if k % 128 == 0 {
                forms.extend([(128, 16), (256, 16)]);
            }
            for (bk, bytes) in forms {
                if k % bk != 0 && bytes == 16 && bk > 64 {
                    continue;
                }
                for rho in [0, 5, 15, 16, 31, 40] {
                    for stage in (0..rb).step_by(bk / 2) {
                        for b0 in (0..bk / 2).step_by(bytes) {
                            if stage + b0 >= rb {
                                continue; // zero-filled (K-tail form)
                            }
                            assert_eq!(
                                copy_plan_address(rho, b0, stage, rb),
                                code_offset(rho, stage + b0, rb),
                                "K {k} stage {bk} copy {bytes} rho {rho} at {stage} + {b0}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The tiled kernel's stage rows (`tiled::weight_row`: gate and up rows alternate) and the
    /// wgmma kernel's A rows (16-row halves of gate and up rows) have paired rows: the wgmma's A
    /// row r of the CTA at n0 is paired row n0 + r, so its copies of 16 rows read whole blocks.
    #[test]
    fn the_tiled_and_wgmma_rows_have_their_paired_rows() {
        let n = 256;
        for n0 in (0..n).step_by(64) {
            for r in 0..64 {
                // sm90_wgmma.cuh weight_row
                let j = (n0 + (r & !15)) / 2 + (r & 7);
                let row = j + ((r >> 3) & 1) * (n / 2);
                assert_eq!(paired_row(MoeOp::GateUp, n, row), n0 + r);
                let tiled =
                    super::super::tiled::weight_row(MoeOp::GateUp, n as u32, n0 as u32, r as u32)
                        .unwrap() as usize;
                let rho = paired_row(MoeOp::GateUp, n, tiled);
                assert_eq!(rho % 16, ((n0 + r) / 2) % 8 + 8 * (r & 1), "n0 {n0} r {r}");
            }
        }
    }

    /// The warp kernels' ordered decode (pairs (s, s + 4)) reads what the natural one does, and
    /// the natural one puts code i on its raw bf16 bits.
    #[test]
    fn the_ordered_word_decode_reads_what_the_natural_one_does() {
        for w in words() {
            let p = decode_order_word(w);
            for s in 0..4 {
                assert_eq!(ordered_pair(p, s), natural_pair(w, s), "{w:#x} pair {s}");
                let want =
                    raw_code((w >> (4 * s)) & 15) | (raw_code((w >> (4 * s + 16)) & 15) << 16);
                assert_eq!(natural_pair(w, s), want, "{w:#x} pair {s}");
            }
        }
    }

    /// The wgmma kernel's lane t takes elements 2t (low half) and 2t + 1 (high half) of an
    /// ordered word.
    #[test]
    fn the_wgmma_lane_pick_takes_the_lanes_two_codes() {
        for w in words() {
            let p = decode_order_word(w);
            for t in 0..4usize {
                let want =
                    raw_code((w >> (8 * t)) & 15) | (raw_code((w >> (8 * t + 4)) & 15) << 16);
                assert_eq!(lane_pick(p, t), want, "{w:#x} lane {t}");
            }
        }
    }

    /// Both order kernels compile for both families' architectures (the static_asserts tie the
    /// table above to nvfp4.cuh's decode constants and the parameter block to Rust's).
    #[test]
    fn the_order_kernels_compile_and_agree_with_nvfp4_cuh() {
        let dir = tempfile::tempdir().unwrap();
        let compiler = crate::compile::Compiler::new(Some(dir.path().to_path_buf()))
            .unwrap_or_else(|e| panic!("{e}"));
        for arch in [Family::Sm90.arch(), Family::Sm120.arch()] {
            for back in [false, true] {
                let src = order_source(arch, back);
                compiler.compile(&src).unwrap_or_else(|e| panic!("{}: {e}", src.kernel_name));
            }
        }
    }

    #[test]
    fn sm90_reads_the_grouped_layout_and_sm120_the_modelopt_one() {
        assert_eq!(WeightOrder::of(Family::Sm90), WeightOrder::Grouped);
        assert_eq!(WeightOrder::of(Family::Sm120), WeightOrder::ModelOpt);
    }
}

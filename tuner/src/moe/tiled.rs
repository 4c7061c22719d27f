//! The CPU mirror of the tiled grouped kernel's index maps (`templates/moe/sm90_tiled.cuh`): which
//! weight row each stage row of a CTA holds ([`weight_row`]: gate_up interleaves gate and up rows
//! in pairs) and which output element each lane's accumulator pair becomes ([`position`]). The
//! tests run whole grids of CTAs through both and check that every output element is written
//! exactly once, from the weight rows it needs. The K-tail form's copies ([`tail_copy_bytes`],
//! [`TAIL_COPIES`]) read exactly each row's bytes below K, once.

use super::MoeOp;

/// The weight row behind stage row `r` of the CTA whose first stage row is `n0` (even), for a
/// projection with `n` weight rows (gate_up: n = 2I, gate rows 0..I, up rows I..2I); `None` past
/// the weight (the row is not copied and its columns are not stored).
pub fn weight_row(op: MoeOp, n: u32, n0: u32, r: u32) -> Option<u32> {
    match op {
        MoeOp::GateUp => {
            let half = n / 2;
            let j = (n0 + r) / 2;
            (j < half).then_some(j + (r & 1) * half)
        }
        MoeOp::Down => (n0 + r < n).then_some(n0 + r),
    }
}

/// Output of accumulator elements (2h, 2h + 1) of m16 tile `i`, n8 tile `q` of `lane`, in the warp
/// whose first routed row is `p0` and whose first stage row of the CTA starting at `n0` is `q0`:
/// (tile-local row, the two stage rows the elements accumulate, the output column or columns).
/// gate_up: one H column `(n0 + q0 + 8q + 2t) / 2` from (gate, up); down: columns
/// `n0 + q0 + 8q + 2t` and `+ 1`.
pub fn position(
    op: MoeOp,
    n0: u32,
    q0: u32,
    p0: u32,
    (i, q, h): (u32, u32, u32),
    lane: u32,
) -> (u32, [u32; 2], Vec<u32>) {
    let (g, t) = (lane >> 2, lane & 3);
    let m = p0 + 16 * i + 8 * h + g;
    let stage = q0 + 8 * q + 2 * t;
    let c = n0 + stage;
    let cols = match op {
        MoeOp::GateUp => vec![c / 2],
        MoeOp::Down => vec![c, c + 1],
    };
    (m, [stage, stage + 1], cols)
}

/// One operand's copies per row and stage in the K-tail form (`templates/moe/sm90_tiled.cuh`,
/// `GroupedTiled`'s plans with `K_TAIL`): bytes per copy, copies per row and stage, k per copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TailCopies {
    pub bytes: u32,
    pub units: u32,
    pub unit_k: u32,
}

/// The K-tail form's stage (64 k) per operand: codes (8-byte copies of 16 k), scales (one 4-byte
/// word of 4 columns), activations (16-byte copies of 8 bf16).
pub const TAIL_COPIES: [(&str, TailCopies); 3] = [
    ("codes", TailCopies { bytes: 8, units: 4, unit_k: 16 }),
    ("scales", TailCopies { bytes: 4, units: 1, unit_k: 64 }),
    ("activations", TailCopies { bytes: 16, units: 8, unit_k: 8 }),
];

/// Bytes a K-tail copy reads from global memory (cp.async zero-fills the rest of its `bytes`):
/// those of its k below K, for a copy whose first k in the stage is `kpos` and a stage with
/// `k_left` k left before K (negative past K). Mirrors `TailCopyPlan::issue`.
pub fn tail_copy_bytes(k_left: i64, kpos: u32, c: TailCopies) -> u32 {
    let b = (k_left - i64::from(kpos)) * i64::from(c.bytes) / i64::from(c.unit_k);
    b.clamp(0, i64::from(c.bytes)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// For every K of whole 16-k blocks up to 1024, the K-tail form's ceil(K / 64) stages read
    /// each operand's row (codes K / 2 bytes, K / 16 scale columns, 2K bytes of bf16) exactly
    /// once and nothing past it; every copy reads from its start and zero-fills the remainder.
    #[test]
    fn k_tail_copies_read_each_row_below_k_exactly_once() {
        for k in (16..=1024i64).step_by(16) {
            for (what, c) in TAIL_COPIES {
                assert_eq!(c.units * c.unit_k, 64, "{what}: a stage's copies cover its 64 k");
                let row = k * i64::from(c.bytes) / i64::from(c.unit_k);
                let stage = i64::from(c.bytes * c.units);
                let stages = (k + 63) / 64;
                let mut read = vec![0u8; (stages * stage) as usize];
                for kb in 0..stages {
                    for u in 0..c.units {
                        let n = tail_copy_bytes(k - kb * 64, u * c.unit_k, c);
                        let start = (kb * stage + i64::from(u * c.bytes)) as usize;
                        for b in &mut read[start..start + n as usize] {
                            *b += 1;
                        }
                    }
                }
                let (below, past) = read.split_at(row as usize);
                assert!(below.iter().all(|&x| x == 1), "K = {k} {what}: {below:?}");
                assert!(past.iter().all(|&x| x == 0), "K = {k} {what}: reads past K");
            }
        }
    }

    /// Every (row, column) of the output of a grid of CTAs over N is written exactly once, from
    /// the weight rows it needs: gate_up H column j from gate row j and up row I + j, down column
    /// c from weight row c; for tiles of 16 to 128 rows, warps along both sides, N not a
    /// multiple of the CTA's rows.
    #[test]
    fn every_output_element_comes_once_from_its_weight_rows() {
        for (op, n) in
            [(MoeOp::GateUp, 512), (MoeOp::GateUp, 208), (MoeOp::Down, 6144), (MoeOp::Down, 400)]
        {
            for (block_m, block_n, warps_m, warps_n) in [
                (16, 64, 1, 2),
                (32, 128, 1, 4),
                (64, 128, 2, 4),
                (128, 128, 1, 8),
                (32, 256, 1, 8),
            ] {
                let width = if op == MoeOp::GateUp { n / 2 } else { n };
                let mut writes = vec![0u32; (block_m * width) as usize];
                let (warp_p, warp_q) = (block_m / warps_m, block_n / warps_n);
                for n0 in (0..n).step_by(block_n as usize) {
                    for w in 0..warps_m * warps_n {
                        let (p0, q0) = (w % warps_m * warp_p, w / warps_m * warp_q);
                        for lane in 0..32 {
                            for i in 0..warp_p / 16 {
                                for q in 0..warp_q / 8 {
                                    for h in 0..2 {
                                        let (m, rows, cols) =
                                            position(op, n0, q0, p0, (i, q, h), lane);
                                        assert!(m < block_m);
                                        let w_rows = rows.map(|r| weight_row(op, n, n0, r));
                                        for (k, &col) in cols.iter().enumerate() {
                                            if col >= width {
                                                continue; // past N: not stored
                                            }
                                            writes[(m * width + col) as usize] += 1;
                                            match op {
                                                MoeOp::GateUp => assert_eq!(
                                                    w_rows,
                                                    [Some(col), Some(col + width)],
                                                    "{op} n0 {n0} lane {lane}"
                                                ),
                                                MoeOp::Down => assert_eq!(w_rows[k], Some(col)),
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                assert!(
                    writes.iter().all(|&x| x == 1),
                    "{op} N {n} tile {block_m}x{block_n}: some element written {:?} times",
                    writes.iter().find(|&&x| x != 1)
                );
            }
        }
    }

    #[test]
    fn stage_rows_past_the_weight_are_not_copied() {
        assert_eq!(weight_row(MoeOp::GateUp, 208, 192, 0), Some(96));
        assert_eq!(weight_row(MoeOp::GateUp, 208, 192, 1), Some(200));
        assert_eq!(weight_row(MoeOp::GateUp, 208, 192, 16), None);
        assert_eq!(weight_row(MoeOp::Down, 400, 384, 15), Some(399));
        assert_eq!(weight_row(MoeOp::Down, 400, 384, 16), None);
    }
}

//! The grouped configurations that won tuning campaigns on the H200 (the GLM-5 TP8 and EP8
//! layers, W4A16 and W4A4, B = 1..1024): every grouped screen measures those legal for its shape
//! besides the even spread of the space, so a campaign never misses a configuration known to be
//! good (the space holds thousands, the screen tens). A winner that NVRTC 13.0 compiles with
//! spills is not listed: every screen would refuse it.

use super::config::GroupedConfig;
use super::MoeOp::{self, Down, GateUp};
use crate::problem::AType;
use crate::template::Family;

const W4A16: AType = AType::Bf16;
const W4A4: AType = AType::Nvfp4;
/// (warp_ring, a_smem, flow): the weights in the register ring (`d` in names), the warp ring
/// (`p`), the warp ring with the activations (`pa`), or that ring running on across tiles (`pf`).
pub(super) const R: (bool, bool, bool) = (false, false, false);
pub(super) const P: (bool, bool, bool) = (true, false, false);
pub(super) const PA: (bool, bool, bool) = (true, true, false);
pub(super) const PF: (bool, bool, bool) = (true, true, true);

/// One winner's parameters (`GroupedConfig::streamed`).
type Row = super::config::StreamedRow;

#[rustfmt::skip]
const WINNERS: &[Row] = &[
    (Down, W4A16, [8, 32, 512], [2, 2], R, 2, 1, 4, 0),
    (Down, W4A16, [8, 32, 2048], [2, 1], R, 2, 1, 2, 0),
    (Down, W4A16, [8, 64, 256], [4, 1], PF, 3, 1, 2, 0),
    (Down, W4A16, [8, 64, 2048], [4, 2], PF, 3, 1, 1, 2),
    (Down, W4A16, [8, 64, 2048], [4, 2], R, 2, 1, 2, 2),
    (Down, W4A16, [8, 128, 256], [4, 1], P, 2, 1, 1, 0),
    (Down, W4A16, [8, 128, 256], [2, 1], R, 2, 1, 4, 4),
    (Down, W4A16, [8, 128, 256], [4, 1], PA, 2, 1, 4, 4),
    (Down, W4A16, [8, 128, 2048], [4, 1], PF, 3, 1, 4, 2),
    (Down, W4A16, [8, 128, 256], [4, 1], R, 1, 1, 1, 4),
    (Down, W4A16, [8, 128, 256], [4, 1], R, 1, 1, 2, 0),
    (Down, W4A16, [8, 128, 256], [4, 1], R, 1, 1, 4, 4),
    (Down, W4A16, [8, 128, 256], [4, 1], R, 2, 1, 1, 0),
    (Down, W4A16, [8, 256, 256], [8, 1], R, 1, 1, 2, 0),
    (Down, W4A16, [16, 128, 256], [4, 1], R, 1, 1, 1, 0),
    (Down, W4A16, [16, 128, 256], [4, 1], R, 2, 1, 1, 4),
    (Down, W4A16, [16, 128, 256], [4, 1], R, 2, 1, 2, 0),
    (Down, W4A16, [16, 128, 2048], [4, 1], R, 2, 1, 2, 2),
    (Down, W4A16, [32, 128, 256], [4, 1], R, 1, 1, 1, 4),
    (Down, W4A4, [8, 32, 512], [2, 2], R, 2, 1, 1, 2),
    (Down, W4A4, [8, 32, 2048], [2, 2], R, 2, 1, 1, 0),
    (Down, W4A4, [8, 64, 256], [4, 1], R, 2, 1, 1, 4),
    (Down, W4A4, [8, 128, 256], [4, 1], R, 1, 1, 1, 0),
    (Down, W4A4, [8, 128, 256], [4, 1], R, 1, 1, 2, 4),
    (Down, W4A4, [8, 128, 256], [4, 1], R, 2, 1, 1, 4),
    (Down, W4A4, [8, 128, 256], [4, 1], R, 2, 1, 2, 0),
    (Down, W4A4, [8, 128, 256], [8, 1], R, 2, 1, 2, 2),
    (Down, W4A4, [8, 128, 512], [4, 2], P, 2, 1, 2, 0),
    (Down, W4A4, [8, 128, 2048], [4, 1], P, 2, 1, 4, 0),
    (Down, W4A4, [16, 128, 256], [4, 1], R, 1, 1, 4, 0),
    (Down, W4A4, [16, 128, 256], [4, 1], R, 2, 1, 1, 4),
    (Down, W4A4, [16, 128, 256], [4, 1], R, 2, 1, 2, 2),
    (Down, W4A4, [16, 128, 256], [4, 1], R, 2, 1, 2, 4),
    (Down, W4A4, [32, 128, 256], [4, 1], P, 2, 1, 2, 2),
    (Down, W4A4, [32, 128, 256], [4, 1], P, 2, 1, 2, 4),
    (Down, W4A4, [32, 128, 256], [4, 1], R, 1, 1, 2, 4),
    (Down, W4A4, [32, 128, 2048], [4, 1], P, 2, 1, 2, 4),
    (Down, W4A4, [32, 128, 2048], [4, 1], R, 2, 1, 1, 4),
    (GateUp, W4A16, [8, 16, 512], [1, 4], PA, 4, 1, 4, 2),
    (GateUp, W4A16, [8, 16, 1024], [1, 4], P, 3, 1, 2, 0),
    (GateUp, W4A16, [8, 16, 1024], [1, 4], R, 2, 2, 4, 0),
    (GateUp, W4A16, [8, 16, 6144], [1, 8], R, 2, 1, 2, 1),
    (GateUp, W4A16, [8, 32, 512], [1, 4], P, 2, 1, 4, 0),
    (GateUp, W4A16, [8, 32, 512], [1, 4], P, 3, 1, 3, 0),
    (GateUp, W4A16, [8, 32, 512], [1, 4], P, 4, 1, 3, 0),
    (GateUp, W4A16, [8, 32, 512], [1, 4], PA, 3, 1, 3, 0),
    (GateUp, W4A16, [8, 32, 512], [1, 4], PA, 3, 1, 4, 0),
    (GateUp, W4A16, [8, 32, 512], [1, 4], R, 3, 1, 1, 2),
    (GateUp, W4A16, [8, 32, 1024], [1, 4], R, 3, 1, 2, 0),
    (GateUp, W4A16, [8, 32, 1024], [1, 8], PA, 3, 1, 2, 0),
    (GateUp, W4A16, [8, 32, 3072], [1, 8], R, 1, 2, 2, 0),
    (GateUp, W4A16, [8, 32, 6144], [1, 4], R, 1, 1, 2, 0),
    (GateUp, W4A16, [16, 32, 512], [1, 4], R, 2, 1, 1, 0),
    (GateUp, W4A16, [32, 32, 512], [1, 4], R, 1, 1, 2, 2),
    (GateUp, W4A16, [32, 32, 6144], [1, 4], R, 1, 1, 2, 0),
    (GateUp, W4A4, [8, 32, 1024], [1, 4], P, 4, 1, 1, 2),
    (GateUp, W4A4, [8, 32, 1024], [1, 4], R, 4, 1, 2, 0),
    (GateUp, W4A4, [8, 32, 2048], [1, 8], R, 2, 1, 1, 0),
    (GateUp, W4A4, [8, 32, 3072], [1, 4], R, 2, 2, 2, 2),
    (GateUp, W4A4, [8, 32, 6144], [1, 4], P, 4, 1, 1, 0),
    (GateUp, W4A4, [8, 32, 6144], [1, 4], R, 1, 1, 1, 0),
    (GateUp, W4A4, [8, 32, 6144], [1, 4], R, 4, 1, 2, 2),
    (GateUp, W4A4, [8, 32, 6144], [1, 8], R, 2, 1, 1, 2),
    (GateUp, W4A4, [8, 64, 1024], [2, 4], R, 1, 1, 2, 2),
    (GateUp, W4A4, [8, 64, 6144], [1, 4], R, 2, 1, 1, 2),
    (GateUp, W4A4, [16, 32, 1024], [1, 4], R, 1, 1, 1, 0),
    (GateUp, W4A4, [16, 64, 1024], [1, 4], P, 4, 1, 2, 2),
    (GateUp, W4A4, [16, 64, 6144], [1, 4], R, 1, 1, 1, 2),
    (GateUp, W4A4, [32, 32, 6144], [1, 4], R, 2, 1, 2, 2),
    (GateUp, W4A4, [32, 64, 6144], [2, 4], P, 4, 1, 1, 2),
];

/// The measured seeds of one family, activation type and op (family sm90 only).
pub fn measured_seeds(family: Family, a_type: AType, op: MoeOp) -> Vec<GroupedConfig> {
    if family != Family::Sm90 {
        return Vec::new();
    }
    WINNERS
        .iter()
        .filter(|r| r.0 == op && r.1 == a_type)
        .map(|&row| GroupedConfig::streamed(family, row))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::moe::space::search_space_for;
    use crate::moe::MoeShape;

    /// Every seed is a configuration of the space of a GLM-5 layer it was measured on (so a change
    /// of the space or of its rules that drops a winner shows here), and none is listed twice.
    #[test]
    fn seeds_are_distinct_members_of_the_space() {
        let mut all = Vec::new();
        for a_type in [W4A16, W4A4] {
            for op in MoeOp::ALL {
                let seeds = measured_seeds(Family::Sm90, a_type, op);
                assert!(!seeds.is_empty(), "{op} {a_type:?}");
                for c in seeds {
                    let member = [MoeShape::GLM5_TP8, MoeShape::GLM5_EP8]
                        .iter()
                        .any(|s| search_space_for(Family::Sm90, a_type, op, s).contains(&c));
                    assert!(member, "{c} is in no GLM-5 space");
                    assert!(!all.contains(&c), "{c} listed twice");
                    all.push(c);
                }
            }
        }
        assert!(all.iter().any(|c| c.warp_ring) && all.iter().any(|c| !c.warp_ring));
        assert!(measured_seeds(Family::Sm120, W4A4, GateUp).is_empty());
        assert!(measured_seeds(Family::Sm90, W4A16, Down).iter().all(|c| c.op == Down));
    }

    /// Every seed compiles with this NVRTC for sm_90a without spills or local memory (the ptxas
    /// report and the SASS), so no screen spends a slot on a seed it must refuse. Needs NVRTC and
    /// cuobjdump (scripts/cuda-tools.sh).
    #[test]
    fn seeds_compile_without_local_memory() {
        let kernels: Vec<_> = [W4A16, W4A4]
            .into_iter()
            .flat_map(|a| MoeOp::ALL.into_iter().map(move |op| (a, op)))
            .flat_map(|(a, op)| measured_seeds(Family::Sm90, a, op))
            .map(|c| (c.to_string(), c.source()))
            .collect();
        let problems = crate::compile::sass::kernels_with_local_memory(&kernels);
        assert!(problems.is_empty(), "seeds with local memory:\n{}", problems.join("\n"));
    }
}

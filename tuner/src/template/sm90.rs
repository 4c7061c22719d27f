//! The SM80/SM90 family: NVFP4 dequantized exactly to bf16, bf16 tensor-core MMA (placeholder).

use super::{ConstraintError, GemmConfig};
use crate::problem::{AType, GemmProblem};

pub fn smem_bytes(_c: &GemmConfig) -> u32 {
    0
}
pub fn check(_c: &GemmConfig) -> Result<(), ConstraintError> {
    Ok(())
}
pub fn check_problem(_c: &GemmConfig, _p: &GemmProblem) -> Result<(), ConstraintError> {
    Ok(())
}
pub fn instantiation(c: &GemmConfig) -> String {
    format!(
        "#include \"common/params.cuh\"\nextern \"C\" __global__ void {}(const fp4tune::GemmParams p) {{ if (p.y) p.y[threadIdx.x] = 0; }}\n",
        c.kernel_name()
    )
}
pub fn search_space(a_type: AType) -> Vec<GemmConfig> {
    vec![GemmConfig {
        family: super::Family::Sm90,
        a_type,
        block_m: 16,
        block_n: 64,
        block_k: 128,
        warps_m: 1,
        warps_n: 4,
        warps_k: 1,
        stages: 4,
        split_k: 1,
        swap_ab: true,
    }]
}
pub fn default_config(a_type: AType) -> GemmConfig {
    search_space(a_type)[0]
}

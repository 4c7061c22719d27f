//! The instantiation unit of a configuration and the family's generic default.

use super::*;
use crate::problem::AType;
use crate::template::{Family, GemmConfig, Pipeline};

/// The instantiation unit: the template, the configuration, a cross-check of the shared-memory
/// size computed here, and the `extern "C"` kernel.
pub fn instantiation(c: &GemmConfig) -> String {
    let threads = c.threads();
    let smem = smem_bytes(c);
    let cluster = if cluster_split(c) {
        format!(" __cluster_dims__(1, 1, {})", c.split_k)
    } else {
        String::new()
    };
    let fp4 = c.a_type == AType::Nvfp4;
    // (header, configuration type, the header that defines it, entry function)
    let (header, cfg, cfg_file, entry) = if c.pipeline.is_direct() {
        (
            "sm90/direct.cuh",
            format!(
                "DirectConfig<{}, {}, {}, {}, {}, {}, {}, {fp4}, {}, {}, {}>",
                c.block_m,
                c.block_n,
                c.block_k,
                c.warps_n,
                c.warps_k,
                c.stages,
                c.split_k,
                c.pipeline == Pipeline::WarpRing,
                c.pipeline == Pipeline::Global,
                c.min_ctas
            ),
            "templates/sm90/direct.cuh",
            "gemm_direct",
        )
    } else {
        (
            "sm90/gemm.cuh",
            format!(
                "Sm90Config<{}, {fp4}{}>",
                c.template_args(),
                if c.pipeline == Pipeline::KTail { ", true" } else { "" }
            ),
            "templates/sm90/config.cuh",
            "gemm",
        )
    };
    format!(
        "// fp4tune SM90 kernel {name}\n\
         #include \"{header}\"\n\
         using Cfg = fp4tune::sm90::{cfg};\n\
         static_assert(Cfg::SMEM_BYTES == {smem}, \"Rust (template/sm90.rs smem_bytes) and {cfg_file} disagree on shared memory\");\n\
         static_assert(Cfg::THREADS == {threads}, \"Rust and {cfg_file} disagree on threads\");\n\
         {params}\n\
         extern \"C\" __global__ void __launch_bounds__({threads}, {min_ctas}){cluster} {kernel}(const fp4tune::GemmParams p) {{\n\
         \x20   fp4tune::sm90::{entry}<Cfg>(p);\n\
         }}\n",
        name = c.name(),
        kernel = c.kernel_name(),
        min_ctas = c.min_ctas,
        params = crate::template::gemm_params_assert(),
    )
}

/// A generic configuration, like a library would ship without tuning: 128x128 tiles, 8 warps,
/// BLOCK_K 64, 4 stages, no split-K.
pub fn default_config(a_type: AType) -> GemmConfig {
    GemmConfig {
        family: Family::Sm90,
        a_type,
        block_m: 128,
        block_n: 128,
        block_k: 64,
        warps_m: 2,
        warps_n: 4,
        warps_k: 1,
        stages: 4,
        split_k: 1,
        swap_ab: false,
        pipeline: Pipeline::CpAsync,
        min_ctas: 1,
    }
}

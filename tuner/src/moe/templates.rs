//! The templates each grouped kernel is built from: the fixed kernels of the layer (routing, the
//! weighted sum) with their sources and launch constants, and the template lists and hashes of
//! the projection kernels per family (the table's `moe_template_hash`).

use crate::template::{Arch, Family, KernelSource};

/// The routing kernels (templates/moe/align.cuh): the one-CTA form, the three launches of the
/// chunked form that long routings take (`AlignForm`), and the one-CTA form launched beside the
/// quantization of X (a W4A4 layer given bf16 X: one launch for both).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlignKernel {
    OneCta,
    Count,
    Scan,
    Place,
    OneCtaQuantize,
}

impl AlignKernel {
    pub const ALL: [AlignKernel; 5] = [
        AlignKernel::OneCta,
        AlignKernel::Count,
        AlignKernel::Scan,
        AlignKernel::Place,
        AlignKernel::OneCtaQuantize,
    ];

    /// (kernel name, device function, parameter type) of the instantiation.
    fn entry(self) -> (&'static str, &'static str, &'static str) {
        match self {
            AlignKernel::OneCta => ("fp4tune_moe_align", "moe_align", "AlignParams"),
            AlignKernel::Count => {
                ("fp4tune_moe_align_count", "moe_align_count", "AlignChunkParams")
            }
            AlignKernel::Scan => ("fp4tune_moe_align_scan", "moe_align_scan", "AlignChunkParams"),
            AlignKernel::Place => {
                ("fp4tune_moe_align_place", "moe_align_place", "AlignChunkParams")
            }
            AlignKernel::OneCtaQuantize => {
                ("fp4tune_moe_align_quantize", "moe_align_quantize", "AlignQuantizeParams")
            }
        }
    }
}

/// The routing kernels' two forms: one CTA walks the ids in rounds of `ALIGN_THREADS`, or three
/// launches take one chunk of `ALIGN_THREADS` ids per CTA. Both write the same schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlignForm {
    OneCta,
    Chunked,
}

impl AlignForm {
    /// The form a layer of `ids` routed ids (tokens * top_k) launches: chunked from
    /// `ALIGN_CHUNKED_MIN_IDS`.
    pub fn for_ids(ids: u32) -> Self {
        if ids >= ALIGN_CHUNKED_MIN_IDS {
            AlignForm::Chunked
        } else {
            AlignForm::OneCta
        }
    }
}

/// Chunks (one CTA each) of the chunked routing form for `ids` routed ids.
pub fn align_chunks(ids: u32) -> u32 {
    ids.div_ceil(ALIGN_THREADS).max(1)
}

/// One routing kernel (fixed code, one instantiation each), for the device's `arch`.
pub fn align_source(arch: Arch, kernel: AlignKernel) -> KernelSource {
    let (name, function, params) = kernel.entry();
    let unit = format!(
        "#include \"moe/align.cuh\"\n\
         static_assert(fp4tune::moe::TILE_LISTS == {lists}, \"Rust (moe::TILE_BLOCK_M) and templates/moe/params.cuh disagree on the tile lists\");\n\
         static_assert(fp4tune::moe::ALIGN_THREADS == {threads}, \"Rust (moe::templates::ALIGN_THREADS) and templates/moe/align.cuh disagree on the routing kernels' threads\");\n\
         static_assert(sizeof(fp4tune::moe::AlignParams) == {base} && sizeof(fp4tune::moe::AlignChunkParams) == {size}, \"gpu::MoeAlignParams / MoeAlignChunkParams (Rust) and the C structs disagree (the chunked form's base pointer follows the AlignParams)\");\n\
         static_assert(sizeof(fp4tune::QuantizeParams) == {quant} && sizeof(fp4tune::moe::AlignQuantizeParams) == {fused}, \"gpu::MoeAlignQuantizeParams (Rust) and the C struct disagree (the AlignParams, the quantizer's parameters, the count of quantizing CTAs)\");\n\
         extern \"C\" __global__ void __launch_bounds__(fp4tune::moe::ALIGN_THREADS) {name}(const fp4tune::moe::{params} p) {{\n\
         \x20   fp4tune::moe::{function}(p);\n\
         }}\n",
        lists = super::TILE_BLOCK_M.len(),
        threads = ALIGN_THREADS,
        size = std::mem::size_of::<crate::gpu::moe_params::MoeAlignChunkParams>(),
        base = std::mem::offset_of!(crate::gpu::moe_params::MoeAlignChunkParams, base),
        quant = std::mem::size_of::<crate::gpu::params::QuantizeParams>(),
        fused = std::mem::size_of::<crate::gpu::moe_params::MoeAlignQuantizeParams>(),
    );
    KernelSource::from_unit(name.to_string(), arch, &unit).expect("moe/align.cuh is embedded")
}

/// The finalize kernel reading its slots in groups of `slot_group` (one of
/// [`FINALIZE_GROUPED_SLOTS`], [`FINALIZE_SINGLE_SLOT`]; templates/moe/finalize.cuh).
pub fn finalize_source(arch: Arch, slot_group: u32) -> KernelSource {
    KernelSource::from_unit(
        format!("fp4tune_moe_finalize_s{slot_group}"),
        arch,
        &format!(
            "#include \"moe/finalize.cuh\"\n\
             extern \"C\" __global__ void __launch_bounds__(fp4tune::moe::FINALIZE_THREADS) fp4tune_moe_finalize_s{slot_group}(const fp4tune::moe::FinalizeParams p) {{\n\
             \x20   fp4tune::moe::moe_finalize<{slot_group}>(p);\n\
             }}\n"
        ),
    )
    .expect("moe/finalize.cuh is embedded")
}

/// The templates the grouped projection kernels of each family are built from (path prefixes
/// under `templates/`): the family's GEMM folder for its pieces, `common/`, and the grouped files
/// they include. A change of `moe/sm120.cuh` leaves the sm90 grouped hash alone, and the other
/// way round.
pub const SM90_TEMPLATES: &[&str] = &[
    "common/",
    "sm90/",
    "moe/code_copy.cuh",
    "moe/epilogue.cuh",
    "moe/layout.cuh",
    "moe/params.cuh",
    "moe/sm90.cuh",
    "moe/sm90_tiled.cuh",
    "moe/sm90_wgmma.cuh",
    "moe/wgmma.cuh",
];
pub const SM120_TEMPLATES: &[&str] =
    &["common/", "sm120/", "moe/epilogue.cuh", "moe/params.cuh", "moe/sm120.cuh"];
/// The layer's fixed kernels (routing, the weighted sum, the weight layout): outside the grouped hashes, since no
/// table entry times them and no projection kernel includes them; a change of them needs the GPU
/// suite and a new benchmark, not a re-tune.
pub const FIXED_KERNEL_TEMPLATES: &[&str] = &["moe/align.cuh", "moe/finalize.cuh", "moe/order.cuh"];

/// Hex SHA-256 of the templates the sm90 grouped kernels are built from (what the `moe` entries
/// of a table measured on SM90 record as `moe_template_hash`; `Table::current_moe_template_hash`
/// gives the hash of any table's entries' family).
pub fn template_hash() -> String {
    family_template_hash(Family::Sm90)
}

/// Hex SHA-256 of the templates one family's grouped kernels are built from.
pub fn family_template_hash(family: Family) -> String {
    crate::template::template_tree_hash(match family {
        Family::Sm90 => SM90_TEMPLATES,
        Family::Sm120 => SM120_TEMPLATES,
    })
}

/// Threads of the align and finalize kernels (templates/moe/align.cuh, finalize.cuh).
pub const ALIGN_THREADS: u32 = 1024;
/// Routed ids (tokens * top_k) from which the layer routes with the chunked form: below, the one
/// CTA's rounds cost less than two more launches (`bench --moe` times both forms per B).
pub const ALIGN_CHUNKED_MIN_IDS: u32 = 4 * ALIGN_THREADS;
pub const FINALIZE_THREADS: u32 = 256;
/// Slots per group of the finalize kernel that keeps a token's top-8 rows in flight together
/// (grids of one wave); the other finalize kernel reads one slot at a time (more CTAs per SM for
/// larger grids).
pub const FINALIZE_GROUPED_SLOTS: u32 = 8;
/// The slot group of the finalize kernel that reads one slot at a time.
pub const FINALIZE_SINGLE_SLOT: u32 = 1;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::moe::space::search_space_for;
    use crate::moe::{MoeOp, MoeShape};
    use crate::problem::AType;

    /// Each family's grouped hash covers exactly what its projection kernels include: a grouped
    /// unit of the family inlines only files its hash covers, every file under moe/ is covered by
    /// a family or is a fixed kernel's (which no projection unit includes), and the sm90 hash does
    /// not cover the sm120 grouped header (nor the other way round).
    #[test]
    fn grouped_template_hashes_cover_what_the_kernels_include() {
        let shape = MoeShape::GLM5_TP8;
        let covered = |prefixes: &[&str], path: &str| prefixes.iter().any(|p| path.starts_with(p));
        for (family, a_type, prefixes) in [
            (Family::Sm90, AType::Bf16, SM90_TEMPLATES),
            (Family::Sm90, AType::Nvfp4, SM90_TEMPLATES),
            (Family::Sm120, AType::Nvfp4, SM120_TEMPLATES),
        ] {
            for op in MoeOp::ALL {
                let space = search_space_for(family, a_type, op, &shape);
                let tiled = space.iter().find(|c| c.tiled && !c.wgmma);
                let wgmma = space.iter().find(|c| c.wgmma);
                for c in std::iter::once(&space[0]).chain(tiled).chain(wgmma) {
                    let code = c.source().code;
                    let included: Vec<&str> =
                        code.lines().filter_map(|l| l.strip_prefix("// ---- begin ")).collect();
                    assert!(included.contains(&"moe/epilogue.cuh"), "{c}: {included:?}");
                    for path in included {
                        assert!(covered(prefixes, path), "{c} includes {path}, outside its hash");
                    }
                }
            }
        }
        for (path, _) in
            crate::template::TEMPLATE_FILES.iter().filter(|(p, _)| p.starts_with("moe/"))
        {
            assert!(
                covered(SM90_TEMPLATES, path)
                    || covered(SM120_TEMPLATES, path)
                    || FIXED_KERNEL_TEMPLATES.contains(path),
                "{path} is in no grouped hash and not a fixed kernel's"
            );
        }
        assert!(
            !covered(SM90_TEMPLATES, "moe/sm120.cuh") && !covered(SM90_TEMPLATES, "sm120/gemm.cuh")
        );
        assert!(
            !covered(SM120_TEMPLATES, "moe/sm90.cuh")
                && !covered(SM120_TEMPLATES, "sm90/direct.cuh")
        );
        assert_ne!(family_template_hash(Family::Sm90), family_template_hash(Family::Sm120));
        assert_eq!(template_hash(), family_template_hash(Family::Sm90));
    }
}

use super::*;
use crate::compile::{sass, Compiler};
use crate::problem::AType;

/// NVRTC (sm_90a) compiles the measured winners and the representative configurations of both
/// activation types; the winners spill nothing; a small-M kernel's SASS uses the bf16 HMMA and
/// LDGSTS (cp.async) and no local memory.
#[test]
fn nvrtc_compiles_sample_configs_without_spills() {
    let dir = tempfile::tempdir().unwrap();
    let compiler = Compiler::new(Some(dir.path().to_path_buf())).unwrap_or_else(|e| panic!("{e}"));
    let mut configs = Vec::new();
    for a_type in [AType::Bf16, AType::Nvfp4] {
        configs.extend(measured_winners(a_type));
        configs.extend(representative_configs(a_type).into_iter().take(3));
    }
    let sources: Vec<_> = configs.iter().map(|c| c.render().unwrap()).collect();
    let winners: Vec<_> =
        [AType::Bf16, AType::Nvfp4].iter().flat_map(|&a| measured_winners(a)).collect();
    for (c, res) in configs.iter().zip(compiler.compile_many(&sources)) {
        let k = res.unwrap_or_else(|e| panic!("{c}: {e}"));
        let stats = k.stats.unwrap_or_else(|| panic!("{c}: no ptxas statistics"));
        assert!(stats.registers > 0 && stats.registers <= 255, "{c}: {stats:?}");
        if winners.contains(c) {
            assert!(!stats.spills(), "{c} spills: {stats:?}");
        }
    }
    let small = measured_winners(AType::Bf16)[0];
    let k = compiler.compile(&small.render().unwrap()).unwrap();
    match sass::dump_sass(&k.kernel_name, &k.cubin) {
        Ok(text) => {
            assert!(sass::count_opcode(&text, "HMMA.16816.F32.BF16") > 0, "no bf16 HMMA");
            assert!(sass::count_opcode(&text, "LDGSTS") > 0, "no cp.async");
            assert!(!sass::uses_local_memory(&text), "local memory in {small}");
        }
        // cuobjdump is optional on developer machines; the ptxas statistics above still ran.
        Err(sass::SassError::NotFound { .. }) => {
            eprintln!("cuobjdump not found: SASS check skipped")
        }
        Err(e) => panic!("{e}"),
    }
}

/// The K-tail form (`Pipeline::KTail`) compiles for sm_90a without spills or local memory: its
/// smallest and largest tiles, with and without swap-AB, and the family default's K-tail form
/// (what a shape outside a table runs), of both activation types.
#[test]
fn nvrtc_compiles_the_k_tail_form_without_spills() {
    let dir = tempfile::tempdir().unwrap();
    let compiler = Compiler::new(Some(dir.path().to_path_buf())).unwrap_or_else(|e| panic!("{e}"));
    let mut configs = Vec::new();
    for a_type in [AType::Bf16, AType::Nvfp4] {
        let space = search_space(a_type);
        for swap_ab in [true, false] {
            let mut tail: Vec<_> = space
                .iter()
                .filter(|c| c.pipeline == crate::template::Pipeline::KTail && c.swap_ab == swap_ab)
                .copied()
                .collect();
            tail.sort_by_key(|c| (c.block_m * c.block_n, c.stages, c.split_k));
            configs.extend(tail.first().copied());
            configs.extend(tail.last().copied());
        }
        let defaults = crate::template::default_configs(crate::template::Family::Sm90, a_type);
        assert_eq!(defaults[1].pipeline, crate::template::Pipeline::KTail);
        configs.push(defaults[1]);
    }
    assert_eq!(configs.len(), 10);
    let sources: Vec<_> = configs.iter().map(|c| c.render().unwrap()).collect();
    for (c, res) in configs.iter().zip(compiler.compile_many(&sources)) {
        let k = res.unwrap_or_else(|e| panic!("{c}: {e}"));
        let stats = k.stats.unwrap_or_else(|| panic!("{c}: no ptxas statistics"));
        assert!(!stats.spills(), "{c} spills: {stats:?}");
        match sass::dump_sass(&k.kernel_name, &k.cubin) {
            Ok(text) => assert!(!sass::uses_local_memory(&text), "local memory in {c}"),
            Err(sass::SassError::NotFound { .. }) => {
                eprintln!("cuobjdump not found: SASS check skipped")
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// The GEMM units assert the size of the parameter block Rust passes (`gpu::GemmParams`): a unit
/// whose expected size is off does not compile, and says which structs disagree.
#[test]
fn a_gemm_unit_refuses_a_parameter_block_of_another_size() {
    let dir = tempfile::tempdir().unwrap();
    let compiler = Compiler::new(Some(dir.path().to_path_buf())).unwrap_or_else(|e| panic!("{e}"));
    let c = measured_winners(AType::Bf16)[0];
    let mut src = c.render().unwrap();
    let size = std::mem::size_of::<crate::gpu::params::GemmParams>();
    let assert = format!("sizeof(fp4tune::GemmParams) == {size}");
    assert!(src.code.contains(&assert), "{}", src.code);
    compiler.compile(&src).unwrap_or_else(|e| panic!("{c}: {e}"));
    src.code = src.code.replace(&assert, &format!("sizeof(fp4tune::GemmParams) == {}", size + 8));
    let e = compiler.compile(&src).unwrap_err().to_string();
    assert!(e.contains("gpu::GemmParams (Rust) and templates/common/params.cuh disagree"), "{e}");
}

//! The SM120 templates' index math against its CPU mirror, at compile time: a translation unit
//! holds, per layout, the mirror's values of every pure index function of `sm120/load.cuh` and of
//! `Epilogue::coords` over the layout's range (tables of ints), and messaged static_asserts that
//! evaluate the template's constexpr functions over the same range and compare. NVRTC compiling it
//! for `sm_120a` is the check: a formula changed on one side only fails the compile with the
//! function's and configuration's names. No SM120 GPU is needed.

use super::fragments::{self, IndexMath};
use super::{search_space, Sm120Layout};
use crate::compile::Compiler;
use crate::problem::AType;
use crate::template::source::KernelSource;
use crate::template::{Arch, GemmConfig};

/// A list of ints for a C++ array initializer (never empty: C++ has no zero-length arrays).
fn ints<T: ToString>(v: &[T]) -> String {
    if v.is_empty() {
        return "0".to_string();
    }
    v.iter().map(T::to_string).collect::<Vec<_>>().join(",")
}

/// One comparison: a table `name_want` of the mirror's values in the loop order of `loops`
/// (nested `for` headers over ints), the template's value `expr` in the innermost loop, and the
/// static_assert naming `what`.
pub(crate) fn compare<T: ToString>(
    name: &str,
    what: &str,
    want: &[T],
    loops: &[String],
    expr: &str,
) -> String {
    let mut body = String::new();
    for l in loops {
        body.push_str(&format!("for ({l}) "));
    }
    format!(
        "constexpr int {name}_want[] = {{{}}};\n\
         __host__ __device__ constexpr bool {name}_ok() {{\n\
         \x20   int i = 0;\n\
         \x20   {body}{{ if ({expr} != {name}_want[i]) return false; ++i; }}\n\
         \x20   return i == {n};\n\
         }}\n\
         static_assert({name}_ok(), \"{what}\");\n",
        ints(want),
        n = want.len(),
    )
}

/// The index functions under one `fp4tune::sm120::Config` instantiation, in namespace `ns`:
/// the layout constants against [`Sm120Layout::of`], `code_offset`, `a_frag_offset`,
/// `b_frag_offset`, `sfa_row`, `sfb_row` over the layout's whole range and `Epilogue::coords` for
/// every warp's first and last MMA tiles, the mirror's values taken from `math`.
pub(crate) fn layout_checks(c: &GemmConfig, ns: &str, math: &IndexMath) -> String {
    let l = Sm120Layout::of(c).expect("a configuration of the space has a layout");
    let cfg = super::config_type(c);
    let side = |f: &str| {
        format!("{cfg}: {f} of templates/sm120 differs from its mirror in tuner/src/template/sm120/fragments.rs")
    };
    let mut out = format!("namespace {ns} {{\nusing Cfg = {cfg};\n");
    out.push_str(&format!(
        "static_assert(Cfg::TILE_P == {} && Cfg::TILE_Q == {} && Cfg::WARPS_P == {} && Cfg::WARPS_Q == {} && \
         Cfg::WARP_P == {} && Cfg::WARP_Q == {} && Cfg::MMA_P == {} && Cfg::MMA_Q == {} && Cfg::K_STEPS == {} && \
         Cfg::K_STEPS_PER_WARP == {} && Cfg::ROW_BYTES == {} && Cfg::ROW_CHUNKS == {} && Cfg::Q_CODE_OFFSET == {} && \
         Cfg::P_SF_OFFSET == {} && Cfg::Q_SF_OFFSET == {} && Cfg::STAGE_BYTES == {} && Cfg::FLAG_OFFSET == {}, \
         \"{cfg}: the sizes of sm120/config.cuh differ from Sm120Layout::of in tuner/src/template/sm120/mod.rs\");\n",
        l.tile_p, l.tile_q, l.warps_p, l.warps_q, l.warp_p, l.warp_q, l.mma_p, l.mma_q, l.k_steps,
        l.k_steps_per_warp, l.row_bytes, l.row_chunks, l.q_code_offset, l.p_sf_offset,
        l.q_sf_offset, l.stage_bytes, l.flag_offset,
    ));
    let rows = l.tile_p.max(l.tile_q);
    let mut want = Vec::new();
    for row in 0..rows {
        for chunk in 0..l.row_chunks {
            want.push(fragments::code_offset(&l, row, chunk));
        }
    }
    out.push_str(&compare(
        "code_offset",
        &side("code_offset"),
        &want,
        &[
            format!("int row = 0; row < {rows}; ++row"),
            "int c = 0; c < Cfg::ROW_CHUNKS; ++c".into(),
        ],
        "fp4tune::sm120::code_offset<Cfg>(row, c)",
    ));
    let warp_loop = |n: u32| format!("int w = 0; w < {n}; ++w");
    let (mut a, mut sfa) = (Vec::new(), Vec::new());
    for w in 0..l.warps_p {
        for mp in 0..l.mma_p {
            for step in 0..l.k_steps {
                for lane in 0..32 {
                    a.push((math.a_frag)(&l, w * l.warp_p, mp, step, lane));
                }
            }
            for lane in 0..32 {
                sfa.push((math.sfa_row)(&l, w * l.warp_p, mp, lane));
            }
        }
    }
    let lane_loop = "int lane = 0; lane < 32; ++lane".to_string();
    let step_loop = "int s = 0; s < Cfg::K_STEPS; ++s".to_string();
    out.push_str(&compare(
        "a_frag",
        &side("a_frag_offset"),
        &a,
        &[
            warp_loop(l.warps_p),
            "int mp = 0; mp < Cfg::MMA_P; ++mp".into(),
            step_loop.clone(),
            lane_loop.clone(),
        ],
        "fp4tune::sm120::a_frag_offset<Cfg>(w * Cfg::WARP_P, mp, s, lane)",
    ));
    out.push_str(&compare(
        "sfa",
        &side("sfa_row"),
        &sfa,
        &[warp_loop(l.warps_p), "int mp = 0; mp < Cfg::MMA_P; ++mp".into(), lane_loop.clone()],
        "fp4tune::sm120::sfa_row<Cfg>(w * Cfg::WARP_P, mp, lane)",
    ));
    let sfb_words = l.mma_q.div_ceil(4);
    let (mut b, mut sfb) = (Vec::new(), Vec::new());
    for w in 0..l.warps_q {
        for mq in (0..l.mma_q).step_by(2) {
            for step in 0..l.k_steps {
                for lane in 0..32 {
                    b.push((math.b_frag)(&l, w * l.warp_q, mq, step, lane));
                }
            }
        }
        for g in 0..sfb_words {
            for lane in 0..32 {
                sfb.push((math.sfb_row)(&l, w * l.warp_q, g, lane));
            }
        }
    }
    out.push_str(&compare(
        "b_frag",
        &side("b_frag_offset"),
        &b,
        &[
            warp_loop(l.warps_q),
            "int mq = 0; mq < Cfg::MMA_Q; mq += 2".into(),
            step_loop,
            lane_loop.clone(),
        ],
        "fp4tune::sm120::b_frag_offset<Cfg>(w * Cfg::WARP_Q, mq, s, lane)",
    ));
    out.push_str(&compare(
        "sfb",
        &side("sfb_row"),
        &sfb,
        &[warp_loop(l.warps_q), format!("int g = 0; g < {sfb_words}; ++g"), lane_loop.clone()],
        "fp4tune::sm120::sfb_row<Cfg>(w * Cfg::WARP_Q, g, lane)",
    ));
    // Epilogue::coords of the CTA tile (1, 2), every warp's first and last MMA tiles
    let (tp0, tq0) = (l.tile_p, 2 * l.tile_q);
    let (mut cm, mut cn) = (Vec::new(), Vec::new());
    let ends = |n: u32| if n > 1 { vec![0, n - 1] } else { vec![0] };
    for wp in 0..l.warps_p {
        for wq in 0..l.warps_q {
            for &mp in &ends(l.mma_p) {
                for &mq in &ends(l.mma_q) {
                    for i in 0..4 {
                        for lane in 0..32 {
                            let (m, n) = fragments::epilogue_coords(
                                c,
                                tp0,
                                tq0,
                                wp * l.warp_p,
                                wq * l.warp_q,
                                mp,
                                mq,
                                i,
                                lane,
                            );
                            cm.push(m);
                            cn.push(n);
                        }
                    }
                }
            }
        }
    }
    let end_loop = |v: &str, n: &str| {
        format!("int {v}i = 0, {v} = 0; {v}i < ({n} > 1 ? 2 : 1); ++{v}i, {v} = {n} - 1")
    };
    let coords_loops = [
        "int wp = 0; wp < Cfg::WARPS_P; ++wp".to_string(),
        "int wq = 0; wq < Cfg::WARPS_Q; ++wq".to_string(),
        end_loop("mp", "Cfg::MMA_P"),
        end_loop("mq", "Cfg::MMA_Q"),
        "int e = 0; e < 4; ++e".to_string(),
        lane_loop,
    ];
    out.push_str(&format!(
        "__host__ __device__ constexpr int coords_at(int wp, int wq, int mp, int mq, int e, int lane, bool want_n) {{\n\
         \x20   int m = -1, n = -1;\n\
         \x20   fp4tune::sm120::Epilogue<Cfg>::coords({tp0}, {tq0}, wp * Cfg::WARP_P, wq * Cfg::WARP_Q, mp, mq, e, lane, m, n);\n\
         \x20   return want_n ? n : m;\n\
         }}\n"
    ));
    out.push_str(&compare(
        "coords_m",
        &side("Epilogue::coords (m)"),
        &cm,
        &coords_loops,
        "coords_at(wp, wq, mp, mq, e, lane, false)",
    ));
    out.push_str(&compare(
        "coords_n",
        &side("Epilogue::coords (n)"),
        &cn,
        &coords_loops,
        "coords_at(wp, wq, mp, mq, e, lane, true)",
    ));
    out.push_str(&format!("}}  // namespace {ns}\n"));
    out
}

/// The configurations with distinct index math: one per (tiles, warps, K per stage, swap), since
/// stages and split-K change none of the functions checked (their sizes are checked by the
/// instantiation units' own asserts).
pub(crate) fn distinct_layouts(configs: &[GemmConfig]) -> Vec<GemmConfig> {
    let mut seen = std::collections::HashSet::new();
    configs
        .iter()
        .filter(|c| {
            seen.insert((
                c.block_m, c.block_n, c.block_k, c.warps_m, c.warps_n, c.warps_k, c.swap_ab,
            ))
        })
        .copied()
        .collect()
}

/// Compile a check unit of `header` and `body` for `sm_120a` (in memory: nothing is cached):
/// `Err` holds the compile log.
pub(crate) fn compile_checks(name: &str, header: &str, body: &str) -> Result<(), String> {
    let unit =
        format!("#include \"{header}\"\n{body}\nextern \"C\" __global__ void {name}() {{}}\n");
    let src = KernelSource::from_unit(name.to_string(), Arch::Sm120a, &unit)?;
    let compiler = Compiler::new(None).map_err(|e| e.to_string())?;
    compiler.compile(&src).map(|_| ()).map_err(|e| e.to_string())
}

/// The index math of every layout of the GEMM space (and the family defaults), in units of up to
/// `per_unit` layouts compiled in parallel.
fn check_space(math: &IndexMath, configs: &[GemmConfig], per_unit: usize) -> Vec<String> {
    use rayon::prelude::*;
    let layouts = distinct_layouts(configs);
    layouts
        .chunks(per_unit)
        .enumerate()
        .collect::<Vec<_>>()
        .par_iter()
        .filter_map(|(u, chunk)| {
            let body: String = chunk
                .iter()
                .enumerate()
                .map(|(j, c)| layout_checks(c, &format!("layout{j}"), math))
                .collect();
            compile_checks(&format!("fp4tune_sm120_index_check{u}"), "sm120/gemm.cuh", &body).err()
        })
        .collect()
}

fn space() -> Vec<GemmConfig> {
    let mut configs = search_space(AType::Nvfp4);
    configs.extend(crate::template::default_configs(crate::template::Family::Sm120, AType::Nvfp4));
    configs
}

#[test]
fn the_templates_index_math_is_its_cpu_mirror_in_every_layout() {
    let configs = space();
    let layouts = distinct_layouts(&configs);
    assert!(layouts.len() >= 10, "{} layouts", layouts.len());
    let errors = check_space(&IndexMath::TEMPLATE, &configs, 16);
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

/// The check fails, naming the function, when the mirror's values are not the template's: a
/// B fragment whose k chunks are swapped, and an SF_A row without its odd lanes' + 8.
#[test]
fn a_mirror_that_differs_fails_the_compile_naming_the_function() {
    fn b_swapped(l: &Sm120Layout, warp_q0: u32, mq: u32, step: u32, lane: u32) -> u32 {
        let row = warp_q0 + (mq + (lane >> 4)) * 8 + (lane & 7);
        fragments::code_offset(l, row, 2 * step + 1 - ((lane >> 3) & 1))
    }
    fn sfa_even(_l: &Sm120Layout, warp_p0: u32, mp: u32, lane: u32) -> u32 {
        warp_p0 + mp * 16 + (lane >> 2)
    }
    let configs = space();
    let c = distinct_layouts(&configs)[0];
    for (math, function) in [
        (IndexMath { b_frag: b_swapped, ..IndexMath::TEMPLATE }, "b_frag_offset"),
        (IndexMath { sfa_row: sfa_even, ..IndexMath::TEMPLATE }, "sfa_row"),
    ] {
        let unit = layout_checks(&c, "m", &math);
        let e = compile_checks("fp4tune_sm120_index_mutant", "sm120/gemm.cuh", &unit)
            .expect_err("a mirror that differs must fail the compile");
        assert!(e.contains(&format!("{function} of templates/sm120 differs")), "{e}");
        let others = [
            "code_offset of",
            "a_frag_offset of",
            "b_frag_offset of",
            "sfa_row of",
            "sfb_row of",
            "Epilogue::coords",
            "the sizes of sm120/config.cuh",
        ];
        for other in others.iter().filter(|o| !o.starts_with(function)) {
            assert!(!e.contains(*other), "{other} was reported too:\n{e}");
        }
    }
}

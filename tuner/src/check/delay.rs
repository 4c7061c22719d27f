//! A deliberately slowed build of one entry's kernel, for the evidence that a check catches a
//! slower kernel and names it (`fp4tune check --inject-delay <entry>=<microseconds>`, a hidden
//! option for that test).
//!
//! The slowed kernel is the entry's own instantiation unit with a delay prologue: before the
//! kernel body, every thread of every CTA waits until the GPU's nanosecond timer
//! (`%globaltimer`) has advanced by the delay. Nothing under `templates/` changes, so no template
//! hash does; the kernel symbol gets a `_delay<us>us` suffix, so the slowed kernel has its own
//! source hash and cache key and never stands in for the real one in the cubin cache. The
//! kernel's parameter list, launch bounds, cluster shape and shared memory are the entry's, so it
//! launches on the same grid and buffers.
//!
//! [`measure_in_process`] verifies and times it, interleaved with the family default, like the
//! measuring worker does for every other entry (`tune::worker`), with the same operands: the same
//! verification and timing code (`bench::gemm`), run in the checking process.

use super::Measurement;
use crate::bench::gemm::{time_candidates, verify, Candidate, DeviceProblem, HostProblem};
use crate::bench::{Summary, TimingPolicy};
use crate::compile::Compiler;
use crate::gpu::{Gpu, GpuError};
use crate::problem::{AType, GemmProblem};
use crate::table::{Entry, Method, Table};
use crate::template::{default_config, sm120, sm90, Family, GemmConfig, KernelSource};
use crate::tune::log::Outcome;

/// Which entry of a table: its position as a check prints it (`[i/total]`, from 1), or its key
/// `<N>x<K>:<M>` with an optional `:w4a4` / `:w4a16`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntrySelector {
    Position(usize),
    Key { n: u32, k: u32, m: u32, a_type: Option<AType> },
}

/// `--inject-delay <selector>=<microseconds>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InjectDelay {
    pub selector: EntrySelector,
    pub us: u32,
}

/// The longest delay accepted (a second per CTA is already far beyond any check's patience).
pub const MAX_DELAY_US: u32 = 1_000_000;

impl InjectDelay {
    /// Parse `<selector>=<microseconds>`: `3=20` (the third entry), `512x6144:16=20`,
    /// `512x6144:16:w4a16=20`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let usage = "expected <entry>=<microseconds>, the entry as its position (3) or its key \
                     <N>x<K>:<M>[:w4a4|:w4a16] (512x6144:16)";
        let (sel, us) = s.rsplit_once('=').ok_or_else(|| format!("`{s}`: {usage}"))?;
        let us: u32 = us
            .trim()
            .parse()
            .ok()
            .filter(|v| (1..=MAX_DELAY_US).contains(v))
            .ok_or_else(|| format!("`{s}`: the delay is 1..={MAX_DELAY_US} microseconds"))?;
        let sel = sel.trim();
        let selector = if let Ok(p) = sel.parse::<usize>() {
            if p == 0 {
                return Err(format!("`{s}`: positions count from 1"));
            }
            EntrySelector::Position(p)
        } else {
            let bad = || format!("`{s}`: {usage}");
            let mut parts = sel.split(':');
            let (n, k) = parts.next().and_then(|nk| nk.split_once('x')).ok_or_else(bad)?;
            let m = parts.next().ok_or_else(bad)?;
            let a_type = match parts.next() {
                None => None,
                Some("w4a4") => Some(AType::Nvfp4),
                Some("w4a16") => Some(AType::Bf16),
                Some(_) => return Err(bad()),
            };
            if parts.next().is_some() {
                return Err(bad());
            }
            let num = |v: &str| v.trim().parse::<u32>().map_err(|_| bad());
            EntrySelector::Key { n: num(n)?, k: num(k)?, m: num(m)?, a_type }
        };
        Ok(Self { selector, us })
    }

    /// The index (into `table.entries`) of the one entry the selector names: an error when it
    /// names none or several, or an entry whose time is not its fused kernel's.
    pub fn select(&self, table: &Table) -> Result<usize, String> {
        let matches: Vec<usize> = match self.selector {
            EntrySelector::Position(p) => {
                if p > table.entries.len() {
                    return Err(format!(
                        "--inject-delay: entry {p} of a table of {} entries",
                        table.entries.len()
                    ));
                }
                vec![p - 1]
            }
            EntrySelector::Key { n, k, m, a_type } => (0..table.entries.len())
                .filter(|&i| {
                    let key = &table.entries[i].key;
                    key.n == n && key.k == k && key.m == m && a_type.is_none_or(|a| a == key.a_type)
                })
                .collect(),
        };
        let keys = |v: &[usize]| {
            v.iter().map(|&i| table.entries[i].key.to_string()).collect::<Vec<_>>().join("; ")
        };
        match matches[..] {
            [] => Err("--inject-delay: no entry of the table has this key".into()),
            [i] if table.entries[i].method != Method::Fused => Err(format!(
                "--inject-delay: {} takes the {} path, whose time is not its kernel's: pick a fused entry",
                table.entries[i].key,
                table.entries[i].method.label()
            )),
            [i] => Ok(i),
            _ => Err(format!(
                "--inject-delay: several entries have this key ({}): add :w4a4 or :w4a16",
                keys(&matches)
            )),
        }
    }
}

/// The slowed kernel's symbol.
pub fn delayed_kernel_name(c: &GemmConfig, us: u32) -> String {
    format!("{}_delay{us}us", c.kernel_name())
}

/// The first statement of the slowed kernel's body.
const CALL: &str = "    fp4tune_injected_delay();\n";

/// The device function the slowed kernel calls first: wait `us` microseconds of `%globaltimer`.
fn prologue(us: u32) -> String {
    format!(
        "// fp4tune check --inject-delay: every thread waits {us} us (%globaltimer) before the body.\n\
         __device__ __forceinline__ void fp4tune_injected_delay() {{\n\
         \x20   unsigned long long start, now;\n\
         \x20   asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(start));\n\
         \x20   do {{\n\
         \x20       asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(now));\n\
         \x20   }} while (now - start < {ns}ull);\n\
         }}\n",
        ns = us as u64 * 1000
    )
}

/// `c`'s instantiation unit with the delay prologue (module docs), as a kernel source.
pub fn delayed_source(c: &GemmConfig, us: u32) -> Result<KernelSource, String> {
    c.check().map_err(|e| e.to_string())?;
    let unit = match c.family {
        Family::Sm90 => sm90::instantiation(c),
        Family::Sm120 => sm120::instantiation(c),
    };
    let signature = format!("{}(const fp4tune::GemmParams p) {{\n", c.kernel_name());
    let at = unit.find(&signature).ok_or_else(|| {
        format!("{c}: the instantiation unit has no kernel definition `{}`", signature.trim())
    })?;
    let name = delayed_kernel_name(c, us);
    // The kernel's own line up to its name (qualifiers, launch bounds, cluster dims) is kept.
    let line_start = unit[..at].rfind('\n').map_or(0, |i| i + 1);
    let delayed = format!(
        "{}{}{}{name}(const fp4tune::GemmParams p) {{\n{CALL}{}",
        &unit[..line_start],
        prologue(us),
        &unit[line_start..at],
        &unit[at + signature.len()..]
    );
    KernelSource::from_unit(name, c.family.arch(), &delayed).map_err(|e| format!("{c}: {e}"))
}

/// The operands a check measures `p` on (the measuring worker's seed: `check::run`).
fn operand_seed(p: &GemmProblem) -> u64 {
    super::run::operand_seed(p)
}

/// Verify, then time interleaved, kernels given by their sources on `problem` in this process;
/// each source runs with the launch dimensions and buffers of its configuration. One outcome per
/// kernel, as the measuring worker gives them; `Err` is a CUDA error (the context may be lost).
pub fn evaluate_sources(
    gpu: &Gpu,
    compiler: &Compiler,
    problem: GemmProblem,
    kernels: &[(GemmConfig, KernelSource)],
    policy: &TimingPolicy,
) -> Result<Vec<Outcome>, GpuError> {
    let host = match HostProblem::random(problem, operand_seed(&problem)) {
        Ok(h) => h,
        Err(e) => {
            let reason = format!("building {problem}: {e}");
            return Ok(vec![Outcome::Illegal { reason }; kernels.len()]);
        }
    };
    let configs: Vec<GemmConfig> = kernels.iter().map(|(c, _)| *c).collect();
    let mut dp = DeviceProblem::upload(gpu, &host, policy, &configs)?;
    let mut out: Vec<Option<Outcome>> = vec![None; kernels.len()];
    let mut verified: Vec<(usize, Candidate)> = Vec::new();
    for (i, (config, source)) in kernels.iter().enumerate() {
        if let Err(e) = config.check_problem(&problem) {
            out[i] = Some(Outcome::Illegal { reason: e.reason });
            continue;
        }
        let compiled = match compiler.compile(source) {
            Ok(k) => k,
            Err(e) => {
                out[i] = Some(Outcome::CompileError { log: e.to_string() });
                continue;
            }
        };
        let candidate = match gpu.load(&compiled, config.smem_bytes()) {
            Ok(kernel) => Candidate { config: *config, kernel },
            Err(e) => {
                out[i] = Some(Outcome::ResourceLimit { reason: e.to_string() });
                continue;
            }
        };
        match verify(gpu, &host, &mut dp, &candidate)? {
            Ok(()) => verified.push((i, candidate)),
            Err(reason) => out[i] = Some(Outcome::WrongAnswer { reason }),
        }
    }
    let refs: Vec<&Candidate> = verified.iter().map(|(_, c)| c).collect();
    for ((i, _), r) in verified.iter().zip(time_candidates(gpu, policy, &dp, &refs)) {
        let s = r?;
        out[*i] = Some(match Summary::of(&s.us) {
            Some(time) => Outcome::Timed { time, samples: s.us },
            None => Outcome::LaunchError { reason: "no samples".into() },
        });
    }
    Ok(out.into_iter().map(|o| o.expect("every kernel has an outcome")).collect())
}

/// Measure `entry` with its kernel slowed by `us` microseconds, interleaved with the family
/// default (the real default kernel), in this process.
pub fn measure_in_process(
    gpu: &Gpu,
    compiler: &Compiler,
    entry: &Entry,
    us: u32,
    policy: &TimingPolicy,
) -> Result<Measurement, String> {
    let problem = entry.key.problem();
    let slowed = delayed_source(&entry.config, us)?;
    let mut kernels = vec![(entry.config, slowed)];
    let default = default_config(entry.key.family, entry.key.a_type);
    if default.check_problem(&problem).is_ok() {
        if let Ok(s) = default.render() {
            kernels.push((default, s));
        }
    }
    let mut outcomes = evaluate_sources(gpu, compiler, problem, &kernels, policy)
        .map_err(|e| format!("CUDA error: {e}"))?
        .into_iter();
    let outcome = outcomes.next().expect("the slowed kernel's outcome");
    Ok(Measurement { outcome, fallback: None, default: outcomes.next() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::{representative_configs, search_space, Pipeline};

    #[test]
    fn selectors_parse_positions_and_keys() {
        let d = |s: &str| InjectDelay::parse(s);
        assert_eq!(d("3=20"), Ok(InjectDelay { selector: EntrySelector::Position(3), us: 20 }));
        assert_eq!(
            d("512x6144:16=250").unwrap().selector,
            EntrySelector::Key { n: 512, k: 6144, m: 16, a_type: None }
        );
        assert_eq!(
            d("512x6144:16:w4a4=1").unwrap().selector,
            EntrySelector::Key { n: 512, k: 6144, m: 16, a_type: Some(AType::Nvfp4) }
        );
        for bad in ["3", "0=20", "3=0", "3=-1", "3=2000000", "512x6144=20", "x:1=2", "1x2:3:fp8=4"]
        {
            assert!(d(bad).is_err(), "{bad}");
        }
        assert!(d("512=1x").unwrap_err().contains("1..=1000000 microseconds"));
        assert!(d("a:b=5").unwrap_err().contains("<entry>=<microseconds>"));
    }

    #[test]
    fn selectors_name_one_fused_entry_or_say_why_not() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results");
        let t = Table::load(&root.join("nvidia-h200.ron")).unwrap();
        let i = InjectDelay::parse("512x6144:16=20").unwrap().select(&t).unwrap();
        assert_eq!((t.entries[i].key.n, t.entries[i].key.k, t.entries[i].key.m), (512, 6144, 16));
        assert_eq!(InjectDelay::parse("2=20").unwrap().select(&t), Ok(1));
        let e = InjectDelay::parse("99=20").unwrap().select(&t).unwrap_err();
        assert!(e.contains("entry 99 of a table of 22 entries"), "{e}");
        let e = InjectDelay::parse("512x6144:3=20").unwrap().select(&t).unwrap_err();
        assert!(e.contains("no entry"), "{e}");
        let e = InjectDelay::parse("512x6144:1024=20").unwrap().select(&t).unwrap_err();
        assert!(e.contains("dequant_cublas_bf16"), "{e}");
        let mut both = t.clone();
        let mut w4a4 = both.entries[0].clone();
        w4a4.key.a_type = AType::Nvfp4;
        both.entries.push(w4a4);
        let e = InjectDelay::parse("512x6144:1=20").unwrap().select(&both).unwrap_err();
        assert!(e.contains("several entries") && e.contains("w4a4"), "{e}");
        assert!(InjectDelay::parse("512x6144:1:w4a16=20").unwrap().select(&both).is_ok());
    }

    /// The slowed source is the entry's unit with the prologue: another symbol (so another
    /// cache key), the same parameter list and launch bounds, the wait before the body; it
    /// compiles for every pipeline and family.
    #[test]
    fn slowed_source_keeps_the_signature_and_adds_the_wait() {
        let space = search_space(Family::Sm90, AType::Bf16);
        let mut configs: Vec<GemmConfig> = Pipeline::ALL
            .iter()
            .filter_map(|p| space.iter().find(|c| c.pipeline == *p))
            .copied()
            .collect();
        configs.extend(space.iter().find(|c| c.split_k > 1 && c.pipeline.is_direct()));
        configs.extend(representative_configs(Family::Sm120, AType::Nvfp4));
        let dir = tempfile::tempdir().unwrap();
        let compiler =
            Compiler::new(Some(dir.path().to_path_buf())).unwrap_or_else(|e| panic!("{e}"));
        for c in configs {
            let real = c.render().unwrap();
            let slow = delayed_source(&c, 20).unwrap();
            assert_ne!(slow.code, real.code);
            assert_ne!(slow.hash(), real.hash());
            assert_eq!(slow.kernel_name, format!("{}_delay20us", c.kernel_name()));
            assert_eq!(slow.options, real.options);
            assert!(slow.code.contains("%%globaltimer") && slow.code.contains("20000ull"));
            // The kernel line: the same qualifiers and launch bounds, the same parameters.
            let line = |code: &str, name: &str| {
                code.lines()
                    .find(|l| l.contains(&format!("{name}(const fp4tune::GemmParams p) {{")))
                    .map(|l| l.replace(name, "NAME"))
                    .unwrap_or_else(|| panic!("{c}: no kernel line for {name}"))
            };
            assert_eq!(line(&slow.code, &slow.kernel_name), line(&real.code, &real.kernel_name));
            assert!(line(&real.code, &real.kernel_name).starts_with("extern \"C\" __global__"));
            // Without the prologue and the call, and with the real name, it is the real source.
            let restored = slow
                .code
                .replace(&prologue(20), "")
                .replace(CALL, "")
                .replace(&slow.kernel_name, &real.kernel_name);
            assert_eq!(restored, real.code, "{c}");
            assert!(
                slow.code.contains(&format!(
                    "{}(const fp4tune::GemmParams p) {{\n{CALL}",
                    slow.kernel_name
                )),
                "{c}: the wait is the body's first statement"
            );
            let k = compiler.compile(&slow).unwrap_or_else(|e| panic!("{c}: {e}"));
            assert_eq!(k.kernel_name, slow.kernel_name);
            assert_ne!(k.key, compiler.key(&real));
        }
        assert!(delayed_source(
            &GemmConfig { stages: 0, ..default_config(Family::Sm90, AType::Bf16) },
            5
        )
        .is_err());
    }

    /// On the GPU: the slowed kernel verifies (the delay changes no result) and is slower than
    /// the real one, interleaved with it, by about the delay.
    #[test]
    #[cfg_attr(
        not(feature = "gpu"),
        ignore = "GPU test: run with --features gpu on a machine with a CUDA GPU"
    )]
    fn slowed_kernel_is_correct_and_slower_by_the_delay_on_the_gpu() {
        let gpu = Gpu::open(0).unwrap_or_else(|e| panic!("the gpu feature is on but: {e}"));
        let (ma, mi) = gpu.info().compute_capability;
        let family = Family::for_arch(
            crate::template::Arch::for_compute_capability(ma, mi).expect("a kernel family"),
        );
        let a_type = if family == Family::Sm120 { AType::Nvfp4 } else { AType::Bf16 };
        let compiler = Compiler::with_default_cache().unwrap_or_else(|e| panic!("{e}"));
        let c = default_config(family, a_type);
        let problem = GemmProblem::new(16, 512, 6144, a_type);
        let kernels = [(c, c.render().unwrap()), (c, delayed_source(&c, 20).unwrap())];
        let out =
            evaluate_sources(&gpu, &compiler, problem, &kernels, &TimingPolicy::quick()).unwrap();
        let median = |o: &Outcome| match o {
            Outcome::Timed { time, samples } => {
                assert_eq!(samples.len(), TimingPolicy::quick().samples);
                time.median
            }
            other => panic!("{c}: {other:?}"),
        };
        let (real, slow) = (median(&out[0]), median(&out[1]));
        assert!(slow >= real + 15.0, "{c}: real {real:.2} us, slowed by 20 us: {slow:.2} us");
    }
}

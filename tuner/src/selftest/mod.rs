//! `fp4tune selftest`: does this GPU run fp4tune's kernels right? For the kernel family of the GPU
//! at hand, first the tensor-core instruction itself (an MMA probe: one warp, inputs built from
//! the CPU model of the instruction's fragments, outputs compared bit for bit: [`sm120_probe`],
//! [`sm90_probe`]), then every kernel of a dispatch table (or, without one, the family's
//! representative kernels) against the CPU reference ([`kernels`]). One [`CheckResult`] per
//! check (PASS, FAIL or SKIP with its reason) and an exit status ([`exit_status`]).
//!
//! Without a GPU both probes are still compiled (for `sm_120a` and `sm_90a`) and their SASS read
//! for the tensor-core instruction they must contain: compile-only PASS lines, then exit 2. The
//! kernels run in this process: a CUDA error ends the GPU checks (the checks after it are SKIP
//! lines naming the check that lost the context).
//!
//! Dependencies: `selftest` sits with `check` (it verifies grouped entries through
//! `check::grouped`) above `bench` and `compile`.

pub mod kernels;
pub mod probe;
pub mod sm120_probe;
pub mod sm90_probe;

#[cfg(test)]
mod gpu_tests;

use crate::compile::Compiler;
use crate::gpu::{DeviceInfo, Gpu};
use crate::table::Table;
use crate::template::Family;
use kernels::KernelCheck;

/// How one check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Pass,
    Fail,
    /// Not run here (the reason is the detail); never a failure.
    Skip,
}

impl Status {
    pub fn label(self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Fail => "FAIL",
            Status::Skip => "SKIP",
        }
    }
}

/// One check: what was checked, how it ended, and the one-line detail (what held, or why not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResult {
    pub status: Status,
    pub what: String,
    pub detail: String,
}

impl CheckResult {
    pub fn pass(what: impl Into<String>, detail: impl Into<String>) -> Self {
        Self { status: Status::Pass, what: what.into(), detail: detail.into() }
    }
    pub fn fail(what: impl Into<String>, detail: impl Into<String>) -> Self {
        Self { status: Status::Fail, what: what.into(), detail: detail.into() }
    }
    pub fn skip(what: impl Into<String>, detail: impl Into<String>) -> Self {
        Self { status: Status::Skip, what: what.into(), detail: detail.into() }
    }

    /// `PASS <what>: <detail>`, one line.
    pub fn line(&self) -> String {
        one_line(&format!("{} {}: {}", self.status.label(), self.what, self.detail))
    }
}

/// A self-test's result.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    /// The GPU checked (none without a GPU).
    pub device: Option<DeviceInfo>,
    pub checks: Vec<CheckResult>,
    /// Why the GPU checks could not run (no GPU, no kernel family for it), one line.
    pub cannot_run: Option<String>,
}

/// The process exit status and its one-line reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    /// 0 every check passed, 1 a check failed, 2 the self-test could not run.
    pub code: u8,
    pub reason: String,
}

/// The exit status of a self-test, by precedence: any FAIL is 1 (naming the failed checks, even
/// when the GPU checks could not run: a probe that does not compile is a finding); otherwise a
/// reason the GPU checks could not run (no GPU, no NVRTC, no kernel family), or no check that
/// passed at all, is 2; otherwise 0.
pub fn exit_status(r: &Report) -> Exit {
    let failed: Vec<&CheckResult> = r.checks.iter().filter(|c| c.status == Status::Fail).collect();
    let passed = r.checks.iter().filter(|c| c.status == Status::Pass).count();
    let skipped = r.checks.iter().filter(|c| c.status == Status::Skip).count();
    if !failed.is_empty() {
        let names: Vec<&str> = failed.iter().map(|c| c.what.as_str()).collect();
        return Exit {
            code: 1,
            reason: one_line(&format!(
                "{} of {} checks failed: {}",
                failed.len(),
                r.checks.len(),
                names.join("; ")
            )),
        };
    }
    if let Some(why) = &r.cannot_run {
        return Exit { code: 2, reason: one_line(&format!("cannot run: {why}")) };
    }
    if passed == 0 {
        return Exit { code: 2, reason: "cannot run: no check ran".into() };
    }
    let skipped = if skipped > 0 { format!(" ({skipped} skipped)") } else { String::new() };
    Exit { code: 0, reason: format!("all {passed} checks passed{skipped}") }
}

/// The exit status when the self-test cannot start at all (no NVRTC, an unreadable table).
pub fn cannot_start(why: &str) -> Exit {
    Exit { code: 2, reason: one_line(&format!("cannot run: {why}")) }
}

/// `text` on one line: line breaks become " / ", at most 400 characters.
pub(crate) fn one_line(text: &str) -> String {
    let joined: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let line = joined.join(" / ");
    match line.char_indices().nth(400) {
        Some((i, _)) => format!("{}...", &line[..i]),
        None => line,
    }
}

/// What to check.
#[derive(Debug, Clone, Copy)]
pub struct Options<'a> {
    /// CUDA device ordinal.
    pub device: usize,
    /// The dispatch table whose kernels to run, with its name for the report; `None`: the
    /// family's representative kernels.
    pub table: Option<(&'a Table, &'a str)>,
}

/// The family's MMA probe.
pub fn probe_of(family: Family) -> probe::Probe {
    match family {
        Family::Sm90 => sm90_probe::probe(),
        Family::Sm120 => sm120_probe::probe(),
    }
}

/// Record `r` in `report` after showing it to `on_check`.
fn record(report: &mut Report, on_check: &mut dyn FnMut(&CheckResult), r: CheckResult) {
    on_check(&r);
    report.checks.push(r);
}

/// A GPU check's result; a CUDA error also marks the context lost at this check.
fn gpu_result(
    what: String,
    r: Result<Result<String, String>, crate::gpu::GpuError>,
    lost: &mut Option<String>,
) -> CheckResult {
    match r {
        Ok(Ok(detail)) => CheckResult::pass(what, detail),
        Ok(Err(why)) => CheckResult::fail(what, why),
        Err(e) => {
            *lost = Some(what.clone());
            CheckResult::fail(what, format!("CUDA error: {}", one_line(&e.to_string())))
        }
    }
}

/// Run the self-test; `on_check` sees each result as it is known (for progress lines).
pub fn run(
    compiler: &Compiler,
    opts: &Options<'_>,
    on_check: &mut dyn FnMut(&CheckResult),
) -> Report {
    let mut report = Report::default();
    let compile_only = |report: &mut Report, on_check: &mut dyn FnMut(&CheckResult)| {
        for family in [Family::Sm120, Family::Sm90] {
            record(report, on_check, probe::compile_only(compiler, &probe_of(family)));
        }
    };
    let gpu = match Gpu::open(opts.device) {
        Ok(g) => g,
        Err(e) => {
            compile_only(&mut report, on_check);
            report.cannot_run = Some(format!("no GPU: {e}"));
            return report;
        }
    };
    let info = gpu.info().clone();
    report.device = Some(info.clone());
    let family = match crate::runtime::family_for(&info) {
        Ok(family) => family,
        Err(e) => {
            compile_only(&mut report, on_check);
            report.cannot_run = Some(e.to_string());
            return report;
        }
    };
    // The context is lost after a CUDA error: the checks after it do not run.
    let mut lost: Option<String> = None;
    let probe = probe_of(family);
    let r = match probe::run_on(&gpu, compiler, &probe) {
        Ok(r) => r,
        Err(e) => gpu_result(format!("{} on the GPU", probe.what), Err(e), &mut lost),
    };
    record(&mut report, on_check, r);
    let plan = kernels::plan(family, info.sm_count, opts.table);
    for s in plan.skipped {
        record(&mut report, on_check, s);
    }
    for check in plan.checks {
        if let Some(at) = &lost {
            let what = match &check {
                KernelCheck::Gemm { what, .. } | KernelCheck::Composite { what, .. } => {
                    what.clone()
                }
                KernelCheck::Grouped { origin, entries } => {
                    format!("{origin}: {} grouped MoE entries", entries.len())
                }
            };
            let why = format!("not run: the CUDA context was lost at `{at}`");
            record(&mut report, on_check, CheckResult::skip(what, why));
            continue;
        }
        match check {
            KernelCheck::Gemm { what, config, problem } => {
                let r = kernels::run_gemm(&gpu, compiler, Some(config), problem);
                record(&mut report, on_check, gpu_result(what, r, &mut lost));
            }
            KernelCheck::Composite { what, problem } => {
                let r = kernels::run_gemm(&gpu, compiler, None, problem);
                record(&mut report, on_check, gpu_result(what, r, &mut lost));
            }
            KernelCheck::Grouped { origin, entries } => {
                crate::check::grouped::measure(&gpu, compiler, &entries, None, &mut |i, o| {
                    let e = &entries[i];
                    let what = format!("{origin} {}: grouped kernel {}", e.key, e.config.name());
                    record(&mut report, on_check, grouped_result(what, e, o));
                });
            }
        }
    }
    report
}

fn grouped_result(
    what: String,
    e: &crate::table::MoeEntry,
    o: &crate::tune::log::Outcome,
) -> CheckResult {
    use crate::tune::log::Outcome;
    match o {
        Outcome::Timed { .. } | Outcome::Screened { .. } => CheckResult::pass(
            what,
            format!(
                "sampled routed rows within the CPU reference bound (routing seed {}, B {})",
                e.routing_seed, e.key.tokens
            ),
        ),
        Outcome::Illegal { reason } => CheckResult::skip(what, reason.clone()),
        Outcome::WrongAnswer { reason } | Outcome::LaunchError { reason } => {
            CheckResult::fail(what, reason.clone())
        }
        Outcome::ResourceLimit { reason } => CheckResult::fail(what, reason.clone()),
        Outcome::CompileError { log } => {
            CheckResult::fail(what, format!("compile error: {}", one_line(log)))
        }
        Outcome::Timeout { seconds } => {
            CheckResult::fail(what, format!("no answer within {seconds:.0} s"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(statuses: &[Status], cannot_run: Option<&str>) -> Report {
        Report {
            device: None,
            checks: statuses
                .iter()
                .enumerate()
                .map(|(i, s)| CheckResult {
                    status: *s,
                    what: format!("check {i}"),
                    detail: "d".into(),
                })
                .collect(),
            cannot_run: cannot_run.map(str::to_string),
        }
    }

    #[test]
    fn exit_0_when_every_check_passes_skips_included() {
        let e = exit_status(&report(&[Status::Pass, Status::Pass], None));
        assert_eq!(e, Exit { code: 0, reason: "all 2 checks passed".into() });
        let e = exit_status(&report(&[Status::Pass, Status::Skip], None));
        assert_eq!(e.code, 0);
        assert!(e.reason.contains("1 skipped"), "{e:?}");
    }

    #[test]
    fn exit_1_names_the_failed_checks_even_without_a_gpu() {
        let e = exit_status(&report(&[Status::Pass, Status::Fail, Status::Fail], None));
        assert_eq!(e.code, 1);
        assert_eq!(e.reason, "2 of 3 checks failed: check 1; check 2");
        // A compile-only probe that fails is a finding, not "cannot run".
        let e = exit_status(&report(&[Status::Fail], Some("no GPU: no CUDA driver")));
        assert_eq!(e.code, 1, "{e:?}");
    }

    #[test]
    fn exit_2_when_the_gpu_checks_cannot_run_or_nothing_ran() {
        let e = exit_status(&report(&[Status::Pass, Status::Pass], Some("no GPU: no CUDA driver")));
        assert_eq!(e, Exit { code: 2, reason: "cannot run: no GPU: no CUDA driver".into() });
        assert_eq!(exit_status(&report(&[], None)).code, 2);
        assert_eq!(exit_status(&report(&[Status::Skip], None)).code, 2);
        let e = cannot_start("no NVRTC: libnvrtc.so.13 not found\n(searched x)");
        assert_eq!(e.code, 2);
        assert_eq!(e.reason, "cannot run: no NVRTC: libnvrtc.so.13 not found / (searched x)");
    }

    #[test]
    fn lines_are_one_line_and_bounded() {
        let c = CheckResult::fail("k", "a\nb\n\n c ");
        assert_eq!(c.line(), "FAIL k: a / b / c");
        assert!(one_line(&"x".repeat(1000)).len() <= 403);
    }

    /// On this machine (no GPU driver in CI): both probes compile and show their tensor-core
    /// instruction, and the self-test says it cannot run the GPU checks (exit 2). With a driver
    /// and a GPU, `gpu_tests` covers the run.
    #[test]
    fn without_a_gpu_the_probes_compile_and_the_exit_is_2() {
        if crate::gpu::loader::driver_present() {
            eprintln!("a CUDA driver is present: the GPU run is tested by selftest::gpu_tests");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let compiler =
            Compiler::new(Some(dir.path().to_path_buf())).unwrap_or_else(|e| panic!("{e}"));
        let mut seen = Vec::new();
        let r = run(&compiler, &Options { device: 0, table: None }, &mut |c| seen.push(c.line()));
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(
            seen[0].starts_with("PASS sm120 MMA probe") && seen[0].contains("OMMA.SF"),
            "{seen:?}"
        );
        assert!(seen[0].contains("compile only"), "{seen:?}");
        assert!(seen[1].starts_with("PASS sm90 MMA probe") && seen[1].contains("HMMA"), "{seen:?}");
        let e = exit_status(&r);
        assert_eq!(e.code, 2, "{e:?}");
        assert!(e.reason.starts_with("cannot run: no GPU: no CUDA driver"), "{e:?}");
    }
}

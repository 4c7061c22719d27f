//! `fp4tune check`: the CI gate on kernel timings. Re-verifies and re-times every entry of a
//! table on this GPU (GEMM entries through the measuring worker, then the grouped MoE entries),
//! compares with a baseline by the noise-aware rule (`fp4tune::check`), writes `check.md` and
//! `check.json` (together, or neither; a run that cannot check at all keeps an earlier report
//! of the folder), and exits 0 (no regression), 1 (regression or failed kernel) or 2 (cannot check),
//! with a one-line reason on stderr. It exits itself, whatever happens: any error (an
//! unreadable table included) is exit 2.
//!
//! `--inject-delay <entry>=<us>` (hidden; the evidence that a slower kernel is caught and named)
//! measures that entry's kernel slowed by a delay prologue (`check::delay`) instead of the table's
//! kernel, and says so in the report's notes.

use anyhow::{bail, Context, Result};
use fp4tune::bench::TimingPolicy;
use fp4tune::check::delay::InjectDelay;
use fp4tune::check::{self, baseline, Blocker, CheckReport, EntryStatus, RuleConfig};
use fp4tune::compile::Compiler;
use fp4tune::gpu::Gpu;
use fp4tune::table::Table;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// The dispatch table to check (results/<sku>.ron).
    #[arg(long)]
    pub table: PathBuf,
    /// What to compare with: a saved check result (check.json), a measurement log (.jsonl or
    /// .jsonl.gz) or another table (.ron). Default: the table's own medians and intervals.
    #[arg(long)]
    pub baseline: Option<PathBuf>,
    /// Slowdown tolerated: "5%" or "0.05".
    #[arg(long, default_value = "5%", value_parser = parse_threshold)]
    pub threshold: f64,
    /// Confidence of the interval on the ratio new/old.
    #[arg(long, default_value_t = 0.95)]
    pub confidence: f64,
    /// Bootstrap resamples of the rule (100 to 1,000,000).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(100..=1_000_000))]
    pub resamples: u64,
    /// Folder for check.md and check.json.
    #[arg(long, default_value = "fp4tune-check")]
    pub out: PathBuf,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Fewer samples per kernel (the tuner's quick policy instead of the benchmark's).
    #[arg(long)]
    pub quick: bool,
    /// Longest wait for one answer of the measuring worker (seconds) before its kernel counts as
    /// hung.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: u64,
    /// Test of the check itself: measure entry <entry> (its position, e.g. 3, or its key
    /// <N>x<K>:<M>[:w4a4|:w4a16]) with its kernel slowed by <us> microseconds per thread.
    #[arg(long, hide = true, value_name = "ENTRY=US", value_parser = InjectDelay::parse)]
    pub inject_delay: Option<InjectDelay>,
}

/// "5%" -> 0.05, "0.05" -> 0.05.
pub fn parse_threshold(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let v = match t.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|v| v / 100.0),
        None => t.parse::<f64>(),
    }
    .map_err(|_| format!("`{s}` is not a threshold (e.g. 5% or 0.05)"))?;
    if !(0.0..1.0).contains(&v) {
        return Err(format!("threshold `{s}` is not in [0%, 100%) (write 5% or 0.05)"));
    }
    Ok(v)
}

pub fn run(args: CheckArgs) -> Result<()> {
    let code = match check(&args) {
        Ok((report, paths)) => {
            let exit = check::exit_status(&report);
            // The exit status is the result: a closed standard output or error (`| head`) must not
            // turn it into a panic, so write errors are ignored here.
            crate::note_lost_stdout(writeln!(std::io::stdout().lock(), "{}", report.to_markdown()));
            crate::note_lost_stdout(match paths {
                Written::Files(paths) => {
                    writeln!(std::io::stdout().lock(), "wrote {}", paths.join(" and "))
                }
                Written::Kept(dir) => writeln!(
                    std::io::stdout().lock(),
                    "kept the earlier report in {dir}: this run could not check"
                ),
            });
            let _ = writeln!(
                std::io::stderr().lock(),
                "fp4tune check: exit {}: {}",
                exit.code,
                exit.reason
            );
            exit.code
        }
        Err(e) => {
            let _ = writeln!(
                std::io::stderr().lock(),
                "fp4tune check: exit 2: cannot check: {}",
                one_line(&e)
            );
            2
        }
    };
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    std::process::exit(code.into())
}

/// An error and its causes on one line, each cause once (a message that already quotes its
/// source is not followed by it again).
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string().replace('\n', " ");
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
    }
    line
}

/// The checking process's own GPU and compiler (the slowed kernel and the grouped entries run
/// here), opened on first use.
#[derive(Default)]
struct Local {
    opened: Option<std::result::Result<(Gpu, Compiler), String>>,
}

impl Local {
    fn get(&mut self, device: usize) -> std::result::Result<(&Gpu, &Compiler), String> {
        let opened = self.opened.get_or_insert_with(|| {
            let gpu = Gpu::open(device).map_err(|e| e.to_string())?;
            let compiler = crate::default_compiler().map_err(|e| format!("{e:#}"))?;
            Ok((gpu, compiler))
        });
        match opened {
            Ok((g, c)) => Ok((g, c)),
            Err(e) => Err(e.clone()),
        }
    }
}

/// A check line for the progress output.
fn progress(status: &EntryStatus, comparison: Option<&check::Comparison>) -> String {
    match (status, comparison) {
        (EntryStatus::Compared(v), Some(c)) => {
            format!("{} (x{:.3} [{:.3}, {:.3}])", v.label(), c.ratio, c.lo, c.hi)
        }
        (EntryStatus::Failed(w), _) => format!("FAILED: {}", w.lines().next().unwrap_or("")),
        (EntryStatus::Missing(w), _) => {
            format!("not checked: {}", w.lines().next().unwrap_or(""))
        }
        (s, _) => format!("{s:?}"),
    }
}

fn check(a: &CheckArgs) -> Result<(CheckReport, Written)> {
    let origin = a.table.display().to_string();
    let table = Table::load(&a.table)?;
    let delayed = match &a.inject_delay {
        Some(d) => Some((d.select(&table).map_err(anyhow::Error::msg)?, d.us)),
        None => None,
    };
    let rule = RuleConfig {
        threshold: a.threshold,
        confidence: a.confidence,
        resamples: a.resamples as usize,
        ..RuleConfig::default()
    };
    // Refuse a bad rule before any GPU work.
    check::compare(&check::Baseline::Samples(vec![1.0]), &[1.0], &rule)?;
    // This run's report must not replace the earlier check it is compared with.
    if let Some(b) = &a.baseline {
        for name in ["check.json", "check.md"] {
            let report = a.out.join(name);
            if let (Ok(x), Ok(y)) = (b.canonicalize(), report.canonicalize()) {
                if x == y {
                    bail!(
                        "--out {} would replace the baseline {} with this run's report: write \
                         the new check to another folder",
                        a.out.display(),
                        b.display()
                    );
                }
            }
        }
    }
    let policy = if a.quick { TimingPolicy::quick() } else { TimingPolicy::default() };
    let mut blockers = Vec::new();
    let baselines = match &a.baseline {
        None => baseline::from_table(&table, &origin),
        Some(p) => baseline::load(p, &table).unwrap_or_else(|why| {
            blockers.push(Blocker::Baseline(why));
            baseline::Baselines {
                description: format!("`{}` (unusable)", p.display()),
                by_key: Default::default(),
                by_moe_key: Default::default(),
                device: None,
                notes: Vec::new(),
            }
        }),
    };
    let exe = std::env::current_exe().context("locating the fp4tune binary for its worker")?;
    let session = check::run::Session::open(&exe, a.device, Duration::from_secs(a.timeout));
    let device_info = session.as_ref().ok().map(|s| s.info().clone());
    let device = session.as_ref().map(|s| s.info()).map_err(|e| e.as_str());
    blockers.extend(check::preflight(&table, device, baselines.device.as_deref()));
    let mut entries = Vec::new();
    let mut grouped = Vec::new();
    let mut notes = Vec::new();
    if let (Ok(mut session), true) = (session, blockers.is_empty()) {
        let (moe, _) = check::grouped_split(&table);
        let total = table.entries.len() + moe.len();
        let mut local = Local::default();
        for (i, e) in table.entries.iter().enumerate() {
            let measured = match delayed {
                Some((j, us)) if j == i => {
                    notes.push(format!(
                        "{}: measured with its kernel slowed by {us} us per thread (--inject-delay, \
                         kernel {}): a test of the check, not the table's kernel",
                        e.key,
                        check::delay::delayed_kernel_name(&e.config, us)
                    ));
                    local.get(a.device).and_then(|(gpu, compiler)| {
                        check::delay::measure_in_process(gpu, compiler, e, us, &policy)
                    })
                }
                _ => session.measure(e, &policy),
            };
            let checked = match measured {
                Ok(m) => check::assess(e, baselines.get(&e.key), &m, &rule),
                Err(why) => {
                    let mut c = check::assess(
                        e,
                        None,
                        &check::Measurement {
                            outcome: fp4tune::tune::log::Outcome::LaunchError {
                                reason: why.clone(),
                            },
                            fallback: None,
                            default: None,
                        },
                        &rule,
                    );
                    c.status = EntryStatus::Missing(format!("not measured: {why}"));
                    c
                }
            };
            let what = progress(&checked.status, checked.comparison.as_ref());
            let _ = writeln!(std::io::stderr().lock(), "[{}/{total}] {}: {what}", i + 1, e.key);
            entries.push(checked);
        }
        // The grouped entries run in this process: the worker gives the GPU back first.
        drop(session);
        if !moe.is_empty() {
            match local.get(a.device) {
                Ok((gpu, compiler)) => {
                    let done = entries.len();
                    check::grouped::measure(gpu, compiler, &moe, Some(&policy), &mut |i, o| {
                        let e = &moe[i];
                        let g = check::assess_grouped(e, baselines.get_moe(&e.key), o, &rule);
                        let what = progress(&g.status, g.comparison.as_ref());
                        let _ = writeln!(
                            std::io::stderr().lock(),
                            "[{}/{total}] {}: {what}",
                            done + i + 1,
                            e.key
                        );
                        grouped.push(g);
                    });
                }
                Err(why) => {
                    for e in &moe {
                        let mut g = check::assess_grouped(
                            e,
                            None,
                            &fp4tune::tune::log::Outcome::LaunchError { reason: why.clone() },
                            &rule,
                        );
                        g.status = EntryStatus::Missing(format!("opening the GPU: {why}"));
                        grouped.push(g);
                    }
                }
            }
        }
    }
    let setup = check::Setup {
        table: &table,
        origin: &origin,
        baselines: &baselines,
        rule,
        timing_policy: policy.describe(),
    };
    grouped.sort_by_key(|g| g.key);
    let mut report = check::report(&setup, device_info, blockers, entries, grouped);
    report.notes.extend(notes);
    let md = a.out.join("check.md");
    let json = a.out.join("check.json");
    // A run that could not check at all (a blocker: no GPU, another GPU or kernel family, stale
    // template hashes, an unusable baseline)
    // does not replace the report of one that could: the earlier result stays where it is. A
    // run that measured entries writes its report, whatever its exit status.
    if !report.blockers.is_empty() && (md.exists() || json.exists()) {
        return Ok((report, Written::Kept(a.out.display().to_string())));
    }
    fp4tune::fsio::create_dir(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let text = report.to_json_string()?;
    fp4tune::fsio::write_atomic_all(&[
        (&md, report.to_markdown().as_bytes()),
        (&json, text.as_bytes()),
    ])
    .with_context(|| format!("writing the check's report into {}", a.out.display()))?;
    Ok((report, Written::Files(vec![md.display().to_string(), json.display().to_string()])))
}

/// What a check left in its `--out` folder.
enum Written {
    Files(Vec<String>),
    /// The folder's earlier report, kept because this run could not check.
    Kept(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_parse_as_percent_or_fraction() {
        assert_eq!(parse_threshold("5%"), Ok(0.05));
        assert_eq!(parse_threshold(" 2.5 % "), Ok(0.025));
        assert_eq!(parse_threshold("0.05"), Ok(0.05));
        assert!(parse_threshold("5").is_err());
        assert!(parse_threshold("-1%").is_err());
        assert!(parse_threshold("five").is_err());
    }
}

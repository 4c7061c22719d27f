//! Parsing ptxas `-v` statistics (registers, spills, shared memory) out of an NVRTC log.

use serde::{Deserialize, Serialize};

/// Resource usage of one compiled kernel as reported by ptxas.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtxasStats {
    pub registers: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    pub stack_frame: u32,
    /// Static shared memory (dynamic shared memory is not known to ptxas).
    pub static_smem: u32,
    pub barriers: u32,
}

impl PtxasStats {
    pub fn spills(&self) -> bool {
        self.spill_stores > 0 || self.spill_loads > 0
    }
}

/// Statistics of `kernel` in `log`; `None` when the log holds no ptxas report for it.
pub fn parse(log: &str, kernel: &str) -> Option<PtxasStats> {
    let mut stats = PtxasStats::default();
    let mut in_kernel = false;
    let mut found = false;
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            in_kernel = rest.split('\'').next() == Some(kernel);
            continue;
        }
        if let Some(rest) = line.split("Function properties for ").nth(1) {
            in_kernel = rest.trim() == kernel;
            continue;
        }
        if !in_kernel {
            continue;
        }
        if line.contains("bytes stack frame") {
            stats.stack_frame = number_before(line, "bytes stack frame").unwrap_or(0);
            stats.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
            stats.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
            found = true;
        }
        if line.contains("Used") && line.contains("registers") {
            stats.registers = number_before(line, "registers").unwrap_or(0);
            stats.barriers = number_before(line, "barriers").unwrap_or(0);
            stats.static_smem = number_before(line, "bytes smem").unwrap_or(0);
            found = true;
        }
    }
    found.then_some(stats)
}

/// The integer immediately before `marker` in `line` (e.g. "Used 40 registers" -> 40).
fn number_before(line: &str, marker: &str) -> Option<u32> {
    let idx = line.find(marker)?;
    line[..idx].split(|c: char| !c.is_ascii_digit()).rfind(|s| !s.is_empty())?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'other' for 'sm_90a'
ptxas info    : Function properties for other
ptxas         .     8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 512 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'k' for 'sm_90a'
ptxas info    : Function properties for k
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 16384 bytes smem, 368 bytes cmem[0]
ptxas info    : Compile time = 3.3 ms
";

    #[test]
    fn parses_the_named_kernel_only() {
        let s = parse(LOG, "k").unwrap();
        assert_eq!(
            s,
            PtxasStats {
                registers: 40,
                spill_stores: 0,
                spill_loads: 0,
                stack_frame: 0,
                static_smem: 16384,
                barriers: 1
            }
        );
        assert!(!s.spills());
        let o = parse(LOG, "other").unwrap();
        assert_eq!((o.registers, o.spill_stores, o.spill_loads, o.stack_frame), (255, 4, 4, 8));
        assert!(o.spills());
        assert!(parse(LOG, "missing").is_none());
    }

    #[test]
    fn line_without_smem_or_barriers() {
        let log = "ptxas info    : Compiling entry function 'k' for 'sm_120a'\n\
                   ptxas info    : Used 8 registers, used 0 barriers\n";
        let s = parse(log, "k").unwrap();
        assert_eq!((s.registers, s.static_smem, s.barriers), (8, 0, 0));
    }
}

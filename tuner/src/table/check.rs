//! Checking a table against the device it is about to serve and the kernel sources compiled in.

use super::schema::{Table, TableError};
use crate::gpu::DeviceInfo;
use crate::template::{family_template_hash, Family};
use std::collections::BTreeSet;
use std::fmt;

/// What to do when a table does not match the device or the template sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MismatchPolicy {
    /// Report every mismatch as a warning. Entries of families whose template sources changed,
    /// or of a table for another compute capability, are not used: lookups fall back to the
    /// family default. A different device name or SM count only warns (entries are used).
    #[default]
    Warn,
    /// Any mismatch (name and SM count included) is an error.
    Error,
    /// Report mismatches as warnings but use every entry anyway (kernel development, where the
    /// template hash changes with every edit).
    Ignore,
}

impl MismatchPolicy {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "warn" => Some(Self::Warn),
            "error" => Some(Self::Error),
            "ignore" => Some(Self::Ignore),
            _ => None,
        }
    }
}

/// One difference between a table and the running system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mismatch {
    /// The table is for another compute capability: its kernels cannot run here.
    ComputeCapability {
        table: (u32, u32),
        device: (u32, u32),
    },
    /// The family's template sources differ from those the table was measured with.
    TemplateHash {
        family: Family,
        table: String,
        current: String,
    },
    /// Another GPU model of the same compute capability (e.g. H100 vs H200).
    DeviceName {
        table: String,
        device: String,
    },
    SmCount {
        table: u32,
        device: u32,
    },
}

impl Mismatch {
    /// Whether the mismatch makes entries unusable under [`MismatchPolicy::Warn`].
    pub fn disables_entries(&self) -> bool {
        matches!(self, Mismatch::ComputeCapability { .. } | Mismatch::TemplateHash { .. })
    }
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::ComputeCapability { table, device } => write!(
                f,
                "table is for compute capability {}.{}, this device is {}.{}",
                table.0, table.1, device.0, device.1
            ),
            Mismatch::TemplateHash { family, table, current } => write!(
                f,
                "{family} template sources changed since the table was made (table {}, current {}): re-tune",
                short(table),
                short(current)
            ),
            Mismatch::DeviceName { table, device } => {
                write!(f, "table was measured on {table:?}, this device is {device:?}")
            }
            Mismatch::SmCount { table, device } => {
                write!(f, "table was measured with {table} SMs, this device has {device}")
            }
        }
    }
}

fn short(h: &str) -> &str {
    &h[..h.len().min(12)]
}

/// The outcome of [`Table::check_against`] when it is not an error.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TableCheck {
    pub policy: MismatchPolicy,
    /// Every difference found (warnings to show).
    pub mismatches: Vec<Mismatch>,
    /// Families whose entries lookups must not use.
    pub disabled: BTreeSet<Family>,
}

impl TableCheck {
    /// A check that found nothing (all entries usable).
    pub fn clean() -> Self {
        Self::default()
    }

    /// One line per mismatch, with what it means for lookups.
    pub fn warnings(&self) -> Vec<String> {
        self.mismatches
            .iter()
            .map(|m| {
                let effect = match (self.policy, m.disables_entries()) {
                    (MismatchPolicy::Warn, true) => {
                        "; its entries are not used (family defaults instead)"
                    }
                    (MismatchPolicy::Ignore, true) => "; entries used anyway (policy ignore)",
                    _ => "",
                };
                format!("{m}{effect}")
            })
            .collect()
    }
}

impl Table {
    /// Compare the table with `device` and the template sources compiled into this binary.
    /// Under [`MismatchPolicy::Error`] any mismatch is a [`TableError::Mismatch`]; otherwise the
    /// mismatches come back as warnings, with the families lookups must skip.
    pub fn check_against(
        &self,
        device: &DeviceInfo,
        policy: MismatchPolicy,
        origin: &str,
    ) -> Result<TableCheck, TableError> {
        let mut mismatches = Vec::new();
        let mut disabled = BTreeSet::new();
        if self.device.compute_capability != device.compute_capability {
            mismatches.push(Mismatch::ComputeCapability {
                table: self.device.compute_capability,
                device: device.compute_capability,
            });
            disabled.extend(self.template_hashes.keys().copied());
            disabled.extend(self.entries.iter().map(|e| e.key.family));
        }
        for (&family, hash) in &self.template_hashes {
            let current = family_template_hash(family);
            if *hash != current {
                mismatches.push(Mismatch::TemplateHash { family, table: hash.clone(), current });
                disabled.insert(family);
            }
        }
        if self.device.name != device.name {
            mismatches.push(Mismatch::DeviceName {
                table: self.device.name.clone(),
                device: device.name.clone(),
            });
        }
        if self.device.sm_count != device.sm_count {
            mismatches
                .push(Mismatch::SmCount { table: self.device.sm_count, device: device.sm_count });
        }
        match policy {
            MismatchPolicy::Error if !mismatches.is_empty() => {
                Err(TableError::Mismatch { origin: origin.to_string(), mismatches })
            }
            MismatchPolicy::Ignore => {
                Ok(TableCheck { policy, mismatches, disabled: BTreeSet::new() })
            }
            _ => Ok(TableCheck { policy, mismatches, disabled }),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::table::schema::tests::sample;

    pub(crate) fn device(name: &str, cc: (u32, u32), sms: u32) -> DeviceInfo {
        DeviceInfo {
            name: name.into(),
            compute_capability: cc,
            sm_count: sms,
            l2_bytes: 60 << 20,
            total_mem: 141 << 30,
            max_smem_per_block_optin: 227 << 10,
            driver_version: (13, 0),
            sm_clock_mhz: 1980,
            mem_clock_mhz: 3201,
            mem_bus_bits: 6144,
        }
    }

    #[test]
    fn matching_device_is_clean_under_every_policy() {
        let t = sample();
        for p in [MismatchPolicy::Warn, MismatchPolicy::Error, MismatchPolicy::Ignore] {
            let c = t.check_against(&device("NVIDIA H200", (9, 0), 132), p, "t").unwrap();
            assert!(c.mismatches.is_empty() && c.disabled.is_empty(), "{c:?}");
        }
    }

    #[test]
    fn table_for_another_gpu_warns_disables_or_errors_by_policy() {
        let t = sample();
        let blackwell = device("NVIDIA RTX PRO 6000 Blackwell", (12, 0), 188);
        let warn = t.check_against(&blackwell, MismatchPolicy::Warn, "t").unwrap();
        assert_eq!(warn.mismatches.len(), 3, "{warn:?}");
        assert!(warn.disabled.contains(&Family::Sm90));
        let w = warn.warnings().join("\n");
        assert!(w.contains("compute capability 9.0, this device is 12.0"), "{w}");
        assert!(w.contains("not used"), "{w}");
        let e = t.check_against(&blackwell, MismatchPolicy::Error, "results/h200.ron").unwrap_err();
        let e = e.to_string();
        assert!(e.starts_with("results/h200.ron: the table does not match"), "{e}");
        assert!(e.contains("188 SMs") || e.contains("188"), "{e}");
        let ignore = t.check_against(&blackwell, MismatchPolicy::Ignore, "t").unwrap();
        assert!(ignore.disabled.is_empty() && ignore.mismatches.len() == 3);
    }

    #[test]
    fn sibling_gpu_only_warns_and_stale_templates_disable_their_family() {
        let t = sample();
        let h100 = device("NVIDIA H100 80GB HBM3", (9, 0), 132);
        let c = t.check_against(&h100, MismatchPolicy::Warn, "t").unwrap();
        assert_eq!(c.mismatches.len(), 1);
        assert!(c.disabled.is_empty(), "a same-CC sibling keeps the entries");
        assert!(t.check_against(&h100, MismatchPolicy::Error, "t").is_err());

        let mut stale = t.clone();
        stale.template_hashes.insert(Family::Sm90, "0123456789abcdef".into());
        let c = stale
            .check_against(&device("NVIDIA H200", (9, 0), 132), MismatchPolicy::Warn, "t")
            .unwrap();
        assert_eq!(c.disabled.iter().copied().collect::<Vec<_>>(), vec![Family::Sm90]);
        assert!(c.warnings()[0].contains("template sources changed"), "{:?}", c.warnings());
    }
}

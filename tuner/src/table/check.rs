//! Checking a table against the device it is about to serve and the kernel sources compiled in.

use super::schema::{Table, TableError};
use crate::gpu::DeviceInfo;
use crate::template::{family_template_hash, Family};
use std::collections::BTreeSet;
use std::fmt;
use std::path::Path;

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
    /// The family's template sources differ from those the table was measured with (an empty
    /// `table` hash: the table does not say which sources it was measured with).
    TemplateHash {
        family: Family,
        table: String,
        current: String,
    },
    /// The grouped MoE kernels' template sources differ from the table's `moe_template_hash`
    /// (or the table has grouped entries and no hash).
    MoeTemplateHash {
        table: Option<String>,
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
            Mismatch::TemplateHash { family, table, current } if table.trim().is_empty() => write!(
                f,
                "the table records an empty {family} template hash, so its kernels cannot be \
                 matched with these sources (current {}): re-tune",
                short(current)
            ),
            Mismatch::TemplateHash { family, table, current } => write!(
                f,
                "{family} template sources changed since the table was made (table {}, current {}): re-tune",
                short(table),
                short(current)
            ),
            Mismatch::MoeTemplateHash { table, current } => write!(
                f,
                "grouped MoE template sources changed since the table was made (table {}, current \
                 {}): re-tune the grouped entries",
                table.as_deref().map_or("none", short),
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
    crate::template::short_hash(h, 12)
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
    /// The grouped template hash this build gives the table's `moe` entries: that of their
    /// family (a table is measured on one device, so its entries share one; for a table without
    /// entries, the family of the device it was measured on). A tune records it as
    /// `moe_template_hash`, and the runtime and the check compare the recorded one with it.
    pub fn current_moe_template_hash(&self) -> String {
        let (major, minor) = self.device.compute_capability;
        let family = self.moe.first().map(|e| e.key.family).unwrap_or_else(|| {
            crate::template::Arch::for_compute_capability(major, minor)
                .map_or(Family::Sm90, Family::for_arch)
        });
        crate::moe::templates::family_template_hash(family)
    }

    /// Grouped entries recorded with other grouped templates than this build's
    /// (`moe_template_hash` against [`Table::current_moe_template_hash`]).
    pub fn moe_templates_stale(&self) -> bool {
        !self.moe.is_empty()
            && self.moe_template_hash.as_deref() != Some(self.current_moe_template_hash().as_str())
    }

    /// The template hashes of the table that differ from the sources compiled into this binary
    /// (no GPU needed): stale, foreign and empty hashes alike.
    pub fn template_mismatches(&self) -> Vec<Mismatch> {
        let mut out: Vec<Mismatch> = self
            .template_hashes
            .iter()
            .filter_map(|(&family, hash)| {
                let current = family_template_hash(family);
                (*hash != current).then(|| Mismatch::TemplateHash {
                    family,
                    table: hash.clone(),
                    current,
                })
            })
            .collect();
        if !self.moe.is_empty() || self.moe_template_hash.is_some() {
            let current = self.current_moe_template_hash();
            if self.moe_template_hash.as_deref() != Some(current.as_str()) {
                out.push(Mismatch::MoeTemplateHash {
                    table: self.moe_template_hash.clone(),
                    current,
                });
            }
        }
        out
    }

    /// Compare the table's template hashes with this build's sources, without a device: under
    /// [`MismatchPolicy::Error`] a stale, foreign or empty hash is a [`TableError::Mismatch`];
    /// otherwise each is a warning and its family is disabled for lookups (as
    /// [`Table::check_against`] would do).
    pub fn check_templates(
        &self,
        policy: MismatchPolicy,
        origin: &str,
    ) -> Result<TableCheck, TableError> {
        let mismatches = self.template_mismatches();
        let disabled = mismatches
            .iter()
            .filter_map(|m| match m {
                Mismatch::TemplateHash { family, .. } => Some(*family),
                _ => None,
            })
            .collect();
        finish(policy, origin, mismatches, disabled)
    }

    /// Read the table file at `path` for `fp4tune table --check`: a UTF-8 byte-order mark is
    /// skipped, a family named twice in `template_hashes` is refused (RON would keep the last
    /// one silently), the table is parsed and validated ([`Table::from_ron_str`]), and its
    /// template hashes are compared with this build's ([`Table::check_templates`] under
    /// `policy`). No GPU is needed.
    pub fn check_file(
        path: &Path,
        policy: MismatchPolicy,
    ) -> Result<(Table, TableCheck), TableError> {
        let origin = path.display().to_string();
        let text = crate::fsio::read_input(path)
            .map_err(|error| TableError::Read { path: path.to_path_buf(), error })?;
        let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
        let table = Table::from_ron_str(text, &origin)?;
        if let Some(family) = duplicate_template_family(text) {
            return Err(TableError::Invalid {
                origin,
                at: "template_hashes".into(),
                reason: format!(
                    "family {family:?} is listed twice (which hash the entries were measured with \
                     is unknown): keep one"
                ),
            });
        }
        let check = table.check_templates(policy, &origin)?;
        Ok((table, check))
    }

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
        for m in self.template_mismatches() {
            if let Mismatch::TemplateHash { family, .. } = &m {
                disabled.insert(*family);
            }
            mismatches.push(m);
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
        finish(policy, origin, mismatches, disabled)
    }
}

/// The mismatches found, as an error or as warnings by `policy`.
fn finish(
    policy: MismatchPolicy,
    origin: &str,
    mismatches: Vec<Mismatch>,
    disabled: BTreeSet<Family>,
) -> Result<TableCheck, TableError> {
    match policy {
        MismatchPolicy::Error if !mismatches.is_empty() => {
            Err(TableError::Mismatch { origin: origin.to_string(), mismatches })
        }
        MismatchPolicy::Ignore => Ok(TableCheck { policy, mismatches, disabled: BTreeSet::new() }),
        _ => Ok(TableCheck { policy, mismatches, disabled }),
    }
}

/// The first family named twice in the `template_hashes` map of a table's text, if any (the
/// text is assumed to parse as a table; anything else gives `None`).
fn duplicate_template_family(text: &str) -> Option<Family> {
    use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
    struct Keys(Option<Family>);
    impl<'de> serde::Deserialize<'de> for Keys {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Keys;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("a map of families to hashes")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Keys, A::Error> {
                    let mut seen = BTreeSet::new();
                    let mut dup = None;
                    while let Some((family, _)) = map.next_entry::<Family, IgnoredAny>()? {
                        if !seen.insert(family) && dup.is_none() {
                            dup = Some(family);
                        }
                    }
                    Ok(Keys(dup))
                }
            }
            d.deserialize_map(V)
        }
    }
    #[derive(serde::Deserialize)]
    struct Probe {
        template_hashes: Keys,
    }
    ron::Options::default().from_str::<Probe>(text).ok()?.template_hashes.0
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

    /// The grouped entries are compared with the hash of their own family's templates: an SM120
    /// table records the sm120 grouped hash and is current with it, and stale with the sm90 one.
    #[test]
    fn grouped_entries_are_checked_against_their_familys_templates() {
        use crate::moe::templates::family_template_hash;
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results");
        let mut t = Table::load(&root.join("nvidia-h200.ron")).unwrap();
        assert!(!t.moe.is_empty());
        t.moe_template_hash = Some(family_template_hash(Family::Sm90));
        assert_eq!(t.current_moe_template_hash(), family_template_hash(Family::Sm90));
        let moe_stale = |t: &Table| {
            t.template_mismatches().iter().any(|m| matches!(m, Mismatch::MoeTemplateHash { .. }))
        };
        assert!(!moe_stale(&t));
        let mut sm120 = t.clone();
        for e in &mut sm120.moe {
            e.key.family = Family::Sm120;
        }
        assert_ne!(family_template_hash(Family::Sm120), family_template_hash(Family::Sm90));
        assert_eq!(sm120.current_moe_template_hash(), family_template_hash(Family::Sm120));
        assert!(moe_stale(&sm120), "an sm120 table with the sm90 grouped hash is stale");
        sm120.moe_template_hash = Some(family_template_hash(Family::Sm120));
        assert!(!moe_stale(&sm120));
        // without entries: the family of the device the table was measured on
        let mut empty = sm120.clone();
        empty.moe.clear();
        empty.device.compute_capability = (12, 0);
        assert_eq!(empty.current_moe_template_hash(), family_template_hash(Family::Sm120));
        assert!(!moe_stale(&empty));
        empty.device.compute_capability = (9, 0);
        assert_eq!(empty.current_moe_template_hash(), family_template_hash(Family::Sm90));
    }

    fn write(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// `table --check` without a device still compares the template hashes: a foreign, stale
    /// or empty hash is a warning (an error under the strict policy), a family listed twice is
    /// refused, and a byte-order mark is skipped.
    #[test]
    fn template_hashes_are_checked_without_a_device() {
        let dir = tempfile::tempdir().unwrap();
        let t = sample();
        let good = write(dir.path(), "good.ron", &t.to_ron_string());
        let (_, c) = Table::check_file(&good, MismatchPolicy::Error).unwrap();
        assert!(c.mismatches.is_empty(), "{c:?}");

        let mut foreign = t.clone();
        foreign.template_hashes.insert(Family::Sm90, "0123456789abcdef".into());
        let p = write(dir.path(), "foreign.ron", &foreign.to_ron_string());
        let (_, c) = Table::check_file(&p, MismatchPolicy::Warn).unwrap();
        assert_eq!(c.disabled.iter().copied().collect::<Vec<_>>(), vec![Family::Sm90]);
        let w = c.warnings().join("\n");
        assert!(w.contains("template sources changed") && w.contains("0123456789ab"), "{w}");
        let e = Table::check_file(&p, MismatchPolicy::Error).unwrap_err().to_string();
        assert!(e.contains("foreign.ron") && e.contains("template sources changed"), "{e}");

        let mut empty = t.clone();
        empty.template_hashes.insert(Family::Sm90, String::new());
        let p = write(dir.path(), "empty.ron", &empty.to_ron_string());
        let (_, c) = Table::check_file(&p, MismatchPolicy::Warn).unwrap();
        assert!(c.warnings()[0].contains("empty sm90 template hash"), "{:?}", c.warnings());

        let hash = family_template_hash(Family::Sm90);
        let twice = t.to_ron_string().replace(
            &format!("{{Sm90: \"{hash}\"}}"),
            &format!("{{Sm90: \"0123\", Sm90: \"{hash}\"}}"),
        );
        assert_ne!(twice, t.to_ron_string());
        let p = write(dir.path(), "twice.ron", &twice);
        let e = Table::check_file(&p, MismatchPolicy::Warn).unwrap_err().to_string();
        assert!(e.contains("twice.ron: template_hashes: family Sm90 is listed twice"), "{e}");

        let p = write(dir.path(), "bom.ron", &format!("\u{feff}{}", t.to_ron_string()));
        assert!(Table::check_file(&p, MismatchPolicy::Error).is_ok());
    }

    /// An entry whose thread count and shared memory wrapped in u32 (block_m
    /// 536870928, warps_m 67108866, ...) is refused when the table is read.
    #[test]
    fn wrapping_configuration_is_refused_when_reading() {
        let mut t = sample();
        let c = &mut t.entries[0].config;
        c.pipeline = crate::template::Pipeline::CpAsync;
        (c.swap_ab, c.min_ctas, c.stages, c.split_k) = (false, 1, 2, 1);
        (c.block_m, c.block_n, c.block_k) = (536_870_928, 16, 128);
        (c.warps_m, c.warps_n, c.warps_k) = (67_108_866, 1, 2);
        let e = Table::from_ron_str(&t.to_ron_string(), "results/h200.ron").unwrap_err();
        let e = e.to_string();
        assert!(e.starts_with("results/h200.ron: entry"), "{e}");
        assert!(e.contains("block_m 536870928 is out of range"), "{e}");
    }
}

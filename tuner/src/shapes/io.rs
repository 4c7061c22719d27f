//! Reading, checking and writing shape files (RON, schema-versioned).

use super::error::{InvalidReason, ShapeError};
use super::{
    ShapeFile, ShapeSet, MAX_DIM, MAX_EXPERTS, MAX_EXPERTS_PER_TOKEN, MAX_LAYERS, SCHEMA_VERSION,
};
use std::collections::HashSet;
use std::path::Path;

/// Only the version, read first so a file of a newer schema gets a version error, not a field error.
#[derive(serde::Deserialize)]
struct VersionProbe {
    schema_version: u32,
}

/// Whether `text` reads as a dispatch table (`results/<sku>.ron`: `template_hashes` and
/// `entries`), a file often passed where a shape file belongs.
fn is_dispatch_table(text: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct TableProbe {
        #[allow(dead_code)]
        template_hashes: serde::de::IgnoredAny,
        #[allow(dead_code)]
        entries: serde::de::IgnoredAny,
    }
    ron::Options::default().from_str::<TableProbe>(text).is_ok()
}

impl ShapeFile {
    /// Parses and checks a shape file; `origin` (a path or label) names it in errors.
    pub fn from_ron_str(text: &str, origin: &str) -> Result<ShapeFile, ShapeError> {
        // A byte-order mark (left by some editors) is not RON.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        if is_dispatch_table(text) {
            return Err(ShapeError::DispatchTable { origin: origin.to_string() });
        }
        let ron_err = |e: ron::error::SpannedError| ShapeError::Ron {
            origin: origin.to_string(),
            line: e.span.start.line,
            column: e.span.start.col,
            message: e.code.to_string().replace("struct `VersionProbe`", "the shape file"),
        };
        if text.trim().is_empty() {
            return Err(ShapeError::Ron {
                origin: origin.to_string(),
                line: 1,
                column: 1,
                message: "the file is empty".into(),
            });
        }
        // Unknown fields are ignored by the probe; a file without schema_version fails here.
        let probe: VersionProbe = ron::Options::default().from_str(text).map_err(ron_err)?;
        if probe.schema_version != SCHEMA_VERSION {
            return Err(ShapeError::SchemaVersion {
                origin: origin.to_string(),
                found: probe.schema_version,
                expected: SCHEMA_VERSION,
            });
        }
        let file: ShapeFile = ron::Options::default().from_str(text).map_err(ron_err)?;
        file.validate(origin)?;
        Ok(file)
    }

    /// Reads, parses and checks the shape file at `path`.
    pub fn load(path: &Path) -> Result<ShapeFile, ShapeError> {
        let text = crate::fsio::read_input(path)
            .map_err(|error| ShapeError::Read { path: path.to_path_buf(), error })?;
        ShapeFile::from_ron_str(&text, &path.display().to_string())
    }

    /// Loads the shape file at `path` and returns its set called `name`.
    pub fn load_set(path: &Path, name: &str) -> Result<ShapeSet, ShapeError> {
        ShapeFile::load(path)?.into_set(name, &path.display().to_string())
    }

    /// Checks every rule of the schema: version, non-empty and uniquely named sets and shapes,
    /// valid parallelism and routing, N and K > 0, K a multiple of 16, counts > 0, token buckets
    /// non-empty, > 0 and strictly increasing.
    pub fn validate(&self, origin: &str) -> Result<(), ShapeError> {
        let invalid = |at: String, reason: InvalidReason| ShapeError::Invalid {
            origin: origin.to_string(),
            at,
            reason,
        };
        if self.schema_version != SCHEMA_VERSION {
            return Err(ShapeError::SchemaVersion {
                origin: origin.to_string(),
                found: self.schema_version,
                expected: SCHEMA_VERSION,
            });
        }
        if self.sets.is_empty() {
            return Err(invalid("sets".into(), InvalidReason::NoSets));
        }
        let mut set_names = HashSet::new();
        for set in &self.sets {
            if !good_name(&set.name) {
                return Err(invalid(format!("set {:?}", set.name), InvalidReason::BadName));
            }
            if !set_names.insert(set.name.as_str()) {
                return Err(invalid(format!("set {:?}", set.name), InvalidReason::DuplicateSet));
            }
            set.validate().map_err(|(at, reason)| invalid(at, reason))?;
        }
        Ok(())
    }

    /// Pretty, stable RON: fields in declaration order, one shape per line, buckets on one line.
    /// The output parses back with [`ShapeFile::from_ron_str`] to an equal value.
    pub fn to_ron_string(&self) -> String {
        use std::fmt::Write;
        // One line per shape and per bucket list; the structure around them indented by hand.
        // Every value goes through ron's serializer, so strings are escaped correctly.
        fn one<T: serde::Serialize>(value: &T) -> String {
            let inline = ron::ser::PrettyConfig::new()
                .new_line("")
                .indentor("")
                .compact_arrays(true)
                .compact_structs(true);
            // Plain structs, strings and integer lists: serializing them cannot fail.
            ron::ser::to_string_pretty(value, inline).unwrap_or_default()
        }
        let mut out = String::new();
        let _ = writeln!(out, "(");
        let _ = writeln!(out, "    schema_version: {},", self.schema_version);
        let _ = writeln!(out, "    model: {},", one(&self.model));
        let _ = writeln!(out, "    source: {},", one(&self.source));
        let _ = writeln!(out, "    sets: [");
        for set in &self.sets {
            let _ = writeln!(out, "        (");
            let _ = writeln!(out, "            name: {},", one(&set.name));
            let _ = writeln!(out, "            parallelism: {},", one(&set.parallelism));
            let _ = writeln!(out, "            routing: {},", one(&set.routing));
            let _ = writeln!(out, "            shapes: [");
            for shape in &set.shapes {
                let _ = writeln!(out, "                {},", one(shape));
            }
            let _ = writeln!(out, "            ],");
            let _ = writeln!(out, "            token_buckets: {},", one(&set.token_buckets));
            let _ = writeln!(out, "        ),");
        }
        let _ = writeln!(out, "    ],");
        let _ = writeln!(out, ")");
        out
    }
}

impl ShapeSet {
    /// Checks one set; on failure returns where (e.g. `set "tp8", shape "routed_down"`) and why.
    pub(super) fn validate(&self) -> Result<(), (String, InvalidReason)> {
        let at_set = || format!("set {:?}", self.name);
        let p = self.parallelism;
        if !p.is_valid() {
            return Err((at_set(), InvalidReason::BadParallelism { tp: p.tp, ep: p.ep }));
        }
        let r = self.routing;
        if r.routed_experts == 0
            || r.experts_per_token == 0
            || r.experts_per_token > r.routed_experts
            || r.routed_experts > MAX_EXPERTS
            || r.experts_per_token > MAX_EXPERTS_PER_TOKEN
        {
            return Err((
                at_set(),
                InvalidReason::BadRouting {
                    routed_experts: r.routed_experts,
                    experts_per_token: r.experts_per_token,
                },
            ));
        }
        if self.shapes.is_empty() {
            return Err((at_set(), InvalidReason::NoShapes));
        }
        let mut names = HashSet::new();
        for s in &self.shapes {
            let at = || format!("set {:?}, shape {:?}", self.name, s.name);
            if !good_name(&s.name) {
                return Err((at(), InvalidReason::BadName));
            }
            if !names.insert(s.name.as_str()) {
                return Err((at(), InvalidReason::DuplicateShape));
            }
            if s.n == 0 {
                return Err((at(), InvalidReason::ZeroDim { dim: "n" }));
            }
            if s.k == 0 {
                return Err((at(), InvalidReason::ZeroDim { dim: "k" }));
            }
            if s.k % 16 != 0 {
                return Err((at(), InvalidReason::KNotBlockMultiple { k: s.k }));
            }
            if s.count_per_layer == 0 {
                return Err((at(), InvalidReason::ZeroCount { field: "count_per_layer" }));
            }
            if s.layers == 0 {
                return Err((at(), InvalidReason::ZeroCount { field: "layers" }));
            }
            for (field, value, max) in [
                ("n", s.n, MAX_DIM),
                ("k", s.k, MAX_DIM),
                ("count_per_layer", s.count_per_layer, MAX_EXPERTS),
                ("layers", s.layers, MAX_LAYERS),
            ] {
                if value > max {
                    return Err((at(), InvalidReason::TooLarge { field, value, max }));
                }
            }
        }
        let at_buckets = || format!("set {:?}, token_buckets", self.name);
        if self.token_buckets.is_empty() {
            return Err((at_buckets(), InvalidReason::NoBuckets));
        }
        if self.token_buckets.contains(&0) {
            return Err((at_buckets(), InvalidReason::ZeroBucket));
        }
        if let Some(&value) = self.token_buckets.iter().find(|&&m| m > MAX_DIM) {
            return Err((
                at_buckets(),
                InvalidReason::TooLarge { field: "token bucket", value, max: MAX_DIM },
            ));
        }
        if let Some(w) = self.token_buckets.windows(2).find(|w| w[1] <= w[0]) {
            return Err((
                at_buckets(),
                InvalidReason::BucketsNotIncreasing { prev: w[0], next: w[1] },
            ));
        }
        Ok(())
    }
}

/// Whether a set or shape name can stand in a CSV field and a file name: non-empty, no comma,
/// quote or control character.
fn good_name(name: &str) -> bool {
    !name.is_empty() && !name.chars().any(|c| c == ',' || c == '"' || c.is_control())
}

#[cfg(test)]
mod tests {
    use super::super::{GemmShape, Op, Parallelism, Routing, GLM5_RON};
    use super::*;

    fn small_file() -> ShapeFile {
        ShapeFile {
            schema_version: 1,
            model: "Tiny \"quoted\" model".into(),
            source: "unit test\nsecond line".into(),
            sets: vec![ShapeSet {
                name: "tp2".into(),
                parallelism: Parallelism::new(2, 1),
                routing: Routing { routed_experts: 8, experts_per_token: 2 },
                shapes: vec![
                    GemmShape {
                        name: "routed_gate_up".into(),
                        op: Op::RoutedGateUp,
                        n: 256,
                        k: 512,
                        count_per_layer: 8,
                        layers: 4,
                    },
                    GemmShape {
                        name: "routed_down".into(),
                        op: Op::RoutedDown,
                        n: 512,
                        k: 128,
                        count_per_layer: 8,
                        layers: 4,
                    },
                ],
                token_buckets: vec![1, 2, 4],
            }],
        }
    }

    /// Serializes `file` after `edit`, parses it back and returns the error.
    fn error_after(edit: impl FnOnce(&mut ShapeFile)) -> ShapeError {
        let mut file = small_file();
        edit(&mut file);
        ShapeFile::from_ron_str(&file.to_ron_string(), "bad.ron").unwrap_err()
    }

    fn reason_after(edit: impl FnOnce(&mut ShapeFile)) -> (String, InvalidReason) {
        match error_after(edit) {
            ShapeError::Invalid { origin, at, reason } => {
                assert_eq!(origin, "bad.ron");
                (at, reason)
            }
            other => panic!("expected an Invalid error, got {other:?}"),
        }
    }

    #[test]
    fn ron_round_trip_is_exact_and_stable() {
        let file = small_file();
        let text = file.to_ron_string();
        let back = ShapeFile::from_ron_str(&text, "mem").unwrap();
        assert_eq!(back, file);
        assert_eq!(back.to_ron_string(), text);
        // One shape per line.
        assert!(text.contains(
            "                (name: \"routed_down\", op: RoutedDown, n: 512, k: 128, \
             count_per_layer: 8, layers: 4),\n"
        ));
        assert!(text.contains("token_buckets: [1, 2, 4],\n"), "{text}");
    }

    #[test]
    fn embedded_glm5_round_trips() {
        let file = ShapeFile::from_ron_str(GLM5_RON, "glm5.ron").unwrap();
        let again = ShapeFile::from_ron_str(&file.to_ron_string(), "again").unwrap();
        assert_eq!(again, file);
    }

    #[test]
    fn malformed_ron_names_file_line_and_column() {
        let text =
            "(\n    schema_version: 1,\n    model: \"x\",\n    source: oops,\n    sets: [],\n)";
        let err = ShapeFile::from_ron_str(text, "shapes/x.ron").unwrap_err();
        let ShapeError::Ron { ref origin, line, .. } = err else { panic!("{err:?}") };
        assert_eq!(origin, "shapes/x.ron");
        assert_eq!(line, 4);
        assert!(err.to_string().starts_with("shapes/x.ron:4:"), "{err}");
    }

    #[test]
    fn unknown_field_is_a_ron_error() {
        let text = small_file().to_ron_string().replace("layers: 4", "layers: 4, extra: 1");
        let err = ShapeFile::from_ron_str(&text, "f.ron").unwrap_err();
        assert!(matches!(err, ShapeError::Ron { .. }), "{err:?}");
        assert!(err.to_string().contains("extra"), "{err}");
    }

    #[test]
    fn missing_schema_version_is_a_ron_error() {
        let text = "(model: \"x\", source: \"y\", sets: [])";
        let err = ShapeFile::from_ron_str(text, "f.ron").unwrap_err();
        assert!(matches!(err, ShapeError::Ron { .. }), "{err:?}");
        assert!(err.to_string().contains("schema_version"), "{err}");
        let empty = ShapeFile::from_ron_str("\n", "f.ron").unwrap_err().to_string();
        assert_eq!(empty, "f.ron:1:1: malformed RON: the file is empty");
        let list = ShapeFile::from_ron_str("[1]", "f.ron").unwrap_err().to_string();
        assert!(!list.contains("VersionProbe"), "{list}");
    }

    #[test]
    fn unknown_schema_version_is_refused_before_other_fields() {
        // A future file may have fields this version does not know; the version error wins.
        let text = small_file()
            .to_ron_string()
            .replace("schema_version: 1", "schema_version: 2, future_field: true");
        let err = ShapeFile::from_ron_str(&text, "new.ron").unwrap_err();
        assert!(matches!(err, ShapeError::SchemaVersion { found: 2, expected: 1, .. }), "{err:?}");
        assert!(err.to_string().contains("new.ron"));
    }

    #[test]
    fn structural_errors() {
        assert_eq!(reason_after(|f| f.sets.clear()).1, InvalidReason::NoSets);
        let (at, r) = reason_after(|f| {
            let s = f.sets[0].clone();
            f.sets.push(s);
        });
        assert_eq!((at.as_str(), r), ("set \"tp2\"", InvalidReason::DuplicateSet));
        assert_eq!(reason_after(|f| f.sets[0].shapes.clear()).1, InvalidReason::NoShapes);
        let (at, r) = reason_after(|f| f.sets[0].shapes[1].name = "routed_gate_up".into());
        assert_eq!(r, InvalidReason::DuplicateShape);
        assert_eq!(at, "set \"tp2\", shape \"routed_gate_up\"");
    }

    #[test]
    fn parallelism_and_routing_errors() {
        for (tp, ep) in [(0, 1), (2, 0), (2, 4), (6, 4)] {
            let r = reason_after(|f| f.sets[0].parallelism = Parallelism::new(tp, ep)).1;
            assert_eq!(r, InvalidReason::BadParallelism { tp, ep });
        }
        // beyond the bounds too: a routed step draws per token and slot
        for (e, k) in [(0, 1), (8, 0), (2, 8), (u32::MAX, 8), (u32::MAX, u32::MAX), (65_536, 257)] {
            let r = reason_after(|f| {
                f.sets[0].routing = Routing { routed_experts: e, experts_per_token: k }
            })
            .1;
            assert_eq!(r, InvalidReason::BadRouting { routed_experts: e, experts_per_token: k });
        }
    }

    #[test]
    fn size_errors_name_the_shape() {
        // names that would break a CSV field, a file name or a report line
        for bad in ["", "a,b", "a\"b", "a\nb", "a\u{1b}[31m"] {
            let r = reason_after(|f| f.sets[0].shapes[1].name = bad.into()).1;
            assert_eq!(r, InvalidReason::BadName, "{bad:?}");
            let r = reason_after(|f| f.sets[0].name = bad.into()).1;
            assert_eq!(r, InvalidReason::BadName, "{bad:?}");
        }
        let (at, r) = reason_after(|f| f.sets[0].shapes[1].n = 0);
        assert_eq!(at, "set \"tp2\", shape \"routed_down\"");
        assert_eq!(r, InvalidReason::ZeroDim { dim: "n" });
        assert_eq!(
            reason_after(|f| f.sets[0].shapes[0].k = 0).1,
            InvalidReason::ZeroDim { dim: "k" }
        );
        assert_eq!(
            reason_after(|f| f.sets[0].shapes[0].k = 520).1,
            InvalidReason::KNotBlockMultiple { k: 520 }
        );
        assert_eq!(
            reason_after(|f| f.sets[0].shapes[0].count_per_layer = 0).1,
            InvalidReason::ZeroCount { field: "count_per_layer" }
        );
        assert_eq!(
            reason_after(|f| f.sets[0].shapes[0].layers = 0).1,
            InvalidReason::ZeroCount { field: "layers" }
        );
        let msg = error_after(|f| f.sets[0].shapes[0].k = 520).to_string();
        assert_eq!(
            msg,
            "bad.ron: set \"tp2\", shape \"routed_gate_up\": k=520 is not a multiple of 16 (the \
             NVFP4 scale block)"
        );
    }

    #[test]
    fn bucket_errors() {
        assert_eq!(reason_after(|f| f.sets[0].token_buckets.clear()).1, InvalidReason::NoBuckets);
        assert_eq!(
            reason_after(|f| f.sets[0].token_buckets = vec![0, 1]).1,
            InvalidReason::ZeroBucket
        );
        assert_eq!(
            reason_after(|f| f.sets[0].token_buckets = vec![1, 4, 2]).1,
            InvalidReason::BucketsNotIncreasing { prev: 4, next: 2 }
        );
        assert_eq!(
            reason_after(|f| f.sets[0].token_buckets = vec![1, 2, 2]).1,
            InvalidReason::BucketsNotIncreasing { prev: 2, next: 2 }
        );
    }

    #[test]
    fn load_reads_files_and_names_missing_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.ron");
        std::fs::write(&path, small_file().to_ron_string()).unwrap();
        assert_eq!(ShapeFile::load(&path).unwrap(), small_file());

        assert_eq!(ShapeFile::load_set(&path, "tp2").unwrap(), small_file().sets[0]);
        let err = ShapeFile::load_set(&path, "tp4").unwrap_err();
        assert!(matches!(err, ShapeError::UnknownSet { .. }), "{err:?}");
        assert!(err.to_string().contains("tiny.ron"), "{err}");

        let missing = dir.path().join("missing.ron");
        let err = ShapeFile::load(&missing).unwrap_err();
        assert!(matches!(err, ShapeError::Read { .. }));
        assert!(err.to_string().contains("missing.ron"), "{err}");

        std::fs::write(&path, "(schema_version: 1, model: \"x\", source: \"y\", sets: [])")
            .unwrap();
        let err = ShapeFile::load(&path).unwrap_err();
        assert!(err.to_string().starts_with(&path.display().to_string()), "{err}");
    }

    /// A dispatch table passed where a shape file belongs says so (not "unsupported schema_version").
    #[test]
    fn a_dispatch_table_is_named_as_such() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "ron") {
                let err = ShapeFile::load(&p).unwrap_err();
                assert!(matches!(err, ShapeError::DispatchTable { .. }), "{err:?}");
                let msg = err.to_string();
                assert!(msg.contains("this is a dispatch table, not a shape file"), "{msg}");
                assert!(msg.starts_with(&p.display().to_string()), "{msg}");
                n += 1;
            }
        }
        assert!(n > 0);
    }

    #[test]
    fn a_byte_order_mark_is_skipped() {
        let text = format!("\u{feff}{}", small_file().to_ron_string());
        assert_eq!(ShapeFile::from_ron_str(&text, "bom.ron").unwrap(), small_file());
    }

    #[test]
    fn sizes_above_the_bounds_are_refused() {
        assert_eq!(
            reason_after(|f| f.sets[0].shapes[0].n = (1 << 31) + 16).1,
            InvalidReason::TooLarge { field: "n", value: (1 << 31) + 16, max: MAX_DIM }
        );
        assert_eq!(
            reason_after(|f| f.sets[0].shapes[0].layers = u32::MAX).1,
            InvalidReason::TooLarge { field: "layers", value: u32::MAX, max: MAX_LAYERS }
        );
        let msg = error_after(|f| f.sets[0].token_buckets = vec![1, 1 << 30]).to_string();
        assert!(msg.contains("token bucket=1073741824 is above the largest"), "{msg}");
    }
}

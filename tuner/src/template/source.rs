//! The embedded template tree, `#include` inlining and source hashing.

use super::Arch;
use sha2::{Digest, Sha256};
use std::collections::HashSet;

// Every file under `templates/`, embedded at build time so that the library (and the runtime
// dispatcher) can render kernels without the source tree. Paths are relative to `templates/`;
// build.rs generates the list, a test checks it against the folder.
include!(concat!(env!("OUT_DIR"), "/templates.rs"));

/// A rendered kernel: one self-contained translation unit plus the options to compile it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelSource {
    /// The `extern "C"` kernel symbol.
    pub kernel_name: String,
    pub arch: Arch,
    /// Source with every `#include "..."` of the template tree inlined.
    pub code: String,
    /// NVRTC options (architecture included).
    pub options: Vec<String>,
}

impl KernelSource {
    /// Build from an instantiation unit: inline its includes and attach the standard options.
    pub fn from_unit(kernel_name: String, arch: Arch, unit: &str) -> Result<Self, String> {
        Ok(Self { kernel_name, arch, code: inline_includes(unit)?, options: default_options(arch) })
    }

    /// Hex SHA-256 of (kernel name, code, options, arch): the identity of the compiled artefact,
    /// before the compiler version is added by the cache. The name is part of it because one
    /// translation unit may hold several kernels and the artefact is looked up by name.
    pub fn hash(&self) -> String {
        let mut h = Sha256::new();
        h.update(self.kernel_name.as_bytes());
        h.update([0]);
        h.update(self.arch.as_str().as_bytes());
        h.update([0]);
        for o in &self.options {
            h.update(o.as_bytes());
            h.update([0]);
        }
        h.update(self.code.as_bytes());
        hex(&h.finalize())
    }
}

/// Options every kernel is compiled with. `-v` makes ptxas report registers, spills and shared
/// memory into the program log, which `compile::stats` parses.
pub fn default_options(arch: Arch) -> Vec<String> {
    vec![
        format!("--gpu-architecture={}", arch.as_str()),
        "--std=c++17".to_string(),
        "--ptxas-options=-v".to_string(),
        "--device-int128".to_string(),
        "-DNDEBUG".to_string(),
    ]
}

fn lookup(path: &str) -> Option<&'static str> {
    TEMPLATE_FILES.iter().find(|(p, _)| *p == path).map(|(_, s)| *s)
}

/// Replace each `#include "x"` by the embedded file `x` (once per file, like `#pragma once`).
/// System includes (`<...>`) are rejected: the NVRTC wheel ships no headers.
pub fn inline_includes(unit: &str) -> Result<String, String> {
    let mut out = String::with_capacity(unit.len() * 4);
    let mut seen = HashSet::new();
    inline_into(unit, "<instantiation>", &mut out, &mut seen, 0)?;
    Ok(out)
}

fn inline_into(
    text: &str,
    from: &str,
    out: &mut String,
    seen: &mut HashSet<String>,
    depth: usize,
) -> Result<(), String> {
    if depth > 32 {
        return Err(format!("include depth over 32 at {from}"));
    }
    for (lineno, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with("#pragma once") {
            continue;
        }
        if let Some(rest) = t.strip_prefix("#include") {
            let rest = rest.trim();
            let Some(path) = rest.strip_prefix('"').and_then(|r| r.split('"').next()) else {
                return Err(format!(
                    "{from}:{}: only `#include \"...\"` of the template tree is allowed, found `{t}`",
                    lineno + 1
                ));
            };
            let Some(body) = lookup(path) else {
                return Err(format!(
                    "{from}:{}: `{path}` is not an embedded template (see TEMPLATE_FILES)",
                    lineno + 1
                ));
            };
            if seen.insert(path.to_string()) {
                out.push_str(&format!("// ---- begin {path}\n"));
                inline_into(body, path, out, seen, depth + 1)?;
                out.push_str(&format!("// ---- end {path}\n"));
            }
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    Ok(())
}

/// The first `chars` characters of a template hash, for messages (a hash read from a file may
/// hold any text: the cut falls on a character boundary).
pub fn short_hash(hash: &str, chars: usize) -> &str {
    hash.char_indices().nth(chars).map_or(hash, |(i, _)| &hash[..i])
}

/// Hex SHA-256 over the embedded template files whose path starts with one of `prefixes`
/// (all files when empty), in path order. Recorded in dispatch tables: a table made with other
/// template sources is detected at load time.
pub fn template_tree_hash(prefixes: &[&str]) -> String {
    let mut files: Vec<_> = TEMPLATE_FILES
        .iter()
        .filter(|(p, _)| prefixes.is_empty() || prefixes.iter().any(|x| p.starts_with(x)))
        .collect();
    files.sort();
    let mut h = Sha256::new();
    for (p, s) in files {
        h.update(p.as_bytes());
        h.update([0]);
        h.update(s.as_bytes());
        h.update([0]);
    }
    hex(&h.finalize())
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn embedded_list_matches_the_templates_folder() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates");
        let mut on_disk = Vec::new();
        fn walk(dir: &Path, root: &Path, acc: &mut Vec<String>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    walk(&p, root, acc);
                } else if p.extension().is_some_and(|x| x == "cuh" || x == "cu") {
                    acc.push(p.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/"));
                }
            }
        }
        walk(&root, &root, &mut on_disk);
        on_disk.sort();
        let mut embedded: Vec<String> = TEMPLATE_FILES.iter().map(|(p, _)| p.to_string()).collect();
        embedded.sort();
        assert_eq!(embedded, on_disk, "TEMPLATE_FILES must list every file under templates/");
    }

    #[test]
    fn includes_are_inlined_once_and_unknown_ones_rejected() {
        let unit = "#include \"common/types.cuh\"\n#include \"common/types.cuh\"\nint x;\n";
        let code = inline_includes(unit).unwrap();
        assert_eq!(code.matches("// ---- begin common/types.cuh").count(), 1);
        assert!(code.ends_with("int x;\n"));
        let err = inline_includes("#include <cuda_fp16.h>\n").unwrap_err();
        assert!(err.contains("only `#include"), "{err}");
        let err = inline_includes("#include \"nope.cuh\"\n").unwrap_err();
        assert!(err.contains("nope.cuh"), "{err}");
    }

    #[test]
    fn short_hashes_cut_on_character_boundaries() {
        assert_eq!(short_hash("0123456789abcdef0123", 12), "0123456789ab");
        assert_eq!(short_hash("abc", 12), "abc");
        assert_eq!(short_hash("aa\u{20ac}\u{20ac}\u{20ac}", 3), "aa\u{20ac}");
        assert_eq!(short_hash("\u{20ac}\u{20ac}", 16), "\u{20ac}\u{20ac}");
    }

    #[test]
    fn hash_depends_on_code_options_and_arch() {
        let a = KernelSource::from_unit("k".into(), Arch::Sm90a, "int x;").unwrap();
        let mut b = a.clone();
        b.options.push("-lineinfo".into());
        let c = KernelSource::from_unit("k".into(), Arch::Sm120a, "int x;").unwrap();
        let d = KernelSource::from_unit("k".into(), Arch::Sm90a, "int y;").unwrap();
        let e = KernelSource::from_unit("k2".into(), Arch::Sm90a, "int x;").unwrap();
        let hs = [a.hash(), b.hash(), c.hash(), d.hash(), e.hash()];
        for i in 0..hs.len() {
            for j in i + 1..hs.len() {
                assert_ne!(hs[i], hs[j]);
            }
        }
        assert_eq!(a.hash(), a.clone().hash());
    }
}

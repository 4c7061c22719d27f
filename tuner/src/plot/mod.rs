//! `fp4tune report`: SVG figures of the committed evidence, no GPU needed.
//!
//! Three kinds of figure, each a [`Chart`] built from data by a pure function (tested on the
//! series it holds) and drawn by [`svg::render`] (plotters, SVG backend only):
//!
//! - [`figures::gemm_time_vs_m`]: per weight shape, time vs M (log-log) of the best verified
//!   fp4tune kernel, the table's entries, the peers and the dequantize-then-cuBLAS method of a
//!   benchmark CSV (`bench-<a_type>.csv`), with the read floor and the roofline;
//! - [`figures::moe_step`]: per shape set and op (`moe_gate_up`, `moe_down`, and `moe_layer`,
//!   the whole decode step), time per token count B from `bench-moe.csv` (and peers CSVs in the
//!   same format) against the peers, with the op's roofline and read floor;
//! - [`figures::search_curves`]: a measurement log's best-so-far (relative to the best in the
//!   log) against evaluations, per search strategy replayed offline (`tune::replay`) and in the
//!   order the log recorded.
//!
//! Dependencies: `plot` sits above `tune` (it reads logs and replays strategies) and prints
//! nothing.

pub mod figures;
pub mod svg;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

/// How a series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// Measured times: a line with markers.
    Line,
    /// A long measured curve: a line without markers.
    Curve,
    /// Markers only (single measurements that should not be joined).
    Points,
    /// A physical bound (read floor, roofline): a dashed grey line.
    Floor,
}

/// One named series of (x, y) points.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub style: Style,
}

/// One figure.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// The SVG file name (no folder), e.g. `time-vs-m-n512-k6144-w4a16.svg`.
    pub file: String,
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_x: bool,
    pub log_y: bool,
    pub series: Vec<Series>,
}

/// Figure size in pixels.
pub const SIZE: (u32, u32) = (900, 560);

#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("{0}")]
    Input(String),
    #[error("figure `{0}` has no point to draw")]
    Empty(String),
    #[error("drawing: {0}")]
    Draw(String),
    // The OS error is part of the message, not a chained source (printed once).
    #[error("{}: {error}", path.display())]
    Io { path: PathBuf, error: std::io::Error },
}

/// Draw every chart into `dir` (created if needed); returns the files written.
pub fn write_all(charts: &[Chart], dir: &Path) -> Result<Vec<PathBuf>, PlotError> {
    crate::fsio::create_dir(dir)
        .map_err(|source| PlotError::Io { path: dir.to_path_buf(), error: source })?;
    let mut files = Vec::new();
    for c in charts {
        files.push((dir.join(&c.file), svg::render(c, SIZE)?));
    }
    // Every figure replaced together, or none.
    let refs: Vec<(&Path, &[u8])> =
        files.iter().map(|(p, t)| (p.as_path(), t.as_bytes())).collect();
    crate::fsio::write_atomic_all(&refs)
        .map_err(|error| PlotError::Io { path: dir.to_path_buf(), error })?;
    Ok(files.into_iter().map(|(p, _)| p).collect())
}

/// A file-name-safe slug: lowercase ASCII letters, digits and `-`.
pub fn slug(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
        .collect();
    while out.contains("--") {
        out = out.replace("--", "-");
    }
    out.trim_matches('-').to_string()
}

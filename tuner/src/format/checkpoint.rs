//! Loading NVFP4 weights from safetensors checkpoints (ModelOpt export layout): one Linear layer,
//! or a stacked MoE expert block (vLLM/SGLang `w13_*` / `w2_*` naming).
//!
//! Only the header and the requested tensors are read (seek + read), so loading one layer from a
//! multi-gigabyte shard is cheap. The header is parsed by the `safetensors` crate.

use super::quant::{Nvfp4Matrix, BLOCK};
use super::FormatError;
use ::safetensors::tensor::{Metadata, TensorInfo};
use ::safetensors::Dtype;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// One NVFP4 Linear layer: `<prefix>.weight` (u8 `[N, K/2]`), `.weight_scale` (F8_E4M3
/// `[N, K/16]`), `.weight_scale_2` (F32 scalar) and the optional static `.input_scale` (F32).
#[derive(Debug, Clone, PartialEq)]
pub struct Nvfp4Linear {
    /// `[N, K]`, `global_scale` = `weight_scale_2`.
    pub weight: Nvfp4Matrix,
    pub input_scale: Option<f32>,
}

/// A stacked MoE expert block: `<prefix>.w13_weight` `[E, 2I, H/2]` (gate rows then up rows),
/// `w13_weight_scale` `[E, 2I, H/16]`, `w13_weight_scale_2` `[E]` or `[E, 2]`, the same for
/// `w2_*` (`[E, H, I/2]`, `[E, H, I/16]`, `[E]`), and optional `w13_input_scale` /
/// `w2_input_scale` (scalar, `[E]` or `[E, 2]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Nvfp4ExpertStack {
    pub experts: usize,
    /// Per expert `[2I, H]`. Its `global_scale` is the gate half's `weight_scale_2` (what vLLM
    /// uses); see [`Self::w13_scale_2`] and [`Self::w13_scales_consistent`].
    pub w13: Vec<Nvfp4Matrix>,
    /// Per expert (gate, up) `weight_scale_2` as stored (both equal when the file has `[E]`).
    pub w13_scale_2: Vec<[f32; 2]>,
    /// Per expert `[H, I]`.
    pub w2: Vec<Nvfp4Matrix>,
    /// Per expert static input scale of w13 (`[E, 2]` reduced by max, a scalar broadcast).
    pub w13_input_scale: Option<Vec<f32>>,
    /// Per expert static input scale of w2.
    pub w2_input_scale: Option<Vec<f32>>,
}

impl Nvfp4ExpertStack {
    /// Whether every expert's gate and up halves share one `weight_scale_2`. When they do not,
    /// [`Self::w13`]'s single global scale is exact for the gate rows only.
    pub fn w13_scales_consistent(&self) -> bool {
        self.w13_scale_2.iter().all(|[g, u]| g == u)
    }
}

/// Load one NVFP4 Linear layer named `prefix` (e.g. `model.layers.0.self_attn.q_proj`).
pub fn load_linear(path: impl AsRef<Path>, prefix: &str) -> Result<Nvfp4Linear, FormatError> {
    let mut f = StFile::open(path.as_ref())?;
    let wname = join(prefix, "weight");
    let sname = join(prefix, "weight_scale");
    let (winfo_shape, sinfo_shape) = (
        f.checked(&wname, Dtype::U8, None)?.shape.clone(),
        f.checked(&sname, Dtype::F8_E4M3, None)?.shape.clone(),
    );
    let [n, kh] = winfo_shape[..] else {
        return Err(f.shape_err(&wname, "[N, K/2]", &winfo_shape));
    };
    let k = kh * 2;
    if k % BLOCK != 0 {
        return Err(f.bad(&wname, format!("K = {k} is not a multiple of 16")));
    }
    if sinfo_shape != [n, k / BLOCK] {
        return Err(f.shape_err(&sname, &format!("[{n}, {}]", k / BLOCK), &sinfo_shape));
    }
    let codes = f.read(&wname)?;
    let scales = f.read(&sname)?;
    let s2 = f.scalar(&join(prefix, "weight_scale_2"))?;
    let input_scale = match f.has(&join(prefix, "input_scale")) {
        true => Some(f.scalar(&join(prefix, "input_scale"))?),
        false => None,
    };
    let weight = Nvfp4Matrix::new(n, k, codes, scales, s2).map_err(|e| f.bad(&wname, e))?;
    Ok(Nvfp4Linear { weight, input_scale })
}

/// Load a stacked MoE expert block named `prefix` (e.g. `model.layers.3.mlp.experts`).
pub fn load_expert_stack(
    path: impl AsRef<Path>,
    prefix: &str,
) -> Result<Nvfp4ExpertStack, FormatError> {
    let mut f = StFile::open(path.as_ref())?;
    let (w13_raw, e, two_i, h) = f.stacked(prefix, "w13")?;
    let (w2_raw, e2, h2, i) = f.stacked(prefix, "w2")?;
    if e2 != e || h2 != h || two_i != 2 * i {
        return Err(f.bad(
            &join(prefix, "w2_weight"),
            format!("[{e2}, {h2}, {i}] (logical) does not fit w13's [{e}, {two_i}, {h}]"),
        ));
    }
    let s13 = f.per_expert(&join(prefix, "w13_weight_scale_2"), e, true)?;
    let s2 = f.per_expert(&join(prefix, "w2_weight_scale_2"), e, false)?;
    let mut w13: Vec<Nvfp4Matrix> = Vec::with_capacity(e);
    let mut w13_scale_2 = Vec::with_capacity(e);
    for (x, (codes, scales)) in w13_raw.into_iter().enumerate() {
        let pair = s13[x];
        w13_scale_2.push(pair);
        let m = Nvfp4Matrix::new(two_i, h, codes, scales, pair[0])
            .map_err(|err| f.bad(&join(prefix, "w13_weight"), err))?;
        w13.push(m);
    }
    let w2 = w2_raw
        .into_iter()
        .zip(&s2)
        .map(|((codes, scales), s)| {
            Nvfp4Matrix::new(h, i, codes, scales, s[0])
                .map_err(|err| f.bad(&join(prefix, "w2_weight"), err))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let input = |f: &mut StFile, name: &str| -> Result<Option<Vec<f32>>, FormatError> {
        let name = join(prefix, name);
        if !f.has(&name) {
            return Ok(None);
        }
        let info = f.checked(&name, Dtype::F32, None)?;
        let v = if info.shape.iter().product::<usize>() == 1 {
            vec![f.scalar(&name)?; e]
        } else {
            f.per_expert(&name, e, true)?.iter().map(|[a, b]| a.max(*b)).collect()
        };
        Ok(Some(v))
    };
    let w13_input_scale = input(&mut f, "w13_input_scale")?;
    let w2_input_scale = input(&mut f, "w2_input_scale")?;
    Ok(Nvfp4ExpertStack { experts: e, w13, w13_scale_2, w2, w13_input_scale, w2_input_scale })
}

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

/// Per-expert (codes, scales) byte buffers plus (E, rows, K).
type Stacked = (Vec<(Vec<u8>, Vec<u8>)>, usize, usize, usize);

/// A safetensors file: its parsed header and an open handle for reading tensors on demand.
struct StFile {
    path: PathBuf,
    file: File,
    data_start: u64,
    meta: Metadata,
}

impl StFile {
    fn open(path: &Path) -> Result<Self, FormatError> {
        let io = |source| FormatError::Io { path: path.to_path_buf(), source };
        let st = |problem: String| FormatError::SafeTensors { path: path.to_path_buf(), problem };
        let mut file = File::open(path).map_err(io)?;
        let file_len = file.metadata().map_err(io)?.len();
        let mut n = [0u8; 8];
        file.read_exact(&mut n).map_err(|e| st(format!("no header length: {e}")))?;
        let n = u64::from_le_bytes(n);
        if n > 100 << 20 || 8 + n > file_len {
            return Err(st(format!("header length {n} does not fit the file ({file_len} bytes)")));
        }
        let mut header = vec![0u8; n as usize];
        file.read_exact(&mut header).map_err(io)?;
        let meta: Metadata = serde_json::from_slice(&header)
            .map_err(|e| st(format!("header does not parse: {e}")))?;
        let data_start = 8 + n;
        let data_len = file_len - data_start;
        for (name, info) in meta.tensors() {
            if info.data_offsets.1 as u64 > data_len {
                return Err(st(format!(
                    "tensor `{name}` ends at byte {} of a {data_len}-byte data section",
                    info.data_offsets.1
                )));
            }
        }
        Ok(Self { path: path.to_path_buf(), file, data_start, meta })
    }

    fn has(&self, name: &str) -> bool {
        self.meta.info(name).is_some()
    }

    fn info(&self, name: &str) -> Result<&TensorInfo, FormatError> {
        self.meta.info(name).ok_or_else(|| FormatError::MissingTensor {
            path: self.path.clone(),
            tensor: name.to_string(),
        })
    }

    /// The tensor's info after checking its dtype and (if given) its rank.
    fn checked(
        &self,
        name: &str,
        dtype: Dtype,
        rank: Option<usize>,
    ) -> Result<&TensorInfo, FormatError> {
        let info = self.info(name)?;
        if info.dtype != dtype {
            return Err(FormatError::WrongDtype {
                path: self.path.clone(),
                tensor: name.to_string(),
                expected: format!("{dtype:?}"),
                got: format!("{:?}", info.dtype),
            });
        }
        if let Some(r) = rank {
            if info.shape.len() != r {
                return Err(self.shape_err(name, &format!("rank {r}"), &info.shape));
            }
        }
        Ok(info)
    }

    fn shape_err(&self, name: &str, expected: &str, got: &[usize]) -> FormatError {
        FormatError::WrongShape {
            path: self.path.clone(),
            tensor: name.to_string(),
            expected: expected.to_string(),
            got: got.to_vec(),
        }
    }

    fn bad(&self, name: &str, problem: impl ToString) -> FormatError {
        FormatError::BadTensor {
            path: self.path.clone(),
            tensor: name.to_string(),
            problem: problem.to_string(),
        }
    }

    /// The raw bytes of a tensor (little-endian).
    fn read(&mut self, name: &str) -> Result<Vec<u8>, FormatError> {
        let (start, end) = self.info(name)?.data_offsets;
        let mut buf = vec![0u8; end - start];
        let io = |source| FormatError::Io { path: self.path.clone(), source };
        self.file.seek(SeekFrom::Start(self.data_start + start as u64)).map_err(io)?;
        self.file.read_exact(&mut buf).map_err(io)?;
        Ok(buf)
    }

    fn read_f32(&mut self, name: &str) -> Result<Vec<f32>, FormatError> {
        let bytes = self.read(name)?;
        Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }

    /// An F32 tensor of shape `[]` or `[1]`.
    fn scalar(&mut self, name: &str) -> Result<f32, FormatError> {
        let shape = self.checked(name, Dtype::F32, None)?.shape.clone();
        if shape.iter().product::<usize>() != 1 || shape.len() > 1 {
            return Err(self.shape_err(name, "[] or [1]", &shape));
        }
        Ok(self.read_f32(name)?[0])
    }

    /// An F32 per-expert tensor `[E]` (returned as pairs of equal values) or, if `pairs`, also
    /// `[E, 2]`.
    fn per_expert(
        &mut self,
        name: &str,
        e: usize,
        pairs: bool,
    ) -> Result<Vec<[f32; 2]>, FormatError> {
        let shape = self.checked(name, Dtype::F32, None)?.shape.clone();
        let v = self.read_f32(name)?;
        if shape == [e] {
            Ok(v.iter().map(|&x| [x, x]).collect())
        } else if pairs && shape == [e, 2] {
            Ok(v.chunks_exact(2).map(|c| [c[0], c[1]]).collect())
        } else {
            let expected = if pairs { format!("[{e}] or [{e}, 2]") } else { format!("[{e}]") };
            Err(self.shape_err(name, &expected, &shape))
        }
    }

    /// `<prefix>.<w>_weight` u8 `[E, R, K/2]` and `<w>_weight_scale` F8_E4M3 `[E, R, K/16]`,
    /// split per expert.
    fn stacked(&mut self, prefix: &str, w: &str) -> Result<Stacked, FormatError> {
        let wname = join(prefix, &format!("{w}_weight"));
        let sname = join(prefix, &format!("{w}_weight_scale"));
        let wshape = self.checked(&wname, Dtype::U8, Some(3))?.shape.clone();
        let sshape = self.checked(&sname, Dtype::F8_E4M3, Some(3))?.shape.clone();
        let (e, r, k) = (wshape[0], wshape[1], wshape[2] * 2);
        if k % BLOCK != 0 {
            return Err(self.bad(&wname, format!("K = {k} is not a multiple of 16")));
        }
        if sshape != [e, r, k / BLOCK] {
            return Err(self.shape_err(&sname, &format!("[{e}, {r}, {}]", k / BLOCK), &sshape));
        }
        let codes = self.read(&wname)?;
        let scales = self.read(&sname)?;
        let per = if r * k == 0 {
            vec![(Vec::new(), Vec::new()); e]
        } else {
            codes
                .chunks_exact(r * k / 2)
                .zip(scales.chunks_exact(r * k / BLOCK))
                .map(|(c, s)| (c.to_vec(), s.to_vec()))
                .collect()
        };
        Ok((per, e, r, k))
    }
}

#[cfg(test)]
mod tests {
    use super::super::quant::quantize_weight;
    use super::*;
    use ::safetensors::tensor::TensorView;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    /// (name, dtype, shape, bytes) -> a safetensors file in `dir`.
    fn write(dir: &Path, file: &str, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) -> PathBuf {
        let views: Vec<(String, TensorView<'_>)> = tensors
            .iter()
            .map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        let bytes = ::safetensors::serialize(views, None).unwrap();
        let p = dir.join(file);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn random_matrix(rng: &mut StdRng, rows: usize, cols: usize) -> Nvfp4Matrix {
        let w: Vec<f32> = (0..rows * cols).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        quantize_weight(&w, rows, cols).unwrap()
    }

    fn linear_tensors(
        m: &Nvfp4Matrix,
        s2_shape: Vec<usize>,
    ) -> Vec<(&'static str, Dtype, Vec<usize>, Vec<u8>)> {
        vec![
            ("l.weight", Dtype::U8, vec![m.rows, m.cols / 2], m.codes.clone()),
            ("l.weight_scale", Dtype::F8_E4M3, vec![m.rows, m.cols / 16], m.scales.clone()),
            ("l.weight_scale_2", Dtype::F32, s2_shape, f32s(&[m.global_scale])),
        ]
    }

    #[test]
    fn linear_round_trips_with_and_without_input_scale() {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = StdRng::seed_from_u64(21);
        let m = random_matrix(&mut rng, 8, 64);
        let mut t = linear_tensors(&m, vec![]);
        let p = write(dir.path(), "a.safetensors", &t);
        let l = load_linear(&p, "l").unwrap();
        assert_eq!(l.weight, m);
        assert_eq!(l.input_scale, None);
        t[2].2 = vec![1];
        t.push(("l.input_scale", Dtype::F32, vec![1], f32s(&[0.25])));
        // An unrelated tensor in the same file must not disturb anything.
        t.push(("other", Dtype::F32, vec![3], f32s(&[1.0, 2.0, 3.0])));
        let p = write(dir.path(), "b.safetensors", &t);
        let l = load_linear(&p, "l").unwrap();
        assert_eq!(l.weight, m);
        assert_eq!(l.input_scale, Some(0.25));
    }

    #[test]
    fn linear_errors_name_file_and_tensor() {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = StdRng::seed_from_u64(22);
        let m = random_matrix(&mut rng, 4, 32);
        let err = |t: &[(&str, Dtype, Vec<usize>, Vec<u8>)], name: &str| {
            let p = write(dir.path(), name, t);
            let e = load_linear(&p, "l").unwrap_err().to_string();
            assert!(e.contains(name), "{e}");
            e
        };
        let mut t = linear_tensors(&m, vec![]);
        t[1].1 = Dtype::U8;
        let e = err(&t, "dtype.safetensors");
        assert!(e.contains("l.weight_scale") && e.contains("F8_E4M3"), "{e}");
        let mut t = linear_tensors(&m, vec![]);
        t[1].2 = vec![2, 4];
        let e = err(&t, "shape.safetensors");
        assert!(e.contains("l.weight_scale") && e.contains("[4, 2]"), "{e}");
        let mut t = linear_tensors(&m, vec![]);
        t[2].2 = vec![1, 1];
        t[2].3 = f32s(&[1.0]);
        let e = err(&t, "scalar.safetensors");
        assert!(e.contains("l.weight_scale_2"), "{e}");
        let t = linear_tensors(&m, vec![]);
        let e = err(&t[..2], "missing.safetensors");
        assert!(e.contains("l.weight_scale_2") && e.contains("missing"), "{e}");
        let mut t = linear_tensors(&m, vec![]);
        t[0].2 = vec![4, 12];
        t[0].3 = vec![0; 48];
        let e = err(&t, "k.safetensors");
        assert!(e.contains("l.weight") && e.contains("24"), "{e}");
        // Not a safetensors file at all, and no file.
        let p = dir.path().join("junk.safetensors");
        std::fs::write(&p, b"\xff\xff\xff\xff\xff\xff\xff\x00junk").unwrap();
        let e = load_linear(&p, "l").unwrap_err().to_string();
        assert!(e.contains("junk.safetensors") && e.contains("header"), "{e}");
        let e = load_linear(dir.path().join("none.safetensors"), "l").unwrap_err().to_string();
        assert!(e.contains("none.safetensors"), "{e}");
    }

    #[test]
    fn expert_stack_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = StdRng::seed_from_u64(23);
        let (e, h, i) = (3, 64, 32);
        let w13: Vec<_> = (0..e).map(|_| random_matrix(&mut rng, 2 * i, h)).collect();
        let w2: Vec<_> = (0..e).map(|_| random_matrix(&mut rng, h, i)).collect();
        let cat = |v: &[Nvfp4Matrix], f: fn(&Nvfp4Matrix) -> &Vec<u8>| -> Vec<u8> {
            v.iter().flat_map(|m| f(m).clone()).collect()
        };
        let s13: Vec<f32> =
            w13.iter().flat_map(|m| [m.global_scale, m.global_scale * 2.0]).collect();
        let s2: Vec<f32> = w2.iter().map(|m| m.global_scale).collect();
        let mut t = vec![
            ("x.w13_weight", Dtype::U8, vec![e, 2 * i, h / 2], cat(&w13, |m| &m.codes)),
            (
                "x.w13_weight_scale",
                Dtype::F8_E4M3,
                vec![e, 2 * i, h / 16],
                cat(&w13, |m| &m.scales),
            ),
            ("x.w13_weight_scale_2", Dtype::F32, vec![e, 2], f32s(&s13)),
            ("x.w2_weight", Dtype::U8, vec![e, h, i / 2], cat(&w2, |m| &m.codes)),
            ("x.w2_weight_scale", Dtype::F8_E4M3, vec![e, h, i / 16], cat(&w2, |m| &m.scales)),
            ("x.w2_weight_scale_2", Dtype::F32, vec![e], f32s(&s2)),
            ("x.w13_input_scale", Dtype::F32, vec![e, 2], f32s(&[1.0, 2.0, 3.0, 0.5, 0.1, 0.2])),
            ("x.w2_input_scale", Dtype::F32, vec![], f32s(&[0.7])),
        ];
        let p = write(dir.path(), "moe.safetensors", &t);
        let s = load_expert_stack(&p, "x").unwrap();
        assert_eq!(s.experts, e);
        assert_eq!(s.w13, w13);
        assert_eq!(s.w2, w2);
        assert!(!s.w13_scales_consistent());
        assert_eq!(s.w13_scale_2[1], [w13[1].global_scale, w13[1].global_scale * 2.0]);
        assert_eq!(s.w13_input_scale, Some(vec![2.0, 3.0, 0.2]));
        assert_eq!(s.w2_input_scale, Some(vec![0.7; 3]));

        // [E] global scales are consistent; input scales are optional.
        t[2] = ("x.w13_weight_scale_2", Dtype::F32, vec![e], f32s(&s2));
        t.truncate(6);
        let p = write(dir.path(), "moe2.safetensors", &t);
        let s = load_expert_stack(&p, "x").unwrap();
        assert!(s.w13_scales_consistent());
        assert_eq!(s.w13_input_scale, None);

        // w2 must be [E, H, I/2] with 2I = w13's rows.
        let good = t.clone();
        t[3].2 = vec![e, h, i];
        t[3].3 = vec![0; e * h * i];
        t[4].2 = vec![e, h, i * 2 / 16];
        t[4].3 = vec![0; e * h * i * 2 / 16];
        let p = write(dir.path(), "moe3.safetensors", &t);
        let msg = load_expert_stack(&p, "x").unwrap_err().to_string();
        assert!(msg.contains("moe3.safetensors") && msg.contains("x.w2_weight"), "{msg}");

        // Wrong per-expert count.
        let mut t2 = good;
        t2[5] = ("x.w2_weight_scale_2", Dtype::F32, vec![2], f32s(&[1.0, 1.0]));
        let p = write(dir.path(), "moe4.safetensors", &t2);
        let msg = load_expert_stack(&p, "x").unwrap_err().to_string();
        assert!(msg.contains("x.w2_weight_scale_2") && msg.contains("[3]"), "{msg}");
    }
}

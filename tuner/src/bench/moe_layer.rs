//! The whole grouped layer timed beside its fixed kernels (`measure_layer`), after its output,
//! and (W4A4) the X it quantized, are checked against the CPU.

use super::*;

/// The workspace's X (`host`, downloaded) is the CPU quantizer's, codes and every scale byte
/// (padding included).
pub(super) fn check_quantized_x(
    host: &[u8],
    l: &WorkspaceLayout,
    q: &W4a4Inputs,
) -> Result<(), MoeBenchError> {
    let codes = &host[l.x_codes..][..q.x_q.codes.len()];
    let sf = &host[l.x_sf..][..q.x_q.sf.len()];
    if let Some(diff) = q.x_q.first_difference(codes, sf) {
        return Err(MoeBenchError::QuantizedX(diff));
    }
    if let Some(i) = (0..sf.len()).find(|&i| sf[i] != q.x_q.sf[i]) {
        return Err(MoeBenchError::QuantizedX(format!("scale padding byte {i}: {:#04x}", sf[i])));
    }
    Ok(())
}

/// Time the whole layer (align + gate_up + down + finalize; W4A4 with bf16 X also the
/// quantization of X) with the given kernels, and the align (both forms) and finalize kernels
/// alone (W4A4 with bf16 X: also the quantization of X alone and launched with the routing);
/// checks finalize's output exactly against the CPU mirror and, for W4A4, the X the layer
/// quantized byte for byte against the CPU quantizer (codes, and every scale byte padding
/// included).
pub fn measure_layer(
    gpu: &Gpu,
    policy: &TimingPolicy,
    launcher: &MoeLauncher<'_>,
    d: &StepData,
    gate_up: &GroupedKernel,
    down: &GroupedKernel,
) -> Result<LayerTimes, MoeBenchError> {
    let a_type = gate_up.config.a_type;
    let layer_args = |c: usize| {
        d.args_for(a_type, c, c, true).ok_or_else(|| {
            MoeBenchError::NoCandidate(MoeOp::GateUp, "the step has no NVFP4 activations".into())
        })
    };
    let args = layer_args(0)?;
    let stream = gpu.own_stream();
    // SAFETY: as in measure_op.
    unsafe { launcher.layer(gate_up, down, &args, &d.ws, stream) }?;
    gpu.synchronize()?;
    let host = d.ws_host(gpu)?;
    let shape = d.step.shape;
    if let (AType::Nvfp4, Some(q)) = (a_type, &d.w4a4) {
        check_quantized_x(&host, &d.ws.layout, q)?;
    }
    let rows: Vec<bf16> = (0..d.schedule.rows() as usize * shape.hidden as usize)
        .map(|i| StepData::bf16_at(&host, d.ws.layout.y_rows, i))
        .collect();
    let want = reference::finalize(
        &rows,
        shape.hidden as usize,
        &d.weights_host,
        &d.schedule.inverse,
        shape.top_k as usize,
    );
    let got = gpu.download(&d.y)?;
    let bad = want.iter().zip(&got).filter(|(a, b)| a.to_bits() != **b).count();
    if bad > 0 {
        return Err(MoeBenchError::Finalize(bad));
    }
    let copies = d.copies13.max(d.copies2);
    let to_gpu = |e: RuntimeError| match e {
        RuntimeError::Gpu(g) => g,
        other => GpuError::Kernel { kernel: "moe".into(), message: other.to_string() },
    };
    let all_copies: Vec<MoeArgs> =
        (0..copies).map(layer_args).collect::<Result<Vec<_>, MoeBenchError>>()?;
    let layer = move |i: usize| {
        // SAFETY: as in measure_op; weight copy i % copies lies inside the weight buffers.
        unsafe { launcher.layer(gate_up, down, &all_copies[i % copies], &d.ws, stream) }
    };
    let align = move |form| {
        // SAFETY: as in measure_op.
        unsafe { launcher.align_as(form, &args, &d.ws, stream) }
    };
    let finalize = move |_| {
        // SAFETY: as in measure_op.
        unsafe { launcher.finalize(&args, &d.ws, stream) }
    };
    let mut launches: Vec<LaunchFn<'_>> = vec![
        Box::new(move |i| layer(i).map_err(to_gpu)),
        Box::new(move |_| align(AlignForm::OneCta).map_err(to_gpu)),
        Box::new(move |_| align(AlignForm::Chunked).map_err(to_gpu)),
        Box::new(move |i| finalize(i).map_err(to_gpu)),
    ];
    // W4A4 with bf16 X: the quantization of X alone, and with the routing in one launch where
    // the layer takes that
    let quantizes = args.quantizes_x();
    let fused = launcher.fused_quantize_ctas(&args, &d.ws).is_some();
    if quantizes {
        launches.push(Box::new(move |_| {
            // SAFETY: as in measure_op; X is the step's bf16 X.
            unsafe { launcher.quantize_x(&args, &d.ws, stream) }.map_err(to_gpu)
        }));
    }
    if fused {
        launches.push(Box::new(move |_| {
            // SAFETY: as in measure_op; ids and X are the step's.
            unsafe { launcher.align_quantize_x(&args, &d.ws, stream) }.map_err(to_gpu)
        }));
    }
    let mut t = measure(gpu, policy, copies, launches)
        .into_iter()
        .map(|r| r.map(|s| Summary::of(&s.us).expect("samples")).map_err(MoeBenchError::Gpu));
    Ok(LayerTimes {
        layer: t.next().unwrap()?,
        align_one_cta: t.next().unwrap()?,
        align_chunked: t.next().unwrap()?,
        finalize: t.next().unwrap()?,
        quantize_x: if quantizes { Some(t.next().unwrap()?) } else { None },
        align_quantize_x: if fused { Some(t.next().unwrap()?) } else { None },
    })
}

/// Times of the whole layer and of its fixed kernels.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LayerTimes {
    pub layer: Summary,
    /// moe_align in both forms (`AlignForm`); the layer takes `AlignForm::for_ids`'s.
    pub align_one_cta: Summary,
    pub align_chunked: Summary,
    pub finalize: Summary,
    /// W4A4 with bf16 X: the quantization of X alone, and the one-CTA routing with it in one
    /// launch where the layer takes that (`MoeLauncher::fused_quantize_ctas`).
    pub quantize_x: Option<Summary>,
    pub align_quantize_x: Option<Summary>,
}

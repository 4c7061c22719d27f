#!/usr/bin/env python3
"""One GLM-5 routed-expert MoE layer (TP8 shapes: 256 experts, top-8) through libfp4tune's grouped
MoE ABI on PyTorch tensors, W4A16, captured in a CUDA graph, checked against torch.

    router:  topk_ids, topk_weights = topk(softmax(logits)), renormalized
    layer:   Y[t] = sum_s w[t, s] * down_e( SiLU(gate_e(X[t])) * up_e(X[t]) ),  e = topk_ids[t, s]

Weights are random, quantized to NVFP4 with the ModelOpt rules (examples/python/glm5_expert.py),
stacked per expert as the ABI expects (fp4tune.h, "Grouped MoE layer"), their codes prepared once
for the grouped kernels (fp4tune_moe_prepare_weights, in place). The layer runs as one
`fp4tune_moe_layer` call on the current torch stream (align, gate_up with SiLU * up, down,
weighted sum), eagerly and inside a CUDA graph (the graph's output must equal the eager one), and
is compared with a torch reference on the block-dequantized weights. Then one decode step is timed
under graph replay with cold L2 (launches rotate over weight copies) against torch._grouped_mm
BF16 on the same routing (bf16 copies of the same weights).

Run from the repository root after `cargo build --release` with a table that has grouped entries
(`fp4tune tune` writes them):

    python3 examples/python/glm5_moe_layer.py --table results/nvidia-h200.ron [--tokens 1 8 64 256]
"""
import argparse
import ctypes
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from glm5_expert import quantize_weight, swizzle_scales  # noqa: E402

HIDDEN, INTER, EXPERTS, TOP_K = 6144, 256, 256, 8  # GLM-5 at TP8
EXPERTS_TOTAL = EXPERTS  # the model's routed experts: all of them on every GPU under TP
ABI_VERSION = 3  # FP4TUNE_ABI_VERSION of the declarations below
TOL_LAYER = 2.0**-5  # H is rounded to bf16 before down in both; f32 summation order differs


class MoeArgs(ctypes.Structure):
    """fp4tune_moe_args. The fields after expert_begin are the W4A4 extension (w4a4, the input
    scales of X and H, X already in NVFP4); ctypes zero-initializes them: a W4A16 call."""
    _fields_ = [(name, ctypes.c_uint64) for name in
                ("x", "topk_ids", "topk_weights", "w13", "w13_sf", "alpha13", "w2", "w2_sf", "alpha2", "y")] + [
        ("tokens", ctypes.c_uint32), ("expert_begin", ctypes.c_int32),
        ("w4a4", ctypes.c_uint32), ("x_scale", ctypes.c_float), ("h_scale", ctypes.c_float),
        ("reserved", ctypes.c_uint32), ("x_fp4", ctypes.c_uint64), ("x_sf", ctypes.c_uint64)]


class StackedWeights:
    """E experts of one projection: codes [E, N, K/2], swizzled scales [E, sf_bytes], alphas [E],
    and the block-dequantized bf16 copy [E, N, K] for the reference."""

    def __init__(self, n, k, experts, gen):
        codes, sfs, alphas, deqs = [], [], [], []
        for _ in range(experts):
            w = torch.randn(n, k, generator=gen, device="cuda") * 0.02
            packed, sf, s2, deq = quantize_weight(w)
            codes.append(packed)
            sfs.append(swizzle_scales(sf))
            alphas.append(s2)
            deqs.append(deq.to(torch.bfloat16))
        self.codes = torch.stack(codes).contiguous()
        self.sf = torch.stack(sfs).contiguous()
        self.alpha = torch.tensor(alphas, dtype=torch.float32, device="cuda")
        self.deq = torch.stack(deqs)  # without alpha


def route(tokens, gen):
    logits = torch.randn(tokens, EXPERTS, generator=gen, device="cuda")
    w, ids = torch.softmax(logits, dim=-1).topk(TOP_K, dim=-1)
    return ids.to(torch.int32).contiguous(), (w / w.sum(dim=-1, keepdim=True)).float().contiguous()


def reference(x, ids, weights, w13, w2):
    """torch on the dequantized weights, alpha after each product, H rounded to bf16 like the kernel."""
    y = torch.zeros(x.shape[0], HIDDEN, dtype=torch.float32, device="cuda")
    for e in ids.unique().tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        xe = x[tok].float()
        g = (xe @ w13.deq[e, :INTER].float().t()) * w13.alpha[e]
        u = (xe @ w13.deq[e, INTER:].float().t()) * w13.alpha[e]
        h = (g / (1 + torch.exp(-g)) * u).to(torch.bfloat16).float()
        ye = ((h @ w2.deq[e].float().t()) * w2.alpha[e]).to(torch.bfloat16).float()
        y.index_add_(0, tok, ye * weights[tok, slot].unsqueeze(1))
    return y.to(torch.bfloat16)


def graph_us(fns, reps=20):
    """Median microseconds per call of fns (one after the other) under CUDA-graph replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fns[0]()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    for _ in range(3):
        g.replay()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / len(fns))
    return sorted(ts)[reps // 2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--table", default=os.environ.get("FP4TUNE_TABLE"))
    ap.add_argument("--lib", default=os.environ.get("FP4TUNE_LIB", "target/release/libfp4tune.so"))
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--copies", type=int, default=8, help="weight copies rotated for cold-L2 timing")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device visible to torch")
        return 2
    if not args.table:
        print("a table with grouped MoE entries is needed (--table)")
        return 2
    gen = torch.Generator(device="cuda").manual_seed(0)
    w13 = StackedWeights(2 * INTER, HIDDEN, EXPERTS, gen)
    w2 = StackedWeights(HIDDEN, INTER, EXPERTS, gen)

    lib = ctypes.CDLL(args.lib)
    lib.fp4tune_last_error.restype = ctypes.c_char_p
    lib.fp4tune_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
    i32 = ctypes.c_int32
    lib.fp4tune_abi_version.restype = ctypes.c_uint32
    if lib.fp4tune_abi_version() != ABI_VERSION:
        print(f"{args.lib}: ABI version {lib.fp4tune_abi_version()}, this example declares {ABI_VERSION}")
        return 2
    lib.fp4tune_moe_workspace_create.argtypes = [ctypes.c_void_p, i32, i32, i32, i32, i32, i32,
                                                 ctypes.POINTER(ctypes.c_void_p)]
    lib.fp4tune_moe_workspace_destroy.argtypes = [ctypes.c_void_p]
    lib.fp4tune_moe_layer.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(MoeArgs), ctypes.c_uint64]
    lib.fp4tune_moe_route.argtypes = [ctypes.c_void_p, i32, i32, i32, i32, i32, i32, ctypes.c_char_p,
                                      ctypes.c_size_t]
    u32, u64 = ctypes.c_uint32, ctypes.c_uint64
    for f in (lib.fp4tune_moe_prepare_weights, lib.fp4tune_moe_restore_weights):
        f.argtypes = [ctypes.c_void_p, i32, i32, i32, u32, u64, u64]
    W13, W2 = 0, 1  # FP4TUNE_MOE_W13, FP4TUNE_MOE_W2

    def prepare(codes, projection):
        return lib.fp4tune_moe_prepare_weights(d, HIDDEN, INTER, EXPERTS, projection, codes.data_ptr(), stream)
    lib.fp4tune_close.argtypes = [ctypes.c_void_p]

    def check(status, what):
        if status != 0:
            raise RuntimeError(f"{what}: status {status}: {lib.fp4tune_last_error().decode()}")

    d = ctypes.c_void_p()
    check(lib.fp4tune_open(args.table.encode(), 0, ctypes.byref(d)), "fp4tune_open")
    max_tokens = max(args.tokens)
    ws = ctypes.c_void_p()
    check(lib.fp4tune_moe_workspace_create(d, HIDDEN, INTER, EXPERTS, TOP_K, EXPERTS_TOTAL, max_tokens,
                                           ctypes.byref(ws)),
          "fp4tune_moe_workspace_create")
    # weight copies for cold-L2 timing (the quantized bytes and the torch peer's bf16 weights)
    copies13 = [(w13.codes, w13.sf)] + [(w13.codes.clone(), w13.sf.clone()) for _ in range(args.copies - 1)]
    copies2 = [(w2.codes, w2.sf)] + [(w2.codes.clone(), w2.sf.clone()) for _ in range(args.copies - 1)]
    stream = torch.cuda.current_stream().cuda_stream
    # a launch on codes in the ModelOpt layout is refused; preparing puts every copy's codes into
    # the grouped kernels' layout once (in place); restoring gives the same bytes back
    probe = torch.zeros(1, dtype=torch.int32, device="cuda")
    unprepared = MoeArgs(probe.data_ptr(), probe.data_ptr(), probe.data_ptr(), w13.codes.data_ptr(),
                         w13.sf.data_ptr(), w13.alpha.data_ptr(), w2.codes.data_ptr(), w2.sf.data_ptr(),
                         w2.alpha.data_ptr(), probe.data_ptr(), 1, 0)
    refused = lib.fp4tune_moe_layer(d, ws, ctypes.byref(unprepared), stream) != 0
    ok = refused and b"not prepared" in lib.fp4tune_last_error()
    print(f"unprepared weights refused: {ok} ({lib.fp4tune_last_error().decode()})")
    original = w13.codes.clone()
    for projection, copies in ((W13, copies13), (W2, copies2)):
        for codes, _ in copies:
            check(prepare(codes, projection), "fp4tune_moe_prepare_weights")
    # the sm90 grouped kernels read the grouped layout; a family that reads the ModelOpt layout
    # as loaded (sm120) only records the codes
    moved = not torch.equal(w13.codes, original) or torch.cuda.get_device_capability()[0] != 9
    check(lib.fp4tune_moe_restore_weights(d, HIDDEN, INTER, EXPERTS, W13, w13.codes.data_ptr(), stream),
          "fp4tune_moe_restore_weights")
    restored = torch.equal(w13.codes, original)
    check(prepare(w13.codes, W13), "fp4tune_moe_prepare_weights")
    twice = prepare(w13.codes, W13) != 0
    print(f"prepare moves the codes: {moved}, restore gives them back: {restored}, "
          f"preparing twice refused: {twice}")
    ok &= moved and restored and twice
    print("B,fp4tune_layer_us,torch_grouped_mm_bf16_us,speedup,max_rel_err,graph_equal,route")
    for b in args.tokens:
        x = (torch.randn(b, HIDDEN, generator=gen, device="cuda") * 0.5).to(torch.bfloat16)
        ids, weights = route(b, gen)
        y = torch.empty(b, HIDDEN, dtype=torch.bfloat16, device="cuda")

        def call(c=0, out=y):
            a = MoeArgs(x.data_ptr(), ids.data_ptr(), weights.data_ptr(), copies13[c][0].data_ptr(),
                        copies13[c][1].data_ptr(), w13.alpha.data_ptr(), copies2[c][0].data_ptr(),
                        copies2[c][1].data_ptr(), w2.alpha.data_ptr(), out.data_ptr(), b, 0)
            check(lib.fp4tune_moe_layer(d, ws, ctypes.byref(a), torch.cuda.current_stream().cuda_stream),
                  "fp4tune_moe_layer")

        call()
        torch.cuda.synchronize()
        ref = reference(x, ids, weights, w13, w2)
        err = ((y.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
        # the same call captured in a CUDA graph gives the same bits
        y_graph = torch.empty_like(y)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            call(out=y_graph)
        g.replay()
        torch.cuda.synchronize()
        equal = torch.equal(y, y_graph)
        # one decode step, cold L2: fp4tune vs torch._grouped_mm BF16 (both projections, same rows)
        t_fp4 = graph_us([lambda c=c: call(c) for c in range(args.copies)])
        counts = torch.bincount(ids.flatten().long(), minlength=EXPERTS)
        order = torch.argsort(ids.flatten().long(), stable=True)
        xs = x[order // TOP_K].contiguous()
        offs = torch.cumsum(counts, 0).to(torch.int32)
        w13t = [w13.deq.transpose(1, 2)] + [w13.deq.clone().transpose(1, 2) for _ in range(1)]
        w2t = [w2.deq.transpose(1, 2)] + [w2.deq.clone().transpose(1, 2) for _ in range(1)]

        def torch_step(c):
            h1 = torch._grouped_mm(xs, w13t[c], offs=offs)
            h = torch.nn.functional.silu(h1[:, :INTER]) * h1[:, INTER:]
            return torch._grouped_mm(h, w2t[c], offs=offs)

        t_torch = graph_us([lambda c=c: torch_step(c) for c in range(len(w13t))])
        buf = ctypes.create_string_buffer(512)
        check(lib.fp4tune_moe_route(d, HIDDEN, INTER, EXPERTS, TOP_K, EXPERTS_TOTAL, b, buf, len(buf)),
              "fp4tune_moe_route")
        good = err <= TOL_LAYER and equal
        ok &= good
        print(f"{b},{t_fp4:.2f},{t_torch:.2f},{t_torch / t_fp4:.2f},{err:.2e},{equal},{buf.value.decode()}"
              + ("" if good else "  <-- FAIL"))
    lib.fp4tune_moe_workspace_destroy(ws)
    lib.fp4tune_close(d)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""GLM-5 routed-expert forward (TP8 shapes) through libfp4tune, W4A16, on PyTorch tensors.

    gate_up: Y1[M, 512]  = X[M, 6144] * W13[512, 6144]^T     (rows 0..255 gate, 256..511 up)
    act:     H[M, 256]   = SiLU(Y1[:, :256]) * Y1[:, 256:]
    down:    Y[M, 6144]  = H[M, 256] * W2[6144, 256]^T

Weights are random, quantized to NVFP4 here with the ModelOpt rules (global scale amax/2688,
E4M3 block scales per 16 K elements, E2M1 codes with round-half-to-even and saturation), their
scales swizzled into the 128x4 layout, and the GEMMs run through the C ABI on the current torch
stream. The reference is torch in bf16 on the dequantized weights (block-dequantized values are
exact in bf16; the global scale is applied after the product, as the kernels do).

Run from the repository root after `cargo build --release` (only torch is needed):

    python3 examples/python/glm5_expert.py [--table results/nvidia-h200.ron] [--tokens 1 4 32 256]

Library: $FP4TUNE_LIB, else target/release/libfp4tune.so. Without --table (or $FP4TUNE_TABLE)
the dispatcher uses the family default configuration for every shape.
"""
import argparse
import ctypes
import os
import sys

import torch

HIDDEN, INTER_TP8 = 6144, 256  # GLM-5 hidden size; moe_intermediate_size 2048 / TP8
A_BF16 = 1

# Tolerances (relative to max |reference| of the compared tensor):
#  - each GEMM against an fp32 reference on the same inputs: bf16 output rounding (2^-8) plus
#    f32 summation-order noise -> 2^-7;
#  - the whole expert against the torch bf16 reference: the intermediate H is rounded differently
#    (fp32 epilogue vs bf16 matmul output) and that propagates through down -> 2^-5.
TOL_GEMM = 2.0**-7
TOL_EXPERT = 2.0**-5


# ---------------------------------------------------------------- NVFP4 quantization (ModelOpt)
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> E2M1 codes (uint8, sign in bit 3), round half to even, saturating at 6."""
    a = x.abs().clamp(max=6.0)
    # Tie points go to the even code: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4.
    code = (
        (a > 0.25).to(torch.uint8)
        + (a >= 0.75)
        + (a > 1.25)
        + (a >= 1.75)
        + (a > 2.5)
        + (a >= 3.5)
        + (a > 5.0)
    ).to(torch.uint8)
    return code | ((x < 0).to(torch.uint8) << 3)


def e2m1_decode(code: torch.Tensor) -> torch.Tensor:
    v = E2M1_VALUES.to(code.device)[(code & 7).long()]
    return torch.where((code & 8) != 0, -v, v)


def quantize_weight(w: torch.Tensor):
    """ModelOpt NVFP4 weight quantization of w [N, K] (K % 16 == 0).

    Returns (packed codes uint8 [N, K/2], block scales float8_e4m3fn [N, K/16] row-major,
    global scale s2 (float), block-dequantized weights fp32 [N, K] (without s2))."""
    n, k = w.shape
    w = w.float()
    s2 = w.abs().max().item() / (6.0 * 448.0)
    blocks = w.view(n, k // 16, 16)
    s = blocks.abs().amax(dim=2) / (6.0 * s2)
    s = torch.where(s == 0, torch.ones_like(s), s).clamp(min=2.0**-9)
    sf = s.to(torch.float8_e4m3fn)  # round to nearest even
    q = blocks / (sf.float().unsqueeze(2) * s2)
    codes = e2m1_encode(q).view(n, k)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)  # element 2j in the low nibble
    deq = (e2m1_decode(codes).view(n, k // 16, 16) * sf.float().unsqueeze(2)).view(n, k)
    return packed.contiguous(), sf, s2, deq


def swizzle_scales(sf: torch.Tensor) -> torch.Tensor:
    """Row-major scales [R, C] (E4M3) -> the swizzled 128x4 layout (bytes, uint8), rows padded to
    128 and columns to 4. Byte offset of (r, c), Cp = C padded to 4 (fp4tune.h, nvfp4-format.md):
        ((r // 128) * (Cp // 4) + c // 4) * 512 + (r % 32) * 16 + ((r // 32) % 4) * 4 + c % 4
    """
    r, c = sf.shape
    rp, cp = (r + 127) // 128 * 128, (c + 3) // 4 * 4
    padded = torch.zeros(rp, cp, dtype=torch.uint8, device=sf.device)
    padded[:r, :c] = sf.view(torch.uint8)
    # r = r128*128 + r4*32 + r32, c = c4*4 + cc  ->  order (r128, c4, r32, r4, cc)
    out = padded.view(rp // 128, 4, 32, cp // 4, 4).permute(0, 3, 2, 1, 4).contiguous().view(-1)
    # Check the reshape against the documented formula on a few positions.
    g = torch.Generator().manual_seed(0)
    for _ in range(16):
        i, j = torch.randint(r, (1,), generator=g).item(), torch.randint(c, (1,), generator=g).item()
        off = ((i // 128) * (cp // 4) + j // 4) * 512 + (i % 32) * 16 + ((i // 32) % 4) * 4 + j % 4
        assert out[off].item() == padded[i, j].item(), (i, j, off)
    return out


class QuantLinear:
    """An NVFP4 weight on the GPU in fp4tune's layout, plus its bf16 block-dequantized copy."""

    def __init__(self, w: torch.Tensor):
        packed, sf, s2, deq = quantize_weight(w)
        self.n, self.k = w.shape
        self.codes = packed.cuda()
        self.sf = swizzle_scales(sf).cuda()
        self.alpha = float(s2)
        self.w_bf16 = deq.to(torch.bfloat16).cuda()  # exact: e2m1 * e4m3 has <= 6 significant bits
        assert torch.equal(self.w_bf16.float().cpu(), deq), "block-dequantized weights exact in bf16"


# ------------------------------------------------------------------------------ libfp4tune
class Fp4tune:
    def __init__(self, lib_path: str, table, device: int):
        self.lib = ctypes.CDLL(lib_path)
        L, u64, i32, c = self.lib, ctypes.c_uint64, ctypes.c_int32, ctypes.c_int
        L.fp4tune_last_error.restype = ctypes.c_char_p
        L.fp4tune_open.argtypes = [ctypes.c_char_p, c, ctypes.POINTER(ctypes.c_void_p)]
        L.fp4tune_gemm.argtypes = [ctypes.c_void_p, u64, u64, u64, u64, u64, i32, i32, i32, c,
                                   ctypes.c_float, u64]
        L.fp4tune_route.argtypes = [ctypes.c_void_p, i32, i32, i32, c, ctypes.c_char_p, ctypes.c_size_t]
        L.fp4tune_report.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
        L.fp4tune_close.argtypes = [ctypes.c_void_p]
        self.handle = ctypes.c_void_p()
        path = table.encode() if table else None
        self._check(L.fp4tune_open(path, device, ctypes.byref(self.handle)), "fp4tune_open")

    def _check(self, status, what):
        if status != 0:
            raise RuntimeError(f"{what}: status {status}: {self.lib.fp4tune_last_error().decode()}")

    def report(self) -> str:
        buf = ctypes.create_string_buffer(16384)
        self._check(self.lib.fp4tune_report(self.handle, buf, len(buf)), "fp4tune_report")
        return buf.value.decode()

    def route(self, m, n, k) -> str:
        buf = ctypes.create_string_buffer(512)
        self._check(self.lib.fp4tune_route(self.handle, m, n, k, A_BF16, buf, len(buf)), "fp4tune_route")
        return buf.value.decode()

    def linear(self, x: torch.Tensor, w: QuantLinear) -> torch.Tensor:
        """Y = alpha * x @ deq(W)^T, x bf16 [M, K] contiguous, on the current torch stream."""
        assert x.dtype == torch.bfloat16 and x.is_contiguous() and x.shape[1] == w.k
        m = x.shape[0]
        y = torch.empty(m, w.n, dtype=torch.bfloat16, device=x.device)
        stream = torch.cuda.current_stream().cuda_stream
        self._check(
            self.lib.fp4tune_gemm(self.handle, x.data_ptr(), 0, w.codes.data_ptr(), w.sf.data_ptr(),
                                  y.data_ptr(), m, w.n, w.k, A_BF16, w.alpha, stream),
            "fp4tune_gemm")
        return y

    def close(self):
        if self.handle:
            torch.cuda.synchronize()
            self.lib.fp4tune_close(self.handle)
            self.handle = ctypes.c_void_p()


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.float() - ref.float()).abs().max() / ref.float().abs().max().clamp(min=1e-30)).item()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--table", default=os.environ.get("FP4TUNE_TABLE"))
    ap.add_argument("--lib", default=os.environ.get("FP4TUNE_LIB", "target/release/libfp4tune.so"))
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 32, 256])
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device visible to torch")
        return 2
    torch.cuda.set_device(args.device)
    torch.manual_seed(0)

    # One routed expert at TP8 (gate and up fused, as checkpoints store w13), with outliers.
    def weight(n, k):
        w = torch.randn(n, k) * 0.02
        w.view(-1)[torch.randint(n * k, (n * k // 256,))] *= 8.0
        return w

    gate_up = QuantLinear(weight(2 * INTER_TP8, HIDDEN))
    down = QuantLinear(weight(HIDDEN, INTER_TP8))

    fp4 = Fp4tune(args.lib, args.table, args.device)
    print(fp4.report())
    ok = True
    try:
        for m in args.tokens:
            x = (torch.randn(m, HIDDEN) * 0.5).to(torch.bfloat16).cuda()
            # fp4tune expert forward.
            y1 = fp4.linear(x, gate_up)
            h = (torch.nn.functional.silu(y1[:, :INTER_TP8].float()) * y1[:, INTER_TP8:].float()).to(torch.bfloat16)
            y = fp4.linear(h.contiguous(), down)
            torch.cuda.synchronize()
            # Per GEMM, against fp32 on the same inputs.
            e1 = rel_err(y1, gate_up.alpha * (x.float() @ gate_up.w_bf16.float().T))
            e2 = rel_err(y, down.alpha * (h.float() @ down.w_bf16.float().T))
            # Whole expert, against torch bf16 on the dequantized weights.
            r1 = ((x @ gate_up.w_bf16.T).float() * gate_up.alpha).to(torch.bfloat16)
            rh = (torch.nn.functional.silu(r1[:, :INTER_TP8].float()) * r1[:, INTER_TP8:].float()).to(torch.bfloat16)
            ref = ((rh @ down.w_bf16.T).float() * down.alpha).to(torch.bfloat16)
            e3 = rel_err(y, ref)
            max_abs = (y.float() - ref.float()).abs().max().item()
            passed = e1 <= TOL_GEMM and e2 <= TOL_GEMM and e3 <= TOL_EXPERT and torch.isfinite(y).all().item()
            ok &= passed
            print(f"M={m:4d}: gate_up {fp4.route(m, 2 * INTER_TP8, HIDDEN)}")
            print(f"        down    {fp4.route(m, HIDDEN, INTER_TP8)}")
            print(f"        rel err gate_up {e1:.2e}, down {e2:.2e} (tol {TOL_GEMM:.2e}); expert vs torch bf16 "
                  f"{e3:.2e} (tol {TOL_EXPERT:.2e}), max abs err {max_abs:.3e}: {'PASS' if passed else 'FAIL'}")
        fallbacks = [l.strip() for l in fp4.report().splitlines() if l.strip().startswith("fallback:")]
        print("\n".join(fallbacks) if fallbacks else "no fallbacks: every shape was in the table")
    finally:
        fp4.close()
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

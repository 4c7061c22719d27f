"""Peers of the grouped MoE benchmark, on the same routings as `fp4tune bench --moe`.

For each shape set and token count B, the routing is drawn exactly as fp4tune draws it
(SplitMix64 seeded with 1000 + B, each token drawing experts until it has top_k distinct ones;
see tuner/src/moe/schedule.rs), the routed rows are grouped by local expert, and each peer runs
one projection over all of them:
  torch_grouped_mm_bf16        torch._grouped_mm with bf16 weights
  torch_scaled_grouped_mm_fp8  torch._scaled_grouped_mm with FP8 e4m3 weights and activations
                               (per-row activation and per-column weight scales)
Timing: CUDA-graph replay over weight copies whose total exceeds 4x L2 (cold), median of 25
replays after warm-up. Output: CSV rows in bench-moe.csv's format (roofline and read-floor columns
are 0: fp4tune's report measures those itself).

Usage: python3 scripts/moe_peers.py --sets tp8,ep8 --m 1,8,64,256 --out peers.csv
       python3 scripts/moe_peers.py --sets "" --layer tp8=4096,192,128,128,8 --m 1,8 --out peers.csv
(--layer NAME=hidden,inter,local experts,experts of the model,top_k: a layer of another model,
its rows labelled NAME as `fp4tune bench --moe --shapes FILE --set NAME` labels its own)
"""
import argparse
import math

try:
    import torch
except ImportError:  # said after the arguments are checked
    torch = None

SETS = {
    # name: (hidden, inter per GPU, local experts, experts of the model, top_k)
    "tp8": (6144, 256, 256, 256, 8),
    "ep8": (6144, 2048, 32, 256, 8),
}
MASK = (1 << 64) - 1


class SplitMix64:
    def __init__(self, seed):
        self.s = seed & MASK

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & MASK
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def below(self, n):
        return self.next() % n


def draw_routing(seed, tokens, top_k, experts_total):
    g = SplitMix64(seed)
    ids = []
    for _ in range(tokens):
        picked = []
        while len(picked) < min(top_k, experts_total):
            e = g.below(experts_total)
            if e not in picked:
                picked.append(e)
        ids.extend(picked)
    return ids


def graph_time(fns, reps=25):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns[:2]:
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / len(fns))
    ts.sort()
    n = len(ts)
    half = 1.96 * math.sqrt(n) / 2
    lo = ts[max(int(n / 2 - half), 1) - 1]
    hi = ts[min(math.ceil(n / 2 + half), n) - 1]
    return ts[n // 2], lo, hi


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", default="tp8,ep8")
    ap.add_argument("--m", default="1,2,4,8,16,32,64,128,256,1024,4096")
    ap.add_argument("--out", required=True)
    ap.add_argument("--layer", action="append", default=[],
                    help="NAME=hidden,inter,local experts,experts of the model,top_k (repeatable)")
    args = ap.parse_args()
    layers = []
    for name in (n for n in args.sets.split(",") if n):
        if name not in SETS:
            raise SystemExit(f"--sets: unknown set {name!r} (built in: {', '.join(SETS)}; other layers: --layer)")
        layers.append((name, SETS[name]))
    for spec in args.layer:
        name, _, dims = spec.partition("=")
        try:
            hidden, inter, experts, total, top_k = (int(v) for v in dims.split(","))
        except ValueError:
            raise SystemExit(f"--layer {spec!r}: expected NAME=hidden,inter,local experts,experts of the model,top_k")
        if not name or "," in name or name != name.strip():
            raise SystemExit(f"--layer {spec!r}: NAME must be a non-empty label without commas or spaces around it")
        if min(hidden, inter, experts, total, top_k) <= 0 or experts > total or top_k > total:
            raise SystemExit(f"--layer {spec!r}: sizes must be positive, local experts and top_k at most the experts of the model")
        layers.append((name, (hidden, inter, experts, total, top_k)))
    names = [n for n, _ in layers]
    if len(set(names)) != len(names):
        raise SystemExit(f"a layer label given twice: {names}")
    if torch is None:
        raise SystemExit("moe_peers.py needs PyTorch with CUDA: `import torch` failed")
    dev = torch.device("cuda")
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 60 << 20)
    rows = ["op,N,K,experts,top_k,B,impl,median_us,lo_us,hi_us,roofline_us,read_floor_us,set,active_experts,config,verified,failed"]
    torch.manual_seed(0)
    for name, (hidden, inter, experts, total, top_k) in layers:
        for op, n, k in (("moe_gate_up", 2 * inter, hidden), ("moe_down", hidden, inter)):
            layer_bytes = experts * n * k * 2
            copies = max(2, math.ceil(4 * l2 / layer_bytes))
            wb = [torch.randn(experts, n, k, dtype=torch.bfloat16, device=dev) * 0.02 for _ in range(copies)]
            w8 = [w.to(torch.float8_e4m3fn) for w in wb]
            sw = torch.ones(experts, n, device=dev)
            for b in [int(v) for v in args.m.split(",")]:
                ids = torch.tensor(draw_routing(1000 + b, b, top_k, total))
                local = ids[ids < experts]
                counts = torch.bincount(local, minlength=experts)
                t = int(counts.sum())
                if t == 0:
                    continue
                active = int((counts > 0).sum())
                x = torch.randn(t, k, dtype=torch.bfloat16, device=dev)
                offs = torch.cumsum(counts, 0).to(torch.int32).to(dev)
                try:
                    med, lo, hi = graph_time([lambda w=w: torch._grouped_mm(x, w.transpose(1, 2), offs=offs) for w in wb])
                    rows.append(f"{op},{n},{k},{experts},{top_k},{b},torch_grouped_mm_bf16,{med:.3f},{lo:.3f},{hi:.3f},0,0,{name},{active},bf16 weights,0,0")
                except Exception as ex:  # a peer that cannot run is reported, not fatal
                    print(f"# {name} {op} B={b}: torch._grouped_mm failed: {ex}")
                try:
                    x8 = x.to(torch.float8_e4m3fn)
                    sx = torch.ones(t, device=dev)
                    med, lo, hi = graph_time([
                        lambda w=w: torch._scaled_grouped_mm(x8, w.transpose(1, 2), sx, sw, offs=offs, out_dtype=torch.bfloat16)
                        for w in w8
                    ])
                    rows.append(f"{op},{n},{k},{experts},{top_k},{b},torch_scaled_grouped_mm_fp8,{med:.3f},{lo:.3f},{hi:.3f},0,0,{name},{active},fp8 e4m3 weights,0,0")
                except Exception as ex:
                    print(f"# {name} {op} B={b}: torch._scaled_grouped_mm failed: {str(ex)[:200]}")
                print(rows[-1], flush=True)
            del wb, w8
            torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        f.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()

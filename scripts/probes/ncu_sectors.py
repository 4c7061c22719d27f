#!/usr/bin/env python3
"""Where a kernel's global traffic and warp stalls come from, per SASS instruction class, from the
source page of an Nsight Compute report:

    ncu --import report.ncu-rep --page source --print-source sass --csv > source.csv
    python3 scripts/probes/ncu_sectors.py source.csv [kernel index]

Global loads and stores are grouped by their SASS form (cp.async of 16 or 4 bytes, 16-byte LDG,
...), each with its L2 sectors (theoretical: what the accesses touch), the excessive ones (sectors
a perfectly coalesced access would not touch) and the instructions executed; then the sampled warp
stall reasons, where the long-scoreboard samples sit (with the instruction before each) and the
opcodes the samples sat on."""
import collections
import csv
import sys


def kernels(path):
    """(name, rows) per kernel of the CSV (each block starts with a "Kernel Name" line)."""
    name, block, out = None, [], []
    for line in open(path, encoding="utf-8", errors="replace").read().split("\n"):
        if line.startswith('"Kernel Name"'):
            if name is not None:
                out.append((name, block))
            name, block = next(csv.reader([line]))[1], []
        elif name is not None:
            block.append(line)
    if name is not None:
        out.append((name, block))
    return out


def num(v):
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0


def load_class(sass):
    op = sass.split()[0] if sass else "?"
    if op.startswith("@"):
        op = sass.split()[1]
    return op, {"LDGSTS.E.BYPASS.128": "cp.async 16 B", "LDGSTS.E": "cp.async 4 B",
                "LDG.E.128": "LDG 16 B", "LDG.E.128.CONSTANT": "LDG 16 B (constant)"}.get(op, op)


NEEDED = ("Source", "Instructions Executed", "L2 Theoretical Sectors Global",
          "L2 Theoretical Sectors Global Excessive", "Warp Stall Sampling (All Samples)", "stall_long_sb")


def fail(message):
    sys.exit(f"ncu_sectors.py: {message}")


def main():
    if len(sys.argv) not in (2, 3):
        fail("usage: ncu_sectors.py <source page CSV> [kernel index]")
    path = sys.argv[1]
    try:
        found = kernels(path)
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    if not found:
        fail(f"{path}: no \"Kernel Name\" line (not the CSV of `ncu --page source --csv`?)")
    which = sys.argv[2] if len(sys.argv) > 2 else "0"
    if not which.isdigit() or int(which) >= len(found):
        fail(f"{path}: no kernel {which!r} (it holds {len(found)}, indices from 0)")
    name, block = found[int(which)]
    rows = list(csv.reader(block))
    hdr = {h: i for i, h in enumerate(rows[0])} if rows else {}
    missing = [h for h in NEEDED if h not in hdr]
    if missing:
        fail(f"{path}: kernel {name} has no column {missing[0]!r} (not the CSV of "
             "`ncu --page source --print-source sass --csv` of a --set full report?)")
    data = [r for r in rows[1:] if len(r) == len(hdr)]
    col = lambda r, h: num(r[hdr[h]])
    sectors, excess, instr = collections.Counter(), collections.Counter(), collections.Counter()
    for r in data:
        s = col(r, "L2 Theoretical Sectors Global")
        if s == 0:
            continue
        _, cls = load_class(r[hdr["Source"]].strip())
        sectors[cls] += s
        excess[cls] += col(r, "L2 Theoretical Sectors Global Excessive")
        instr[cls] += col(r, "Instructions Executed")
    total = sum(sectors.values()) or 1.0
    print(f"kernel {name}")
    print(f"global L2 sectors: {total / 1e6:.2f} M ({total * 32 / 1e6:.1f} MB)")
    print(f"{'access':24s} {'sectors M':>10s} {'share':>6s} {'excessive M':>12s} {'instructions M':>15s}")
    for cls, s in sectors.most_common():
        print(f"{cls:24s} {s / 1e6:10.2f} {100 * s / total:5.1f}% {excess[cls] / 1e6:12.2f} {instr[cls] / 1e6:15.2f}")
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    reasons = collections.Counter()
    for r in data:
        for h in stalls:
            reasons[h] += col(r, h)
    samples = sum(reasons.values()) or 1.0
    print(f"warp stall samples: {samples:.0f}")
    for h, v in reasons.most_common(8):
        print(f"  {h[6:]:20s} {100 * v / samples:5.1f}%")
    # where the long-scoreboard samples sit, with the instruction before each (what it waits on)
    long_sb = sorted(range(len(data)), key=lambda i: -col(data[i], "stall_long_sb"))
    total_sb = sum(col(r, "stall_long_sb") for r in data) or 1.0
    print("long scoreboard samples at (after):")
    for i in long_sb[:3]:
        before = data[i - 1][hdr["Source"]].strip() if i > 0 else "-"
        print(f"  {100 * col(data[i], 'stall_long_sb') / total_sb:5.1f}% {data[i][hdr['Source']].strip()[:48]}"
              f"  (after {before[:40]})")
    by_op = collections.Counter()
    for r in data:
        op, _ = load_class(r[hdr["Source"]].strip())
        by_op[op.split(".")[0]] += col(r, "Warp Stall Sampling (All Samples)")
    total_op = sum(by_op.values()) or 1.0
    print("samples by opcode: " + ", ".join(f"{op} {100 * v / total_op:.1f}%" for op, v in by_op.most_common(10)))


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:  # a closed pipe (e.g. `| head`) ends the listing quietly
        sys.stderr.close()
        sys.exit(141)

"""The Hopper forward launched as a programmatic dependent of the kernel ahead of it, against the usual launch,
beside SDPA's cuDNN forward, alternating in one process: each cell's spec (the dispatch table's pick through
`attngen.attention`) loaded twice, "pdl" as built (its part awaits_predecessor) and "plain" with its functions
launched the usual way (await_predecessor is then a no-op); `attngen bench`'s queued timing (30 calls behind a GPU
sleep, cycling through input sets that defeat L2 reuse), the median of the rounds. The two launches give the same
bits (checked per cell).

Usage: python3 docs/hopper-h200/fwd_pdl/forward_pdl_ab.py OUT.json [ROUNDS]   (default 3 rounds)

forward_pdl_ab.json was measured on a tree whose wgmma forward part awaited its predecessor (forward_awaits.patch
beside this script). Each call is timed between its own CUDA events, and a kernel cannot start before an event
recorded ahead of it, so this timing cannot show what the launch hides: it found the two launches equal (the median
cell 0.02 us apart). forward_pdl_b2b.py times the calls back to back and finds the difference. On a tree without
the patch both kernels run the usual launch, and the "awaits_predecessor" column says so."""
from pathlib import Path
import sys

import torch

from attngen.ops import library
from attngen.runtime.calls import kernel_class
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "measurements"))
from gpu_timing import alternating_sets, cudnn_forward, forward_pick, write_report  # noqa: E402

SHAPES = ((16, 16, 512), (8, 16, 1024), (4, 16, 2048), (2, 16, 1024), (1, 8, 2048), (1, 8, 1024), (1, 8, 512),
          (2, 16, 8192), (1, 16, 16384))


def main(out_path, rounds="3"):
    rows, gen = [], torch.Generator(device="cuda")
    gen.manual_seed(0)
    for d in (64, 128):
        for b, h, s in SHAPES:
            for causal in (False, True):
                sets, chosen = forward_pick(b, h, s, d, causal, gen)
                q, k, v = sets[0]
                pdl, plain = (kernel_class(chosen.plan).from_sources(chosen.plan, chosen.sources, label=chosen.label)
                              for _ in range(2))   # two kernels of the table's pick, as the table loaded it
                awaits = all(fn.programmatic for fn in pdl.functions.values())
                for name, fn in list(plain.functions.items()):
                    plain.functions[name] = fn._replace(programmatic=False)
                same = bool(torch.equal(pdl(q, k, v, causal=causal), plain(q, k, v, causal=causal)))
                calls = {"pdl": (lambda q, k, v: pdl(q, k, v, causal=causal), sets),
                         "plain": (lambda q, k, v: plain(q, k, v, causal=causal), sets),
                         "cudnn": (cudnn_forward(causal), sets)}
                med, each = alternating_sets(calls, int(rounds))
                row = {"shape": f"{b}x{h}x{s}x{d}", "dtype": "bf16", "causal": causal, "spec": chosen.plan.spec.name,
                       "awaits_predecessor": awaits, "same_bits": same, "us": med, "rounds": each,
                       "x_cudnn": {w: med["cudnn"] / med[w] for w in ("pdl", "plain")}}
                print(f"{row['shape']:14} {'causal' if causal else 'none':6} {row['spec']:40} pdl {med['pdl']:8.2f} "
                      f"plain {med['plain']:8.2f} cudnn {med['cudnn']:8.2f}  x{row['x_cudnn']['pdl']:.3f} "
                      f"(plain x{row['x_cudnn']['plain']:.3f}) same={same}", flush=True)
                rows.append(row)
                sets = None
                library._FORWARD.clear()
    write_report(out_path, rows, f"python3 docs/hopper-h200/fwd_pdl/forward_pdl_ab.py OUT.json {rounds}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(*sys.argv[1:])

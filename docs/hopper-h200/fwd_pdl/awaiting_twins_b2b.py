"""The forward's awaiting twins (schedule.awaiting_twins), timed as attngen.attention serves each cell.

Per short cell (bf16, the 28 cells of forward_pdl_b2b.py): "twin", the table's pick as the entry point launches
it (its awaiting twin, a programmatic dependent); "usual", the same spec with its usual function launched the
usual way (the code every call launched before the twins); "cudnn", SDPA's cuDNN forward. Each is timed back to
back ("b2b": 30 calls between two events, queued behind a GPU sleep), back to back with a small torch op ahead
of each call ("op"), and per call ("call": an event pair around each call), alternating over ROUNDS rounds, the
input sets cycling past L2; medians. The twin's and the usual function's outputs are compared bit for bit. For
the long cells the script checks only which function a call launches (the usual one, whose code the twins
left as it was).

Usage: python3 docs/hopper-h200/fwd_pdl/awaiting_twins_b2b.py OUT.json [ROUNDS]"""
from pathlib import Path
import json
import statistics
import sys

import torch

from attngen.eval.bench import time_calls
from attngen.ops import library
from attngen.runtime.calls import kernel_class
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "measurements"))
from gpu_timing import back_to_back_us, cudnn_forward, forward_pick, write_report  # noqa: E402

SHAPES = ((16, 16, 512), (8, 16, 1024), (4, 16, 2048), (2, 16, 1024), (1, 8, 2048), (1, 8, 1024), (1, 8, 512))
LONG = ((2, 16, 8192), (1, 16, 16384))


def launched(kernel) -> str:
    """The function the kernel's last prepared call launches."""
    prepared = list(kernel._prepared.values())[-1]
    return prepared.launches[0][0].name


def main(out_path, rounds="3"):
    rows, gen = [], torch.Generator(device="cuda")
    gen.manual_seed(0)
    side = torch.randn(4096, device="cuda")
    for d in (64, 128):
        for b, h, s in LONG:
            for causal in (False, True):
                sets, chosen = forward_pick(b, h, s, d, causal, gen)
                rows.append({"shape": f"{b}x{h}x{s}x{d}", "causal": causal, "spec": chosen.plan.spec.name,
                             "launches": launched(chosen)})
                print(json.dumps(rows[-1]), flush=True)
                sets = None
                library._FORWARD.clear()
        for b, h, s in SHAPES:
            for causal in (False, True):
                sets, chosen = forward_pick(b, h, s, d, causal, gen)
                q, k, v = sets[0]
                plan = chosen.plan
                usual = kernel_class(plan).from_sources(plan, chosen.sources, label=f"{chosen.label}_usual")
                usual.awaiting_entry = {}
                same = bool(torch.equal(chosen(q, k, v, causal=causal), usual(q, k, v, causal=causal)))
                calls = {"twin": lambda q, k, v: chosen(q, k, v, causal=causal),
                         "usual": lambda q, k, v: usual(q, k, v, causal=causal),
                         "cudnn": cudnn_forward(causal)}
                each = {f"{w}_{m}": [] for w in calls for m in ("b2b", "op", "call")}
                for _ in range(int(rounds)):
                    for w, fn in calls.items():
                        each[f"{w}_b2b"].append(back_to_back_us(fn, sets))
                        each[f"{w}_op"].append(back_to_back_us(fn, sets, side))
                        each[f"{w}_call"].append(time_calls(torch, fn, sets, reps=30)[0])
                med = {w: statistics.median(t) for w, t in each.items()}
                row = {"shape": f"{b}x{h}x{s}x{d}", "dtype": "bf16", "causal": causal, "spec": plan.spec.name,
                       "launches": launched(chosen), "usual_launches": launched(usual), "same_bits": same,
                       "us": med, "rounds": each,
                       "x_cudnn": {w: med[f"cudnn_{w.split('_')[1]}"] / med[w] for w in med if not w.startswith("c")}}
                print(json.dumps({k: row[k] for k in ("shape", "causal", "spec", "launches", "same_bits")})[:-1],
                      *(f"{w} {t:.2f}" for w, t in med.items()), flush=True)
                rows.append(row)
                sets = None
                library._FORWARD.clear()
    write_report(out_path, rows, f"python3 docs/hopper-h200/fwd_pdl/awaiting_twins_b2b.py OUT.json {rounds}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(*sys.argv[1:])

"""#61's "eager host time of forward + backward <= SDPA's": attngen.attention's eager training step through
the native step (a C++ autograd node, attngen/runtime/native) beside the same step through the Python node
(the native step switched off on the shape's entry) and SDPA with its own choice of backend, in one process.
One step: o = f(q, k, v, causal); torch.autograd.grad(o, (q, k, v), do). Per path: CPU us per step
(host_time.host_and_wall: 100 steps back to back, no synchronize inside), wall us (the same, synchronized),
GPU us per step (queued behind a GPU sleep); medians of 5 rounds, the paths taking turns.

Usage (GPU machine, repository root): python3 docs/backward-h200/native_step_host.py OUT.json"""
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import attngen
from attngen.ops import library
from attngen.runtime import native

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the shared helpers
from host_time import gpu_time, host_and_wall  # noqa: E402

CELLS = (((1, 8, 512, 64), False, torch.float16), ((1, 8, 512, 64), True, torch.bfloat16),
         ((16, 16, 512, 128), True, torch.float16), ((4, 32, 2048, 128), True, torch.bfloat16))


def main(out_path):
    native.build(torch)
    rows = []
    for shape, causal, dtype in CELLS:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(shape, generator=gen, device="cuda").to(dtype).requires_grad_() for _ in range(3))
        do = torch.randn(shape, generator=gen, device="cuda").to(dtype)

        def attngen_step():
            o = attngen.attention(q, k, v, causal=causal)
            return torch.autograd.grad(o, (q, k, v), do)

        def sdpa_step():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            return torch.autograd.grad(o, (q, k, v), do)
        for _ in range(3):
            attngen_step()
        entry = library._TRAIN[library.call_key(q, k, v, causal, None, None, False, "bhsd")]
        made = entry.native
        assert isinstance(made, torch.ScriptObject), f"no native step: {made!r} ({native._state})"

        def with_native(flag):
            def run():
                entry.native = made if flag else None
                return attngen_step()
            return run
        paths = {"attngen native": with_native(True), "attngen python node": with_native(False), "sdpa": sdpa_step}
        got = {n: {"cpu": [], "wall": [], "gpu": []} for n in paths}
        for _ in range(5):
            for n, fn in paths.items():
                cpu, wall = host_and_wall(fn, n=100, repeats=3)
                got[n]["cpu"].append(cpu)
                got[n]["wall"].append(wall)
                got[n]["gpu"].append(gpu_time(fn, n=20, repeats=3))
        entry.native = made
        row = {"shape": "x".join(map(str, shape)), "causal": causal, "dtype": str(dtype).replace("torch.", ""),
               **{n: {k: round(statistics.median(t), 1) for k, t in d.items()} for n, d in got.items()}}
        row["cpu native / sdpa"] = round(row["attngen native"]["cpu"] / row["sdpa"]["cpu"], 3)
        row["cpu python node / sdpa"] = round(row["attngen python node"]["cpu"] / row["sdpa"]["cpu"], 3)
        print(json.dumps(row), flush=True)
        rows.append(row)
    Path(out_path).write_text(json.dumps({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
                                          "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])

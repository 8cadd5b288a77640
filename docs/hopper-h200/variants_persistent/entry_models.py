"""The models' variant calls (model_calls.py) through attngen.attention, in one tree (PYTHONPATH selects it): for
timing the dispatch table's variant entries before and after a change, alternating trees. Per call: GPU us (calls
queued behind a GPU sleep, inputs rotated past L2, median) and eager us (back to back, host included), bf16; plus
the largest |difference| of the output from fp32 math where the call fits (the same in both trees when the math
is the same).
Usage (GPU machine, repository root): python3 docs/hopper-h200/variants_persistent/entry_models.py OUT.json"""
from pathlib import Path
import json
import sys

import torch

import attngen
from attngen.eval.bench.timing import time_calls, time_eager
sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_calls import CALLS, sets_for


def reference(q, k, v, kw):
    """fp32 attention with the call's window, softcap and sinks (GQA by repeating K and V)."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.float().repeat_interleave(group, dim=1) for t in (k, v))
    s = (q.float() @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if "softcap" in kw:
        s = kw["softcap"] * torch.tanh(s / kw["softcap"])
    n = s.shape[-1]
    i, j = torch.arange(n, device=q.device)[:, None], torch.arange(n, device=q.device)[None, :]
    keep = torch.ones(n, n, dtype=torch.bool, device=q.device)
    if kw["causal"]:
        keep &= j <= i
    if "window" in kw:
        keep &= j >= i - kw["window"][0]
    s = s.masked_fill(~keep, float("-inf"))
    if "sinks" in kw:
        sink = kw["sinks"].float().reshape(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], 1)
        p = torch.cat([s, sink], dim=-1).softmax(-1)[..., :-1]
    else:
        p = s.softmax(-1)
    return p @ v


rows, gen = [], torch.Generator(device="cuda")
gen.manual_seed(0)
for label, d, member, h, hk, kw, shapes in CALLS:
    for b, s in shapes:
        call_kw = {"causal": True, **kw}
        if kw.get("sinks"):
            call_kw["sinks"] = torch.randn(h, generator=gen, device="cuda")
        sets = sets_for(b, h, hk, s, d, gen)
        fn = lambda q, k, v: attngen.attention(q, k, v, **call_kw)
        fn(*sets[0])
        gpu = time_calls(torch, fn, sets, reps=30)[0]
        eager = time_eager(torch, fn, sets, reps=30)
        row = {"call": label, "shape": f"{b}x{h}/{hk}x{s}x{d}", "gpu_us": gpu, "eager_us": eager}
        if b * h * s * s <= 2 ** 30:
            q, k, v = sets[0]
            row["err"] = float((fn(q, k, v).float() - reference(q, k, v, call_kw)).abs().max())
        rows.append(row)
        print(json.dumps(row), flush=True)
        sets = None
        torch.cuda.empty_cache()
Path(sys.argv[1]).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                         "tree": attngen.__file__, "rows": rows}, indent=1) + "\n")

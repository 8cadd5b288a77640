"""The GPU timing the measurement scripts under docs/ share: the median of CUDA-event-timed calls (`med`: host
gaps included), or `attngen bench`'s queued timing (`queued_med`: launches hidden); forward calls
alternating over rounds on input sets (`alternating_sets`; per call and back to back: `alternating_both`) and SDPA's cuDNN forward beside them
(`cudnn_forward`); calls timed back to back (`back_to_back_us`); a forward cell as the table serves it
(`forward_pick`); an earlier checkout's kernel beside today's (`old_kernel`); the comparison of the
two backward classes' gradients in one row; and the report a script writes (`write_report`)."""
import dataclasses
import json
import re
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attngen.eval.bench import time_back_to_back, time_calls
from attngen.eval.bench.timing import run_behind_sleep


def med(fn, reps=15):
    """Median GPU time of fn() in µs over `reps` calls, after 3 warm-up calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)


def queued_med(fn, reps=30):
    """`attngen bench`'s timing of fn(): CUDA events around each of `reps` calls queued behind a GPU
    sleep, so the host's launches are hidden; the median, µs."""
    return time_calls(torch, fn, [()], reps=reps)[0]


def alternating(calls: dict, rounds: int = 3) -> tuple[dict, dict]:
    """Time each of `calls` ({name: fn}) with queued_med, the calls alternating over `rounds` rounds
    (so that drift in the GPU's clocks reaches all alike): ({name: median of its rounds, µs},
    {name: its rounds})."""
    t = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            t[name].append(queued_med(fn))
    return {name: statistics.median(x) for name, x in t.items()}, t


def back_to_back_us(fn, sets, side=None, n: int = 30, runs: int = 3) -> float:
    """GPU us per call of fn(*set), n calls (the sets cycling) between two CUDA events, queued behind a GPU sleep so
    that the host's pace does not show: as a model's calls run, so a kernel launched as a programmatic dependent of
    the one ahead can start early (with an event between every two calls, as queued_med times, it cannot). side: a
    small tensor scaled in place ahead of each call (a model's attention follows other kernels). Median of `runs`,
    each behind about 15 ms of sleep (longer than the host takes to queue the n calls): `attngen bench`'s
    run_behind_sleep."""
    call = fn if side is None else (lambda *a: (side.mul_(1.0), fn(*a)))
    return sorted(run_behind_sleep(torch, call, sets, n, int(3e7))[0] for _ in range(runs))[runs // 2]


def forward_pick(b: int, h: int, s: int, d: int, causal: bool, gen):
    """A bf16 forward cell (B, H, S, D; self-attention) as attngen.attention serves it: (input sets that defeat L2
    reuse, drawn from `gen`; the dispatch table's entry it cached: .plan, .sources, .label)."""
    import attngen
    from attngen.eval.bench import Case, input_sets
    from attngen.ops import library
    sets = input_sets(torch, Case(b, h, s, d, "bf16", causal), torch.device("cuda"), gen)
    q, k, v = sets[0]
    attngen.attention(q, k, v, causal=causal)
    chosen = library._FORWARD.get((q.get_device(), q.dtype, d, causal, s, d, b * h * s))
    assert chosen is not None, "attngen.attention cached no kernel under the key this script reads"
    return sets, chosen


def cudnn_forward(causal: bool):
    """fn(q, k, v): SDPA's forward on its cuDNN backend only."""
    def call(q, k, v):
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return call


def alternating_sets(calls: dict, rounds: int) -> tuple[dict, dict]:
    """`attngen bench`'s queued timing (30 calls, cycling through input sets that defeat L2 reuse) of
    each of `calls` ({name: (fn, its input sets)}), the calls alternating over `rounds` rounds: ({name:
    median of its rounds, µs}, {name: its rounds})."""
    each = {name: [] for name in calls}
    for _ in range(rounds):
        for name, (fn, sets) in calls.items():
            each[name].append(time_calls(torch, fn, sets, reps=30)[0])
    return {name: statistics.median(t) for name, t in each.items()}, each


def alternating_both(calls: dict, sets, rounds: int) -> tuple[dict, dict]:
    """Each of `calls` ({name: fn}) timed per call (`attngen bench`'s queued timing, 30 calls) and back to back
    (`attngen bench`'s b2b, 30 calls between two events) on `sets`, the calls alternating over `rounds` rounds:
    ({name: {"us": median, "b2b_us": median}}, {name: {"us": its rounds, "b2b_us": its rounds}})."""
    each = {name: {"us": [], "b2b_us": []} for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            each[name]["us"].append(time_calls(torch, fn, sets, reps=30)[0])
            each[name]["b2b_us"].append(time_back_to_back(torch, fn, sets, reps=30))
    return {name: {m: statistics.median(t) for m, t in w.items()} for name, w in each.items()}, each


def old_kernel(new, old_dir: Path):
    """`new`'s spec as an earlier checkout generated it (its sources in old_dir), compiled and launched
    through today's runtime: the Params ABI must be unchanged, but for the tensor maps the Hopper
    backward added at its end. The old kernel gets the dynamic shared memory its own header states."""
    sources = [(Path(old_dir) / part.file_name).read_text() for part in new.plan.parts]
    smem = re.search(r"dynamic: (\d+) B exceed", sources[0])
    plan = dataclasses.replace(new.plan, smem_bytes=int(smem.group(1))) if smem else new.plan
    if new.plan.tensor_maps and "tma_q" not in sources[0]:
        # Kernels from before the Hopper backward read Q and dO by TMA: their Params end before the maps.
        plan = dataclasses.replace(plan, tensor_maps=(),
                                   abi=plan.abi.without({m.abi_field for m in new.plan.tensor_maps}))
    plan = _old_dq_order(plan, sources)
    return type(new).from_sources(plan, sources, label=f"{new.plan.spec.name}_before")


def _old_dq_order(plan, sources):
    """The plan with the dQ order of old sources whose convert part has one dQ function, `convert`
    (kernels from before dQ order was chosen per mask): every mask pairs with it, in the order it
    reads (register-pair order where it reads pair v / 2 of thread t at v x 128 + 2 t)."""
    index = next((i for i, part in enumerate(plan.parts) if part.name == "convert"), None)
    if index is None or not hasattr(plan.fragments, "pair_masks"):
        return plan
    part, source = plan.parts[index], sources[index]
    if all(f"\n{fn}(" in source for _, fn in part.functions):
        return plan
    pairs = "block + v * 128 + 2 * t" in source
    functions = ((("convert_pairs" if pairs else "convert"), f"attngen_{plan.spec.name}_convert"),)
    functions += tuple((key, fn) for key, fn in part.functions if key == "kv_convert")
    parts = plan.parts[:index] + (dataclasses.replace(part, functions=functions),) + plan.parts[index + 1:]
    return dataclasses.replace(plan, parts=parts, fragments=dataclasses.replace(
        plan.fragments, pair_masks=tuple(plan.spec.masks) if pairs else ()))


def gradient_difference(grads, reference) -> dict:
    """{"max_diff": the largest |difference| between two (dq, dk, dv), "max_grad": the largest
    |gradient| of `reference`}."""
    return {"max_diff": max((a.float() - b.float()).abs().max().item() for a, b in zip(grads, reference)),
            "max_grad": max(g.float().abs().max().item() for g in reference)}


def compare_classes(row, grads, rows):
    """Finish a row timing both backward classes (mma_us, wgmma_us): their gradients' largest
    difference beside the largest gradient, and wgmma's speedup; print it and keep it in rows."""
    row.update(gradient_difference(grads["wgmma"], grads["mma"]))
    row["wgmma_speedup"] = row["mma_us"] / row["wgmma_us"]
    print(json.dumps(row), flush=True)
    rows.append(row)


def write_report(out_path, rows, command: str | None = None) -> None:
    """OUT.json of a script: the GPU, torch, the command that made it (default: this process's) and
    its rows."""
    with open(out_path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "command": command or " ".join(["python3", *sys.argv]), "rows": rows}, f, indent=1)
        f.write("\n")

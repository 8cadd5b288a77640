"""Where the forward's programmatic launch costs at long causal cells, if anywhere: the d128 persistent cell
(`h100_wgmma_d128_persistent_q2_bf16`, the table's pick for every cell below) launched three ways, timed back to
back as forward_pdl_b2b.py times them (30 calls between two events behind a GPU sleep, "b2b"; with a small torch op
ahead of each call, "op"), the three alternating over the rounds, the median kept:
  "trigger":  the sources in SOURCES (await_predecessor first; the producer's allow_dependents once its last load
              is issued), launched as a programmatic dependent;
  "implicit": the same sources without the allow_dependents calls (the next kernel may start as blocks exit),
              launched so;
  "plain":    the spec as generated now, launched the usual way.

Usage: python3 docs/hopper-h200/fwd_pdl/forward_pdl_trigger.py SOURCES OUT.json [ROUNDS]   (default 9 rounds)
SOURCES: as forward_pdl_b2b.py makes it."""
from pathlib import Path
import statistics
import sys

import torch

from attngen.ops import library
from attngen.runtime.calls import kernel_class
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "measurements"))
from gpu_timing import back_to_back_us, forward_pick, write_report  # noqa: E402

CELLS = ((2, 16, 8192, True), (2, 16, 8192, False), (1, 8, 1024, False), (16, 16, 512, True))


def main(sources_dir, out_path, rounds="9"):
    rows, gen = [], torch.Generator(device="cuda")
    gen.manual_seed(0)
    side = torch.randn(4096, device="cuda")
    for b, h, s, causal in CELLS:
        d = 128
        sets, chosen = forward_pick(b, h, s, d, causal, gen)
        q, k, v = sets[0]
        plan = chosen.plan
        trigger = [(Path(sources_dir) / part.file_name).read_text() for part in plan.parts]
        implicit = ["\n".join(line for line in src.splitlines() if line.strip().split("//")[0].strip()
                              != "allow_dependents();") + "\n" for src in trigger]
        assert all(t != i for t, i in zip(trigger, implicit)), "no allow_dependents call found to take out"
        kernels = {"trigger": kernel_class(plan).from_sources(plan, trigger, label=f"{chosen.label}_trigger"),
                   "implicit": kernel_class(plan).from_sources(plan, implicit, label=f"{chosen.label}_implicit"),
                   "plain": kernel_class(plan).from_sources(plan, chosen.sources, label=chosen.label)}
        for w in ("trigger", "implicit"):
            for name, fn in list(kernels[w].functions.items()):
                kernels[w].functions[name] = fn._replace(programmatic=True)
        outs = {w: kern(q, k, v, causal=causal) for w, kern in kernels.items()}
        same = all(torch.equal(outs["plain"], o) for o in outs.values())
        each = {f"{w}_{m}": [] for w in kernels for m in ("b2b", "op")}
        for _ in range(int(rounds)):
            for w, kern in kernels.items():
                fn = (lambda kern: lambda q, k, v: kern(q, k, v, causal=causal))(kern)
                each[f"{w}_b2b"].append(back_to_back_us(fn, sets))
                each[f"{w}_op"].append(back_to_back_us(fn, sets, side))
        med = {w: statistics.median(t) for w, t in each.items()}
        row = {"shape": f"{b}x{h}x{s}x{d}", "causal": causal, "spec": plan.spec.name, "same_bits": same,
               "us": med, "rounds": each}
        print(row["shape"], causal, same, *(f"{w} {t:.2f}" for w, t in med.items()), flush=True)
        rows.append(row)
        sets = None
        library._FORWARD.clear()
    write_report(out_path, rows, f"python3 docs/hopper-h200/fwd_pdl/forward_pdl_trigger.py SOURCES OUT.json {rounds}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])

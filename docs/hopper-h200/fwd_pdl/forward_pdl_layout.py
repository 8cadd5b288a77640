"""Is the long full-mask d128 cells' 0.2-0.4 % (forward_pdl_long_clocks_rotated.json: the branch's kernel slower than
main's in 14 and 17 of 21 paired rounds, launched either way) the wait's cost or where the code landed? The wait
adds one SASS instruction (ACQBULK) ahead of the main loops, which moves every loop 16 bytes against its
128-byte line. Five kernels of the table's pick, alternating, each round starting with the next:

  main     SOURCES' kernel (no wait), launched the usual way
  usual    this tree's kernel (the wait), launched the usual way
  pdl      this tree's kernel, launched as a programmatic dependent
  moved    this tree's kernel with the wait replaced by `pmevent 0` (one PMTRIG: the same 16-byte move, no wait),
           launched the usual way
  aligned  this tree's kernel with six `nanosleep.u32 0` after the wait (the loops back at main's place in their
           lines, 128 bytes on), launched as a programmatic dependent

Each timing: 30 calls back to back between two events behind a GPU sleep (gpu_timing.back_to_back_us), SM clock
and power sampled beside it. If `moved` tracks `usual` and `aligned` tracks `main`, the cost is placement.

Usage: python3 docs/hopper-h200/fwd_pdl/forward_pdl_layout.py SOURCES OUT.json [ROUNDS]   (on a tree with
forward_awaits_implicit.patch applied and generated/ rebuilt; SOURCES: as in forward_pdl_long_clocks.py)"""
from pathlib import Path
import statistics
import sys

import torch

from attngen.ops import library
from attngen.runtime.calls import kernel_class
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "measurements"))
from forward_pdl_long_clocks import Sampler  # noqa: E402
from gpu_timing import back_to_back_us, forward_pick, write_report  # noqa: E402

CELLS = ((2, 16, 8192, 128, False), (1, 16, 16384, 128, False))


def variant(src: str, replace_wait: str) -> str:
    """src with every entry point's wait line replaced by replace_wait(line)."""
    out = [replace_wait(line) if line.strip().endswith("::await_predecessor();") or "::await_predecessor();   //"
           in line else line for line in src.split("\n")]
    assert out != src.split("\n"), "no wait to replace"
    return "\n".join(out)


def main(sources_dir, out_path, rounds="21"):
    rows, gen, sampler = [], torch.Generator(device="cuda"), Sampler()
    gen.manual_seed(0)
    for b, h, s, d, causal in CELLS:
        sets, chosen = forward_pick(b, h, s, d, causal, gen)
        q, k, v = sets[0]
        plan = chosen.plan
        main_sources = [(Path(sources_dir) / part.file_name).read_text() for part in plan.parts]
        moved = [variant(src, lambda line: '    asm volatile("pmevent 0;");') for src in chosen.sources]
        aligned = [variant(src, lambda line: line + '\n    asm volatile("nanosleep.u32 0;");' * 6)
                   for src in chosen.sources]
        build = kernel_class(plan).from_sources
        kernels = {"main": build(plan, main_sources, label=f"{chosen.label}_main"),
                   "usual": build(plan, chosen.sources, label=chosen.label),
                   "pdl": build(plan, chosen.sources, label=chosen.label),
                   "moved": build(plan, moved, label=f"{chosen.label}_moved"),
                   "aligned": build(plan, aligned, label=f"{chosen.label}_aligned")}
        for w in ("main", "usual", "moved"):
            for name, fn in list(kernels[w].functions.items()):
                kernels[w].functions[name] = fn._replace(programmatic=False)
        assert all(fn.programmatic for w in ("pdl", "aligned") for fn in kernels[w].functions.values())
        outs = [kern(q, k, v, causal=causal) for kern in kernels.values()]
        same = all(torch.equal(outs[0], o) for o in outs)
        each = {w: {"us": [], "mhz": [], "w": []} for w in kernels}
        names = list(kernels)
        for r in range(int(rounds)):
            for w in names[r % len(names):] + names[:r % len(names)]:
                sampler.start()
                us = back_to_back_us((lambda kern: lambda q, k, v: kern(q, k, v, causal=causal))(kernels[w]), sets)
                mhz, watts = sampler.stop()
                for m, x in (("us", us), ("mhz", mhz), ("w", watts)):
                    each[w][m].append(x)
        med = {w: {m: statistics.median(t[m]) for m in t} for w, t in each.items()}
        paired = {w: statistics.median(a - m for a, m in zip(each[w]["us"], each["main"]["us"]))
                  for w in kernels if w != "main"}
        slower = {w: sum(a > m for a, m in zip(each[w]["us"], each["main"]["us"])) for w in kernels if w != "main"}
        row = {"shape": f"{b}x{h}x{s}x{d}", "causal": causal, "spec": plan.spec.name, "same_bits": same,
               "median": med, "paired_minus_main_us": paired, "rounds_slower_than_main": slower, "rounds": each}
        print(row["shape"], causal, same, *(f"{w} {m['us']:.1f} us {m['mhz']:.0f} MHz" for w, m in med.items()),
              "| paired vs main:", *(f"{w} {paired[w]:+.1f} ({slower[w]}/{rounds})" for w in paired), flush=True)
        rows.append(row)
        sets = None
        library._FORWARD.clear()
    write_report(out_path, rows, f"python3 docs/hopper-h200/fwd_pdl/forward_pdl_layout.py SOURCES OUT.json {rounds}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])

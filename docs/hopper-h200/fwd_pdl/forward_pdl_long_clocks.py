"""The forward launched as a programmatic dependent (a tree with forward_awaits_implicit.patch applied and
`python3 -m attngen build` run: the part awaits its predecessor, no early trigger)
at the long cells, against the same kernel launched the usual way and against the forward as main generates it
(SOURCES: generated/<spec>.cu from a checkout without the change), with the SM clock and the board power sampled
through NVML (the nvidia-ml-py package) during every timing: do the long d128 full-mask cells lose anything, beyond their rounds' spread and
the power cap's doing?

Each cell: the table's pick; "pdl" as built, "usual" the same kernel with its functions launched the usual way,
"main" SOURCES' kernel launched the usual way; 30 calls back to back between two CUDA events behind a GPU sleep
(docs/measurements/gpu_timing.back_to_back_us), the three alternating over ROUNDS rounds (default 15), each round
starting with the next of the three (a timing's place in its round moves its clock under the power cap). Per timing:
µs per call, the median SM clock (MHz) and power (W) sampled every 2 ms while it ran.

Usage: python3 docs/hopper-h200/fwd_pdl/forward_pdl_long_clocks.py SOURCES OUT.json [ROUNDS] [HEAD_DIM]
(HEAD_DIM: only the cells of that head dim)
SOURCES: for n in h100_wgmma_d64_persistent_q2_c3_bf16 h100_wgmma_d128_persistent_q2_bf16
h100_wgmma_d128_n176c2ps2r24x240ppet_bf16; do git show main:generated/$n.cu > SOURCES/$n.cu; done"""
from pathlib import Path
import statistics
import sys
import threading

import pynvml
import torch

from attngen.ops import library
from attngen.runtime.calls import kernel_class
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "measurements"))
from gpu_timing import back_to_back_us, forward_pick, write_report  # noqa: E402

CELLS = ((2, 16, 8192, 128, False), (2, 16, 8192, 128, True), (1, 16, 16384, 128, False),
         (1, 16, 16384, 128, True), (2, 16, 8192, 64, False), (1, 16, 16384, 64, False))


class Sampler:
    """SM clock (MHz) and power (W) of GPU 0 every 2 ms between start() and stop(): (median clock, median power)."""

    def __init__(self):
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())

    def start(self):
        self.samples, self.running = [], True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while self.running:
            self.samples.append((pynvml.nvmlDeviceGetClockInfo(self.handle, pynvml.NVML_CLOCK_SM),
                                 pynvml.nvmlDeviceGetPowerUsage(self.handle) / 1e3))
            threading.Event().wait(0.002)

    def stop(self):
        self.running = False
        self.thread.join()
        clocks, watts = zip(*self.samples) if self.samples else ((0,), (0.0,))
        return statistics.median(clocks), statistics.median(watts)


def main(sources_dir, out_path, rounds="15", head_dim=None):
    rows, gen, sampler = [], torch.Generator(device="cuda"), Sampler()
    gen.manual_seed(0)
    for b, h, s, d, causal in (c for c in CELLS if head_dim is None or c[3] == int(head_dim)):
        sets, chosen = forward_pick(b, h, s, d, causal, gen)
        q, k, v = sets[0]
        plan = chosen.plan
        main_sources = [(Path(sources_dir) / part.file_name).read_text() for part in plan.parts]
        assert all("await_predecessor();" not in src for src in main_sources), "SOURCES' forward awaits already"
        kernels = {"pdl": kernel_class(plan).from_sources(plan, chosen.sources, label=chosen.label),
                   "usual": kernel_class(plan).from_sources(plan, chosen.sources, label=chosen.label),
                   "main": kernel_class(plan).from_sources(plan, main_sources, label=f"{chosen.label}_main")}
        assert all(fn.programmatic for fn in kernels["pdl"].functions.values()), "this tree's forward does not await"
        for w in ("usual", "main"):
            for name, fn in list(kernels[w].functions.items()):
                kernels[w].functions[name] = fn._replace(programmatic=False)
        outs = [kern(q, k, v, causal=causal) for kern in kernels.values()]
        same = all(torch.equal(outs[0], o) for o in outs)
        each = {w: {"us": [], "mhz": [], "w": []} for w in kernels}
        names = list(kernels)
        for r in range(int(rounds)):
            # each round starts with the next kernel: under the power cap a timing's place in the round moves its
            # clock (round 1: pdl, usual, main; round 2: usual, main, pdl; ...)
            for w in names[r % 3:] + names[:r % 3]:
                kern = kernels[w]
                sampler.start()
                us = back_to_back_us((lambda kern: lambda q, k, v: kern(q, k, v, causal=causal))(kern), sets)
                mhz, watts = sampler.stop()
                each[w]["us"].append(us)
                each[w]["mhz"].append(mhz)
                each[w]["w"].append(watts)
        med = {w: {m: statistics.median(t[m]) for m in t} for w, t in each.items()}
        row = {"shape": f"{b}x{h}x{s}x{d}", "causal": causal, "spec": plan.spec.name, "same_bits": same,
               "median": med, "rounds": each}
        print(row["shape"], causal, same, *(f"{w} {m['us']:.1f} us {m['mhz']:.0f} MHz {m['w']:.0f} W"
                                            for w, m in med.items()), flush=True)
        rows.append(row)
        sets = None
        library._FORWARD.clear()
    write_report(out_path, rows,
                 f"python3 docs/hopper-h200/fwd_pdl/forward_pdl_long_clocks.py SOURCES OUT.json {rounds}"
                 + (f" {head_dim}" if head_dim else ""))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])

"""The main loop of a compiled attention kernel, read from its SASS with no GPU: how many instructions a consumer
thread issues per tile, which ones, how many cycles ptxas's own schedule gives them, and where the wgmma waits sit
against the exponentials. The figures of docs/hopper-h200/lazy_rescale/ and docs/hopper-h200/fwd_ablation/ come
from it.

Usage: python3 docs/measurements/sass_loop.py FILE [FILE ...] [--function SUFFIX] [--arch sm_90a] [--list]
  FILE: a spec (.yaml, rendered first), a CUDA source (.cu) or a cubin; sources are compiled with attngen's nvcc
  flags (nvcc and cuobjdump on PATH). --function: the kernel function whose name ends so (default _none, the
  full-mask function). --list: every instruction of the loop with its stall count.

The loop is the innermost one (a backward branch's body) holding wgmma and MUFU.EX2 (a kernel without
exponentials: at least four wgmma). Its hot path leaves out what a forward branch inside it skips (the mask of a tile that needs one,
lazy_rescale's rescale; with schedule.softmax_block the softmax itself sits behind such a branch, never taken, so read
the whole loop's figure there). Static cycles add each instruction's stall count, at least 1: the cycles ptxas plans
between one instruction's issue and the next's for one warp alone, before any wait on a variable-latency result
(exponentials, shared memory, wgmma). Those counts sit in each instruction's scheduling bits, which public
microbenchmark studies of Volta and later GPUs describe: bits 41-44 of the instruction's second 64-bit word.
"""
from __future__ import annotations

import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

INSTRUCTION = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\* (0x[0-9a-f]{16}) \*/")
SECOND_WORD = re.compile(r"\s+/\* (0x[0-9a-f]{16}) \*/")
BRANCH = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")


def sass_of(path: Path, arch: str) -> str:
    """cuobjdump -sass of a cubin, compiling a .cu (or rendering and compiling a spec) first."""
    if path.suffix == ".cubin":
        return subprocess.run(["cuobjdump", "-sass", str(path)], capture_output=True, text=True, check=True).stdout
    if path.suffix in (".yaml", ".yml"):
        from attngen.render import render_for
        _, source, _ = render_for(path)
    else:
        source = path.read_text()
    from attngen.compile import NVCC_FLAGS
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "k.cu").write_text(source)
        flags = [f for f in NVCC_FLAGS if not f.startswith("-Xptxas")]
        subprocess.run(["nvcc", *flags, f"-arch={arch}", "-cubin", "-o", "k.cubin", "k.cu"], cwd=tmp, check=True,
                       capture_output=True)
        return sass_of(Path(tmp) / "k.cubin", arch)


def instructions(sass: str, suffix: str) -> tuple[str, list[tuple[int, str, int]]]:
    """(name, [(address, text, stall cycles)]) of the function whose name ends with `suffix`."""
    name, found, lines = None, {}, sass.splitlines()
    for i, line in enumerate(lines):
        if m := re.search(r"Function : (\S+)", line):
            name = m.group(1)
            found[name] = []
        elif name and (m := INSTRUCTION.match(line)) and i + 1 < len(lines) and (w := SECOND_WORD.match(lines[i + 1])):
            found[name].append((int(m.group(1), 16), m.group(2), (int(w.group(1), 16) >> 41) & 0xF))
    names = [n for n in found if n.endswith(suffix)]
    if len(names) != 1:
        sys.exit(f"{len(names)} functions end with {suffix!r}: {sorted(found)}")
    return names[0], found[names[0]]


def opcode(text: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]


def main_loop(code):
    """The innermost loop (a backward branch's body) holding wgmma and exponentials (a kernel without exponentials:
    at least four wgmma); of several, the one with the most exponentials."""
    at = {a: i for i, (a, _, _) in enumerate(code)}
    spans = [(at[int(m.group(1), 16)], i) for i, (a, t, _) in enumerate(code)
             if (m := BRANCH.search(t)) and int(m.group(1), 16) < a and int(m.group(1), 16) in at]
    count = lambda span, what: sum(what in opcode(t) for _, t, _ in code[span[0]:span[1] + 1])
    exps = any("MUFU.EX2" in opcode(t) for _, t, _ in code)
    fit = [sp for sp in spans if count(sp, "GMMA") >= (1 if exps else 4) and (count(sp, "MUFU.EX2") or not exps)]
    inner = [sp for sp in fit if not any(o != sp and sp[0] <= o[0] and o[1] <= sp[1] for o in fit)]
    if not inner:
        sys.exit("no loop with wgmma in this function")
    start, end = max(inner, key=lambda sp: (count(sp, "MUFU.EX2"), -(sp[1] - sp[0])))
    return code[start:end + 1]


def hot_path(loop):
    """The loop less what a forward branch inside it skips."""
    end, skipped = loop[-1][0], set()
    for a, t, _ in loop:
        if (m := BRANCH.search(t)) and a < int(m.group(1), 16) <= end:
            skipped |= {b for b, _, _ in loop if a < b < int(m.group(1), 16)}
    return [x for x in loop if x[0] not in skipped]


def report(label: str, name: str, code, listing: bool) -> None:
    loop = main_loop(code)
    hot = hot_path(loop)
    cycles = lambda part: sum(max(st, 1) for _, _, st in part)
    mix = collections.Counter(opcode(t).split(".")[0] for _, t, _ in hot)
    print(f"{label}: {name}")
    print(f"  loop {len(loop)} instructions, hot path {len(hot)}, static cycles {cycles(hot)} "
          f"(whole loop {cycles(loop)})")
    print("  " + " ".join(f"{op} {n}" for op, n in mix.most_common()))
    exps = [i for i, (_, t, _) in enumerate(hot) if "MUFU.EX2" in t]
    if exps:
        print(f"  exponentials: static cycles before the first {cycles(hot[:exps[0]])}, from the first to the last "
              f"{cycles(hot[exps[0]:exps[-1] + 1])}, after {cycles(hot[exps[-1] + 1:])}")
        for i, (_, t, _) in enumerate(hot):
            if "WARPGROUP.DEPBAR" in t:
                ahead = sum(j < i for j in exps)
                print(f"  {t.split()[-1]:4} wait ({t}): {ahead} of {len(exps)} exponentials ahead of it")
    if listing:
        for a, t, st in hot:
            print(f"    {a:05x} stall {st:2d}  {t}")


def main(argv):
    args, suffix, arch, listing = [], "_none", "sm_90a", False
    it = iter(argv)
    for a in it:
        if a == "--function":
            suffix = next(it)
        elif a == "--arch":
            arch = next(it)
        elif a == "--list":
            listing = True
        else:
            args.append(a)
    if not args:
        sys.exit(__doc__)
    for path in map(Path, args):
        name, code = instructions(sass_of(path, arch), suffix)
        report(path.name, name, code, listing)


if __name__ == "__main__":
    main(sys.argv[1:])

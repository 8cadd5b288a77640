"""`attngen sweep`: search the neighbourhood of a base spec for the fastest correct kernel per shape.

Which block_m, block_n, warps, stages and swizzle win depends on head dim, sequence length,
causality and the GPU, so the sweep measures instead of guessing. One function per step:

1. space      `default_space(base)`: the values each field may take (a `SearchSpace`);
2. prune      `prune(base, space)`: build every candidate spec through the YAML loader's own
              validation, drop those that break a spec rule, exceed the shared-memory budget or
              render to the same code as an earlier one, counting each reason;
3. compile    `compile_all(...)`: nvcc in a process pool; spills and compile errors are dropped;
4. measure    a `Measurer` (`GpuMeasurer` on a GPU, a stub in tests): verify, then time beside
              torch's flash backend, as `attngen bench` does;
5. cache      `RecordCache`: one JSON record per (spec hash, GPU, shape, dtype, causal), so an
              interrupted sweep resumes without measuring anything twice;
6. search     `grid` measures every survivor (up to the budget); `evolve` keeps the top-k and
              mutates one field at a time, reproducibly for a seed;
7. report     `format_report`, `report_dict` (JSON) and `write_best` (winning specs as YAML).
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import multiprocessing
import os
import random
import re
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, ClassVar, Iterable, Protocol


from .bench import CAUSAL_CHOICES, Case, check_output, input_sets, kernel_call, parse_shape, sdpa_callable, time_calls
from ..errors import BudgetError, SpecError, ToolError
from ..plan import Plan, make_plan
from ..render import render_plan
from ..spec import PadSwizzle, Spec, XorSwizzle, parse_spec, spec_dict, spec_yaml

Shape = tuple[int, int, int, int]          # batch, heads, seqlen, head_dim

DEFAULT_BLOCK_M = (64, 96, 112, 128)
DEFAULT_BLOCK_N = (32, 64, 128)
DEFAULT_COMPUTE_WARPS = (2, 4, 8)
DEFAULT_ROLE_PAIRS = ((1, 4), (1, 7), (2, 4), (2, 6))   # (producer, consumer), for bases with roles
DEFAULT_STAGES = (1, 2, 3, 4)
DEFAULT_REPS = 30
NAME_MAX = 48                              # the spec name rule: ^[a-z][a-z0-9_]{0,47}$

# Reasons a candidate leaves the sweep (besides "spec rule: <key>" for each rule).
BUDGET = "smem budget"
DUPLICATE = "duplicate"
NOT_SAMPLED = "over --budget"      # grid: survivors left out of the sample
NOT_REACHED = "not reached"        # evolve: survivors the evolution never got to
COMPILE_FAILED = "compile failed"
SPILLS = "spills"
FAILED_VERIFY = "failed-verify"
ERROR = "error"
COMPILED = "compiled"             # compiled, not measured (--compile-only)
TIMED = "timed"                   # verified and timed on every case


# -- 1. the space ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class WarpChoice:
    """Homogeneous warps (producer 0) or a producer/consumer split."""

    compute: int
    producer: int = 0

    def as_spec(self) -> dict:
        if self.producer:
            return {"producer": self.producer, "consumer": self.compute}
        return {"compute": self.compute}

    @property
    def tag(self) -> str:
        return f"p{self.producer}c{self.compute}" if self.producer else f"w{self.compute}"

    def __str__(self) -> str:
        return f"{self.producer}+{self.compute}" if self.producer else str(self.compute)


def swizzle_token(value) -> str:
    """A spec's smem.swizzle (model or dumped form) as a short token: none, xor3, xor3r1, pad16."""
    if isinstance(value, (PadSwizzle, XorSwizzle)):
        value = value.model_dump()
    if value == "none":
        return "none"
    if "pad_bytes" in value:
        return f"pad{value['pad_bytes']}"
    shift = value.get("row_shift", 0)
    return f"xor{value['xor_bits']}" + (f"r{shift}" if shift else "")


def swizzle_value(token: str):
    """Inverse of swizzle_token: the value a spec's smem.swizzle takes."""
    m = re.fullmatch(r"none|pad(\d+)|xor(\d+)(?:r(\d+))?", token)
    if not m:
        raise ValueError(f"swizzle token {token!r} is not none, padN, xorB or xorBrS")
    if token == "none":
        return "none"
    if m.group(1):
        return {"pad_bytes": int(m.group(1))}
    return {"xor_bits": int(m.group(2)), "row_shift": int(m.group(3) or 0)}


def _swizzle_tag(token: str) -> str:
    return {"none": "u"}.get(token, token.replace("xor", "x").replace("pad", "p"))


@dataclass(frozen=True)
class Choice:
    """One point of a SearchSpace: a value for each field."""

    block_m: int
    block_n: int
    warps: WarpChoice
    stages: int
    swizzle: str
    q_in_registers: bool

    @property
    def tag(self) -> str:
        """Short, deterministic and unique within a space, e.g. m128n64w8s2x3q."""
        return (f"m{self.block_m}n{self.block_n}{self.warps.tag}s{self.stages}{_swizzle_tag(self.swizzle)}"
                + ("q" if self.q_in_registers else ""))

    def as_dict(self) -> dict:
        return {"block_m": self.block_m, "block_n": self.block_n, "warps": str(self.warps),
                "stages": self.stages, "swizzle": self.swizzle, "q_in_registers": self.q_in_registers}


@dataclass(frozen=True)
class SearchSpace:
    """The values each varied field may take; everything else comes from the base spec."""

    block_m: tuple[int, ...]
    block_n: tuple[int, ...]
    warps: tuple[WarpChoice, ...]
    stages: tuple[int, ...]
    swizzle: tuple[str, ...]
    q_in_registers: tuple[bool, ...]

    FIELDS: ClassVar[tuple[str, ...]] = ("block_m", "block_n", "warps", "stages", "swizzle", "q_in_registers")

    @property
    def size(self) -> int:
        return math.prod(len(getattr(self, f)) for f in self.FIELDS)

    def choices(self) -> Iterable[Choice]:
        """Every point, in a fixed order (the fields' values in the order given)."""
        for values in itertools.product(*(getattr(self, f) for f in self.FIELDS)):
            yield Choice(*values)

    def neighbours(self, choice: Choice) -> list[Choice]:
        """Points that differ from `choice` in one field, by one step in that field's value list."""
        out = []
        for f in self.FIELDS:
            values = getattr(self, f)
            i = values.index(getattr(choice, f))
            for j in (i - 1, i + 1):
                if 0 <= j < len(values):
                    out.append(Choice(**{**_fields(choice), f: values[j]}))
        return out

    def as_dict(self) -> dict:
        d = {f: list(getattr(self, f)) for f in self.FIELDS}
        d["warps"] = [w.as_spec() for w in self.warps]
        return d


def _fields(choice: Choice) -> dict:
    return {f: getattr(choice, f) for f in SearchSpace.FIELDS}


def _with(defaults: Iterable, base_value) -> tuple:
    return tuple(sorted(set(defaults) | {base_value}))


def choice_of(spec: Spec) -> Choice:
    """The point a spec sits at."""
    warps = WarpChoice(spec.compute_warps, spec.producer_warps)
    return Choice(spec.tile.block_m, spec.tile.block_n, warps, spec.smem.stages, swizzle_token(spec.smem.swizzle),
                  spec.smem.q_in_registers)


def default_space(base: Spec) -> SearchSpace:
    """The default space around `base`: its own values plus the usual alternatives.

    Producer/consumer splits are tried only when the base uses warp roles; the swizzle is the
    base's or none.
    """
    at = choice_of(base)
    warps = {WarpChoice(w) for w in DEFAULT_COMPUTE_WARPS}
    if base.producer_warps:
        warps |= {WarpChoice(c, p) for p, c in DEFAULT_ROLE_PAIRS}
    warps.add(at.warps)
    return SearchSpace(
        block_m=_with(DEFAULT_BLOCK_M, at.block_m),
        block_n=_with(DEFAULT_BLOCK_N, at.block_n),
        warps=tuple(sorted(warps, key=lambda w: (w.producer > 0, w.producer, w.compute))),
        stages=_with(DEFAULT_STAGES, at.stages),
        swizzle=tuple(dict.fromkeys((at.swizzle, "none"))),
        q_in_registers=(False, True),
    )


# -- 2. candidates and static pruning ---------------------------------------------------------------

@dataclass(frozen=True)
class Candidate:
    """A valid, planned and rendered variant of the base spec."""

    choice: Choice
    spec: Spec
    plan: Plan
    source: str
    spec_hash: str
    code_hash: str

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class Pruned:
    choice: Choice
    reason: str
    message: str


def candidate_name(base_name: str, tag: str) -> str:
    """`<base>_<tag>`, the base part shortened when the whole would break the name rule."""
    return f"{base_name[:NAME_MAX - len(tag) - 1].rstrip('_')}_{tag}"


def spec_hash(spec: Spec) -> str:
    """SHA-256 of the spec's canonical JSON without its name: the same kernel under any name."""
    data = {k: v for k, v in spec_dict(spec).items() if k != "name"}
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def code_hash(source: str, name: str) -> str:
    """SHA-256 of the generated code below its header comment, with the kernel name factored out:
    two candidates with equal code hashes compile to the same kernel."""
    lines = source.splitlines()
    start = next((i for i, ln in enumerate(lines) if not ln.startswith("//")), len(lines))
    code = "\n".join(lines[start:]).replace(f"attngen_{name}", "attngen_@")
    return hashlib.sha256(code.encode()).hexdigest()


def build_candidate(base: Spec, choice: Choice) -> Candidate:
    """The base spec with `choice` applied, validated like a spec file, planned and rendered.

    Raises SpecError (a rule) or BudgetError (shared memory over the target's budget).
    """
    data = spec_dict(base)
    data["name"] = candidate_name(base.name, choice.tag)
    data["tile"] = {"block_m": choice.block_m, "block_n": choice.block_n}
    data["warps"] = choice.warps.as_spec()
    data["smem"] = {**data["smem"], "swizzle": swizzle_value(choice.swizzle), "stages": choice.stages,
                    "q_in_registers": choice.q_in_registers}
    text = spec_yaml(data)
    label = f"<sweep {data['name']}>"
    spec = parse_spec(text, file=label)
    plan = make_plan(spec, file=label)
    source = render_plan(plan, label, text)
    return Candidate(choice, spec, plan, source, spec_hash(spec), code_hash(source, spec.name))


def prune_reason(exc: SpecError) -> str:
    """The count a refused candidate goes to: the budget, or the spec rule by its key."""
    if isinstance(exc, BudgetError):
        return BUDGET
    return f"spec rule: {exc.key or 'other'}"


def prune(base: Spec, choices: Iterable[Choice]) -> tuple[list[Candidate], list[Pruned]]:
    """Build every choice; keep the valid ones whose code no earlier candidate already has."""
    survivors, pruned, seen = [], [], {}
    for choice in choices:
        try:
            cand = build_candidate(base, choice)
        except SpecError as exc:
            pruned.append(Pruned(choice, prune_reason(exc), exc.message))
            continue
        if cand.code_hash in seen:
            pruned.append(Pruned(choice, DUPLICATE, f"same code as {seen[cand.code_hash]}"))
            continue
        seen[cand.code_hash] = cand.name
        survivors.append(cand)
    return survivors, pruned


def sample(candidates: list[Candidate], budget: int | None, seed: int) -> list[Candidate]:
    """At most `budget` candidates: all when they fit, else a seeded sample kept in space order."""
    if budget is None or len(candidates) <= budget:
        return list(candidates)
    keep = sorted(random.Random(seed).sample(range(len(candidates)), budget))
    return [candidates[i] for i in keep]


# -- 3. compile --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CompileOutcome:
    status: str                     # ok | spills | compile failed
    registers: int | None = None    # the most any of its functions uses
    note: str = ""


def compile_candidate(source: str, arch: str) -> CompileOutcome:
    """nvcc one source (cached by compile.compile_source); runs in a pool worker."""
    from ..compile import compile_source
    try:
        res = compile_source(source, arch)
    except ToolError as exc:
        return CompileOutcome(COMPILE_FAILED, note=str(exc).splitlines()[-1][:200])
    regs = max((f.registers for f in res.functions), default=None)
    spilled = [f for f in res.functions if f.spills]
    if spilled:
        f = spilled[0]
        return CompileOutcome(SPILLS, regs, f"{f.name}: {f.spill_stores} B spill stores, {f.spill_loads} B loads")
    return CompileOutcome("ok", regs)


def compile_all(candidates: list[Candidate], arch: str, jobs: int,
                on_done: Callable[[Candidate, CompileOutcome], None] | None = None) -> dict[str, CompileOutcome]:
    """Compile every candidate, `jobs` at a time, in worker processes (nvcc and rendering are CPU-bound).

    Workers are spawned, not forked: the parent may already hold a CUDA context.
    """
    from ..compile import find_nvcc
    find_nvcc()                     # no nvcc is one error for the sweep, not one per candidate
    out: dict[str, CompileOutcome] = {}

    def done(cand, outcome):
        out[cand.name] = outcome
        if on_done:
            on_done(cand, outcome)

    if jobs <= 1 or len(candidates) <= 1:
        for cand in candidates:
            done(cand, compile_candidate(cand.source, arch))
        return out
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(candidates)), mp_context=ctx) as pool:
        futures = {pool.submit(compile_candidate, c.source, arch): c for c in candidates}
        for fut in as_completed(futures):
            done(futures[fut], fut.result())
    return out


# -- 4. measure ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Measurement:
    status: str                      # ok | failed-verify | error
    median_us: float | None = None
    note: str = ""
    fatal: bool = False              # the CUDA context is unusable: nothing more can run in this process


class Measurer(Protocol):
    """Runs candidates on one GPU. `measure` verifies before timing; a candidate that fails is
    reported as failed-verify and never timed."""

    gpu: str                         # device name, part of every cache key
    arch: str                        # what candidates are compiled for
    torch_version: str

    def measure(self, plan: Plan, source: str, shape: Shape, causal: bool) -> Measurement: ...

    def flash_time(self, shape: Shape, dtype: str, causal: bool) -> float | None: ...


class GpuMeasurer:
    """The real Measurer: attngen's runtime, verifier and bench timing on the current GPU.

    Per candidate: the verifier's quick suite on every mask variant (once), then the bench's
    output check on the sweep shape's inputs, then the median of `reps` timed calls. Inputs are
    made once per shape and dtype and shared by every candidate and by torch's flash backend.
    """

    def __init__(self, *, reps: int = DEFAULT_REPS, seed: int = 0):
        from ..runtime import device_arch, gpu_modules
        torch = gpu_modules()[0]
        self.torch = torch
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.gpu = torch.cuda.get_device_name(self.device)
        self.arch = device_arch(torch)
        self.torch_version = torch.__version__
        self.reps = reps
        self.seed = seed
        self._inputs: dict[tuple, list] = {}
        self._verified: dict[str, tuple[bool, str]] = {}
        self._kernel = (None, None)              # (source, Kernel): the candidate being measured

    def _sets(self, shape: Shape, dtype: str):
        key = (shape, dtype)
        if key not in self._inputs:
            gen = self.torch.Generator(device=self.device)
            gen.manual_seed(self.seed)
            self._inputs[key] = input_sets(self.torch, Case(*shape, dtype, False), self.device, gen)
        return self._inputs[key]

    def _load(self, plan: Plan, source: str):
        from ..runtime import Kernel
        if self._kernel[0] != source:
            self._kernel = (None, None)
            kernel = Kernel.from_source(plan, source, label=plan.spec.name, on_compile=lambda arch: None)
            self._kernel = (source, kernel)
        return self._kernel[1]

    def _verify(self, kernel) -> tuple[bool, str]:
        """The quick verification suite on every mask variant, once per source."""
        from .verify import suite, verify_kernel
        if kernel.source not in self._verified:
            kernel.synchronize = True            # a fault is reported with the case that caused it
            try:
                results = verify_kernel(kernel, suite(quick=True), seed=self.seed, spec_label=kernel.name)
            finally:
                kernel.synchronize = False
            bad = [r for r in results if not r.passed]
            note = f"{bad[0].variant} {bad[0].shape.label}: {'; '.join(bad[0].problems)}" if bad else ""
            self._verified[kernel.source] = (not bad, note)
        return self._verified[kernel.source]

    def _usable(self) -> bool:
        from .verify import context_usable
        return context_usable(self.device)

    def measure(self, plan: Plan, source: str, shape: Shape, causal: bool) -> Measurement:
        try:
            kernel = self._load(plan, source)
            ok, note = self._verify(kernel)
            if ok:
                sets = self._sets(shape, plan.spec.dtype)
                ok, note = check_output(self.torch, kernel, *sets[0], causal)
            if not ok:
                return Measurement(FAILED_VERIFY, note=note, fatal=not self._usable())
            med, spread = time_calls(self.torch, kernel_call(self.torch, kernel, sets, causal), sets, reps=self.reps)
            return Measurement("ok", med, f"spread {spread:.1f}%")
        except (TypeError, ValueError):
            raise                                # the sweep called the kernel wrongly: a bug, not a result
        except Exception as exc:
            first = str(exc).splitlines()[0][:200] if str(exc) else ""
            return Measurement(ERROR, note=f"{type(exc).__name__}: {first}", fatal=not self._usable())

    def flash_time(self, shape: Shape, dtype: str, causal: bool) -> float | None:
        fn = sdpa_callable(self.torch, "flash", causal)
        sets = self._sets(shape, dtype)
        try:
            fn(*sets[0])
            self.torch.cuda.synchronize()
        except RuntimeError:
            return None                          # flash does not run this case on this GPU
        return time_calls(self.torch, fn, sets, reps=self.reps)[0]


# -- 5. the record cache ----------------------------------------------------------------------------

def shape_of(case: Case) -> Shape:
    return case.batch, case.heads, case.seqlen, case.head_dim


class RecordCache:
    """One JSON file per (spec hash, GPU, shape, dtype, causal) under <compile.cache_dir()>/sweep/.

    A record also holds the code hash it was measured with: after a template change the same
    spec renders other code, and its old record no longer counts.
    """

    def __init__(self, root: Path | None = None):
        if root is None:
            from ..compile import cache_dir
            root = cache_dir() / "sweep"
        self.root = Path(root)

    def path(self, spec_hash: str, gpu: str, case: Case) -> Path:
        gpu_slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
        shape = "x".join(map(str, shape_of(case)))
        return self.root / spec_hash[:32] / f"{gpu_slug}_{shape}_{case.dtype}_{'causal' if case.causal else 'full'}.json"

    def get(self, cand: Candidate, gpu: str, case: Case) -> dict | None:
        try:
            rec = json.loads(self.path(cand.spec_hash, gpu, case).read_text())
        except (OSError, ValueError):
            return None
        same = (rec.get("spec_hash") == cand.spec_hash and rec.get("code_hash") == cand.code_hash
                and rec.get("gpu") == gpu and tuple(rec.get("shape", ())) == shape_of(case)
                and rec.get("dtype") == case.dtype and rec.get("causal") == case.causal)
        return rec if same else None

    def put(self, record: dict) -> None:
        """Write atomically, so an interrupted sweep never leaves half a record."""
        case = Case(*record["shape"], record["dtype"], record["causal"])
        path = self.path(record["spec_hash"], record["gpu"], case)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(record, indent=1) + "\n")
            os.replace(tmp, path)
        except OSError:
            pass                                 # a read-only cache only costs re-measuring


def make_record(cand: Candidate, measurer: Measurer, case: Case, m: Measurement) -> dict:
    return {"spec_hash": cand.spec_hash, "code_hash": cand.code_hash, "name": cand.name, "gpu": measurer.gpu,
            "shape": list(shape_of(case)), "dtype": case.dtype, "causal": case.causal, "status": m.status,
            "median_us": m.median_us, "note": m.note, "torch": measurer.torch_version}


# -- 6. the search -------------------------------------------------------------------------------

@dataclass
class Progress:
    """Counts shown while a sweep runs; `on_change(progress, steps_done)` after every step."""

    pruned: int = 0
    compiled: int = 0
    failed: int = 0
    timed: int = 0
    cached: int = 0
    best: dict = field(default_factory=dict)      # case label -> (us, name)
    on_change: Callable[["Progress", int], None] | None = None

    def step(self, n: int = 1) -> None:
        if self.on_change:
            self.on_change(self, n)

    def best_text(self) -> str:
        if not self.best:
            return "-"
        label, (us, name) = next(iter(self.best.items()))
        return f"{name} {us:.1f} us ({label})"


@dataclass
class CandidateResult:
    candidate: Candidate
    compile: CompileOutcome | None = None        # None: every case came from the record cache
    records: dict[Case, dict] = field(default_factory=dict)

    @property
    def outcome(self) -> str:
        """compile failed | spills | compiled (not measured) | timed | failed-verify | error."""
        if self.compile is not None and self.compile.status != "ok":
            return self.compile.status
        if not self.records:
            return COMPILED
        statuses = {r["status"] for r in self.records.values()}
        return next((s for s in (ERROR, FAILED_VERIFY) if s in statuses), TIMED)

    def time(self, case: Case) -> float | None:
        r = self.records.get(case)
        return r["median_us"] if r and r["status"] == "ok" else None

    def fitness(self, cases: list[Case]) -> float:
        """Geometric mean of the times over every case; infinite unless every case passed."""
        times = [self.time(c) for c in cases]
        if not times or any(t is None for t in times):
            return math.inf
        return math.exp(sum(map(math.log, times)) / len(times))


@dataclass
class SweepOptions:
    cases: list[Case]
    search: str = "grid"             # grid | evolve
    budget: int | None = None        # at most this many candidates compiled
    seed: int = 0
    generations: int = 4
    top_k: int = 4
    jobs: int = 1


@dataclass
class SweepReport:
    base: Spec
    space: SearchSpace
    options: SweepOptions
    arch: str
    pruned: list[Pruned]
    results: list[CandidateResult]
    gpu: str | None = None
    torch_version: str | None = None
    flash: dict[Case, float | None] = field(default_factory=dict)
    unvisited: tuple[str, int] = (NOT_SAMPLED, 0)    # survivors left out, and why

    def counts(self) -> dict[str, int]:
        """Candidates per outcome: each prune reason, then compile and measurement outcomes."""
        c = Counter(p.reason for p in self.pruned)
        if self.unvisited[1]:
            c[self.unvisited[0]] = self.unvisited[1]
        c.update(r.outcome for r in self.results)
        return {"enumerated": self.space.size, **dict(sorted(c.items()))}

    def ranking(self, case: Case) -> list[CandidateResult]:
        """Candidates timed on `case`, fastest first (ties by name); failures are never ranked."""
        timed = [r for r in self.results if r.outcome == TIMED and r.time(case) is not None]
        return sorted(timed, key=lambda r: (r.time(case), r.candidate.name))


class Sweep:
    """Runs one sweep: compile and measure batches of candidates, through the record cache."""

    def __init__(self, report: SweepReport, measurer: Measurer | None, cache: RecordCache | None,
                 progress: Progress):
        self.report = report
        self.measurer = measurer
        self.cache = cache
        self.progress = progress
        self.done: dict[Choice, CandidateResult] = {}

    @property
    def cases(self) -> list[Case]:
        return self.report.options.cases

    def evaluate(self, batch: list[Candidate]) -> None:
        """Compile and measure `batch`; a candidate with every case in the record cache skips both."""
        results = [CandidateResult(c) for c in batch]
        to_compile = []
        for r in results:
            self.done[r.candidate.choice] = r
            self.report.results.append(r)
            if self.measurer is not None:
                for case in self.cases:
                    rec = self.cache.get(r.candidate, self.measurer.gpu, case) if self.cache else None
                    if rec is not None:
                        r.records[case] = rec
            unfinished = len(r.records) < len(self.cases) and r.outcome in (COMPILED, TIMED)
            if self.measurer is None or unfinished:
                to_compile.append(r)
            else:
                self._count_cached(r)
        by_name = {r.candidate.name: r for r in to_compile}

        def compiled(cand, outcome):
            by_name[cand.name].compile = outcome
            if outcome.status == "ok":
                self.progress.compiled += 1
            else:
                self.progress.failed += 1
            self.progress.step()

        if to_compile:
            compile_all([r.candidate for r in to_compile], self.report.arch, self.report.options.jobs, compiled)
        if self.measurer is None:
            return
        for r in to_compile:
            if r.compile.status == "ok":
                self._measure(r)
            else:
                self.progress.step(len(self.cases))

    def _count_cached(self, r: CandidateResult) -> None:
        self.progress.cached += len(r.records)
        for case, rec in r.records.items():
            self._note_time(r, case, rec)
        self._count_failed(r)
        self.progress.step(1 + len(self.cases))

    def _measure(self, r: CandidateResult) -> None:
        """Measure the cases not in the cache; after a failure the rest are skipped (never ranked)."""
        for case in self.cases:
            if case in r.records:
                self.progress.cached += 1
                self._note_time(r, case, r.records[case])
            elif r.outcome in (COMPILED, TIMED):
                self._measure_case(r, case)
            self.progress.step()
        self._count_failed(r)

    def _measure_case(self, r: CandidateResult, case: Case) -> None:
        cand = r.candidate
        m = self.measurer.measure(cand.plan, cand.source, shape_of(case), case.causal)
        rec = make_record(cand, self.measurer, case, m)
        r.records[case] = rec
        if m.status != ERROR or m.fatal:
            self.cache.put(rec)                  # other errors may be passing: the next run retries them
        if m.fatal:
            raise ToolError(f"the CUDA context was lost while measuring {cand.name} ({m.note}); its result is "
                            "cached: run the same command again to resume")
        self._note_time(r, case, rec)

    def _note_time(self, r: CandidateResult, case: Case, rec: dict) -> None:
        if rec["status"] != "ok":
            return
        self.progress.timed += 1
        best = self.progress.best.get(case.label)
        if best is None or rec["median_us"] < best[0]:
            self.progress.best[case.label] = (rec["median_us"], r.candidate.name)

    def _count_failed(self, r: CandidateResult) -> None:
        if r.outcome in (FAILED_VERIFY, ERROR):
            self.progress.failed += 1

    # -- searches ------------------------------------------------------------------------------
    def grid(self, candidates: list[Candidate]) -> None:
        self.evaluate(candidates)

    def evolve(self, candidates: list[Candidate]) -> None:
        """Seeded random population of 2 x top-k; then per generation keep the top-k by time and
        give each one child that differs in one field by one step. A candidate is never
        evaluated twice; the budget caps how many are evaluated in all."""
        opts = self.report.options
        rng = random.Random(opts.seed)
        valid = {c.choice: c for c in candidates}
        limit = len(candidates) if opts.budget is None else min(opts.budget, len(candidates))
        self.evaluate(rng.sample(candidates, min(2 * opts.top_k, limit)))
        for _ in range(opts.generations):
            ranked = sorted((r for r in self.done.values() if r.fitness(self.cases) < math.inf),
                            key=lambda r: (r.fitness(self.cases), r.candidate.name))
            children: dict[Choice, Candidate] = {}
            for parent in ranked[:opts.top_k]:
                options = self.report.space.neighbours(parent.candidate.choice)
                rng.shuffle(options)
                child = next((c for c in options if c in valid and c not in self.done and c not in children), None)
                if child is not None:
                    children[child] = valid[child]
            batch = list(children.values())[:limit - len(self.done)]
            if not batch:
                break
            self.evaluate(batch)


def planned_steps(n_candidates: int, options: SweepOptions, measuring: bool) -> int:
    """Progress steps: one per compile and one per measured case of each candidate."""
    if options.search == "evolve":
        n = 2 * options.top_k + options.generations * options.top_k
        n = min(n, n_candidates if options.budget is None else min(options.budget, n_candidates))
    else:
        n = n_candidates if options.budget is None else min(options.budget, n_candidates)
    return n * (1 + (len(options.cases) if measuring else 0))


def run_sweep(base: Spec, space: SearchSpace, options: SweepOptions, *, arch: str,
              measurer: Measurer | None = None, cache: RecordCache | None = None,
              progress: Progress | None = None, survivors: tuple[list[Candidate], list[Pruned]] | None = None
              ) -> SweepReport:
    """The whole sweep. Without a measurer only compiles (what a grid sweep would measure).

    `survivors`: the result of prune(base, space.choices()) when the caller already has it.
    """
    progress = progress or Progress()
    candidates, pruned = survivors or prune(base, space.choices())
    progress.pruned = len(pruned)
    report = SweepReport(base, space, options, arch, pruned, [],
                         gpu=getattr(measurer, "gpu", None), torch_version=getattr(measurer, "torch_version", None))
    if measurer is not None and cache is None:
        cache = RecordCache()
    sweep = Sweep(report, measurer, cache, progress)
    if measurer is not None:
        for case in options.cases:
            report.flash[case] = measurer.flash_time(shape_of(case), case.dtype, case.causal)
    if options.search == "evolve" and measurer is not None:
        sweep.evolve(candidates)
        report.unvisited = (NOT_REACHED, len(candidates) - len(report.results))
    else:
        chosen = sample(candidates, options.budget, options.seed)
        progress.pruned += len(candidates) - len(chosen)
        sweep.grid(chosen)
        report.unvisited = (NOT_SAMPLED, len(candidates) - len(chosen))
    return report


# -- 7. output ---------------------------------------------------------------------------------------

def _ratio(flash: float | None, us: float | None) -> float | None:
    return flash / us if flash and us else None


def format_report(report: SweepReport, *, top: int | None = 20) -> str:
    """Ranked table per case, the flash reference, the base spec's place, and the counts."""
    base_choice = choice_of(report.base)
    lines = []
    if report.gpu:
        lines.append(f"GPU: {report.gpu} ({report.arch}), torch {report.torch_version}; "
                     f"vs flash = flash time / candidate time (above 1.00 the candidate is faster)")
    head = (f"{'rank':>4}  {'name':<40} {'block_m':>7} {'block_n':>7} {'warps':>5} {'stages':>6} "
            f"{'swizzle':<7} {'q_regs':<6} {'time us':>9} {'TFLOP/s':>8} {'vs flash':>8}")
    for case in report.options.cases if report.gpu else []:
        ranked = report.ranking(case)
        flash = report.flash.get(case)
        lines += ["", f"{case.label}: {len(ranked)} ranked; torch flash "
                      + (f"{flash:.1f} us, {case.tflops(flash):.1f} TFLOP/s" if flash else "unavailable"), head]
        for i, r in enumerate(ranked, 1):
            if top is not None and i > top and r.candidate.choice != base_choice:
                continue
            c, us = r.candidate.choice, r.time(case)
            ratio = _ratio(flash, us)
            mark = "  (base)" if c == base_choice else ""
            lines.append(f"{i:>4}  {r.candidate.name:<40} {c.block_m:>7} {c.block_n:>7} {str(c.warps):>5} "
                         f"{c.stages:>6} {c.swizzle:<7} {'yes' if c.q_in_registers else 'no':<6} {us:>9.1f} "
                         f"{case.tflops(us):>8.1f} {f'{ratio:.2f}' if ratio else '-':>8}{mark}")
        if top is not None and len(ranked) > top:
            lines.append(f"      ... {len(ranked) - top} more in --json")
    lines += ["", "candidates:"] + [f"  {k:<28} {v:>5}" for k, v in report.counts().items()]
    return "\n".join(lines)


def report_dict(report: SweepReport) -> dict:
    """Everything: space, options, counts, flash times, per-case rankings, every candidate."""
    def case_dict(case: Case) -> dict:
        return {"shape": list(shape_of(case)), "dtype": case.dtype, "causal": case.causal, "label": case.label}

    cases = []
    for case in report.options.cases if report.gpu else []:
        flash = report.flash.get(case)
        cases.append({**case_dict(case), "flash_us": flash, "ranking": [
            {"rank": i, "name": r.candidate.name, "median_us": r.time(case), "tflops": case.tflops(r.time(case)),
             "vs_flash": _ratio(flash, r.time(case))} for i, r in enumerate(report.ranking(case), 1)]})
    opts = report.options
    return {
        "base": report.base.name, "gpu": report.gpu, "arch": report.arch, "torch": report.torch_version,
        "space": report.space.as_dict(),
        "options": {"search": opts.search, "budget": opts.budget, "seed": opts.seed, "generations": opts.generations,
                    "top_k": opts.top_k, "cases": [case_dict(c) for c in opts.cases]},
        "counts": report.counts(),
        "cases": cases,
        "candidates": [{"name": r.candidate.name, "fields": r.candidate.choice.as_dict(),
                        "spec_hash": r.candidate.spec_hash, "outcome": r.outcome,
                        "compile": asdict(r.compile) if r.compile else None,
                        "results": [{**case_dict(c), "status": rec["status"], "median_us": rec["median_us"],
                                     "note": rec["note"]} for c, rec in r.records.items()]}
                       for r in report.results],
        "pruned": [{"name": candidate_name(report.base.name, p.choice.tag), "fields": p.choice.as_dict(),
                    "reason": p.reason, "message": p.message} for p in report.pruned],
    }


def winners(report: SweepReport) -> dict[str, tuple[Candidate, list[Case]]]:
    """The fastest candidate of each case, grouped: name -> (candidate, the cases it won)."""
    out: dict[str, tuple[Candidate, list[Case]]] = {}
    for case in report.options.cases:
        ranked = report.ranking(case)
        if ranked:
            cand = ranked[0].candidate
            out.setdefault(cand.name, (cand, []))[1].append(case)
    return out


def best_spec_text(report: SweepReport, cand: Candidate, cases: list[Case], command: str) -> str:
    """A spec file for a winner: comment lines on where and how it won, then the spec."""
    result = next(r for r in report.results if r.candidate is cand)
    lines = [f"# attngen sweep winner over {report.base.name} on {report.gpu} ({report.arch}), "
             f"torch {report.torch_version}:"]
    for case in cases:
        us, flash = result.time(case), report.flash.get(case)
        ratio = _ratio(flash, us)
        vs = f"{ratio:.2f}x torch's flash backend ({flash:.1f} us)" if ratio else "torch's flash backend unavailable"
        lines.append(f"#   {case.label}: {us:.1f} us, {case.tflops(us):.1f} TFLOP/s, {vs}")
    lines.append(f"# command: {command}")
    data = spec_dict(cand.spec)
    c = cand.choice
    data["description"] = (f"sweep winner over {report.base.name}, {c.block_m}x{c.block_n} tiles, {c.warps} warps, "
                           f"{c.stages} stages, swizzle {c.swizzle}, Q in {'registers' if c.q_in_registers else 'smem'}")
    return "\n".join(lines) + "\n" + spec_yaml(data)


def write_best(report: SweepReport, out_dir: str | Path, command: str) -> list[Path]:
    """DIR/<name>.yaml for the winner of each case, ready for `attngen build`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (cand, cases) in winners(report).items():
        path = out / f"{name}.yaml"
        path.write_text(best_spec_text(report, cand, cases, command))
        written.append(path)
    return written


def parse_cases(shapes: str, base: Spec, causal: str) -> list[Case]:
    """--shapes and --causal as cases in the base's dtype; a shape must have the base's head_dim and
    the base must emit the mask variants asked for."""
    causals = CAUSAL_CHOICES[causal]
    for c in causals:
        mask = "causal" if c else "none"
        if mask not in base.masks:
            raise ValueError(f"the base spec {base.name} has no {mask!r} variant (masks {list(base.masks)}); "
                             f"choose --causal {'no' if c else 'yes'}")
    cases = []
    for text in shapes.split(","):
        shape = parse_shape(text.strip())
        if shape[3] != base.head_dim:
            raise ValueError(f"shape {text.strip()} has head_dim {shape[3]}, the base spec {base.name} "
                             f"{base.head_dim}")
        cases += [Case(*shape, base.dtype, c) for c in causals]
    return cases

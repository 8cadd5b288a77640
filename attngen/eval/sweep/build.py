"""Candidates: a base spec with one point of its space applied, validated, planned and rendered
(`build_candidate`), their hashes, and nvcc over many of them at once (`compile_all`)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Callable

from ...errors import ToolError, WriteError
from ...plan import Plan, make_plan
from ...render import render_parts
from ...spec import Spec, parse_spec, spec_dict, spec_yaml
from .space import Choice, SearchSpace

NAME_MAX = 48                              # the spec name rule: ^[a-z][a-z0-9_]{0,47}$

# Compile outcomes that drop a candidate.
COMPILE_FAILED = "compile failed"
SPILLS = "spills"


@dataclass(frozen=True)
class Candidate:
    """A valid, planned and rendered variant of the base spec."""

    choice: Choice
    spec: Spec
    plan: Plan
    sources: tuple[str, ...]   # one per part of the plan's bundle (a forward kind: one)
    spec_hash: str
    code_hash: str

    @property
    def name(self) -> str:
        return self.spec.name


def candidate_name(base_name: str, tag: str) -> str:
    """`<base>_<tag>`, the base part shortened when the whole would break the name rule."""
    return f"{base_name[:NAME_MAX - len(tag) - 1].rstrip('_')}_{tag}"


def spec_hash(spec: Spec) -> str:
    """SHA-256 of the spec's canonical JSON without its name: the same kernel under any name."""
    data = {k: v for k, v in spec_dict(spec).items() if k != "name"}
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def code_hash(sources: tuple[str, ...], name: str) -> str:
    """SHA-256 of the generated code of every part below its header comment, with the kernel name
    factored out: two candidates with equal code hashes compile to the same kernels."""
    def code(source: str) -> str:
        lines = source.splitlines()
        start = next((i for i, ln in enumerate(lines) if not ln.startswith("//")), len(lines))
        return "\n".join(lines[start:]).replace(f"attngen_{name}", "attngen_@")
    return hashlib.sha256("\n\f\n".join(code(s) for s in sources).encode()).hexdigest()


@dataclass(frozen=True)
class Checked:
    """A point of a space applied to the base spec, validated and planned, not yet rendered."""

    choice: Choice
    spec: Spec
    plan: Plan
    text: str      # the spec's YAML, which the generated files' headers quote
    label: str


def check_candidate(base: Spec, space: SearchSpace, choice: Choice) -> Checked:
    """The base spec with `choice` (a point of `space`) applied, validated like a spec file and
    planned. Raises SpecError (a rule) or BudgetError (shared memory over the target's budget)."""
    data = spec_dict(base)
    data["name"] = candidate_name(base.name, choice.tag)
    space.apply(data, choice)
    text = spec_yaml(data)
    label = f"<sweep {data['name']}>"
    spec = parse_spec(text, file=label)
    return Checked(choice, spec, make_plan(spec, file=label), text, label)


def render_candidate(checked: Checked) -> Candidate:
    """A checked point rendered: its sources and hashes (most of a candidate's cost before nvcc)."""
    sources = tuple(part.source for part in render_parts(checked.plan, checked.label, checked.text))
    return Candidate(checked.choice, checked.spec, checked.plan, sources, spec_hash(checked.spec),
                     code_hash(sources, checked.spec.name))


def build_candidate(base: Spec, space: SearchSpace, choice: Choice) -> Candidate:
    """The base spec with `choice` (a point of `space`) applied, validated like a spec file, planned
    and rendered.

    Raises SpecError (a rule) or BudgetError (shared memory over the target's budget).
    """
    return render_candidate(check_candidate(base, space, choice))


@dataclass(frozen=True)
class CompileOutcome:
    status: str                     # ok | spills | compile failed
    registers: int | None = None    # the most any of its functions uses
    note: str = ""


def compile_candidate(sources: tuple[str, ...], arch: str) -> CompileOutcome:
    """nvcc a candidate's sources one after another (cached by compile.compile_source)."""
    from ...compile import compile_source
    results = []
    for source in sources:
        try:
            results.append(compile_source(source, arch))
        except ToolError as exc:
            results.append(exc)
            break
    return outcome_of(results)


def outcome_of(results) -> CompileOutcome:
    """A candidate's outcome from its parts' CompileResults (or the ToolError of a failed one)."""
    functions = []
    for r in results:
        if isinstance(r, WriteError):
            raise r                 # an unwritable cache fails every candidate alike: one error, exit 3
        if isinstance(r, ToolError):
            return CompileOutcome(COMPILE_FAILED, note=str(r).splitlines()[-1][:200])
        functions += r.functions
    regs = max((f.registers for f in functions), default=None)
    spilled = [f for f in functions if f.spills]
    if spilled:
        f = spilled[0]
        return CompileOutcome(SPILLS, regs, f"{f.name}: {f.spill_stores} B spill stores, {f.spill_loads} B loads")
    return CompileOutcome("ok", regs)


def compile_all(candidates: list[Candidate], arch: str, jobs: int,
                on_done: Callable[[Candidate, CompileOutcome], None] | None = None) -> dict[str, CompileOutcome]:
    """Compile every candidate, `jobs` nvcc at a time (compile.compile_many): every part of every
    candidate is a job of one batch, and a candidate's outcome is known when its last part is."""
    from ...compile import CompileJob, compile_many
    batch, owner = [], []
    for cand in candidates:
        target = cand.plan.compile_arch(arch)     # a kind may need the arch-specific target (sm_90a for wgmma)
        for source in cand.sources:
            batch.append(CompileJob(source, target, cand.name))
            owner.append(cand)
    parts: dict[str, dict[int, object]] = {c.name: {} for c in candidates}
    out: dict[str, CompileOutcome] = {}

    def part_done(index, result):
        cand = owner[index]
        got = parts[cand.name]
        got[index] = result
        if len(got) == len(cand.sources):
            outcome = out[cand.name] = outcome_of([got[i] for i in sorted(got)])
            if on_done:
                on_done(cand, outcome)

    compile_many(batch, workers=jobs, progress=False, on_done=part_done)   # the sweep draws its own bar
    return out

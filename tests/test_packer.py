"""The Packer a call convention builds at load lays Params out byte for byte as Abi.pack does, for
every committed spec's ABI; it refuses fields the ABI lacks and missing values at load."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from attngen.core.abi import Abi, int32, pointer
from attngen.plan import make_plan
from attngen.spec import load_spec
from spec_sample import SPEC_PATHS

ROOT = Path(__file__).resolve().parent.parent
SPECS = SPEC_PATHS


def random_value(field, rng):
    if field.array:
        return bytes(rng.randrange(256) for _ in range(field.size))
    if field.pack == "f":
        return rng.choice([0.125, 1.4426950408889634, -3.5])
    if field.pack in ("Q",):
        return rng.randrange(2**48)
    if field.pack == "q":
        return rng.randrange(-2**40, 2**40)
    return rng.randrange(-2**31, 2**31)


@pytest.mark.parametrize("spec", SPECS, ids=[p.stem for p in SPECS])
def test_packer_matches_abi_pack(spec):
    abi = make_plan(load_spec(spec)).abi
    rng = random.Random(spec.stem)
    values = {f.name: random_value(f, rng) for f in abi.fields}
    per_call = tuple(rng.sample([f.name for f in abi.fields], len(abi.fields) // 2))
    # every other field is fixed at load when it has no default, and half of the rest are
    fixed = {f.name: values[f.name] for f in abi.fields
             if f.name not in per_call and (f.default is None or rng.random() < 0.5)}
    packer = abi.packer(per_call, fixed)
    assert packer.pack([values[n] for n in per_call]) == abi.pack({n: values[n] for n in per_call} | fixed)


def test_packer_refuses_unknown_and_missing_fields():
    abi = Abi("P", (pointer("q", "q"), int32("n", "n"), int32("m", "m", default=3)))
    with pytest.raises(ValueError, match="no field"):
        abi.packer(("q", "zz"))
    with pytest.raises(ValueError, match="no value for n"):
        abi.packer(("q",))
    with pytest.raises(ValueError, match="both fixed and per call"):
        abi.packer(("q", "n"), {"n": 1})
    assert abi.packer(("q", "n")).pack([16, 7]) == abi.pack({"q": 16, "n": 7})

"""Every kind's tile layout, swept over head dims and XOR widths: a spec the rules accept lays each
16-byte chunk of every tile row at its own address inside the tile; a spec whose XOR would move a
chunk past its row is refused with the key and the fix. Checked in Python, from the plan."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from attngen.errors import SpecError
from attngen.kinds import KINDS, kind_of
from attngen.plan import make_plan
from attngen.spec import load_spec, parse_spec
from spec_sample import SPEC_PATHS, spec_text

ROOT = Path(__file__).resolve().parent.parent


def label(spec) -> str:
    """A kind's name, with the dtype where the spec takes a dtype form of the kind (fwd_wgmma_e4m3)."""
    kind = kind_of(spec)
    return kind.name if kind in KINDS else f"{kind.name}_{spec.dtype}"


def base_specs() -> dict:
    """One committed spec per kind and dtype form (its first: specs/ before its lab, by file name)."""
    out = {}
    for path in SPEC_PATHS:
        spec = load_spec(path)
        out.setdefault(label(spec), path)
    return out


BASES = base_specs()
XOR_KINDS = ("fwd_mma", "decode_mma")     # the kinds whose tiles take any XOR width (wgmma: TMA's panel swizzles)
PANEL_KINDS = ("fwd_wgmma", "fwd_wgmma_e4m3")   # TMA fills whole panels: a padded head_dim's last panel row is permuted whole


def test_every_kind_has_a_base_spec():
    assert set(BASES) == {k.name for k in KINDS} | {f"{k.name}_{dtype}" for k in KINDS for dtype, _ in k.by_dtype}


def tile_rows(plan) -> int:
    return max(plan.block_m, plan.block_n)


def assert_chunks_stay_in_their_tile(plan):
    # A row of the address function: a tile row, or one panel row of the wgmma tiles (whole panels:
    # a padded head_dim's last panel row is permuted whole).
    sw, rows = plan.swizzle, tile_rows(plan)
    chunks = sw.pitch_bytes // 16 if sw.is_xor else min(plan.chunks_per_row, sw.pitch_bytes // 16)
    seen = set()
    for row in range(rows):
        for chunk in range(chunks):
            at = sw.chunk_offset(row, chunk)
            assert row * sw.pitch_bytes <= at < row * sw.pitch_bytes + chunks * 16, (row, chunk, at)
            assert at not in seen, (row, chunk, at)
            seen.add(at)


@pytest.mark.parametrize("kind", sorted(BASES))
@pytest.mark.parametrize("xor_bits", [0, 1, 2, 3])
def test_swizzle_sweep(kind, xor_bits):
    data = yaml.safe_load(spec_text(BASES[kind]))
    accepted = refused = 0
    for head_dim in range(16, 257, 8):
        spec = dict(data, head_dim=head_dim, name=f"sweep_{kind}")
        spec["smem"] = dict(data.get("smem", {}), swizzle={"xor_bits": xor_bits} if xor_bits else "none")
        try:
            plan = make_plan(parse_spec(yaml.safe_dump(spec)))
        except SpecError as exc:
            chunks = head_dim * (1 if data.get("dtype") == "e4m3" else 2) // 16   # e4m3: a byte per element
            if exc.key == "smem.swizzle.xor_bits":
                assert chunks % (1 << xor_bits), f"{kind} d{head_dim}: refused a swizzle that fits: {exc}"
                assert "use " in str(exc)
                refused += 1
            continue   # refused for another rule of the kind (head dims it does not take, budgets)
        if plan.swizzle.is_xor:
            permuted = min(plan.chunks_per_row, plan.swizzle.pitch_bytes // 16) if kind not in PANEL_KINDS else \
                plan.swizzle.pitch_bytes // 16
            assert permuted % (1 << plan.swizzle.xor_bits) == 0, f"{kind} d{head_dim} accepted"
        assert_chunks_stay_in_their_tile(plan)
        accepted += 1
    if xor_bits and kind in XOR_KINDS:
        assert accepted and (refused or xor_bits == 1), f"{kind}: the sweep reached no {'refusal' if accepted else 'plan'}"


@pytest.mark.parametrize("name, head_dim, xor_bits", [("h200_decode_d64", 80, 3), ("l4_mma_d64", 80, 3),
                                                      ("h200_decode_d64", 48, 3), ("l4_mma_d64", 16, 4)])
def test_reported_overflows_are_refused(name, head_dim, xor_bits):
    data = yaml.safe_load(spec_text(ROOT / "specs" / f"{name}.yaml"))
    data["head_dim"] = head_dim
    data["smem"] = dict(data["smem"], swizzle={"xor_bits": xor_bits})
    with pytest.raises(SpecError, match="can land past the row's end; use ") as info:
        make_plan(parse_spec(yaml.safe_dump(data)))
    assert info.value.key == "smem.swizzle.xor_bits"


@pytest.mark.parametrize("name, swizzle, hint", [
    ("h100_mma_d96", {"xor_bits": 2}, "{xor_bits: 2, row_shift: 1}"),     # rows r and r + 4 share banks
    ("h100_mma_d80", {"xor_bits": 1}, "{xor_bits: 1, row_shift: 2}"),     # rows r and r + 2
    ("h100_mma_d96", {"xor_bits": 2, "row_shift": 1}, ""),                # conflict-free: no hint
    ("l4_mma_d64_unswizzled", None, "{xor_bits: 3}"),
    ("h200_decode_d96", {"xor_bits": 2}, "{xor_bits: 2, row_shift: 1}")])
def test_explain_names_a_conflict_free_swizzle(name, swizzle, hint):
    """Where the bank report shows conflicts, the plan names the first XOR swizzle the kind takes
    under which every pattern is conflict-free, and explain prints it."""
    from attngen.explain import explain
    data = yaml.safe_load(spec_text(ROOT / "specs" / f"{name}.yaml"))
    if swizzle:
        data["smem"] = dict(data["smem"], swizzle=swizzle)
    plan = make_plan(parse_spec(yaml.safe_dump(data)))
    assert plan.swizzle_hint == hint
    assert any(p.degree > 1 for p in plan.bank_report) == bool(hint)
    assert (f"smem.swizzle: {hint} makes every access above conflict-free" in explain(plan)) == bool(hint)

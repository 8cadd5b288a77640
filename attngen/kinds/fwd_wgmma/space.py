"""The search space of the wgmma forward kinds for `attngen sweep`: tiles, roles, ring depth, registers, schedule, epilogue."""
from __future__ import annotations

from ...core.search_space import Axis, SearchSpace, field_axis, with_base
from .spec import ROWS_PER_WARPGROUP, WARPGROUP, WgmmaForwardSpec

SWEEP_BLOCK_N = (64, 96, 128, 176, 192)
SWEEP_WARPGROUPS = tuple((p, c) for p in (1, 0) for c in (1, 2, 3))   # (producer warpgroups, consumer warpgroups)
SWEEP_STAGES = (2, 3, 4)
SWEEP_REGISTERS = (None, (24, 240), (32, 160))                       # (producer, consumer) after setmaxnreg
SWEEP_SCHEDULES = ("seq", "overlap", "pingpong")
SWEEP_EPILOGUES = ("registers", "tma")   # shared: measured no faster than tma on any cell (H200)
EPILOGUE_TAGS = {"registers": "", "shared": "es", "tma": "et"}
# (schedule.persistent, schedule.q_tiles): a block per query block, or a block per SM walking query
# blocks with one or two Q tiles. The first names no tag, so that earlier candidates keep their names.
SWEEP_BLOCKS = ((False, 1), (True, 1), (True, 2))
BLOCKS_TAGS = {(False, 1): "", (True, 1): "pb", (True, 2): "pbq2"}
SWEEP_MAX_CHAINS = (1, 4)   # softmax.max_chains; 1 names no tag
SWEEP_K_ROWS = ("in_order", "even_odd")   # e4m3 only; in_order names no tag, even_odd "keo"


def _read_warpgroups(s) -> tuple[int, int]:
    return s.producer_warps // WARPGROUP, s.compute_warps // WARPGROUP


def _write_warpgroups(data: dict, v: tuple[int, int]) -> None:
    producers, consumers = v
    data["warps"] = ({"producer": WARPGROUP, "consumer": WARPGROUP * consumers} if producers
                     else {"compute": WARPGROUP * consumers})
    data.setdefault("tile", {})["block_m"] = ROWS_PER_WARPGROUP * consumers


def _write_registers(data: dict, v) -> None:
    if v is None:
        data.pop("registers", None)
    else:
        data["registers"] = {"producer": v[0], "consumer": v[1]}


def _read_schedule(s) -> str:
    return "pingpong" if s.schedule.pingpong else "overlap" if s.schedule.overlap else "seq"


def _write_schedule(data: dict, v: str) -> None:
    # The base's other schedule keys (persistent, q_tiles: the blocks axis; separate_kv_barriers) stay;
    # softmax_block only where the candidate overlaps (the rule refuses it on the sequential schedule).
    data["schedule"] = {**(data.get("schedule") or {}), "overlap": v != "seq", "pingpong": v == "pingpong"}
    if v == "seq":
        data["schedule"].pop("softmax_block", None)


def _read_blocks(s) -> tuple[bool, int]:
    return s.schedule.persistent, s.schedule.q_tiles


def _write_blocks(data: dict, v: tuple[bool, int]) -> None:
    data["schedule"] = {**(data.get("schedule") or {}), "persistent": v[0], "q_tiles": v[1]}


def _show_blocks(v: tuple[bool, int]) -> str:
    return f"persistent, {v[1]} Q tile{'s' if v[1] > 1 else ''}" if v[0] else "one per query block"


def sweep_space(base: WgmmaForwardSpec) -> SearchSpace:
    """Tiles, roles (producer warpgroup or homogeneous, 1-3 consumer warpgroups), ring depth,
    register split, schedule, epilogue, blocks (one per query block, or persistent with one or
    two Q tiles), the row max's chains and, for e4m3, K's row order, around `base`; the spec rules
    prune what does not fit. softmax.fma_exp2 is kept as the base has it, not swept: on the H200 it
    was slower in 95 of 96 16-bit cells and every full-mask e4m3 cell (docs/performance/hopper.md,
    "A share of the softmax's exponentials on the FMA pipes"), and an axis doubles a sweep."""
    regs = (base.registers.producer, base.registers.consumer) if base.registers else None
    # k_rows is a key of the e4m3 spec alone: even_odd paid on some cells and cost on others
    # (docs/performance/hopper.md, "e4m3: K's even keys first"), so its sweep tries both.
    k_rows = (field_axis("k_rows", "k_rows", SWEEP_K_ROWS, lambda s: s.k_rows,
                         lambda v: "keo" if v == "even_odd" else ""),) if hasattr(base, "k_rows") else ()
    return SearchSpace((
        field_axis("block_n", "tile.block_n", with_base(SWEEP_BLOCK_N, base.tile.block_n), lambda s: s.tile.block_n,
                   lambda v: f"n{v}"),
        Axis("warpgroups", tuple(dict.fromkeys(SWEEP_WARPGROUPS + (_read_warpgroups(base),))), _read_warpgroups,
             _write_warpgroups, lambda v: f"c{v[1]}" + ("p" if v[0] else "h"),
             lambda v: f"p+{v[1]}" if v[0] else f"{v[1]}"),
        field_axis("stages", "smem.stages", with_base(SWEEP_STAGES, base.smem.stages), lambda s: s.smem.stages,
                   lambda v: f"s{v}"),
        Axis("registers", tuple(dict.fromkeys(SWEEP_REGISTERS + (regs,))),
             lambda s: (s.registers.producer, s.registers.consumer) if s.registers else None, _write_registers,
             lambda v: f"r{v[0]}x{v[1]}" if v else "", lambda v: f"{v[0]}/{v[1]}" if v else "-"),
        Axis("schedule", SWEEP_SCHEDULES, _read_schedule, _write_schedule,
             lambda v: {"seq": "", "overlap": "o", "pingpong": "pp"}[v]),
        field_axis("epilogue", "epilogue", with_base(SWEEP_EPILOGUES, base.epilogue), lambda s: s.epilogue,
                   lambda v: EPILOGUE_TAGS[v]),
        Axis("blocks", SWEEP_BLOCKS, _read_blocks, _write_blocks, lambda v: BLOCKS_TAGS[v], _show_blocks),
        field_axis("max_chains", "softmax.max_chains", with_base(SWEEP_MAX_CHAINS, base.softmax.max_chains),
                   lambda s: s.softmax.max_chains, lambda v: f"mc{v}" if v > 1 else ""),
    ) + k_rows)

"""The axes `attngen sweep` explores around a backward spec (both backward kinds): the query block,
the key block with the warps that own it, and each kind's own fields. A backward block's keys are
split between its warps, 16 each in both kinds (bwd_wgmma: 64 per warpgroup), so block_n and
warps.compute move together on one axis (bwd_mma's warp_keys 32 keeps that: two warps share each
32 keys; bwd_wgmma's key_sharing axis then lets two warpgroups share each 64 keys)."""
from __future__ import annotations

from .search_space import Axis, SearchSpace, field_axis, with_base

# bwd_mma: the keys whose dK and dV a warp holds, with how the two warps that share 32 keys split the
# work (spec keys warp_keys and warp_split; the rules refuse 32 keys with the query split above d64).
WARP_TILES = ((16, "queries"), (32, "queries"), (32, "columns"))

BLOCK_M = (64, 128)        # query blocks the walk takes
BLOCK_N = (64, 128)        # keys per block
KEYS_PER_WARP = 16


def block_m_axis(base) -> Axis:
    return field_axis("block_m", "tile.block_m", with_base(BLOCK_M, base.tile.block_m), lambda s: s.tile.block_m,
                      lambda v: f"m{v}")


def keys_axis(base) -> Axis:
    """tile.block_n with warps.compute = block_n / 16."""
    def write(data: dict, n: int) -> None:
        data.setdefault("tile", {})["block_n"] = n
        data["warps"] = {"compute": n // KEYS_PER_WARP}
    return Axis("block_n", with_base(BLOCK_N, base.tile.block_n), lambda s: s.tile.block_n, write,
                lambda v: f"n{v}", lambda v: f"{v} ({v // KEYS_PER_WARP} warps)")


def mma_backward_space(base) -> SearchSpace:
    """bwd_mma: query block, key block (16 keys per warp), query stages, query chunk and the keys each
    warp holds (32: two warps share them, split by queries, d64 and below, or by columns)."""
    return SearchSpace((
        block_m_axis(base),
        keys_axis(base),
        field_axis("query_stages", "query_stages", with_base((1, 2), base.query_stages), lambda s: s.query_stages,
                   lambda v: f"s{v}"),
        field_axis("query_chunk", "query_chunk", with_base((32, 64), base.query_chunk), lambda s: s.query_chunk,
                   lambda v: f"c{v}"),
        warp_tile_axis(base),
    ))


def warp_tile_axis(base) -> Axis:
    """warp_keys with warp_split: 16 keys per warp, or 32 split by queries (tag k32) or by columns (k32c)."""
    def read(s):
        return (s.warp_keys, s.warp_split if s.warp_keys > 16 else "queries")

    def write(data: dict, v) -> None:
        data["warp_keys"] = v[0]
        if v[0] > 16:
            data["warp_split"] = v[1]
        else:
            data.pop("warp_split", None)
    return Axis("warp_keys", tuple(sorted(set(WARP_TILES) | {read(base)})), read, write,
                lambda v: f"k{v[0]}" + ("c" if v[1] == "columns" else ""),
                lambda v: str(v[0]) if v[0] == 16 else f"{v[0]} ({v[1]})")


# bwd_wgmma: warpgroups per 64 keys of the block (2: two warpgroups share a block of 64 keys, each holding
# half of dK's and dV's columns, as head_dim 256 needs)
KEY_SHARING = (1, 2)
WARPS_PER_WARPGROUP = 4


def key_sharing_axis(base) -> Axis:
    """Warpgroups per 64 keys: 1, or 2 sharing a block of 64 keys (tag s2; warps.compute doubled after
    the key block's axis wrote it)."""
    def read(s) -> int:
        warpgroups = s.compute_warps // WARPS_PER_WARPGROUP
        return warpgroups if s.tile.block_n == KEYS_PER_WARP * WARPS_PER_WARPGROUP and warpgroups > 1 else 1

    def write(data: dict, share: int) -> None:
        data["warps"] = {"compute": data["warps"]["compute"] * share}
    return Axis("key_sharing", with_base(KEY_SHARING, read(base)), read, write,
                lambda v: "" if v == 1 else f"s{v}",
                lambda v: "1" if v == 1 else f"{v} (dK, dV split by columns; S^T, dP^T by queries)")


def wgmma_backward_space(base) -> SearchSpace:
    """bwd_wgmma: query block (64, or 64 per warpgroup: dQ by rows), key block (64 per warpgroup) and
    the warpgroups that share 64 keys."""
    return SearchSpace((block_m_axis(base), keys_axis(base), key_sharing_axis(base)))

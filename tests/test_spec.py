"""Spec loading: good specs load; every bad spec gives one message with file, line and key path."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from click.testing import CliRunner

from attngen.core import spec_keys as core_spec
from attngen.kinds import KINDS, kind_for_data
from attngen.cli import main
from attngen.errors import SpecError
from attngen.spec import load_spec, parse_spec
from spec_sample import SPEC_PATHS, spec_text

ROOT = Path(__file__).resolve().parents[1]
SPEC_FILES = SPEC_PATHS

# Valid bases, one per family; every bad case below changes one thing so that exactly one rule fires.
SCALAR = {
    "schema": 1, "name": "t_scalar", "head_dim": 64, "tile": {"block_m": 32, "block_n": 64},
    "warps": {"compute": 4}, "mma": "scalar", "smem": {"swizzle": {"pad_bytes": 4}},
}
MMA = {
    "schema": 1, "name": "t_mma", "head_dim": 64, "tile": {"block_m": 64, "block_n": 64},
    "warps": {"compute": 4}, "mma": "mma_m16n8k16",
    "smem": {"swizzle": {"xor_bits": 3}, "stages": 2, "async_copy": True, "q_in_registers": True},
    "softmax": {"rescale": "on_max_change"},
}
FP8 = {
    "schema": 1, "name": "t_fp8", "dtype": "e4m3", "head_dim": 128, "tile": {"block_m": 128, "block_n": 64},
    "warps": {"compute": 8}, "mma": "mma_m16n8k16",
    "smem": {"swizzle": {"xor_bits": 3}, "stages": 2, "async_copy": True},
}
WMMA = {
    "schema": 1, "name": "t_wmma", "head_dim": 64, "tile": {"block_m": 32, "block_n": 64},
    "warps": {"compute": 2}, "mma": "wmma_m16n16k16", "smem": {"swizzle": {"pad_bytes": 16}},
}
SPECIALIZED = {
    "schema": 1, "name": "t_ws", "head_dim": 128, "tile": {"block_m": 64, "block_n": 32},
    "warps": {"producer": 1, "consumer": 4}, "mma": "mma_m16n8k16",
    "smem": {"swizzle": {"xor_bits": 3}, "stages": 3, "async_copy": True},
}
WGMMA = {
    "schema": 1, "name": "t_wgmma", "target": "h100", "head_dim": 128, "tile": {"block_m": 128, "block_n": 128},
    "warps": {"producer": 4, "consumer": 8}, "mma": "wgmma_m64nNk16",
    "smem": {"swizzle": {"xor_bits": 3}, "stages": 2, "async_copy": True, "opt_in": True},
    "registers": {"producer": 24, "consumer": 240},
}
WGMMA_FP8 = {
    "schema": 1, "name": "t_wgmma_fp8", "target": "h100", "dtype": "e4m3", "head_dim": 128,
    "tile": {"block_m": 128, "block_n": 128}, "warps": {"producer": 4, "consumer": 8}, "mma": "wgmma_m64nNk16",
    "smem": {"swizzle": {"xor_bits": 3}, "stages": 2, "async_copy": True, "opt_in": True},
    "registers": {"producer": 24, "consumer": 240},
}
DECODE = {
    "schema": 1, "name": "t_decode", "target": "h200", "head_dim": 128, "decode": "split_kv",
    "tile": {"block_m": 16, "block_n": 128}, "warps": {"compute": 4},
    "smem": {"swizzle": {"xor_bits": 3}, "stages": 3, "async_copy": True, "opt_in": True},
}

MLA = {
    "schema": 1, "name": "t_mla", "target": "h200", "head_dim": 576, "head_dim_v": 512, "decode": "latent_split_kv",
    "tile": {"block_m": 16, "block_n": 64}, "warps": {"compute": 4},
    "smem": {"swizzle": {"xor_bits": 3}, "stages": 2, "async_copy": True, "opt_in": True},
}

MLA_WGMMA = dict(MLA, mma="wgmma_m64nNk16", tile={"block_m": 64, "block_n": 64}, warps={"compute": 8})

BACKWARD_WGMMA = {
    "schema": 1, "name": "t_backward_wgmma", "target": "h100", "head_dim": 128, "backward": "wgmma_dq_red",
    "tile": {"block_m": 64, "block_n": 128}, "warps": {"compute": 8},
    "smem": {"swizzle": {"xor_bits": 3}, "async_copy": True, "opt_in": True},
}
BACKWARD = {
    "schema": 1, "name": "t_backward", "target": "h100", "head_dim": 128, "backward": "dq_atomic",
    "tile": {"block_m": 64, "block_n": 64}, "warps": {"compute": 4},
    "smem": {"swizzle": {"xor_bits": 3}, "async_copy": True, "opt_in": True},
}


def merged(base: dict, **changes) -> dict:
    """base with changes applied; a dotted key (smem__stages) reaches into a nested mapping."""
    out = yaml.safe_load(yaml.safe_dump(base, sort_keys=False))
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        if value is DELETE:
            node.pop(leaf)
        else:
            node[leaf] = value
    return out


DELETE = object()


def to_yaml(data: dict) -> str:
    """Block-style YAML, one key per line, so that every key path has its own line."""
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def line_of(text: str, key: str) -> int:
    """1-based line of a dotted key in block-style YAML written by to_yaml (2-space indent)."""
    lines = text.splitlines()
    start = 0
    for depth, part in enumerate(key.split(".")):
        prefix = "  " * depth + part + ":"
        for i in range(start, len(lines)):
            if lines[i].startswith(prefix):
                start = i + 1
                break
        else:
            raise AssertionError(f"{key} not found in\n{text}")
    return start


def spec_error(text: str, file: str = "bad.yaml") -> SpecError:
    with pytest.raises(SpecError) as info:
        parse_spec(text, file=file)
    return info.value


def assert_where(err: SpecError, line: int, key: str | None, file: str = "bad.yaml") -> None:
    assert err.file == file
    assert err.line == line, str(err)
    assert err.key == key, str(err)
    prefix = f"{file}:{line}: " + (f"{key}: " if key else "")
    assert str(err).startswith(prefix), str(err)


# -- good specs ------------------------------------------------------------------------------

@pytest.mark.parametrize("path", SPEC_FILES, ids=[p.name for p in SPEC_FILES])
def test_repo_spec_loads(path):
    s = load_spec(path)
    assert s.name == path.stem == yaml.safe_load(spec_text(path))["name"]


def test_repo_has_specs():
    assert SPEC_FILES, "specs/ holds no spec"


@pytest.mark.parametrize("base", [SCALAR, MMA, WMMA, SPECIALIZED], ids=["scalar", "mma", "wmma", "specialized"])
def test_inline_base_specs_load(base):
    s = parse_spec(to_yaml(base))
    assert s.name == base["name"]


def test_defaults():
    s = parse_spec(to_yaml(merged(SCALAR, smem=DELETE)))
    assert (s.target, s.dtype, s.masks, s.description) == ("l4", "fp16", ["none", "causal"], "")
    assert s.smem.swizzle == "none"
    assert (s.smem.stages, s.smem.async_copy, s.smem.q_in_registers, s.smem.opt_in) == (1, False, False, False)
    assert s.softmax.rescale == "always"


def test_warp_roles():
    s = parse_spec(to_yaml(SPECIALIZED))
    assert (s.compute_warps, s.producer_warps) == (4, 1)
    s = parse_spec(to_yaml(SCALAR))
    assert (s.compute_warps, s.producer_warps) == (4, 0)


# -- one bad spec per cross-field rule -------------------------------------------------------
# (rule, base, changes, key path, part of the message)
RULE_CASES = [
    ("rule_backward_homogeneous", BACKWARD, {"warps": {"producer": 1, "consumer": 4}}, "warps", "use warps: {compute: N}"),
    ("rule_backward_head_dim", BACKWARD, {"head_dim": 96}, "head_dim", "generated for head_dim 32, 64, 128"),
    ("rule_backward_warps", BACKWARD, {"smem__async_copy": False}, "smem.async_copy", "set smem.async_copy: true"),
    ("rule_backward_keys_per_warp", BACKWARD, {"tile__block_n": 128}, "tile.block_n", "16 x warps.compute = 64"),
    ("rule_backward_query_chunks", BACKWARD, {"tile__block_m": 80}, "tile.block_m", "chunks of 32 queries"),
    ("rule_backward_warp_keys", BACKWARD, {"warp_keys": 32}, "warp_keys", "or warp_split: columns"),
    ("rule_backward_dq_blocks", BACKWARD, {"tile": {"block_m": 96, "block_n": 128}, "warps": {"compute": 8}},
     "tile.block_m", "blocks of 64 rows in register order"),
    ("rule_backward_dq_grid", BACKWARD, {"tile": {"block_m": 64, "block_n": 96}, "warps": {"compute": 6}},
     "warps.compute", "do not split dQ of 64 queries"),
    ("rule_backward_varlen_no_expressions", BACKWARD, {"masks": ["expr"], "variant": {"mask": "kv_idx <= q_idx"},
     "varlen": True}, "variant", "varlen functions take no expressions yet"),
    ("rule_backward_varlen_plain", BACKWARD, {"varlen": True, "scores": ["softcap"]}, "varlen",
     "masks none and causal, without score modifiers"),
    ("rule_backward_one_stage", BACKWARD, {"smem__stages": 2}, "smem.stages", "set smem.stages: 1"),
    ("rule_backward_warpgroups", BACKWARD_WGMMA, {"tile__block_m": 192}, "tile.block_m", "one m64 wgmma per warpgroup"),
    ("rule_backward_registers", BACKWARD_WGMMA, {"tile__block_m": 128}, "tile.block_m", "296 registers with the margin"),
    ("rule_backward_dq_transposed", BACKWARD_WGMMA, {"tile__block_m": 80, "varlen": True}, "tile.block_m",
     "query blocks of 80 rows take dQ^T"),
    ("rule_backward_rows_plain", BACKWARD_WGMMA, {"head_dim": 64, "smem": {"swizzle": {"xor_bits": 2, "row_shift": 1},
     "async_copy": True, "opt_in": True}, "tile__block_m": 128, "varlen": True}, "tile.block_m",
     "varlen is generated for query blocks of 64 rows"),
    ("rule_backward_head_dim", BACKWARD_WGMMA, {"head_dim": 64}, "smem.swizzle", "{xor_bits: 2, row_shift: 1}"),
    ("rule_backward_copies", BACKWARD_WGMMA, {"smem__stages": 2}, "smem", "double-buffers Q and dO itself"),
    ("rule_backward_opt_in", BACKWARD_WGMMA, {"smem__opt_in": False}, "smem.opt_in", "set smem.opt_in: true"),
    ("rule_homogeneous", DECODE, {"warps": {"producer": 1, "consumer": 4}}, "warps", "use warps: {compute: N}"),
    ("rule_head_dim", DECODE, {"head_dim": 72}, "head_dim", "multiple of 16 (k16 steps of Q.K^T)"),
    ("rule_rows", DECODE, {"tile__block_m": 24}, "tile.block_m", "16-row fragments, at most 64"),
    ("rule_keys_per_warp", DECODE, {"tile__block_n": 96}, "tile.block_n", "multiple of 64 (got 96)"),
    ("rule_accumulators", DECODE, {"tile__block_m": 64}, "tile.block_m", "320 registers per thread hold S and O"),
    ("rule_swizzle", DECODE, {"smem__swizzle": "none"}, "smem.swizzle", "set swizzle: {xor_bits: 3}"),
    ("rule_ring", DECODE, {"smem__stages": 1}, "smem.stages", "streams K/V through a cp.async ring"),
    ("rule_no_q_registers", DECODE, {"smem__q_in_registers": True}, "smem.q_in_registers",
     "keeps Q fragments in registers wherever they fit"),
    ("rule_head_dim_vector_loads", SCALAR, {"head_dim": 68}, "head_dim", "multiple of 8 for 16-byte loads (got 68); try 72"),
    ("rule_head_dim_fragments", MMA, {"head_dim": 72}, "head_dim", "multiple of 16 for mma_m16n8k16 fragments (got 72); try 80"),
    ("rule_head_dim_fragments", WMMA, {"head_dim": 40}, "head_dim", "multiple of 16 for wmma_m16n16k16"),
    ("rule_scalar_head_dim", SCALAR, {"head_dim": 96}, "head_dim", "multiple of 64 (got 96)"),
    ("rule_block_m_split", SCALAR, {"tile__block_m": 30}, "tile.block_m", "multiple of warps.compute = 4"),
    ("rule_block_m_split", MMA, {"tile__block_m": 48}, "tile.block_m", "multiple of 16 x warps.compute = 64"),
    ("rule_block_m_split", SPECIALIZED, {"tile__block_m": 32}, "tile.block_m", "16 x warps.consumer = 64"),
    ("rule_block_n", SCALAR, {"tile__block_n": 48}, "tile.block_n", "multiple of 32 for scalar"),
    ("rule_block_n", MMA, {"tile__block_n": 40}, "tile.block_n", "multiple of 16 for mma_m16n8k16"),
    ("rule_stages_need_async", MMA, {"smem__async_copy": False}, "smem.stages", "set smem.async_copy: true or stages: 1"),
    ("rule_paged_varlen", MMA, {"paged": True}, "paged", "it needs varlen: true"),
    ("rule_paged_varlen", WGMMA, {"paged": True}, "paged", "it needs varlen: true"),
    ("rule_page_copies", WGMMA, {"page_copies": "every_lane"}, "page_copies", "it needs paged: true"),
    ("rule_page_copies", WGMMA, {"varlen": True, "paged": True, "page_copies": "gather", "warps": {"compute": 4},
                                 "tile__block_m": 64, "registers": DELETE}, "page_copies", "needs warps: {producer: 4"),
    ("rule_no_async_copy", SCALAR, {"smem__async_copy": True}, "smem.async_copy",
     "asynchronous copies are not generated for scalar; set smem.async_copy: false"),
    ("rule_no_q_in_registers", WMMA, {"smem__q_in_registers": True}, "smem.q_in_registers",
     "Q fragments in registers are not generated for wmma_m16n16k16; set smem.q_in_registers: false"),
    ("rule_no_q_in_registers", SCALAR, {"smem__q_in_registers": True}, "smem.q_in_registers",
     "Q fragments in registers are not generated for scalar"),
    ("rule_no_xor_swizzle", SCALAR, {"smem__swizzle": {"xor_bits": 2}}, "smem.swizzle",
     "the XOR swizzle is not generated for scalar; set smem.swizzle to {pad_bytes: N} or none"),
    ("rule_no_xor_swizzle", WMMA, {"smem__swizzle": {"xor_bits": 2}}, "smem.swizzle",
     "the XOR swizzle is not generated for wmma_m16n16k16"),
    ("rule_pad_bytes", SCALAR, {"smem__swizzle": {"pad_bytes": 6}}, "smem.swizzle.pad_bytes", "multiple of 4 (got 6); try 8"),
    ("rule_pad_16_bytes", MMA, {"smem__swizzle": {"pad_bytes": 8}}, "smem.swizzle.pad_bytes", "multiple of 16"),
    ("rule_xor_bits", MMA, {"head_dim": 32, "smem__swizzle": {"xor_bits": 3}}, "smem.swizzle.xor_bits",
     "can land past the row's end; use xor_bits: 2"),
    ("rule_xor_bits", DECODE, {"head_dim": 80}, "smem.swizzle.xor_bits", "chunks 8..9 can land past the row's end"),
    ("rule_register_cap", DECODE, {"min_blocks_per_sm": 16}, "min_blocks_per_sm",
     "cap ptxas at 32 registers per thread, but the kernel holds at least"),
    ("rule_register_cap", MMA, {"min_blocks_per_sm": 12}, "min_blocks_per_sm", "use min_blocks_per_sm <= "),
    ("rule_decode_always_rescales", DECODE, {"softmax": {"rescale": "on_max_change"}}, "softmax.rescale",
     "the decode kernel rescales its output at every tile"),
    ("rule_kv_e4m3_head_dim", DECODE, {"kv_dtype": "e4m3", "head_dim": 80,
                                       "smem": {"swizzle": {"xor_bits": 1}, "stages": 4,
                                                "async_copy": True, "opt_in": True}}, "head_dim",
     "an e4m3 KV cache is generated for head dims that are multiples of 32"),
    ("rule_kv_e4m3_plain_scores", DECODE, {"kv_dtype": "e4m3", "scores": ["softcap"]}, "kv_dtype",
     "without score modifiers or expressions"),
    ("rule_kv_e4m3_no_append", DECODE, {"kv_dtype": "e4m3", "append": True}, "kv_dtype",
     "an e4m3 KV cache is generated without append"),
    ("rule_kv_mma_needs_e4m3", DECODE, {"kv_mma": "fp16"}, "kv_mma", "set kv_dtype: e4m3 or drop kv_mma"),
    ("rule_kv_mma_holds_q", DECODE, {"kv_dtype": "e4m3", "kv_mma": "fp16", "head_dim": 256,
                                     "tile": {"block_m": 16, "block_n": 64},
                                     "smem": {"swizzle": {"xor_bits": 3}, "stages": 2, "async_copy": True,
                                              "opt_in": True}}, "kv_mma",
     "reads Q from its tile at every k-step"),
    ("rule_backward_no_rescale", BACKWARD, {"softmax": {"rescale": "on_max_change"}}, "softmax.rescale",
     "keeps no running max to rescale by"),
    ("rule_backward_no_rescale", BACKWARD_WGMMA, {"softmax": {"rescale": "on_max_change"}}, "softmax.rescale",
     "keeps no running max to rescale by"),
    ("rule_backward_one_block", BACKWARD_WGMMA, {"min_blocks_per_sm": 2}, "min_blocks_per_sm",
     "this backward runs one block per SM"),
    ("rule_backward_group_split", BACKWARD_WGMMA, {"group_split": True, "head_dim_v": 64}, "group_split",
     "group_split is generated for one head dim of whole k16 steps"),
    ("rule_fp8_target", FP8, {"target": "a100"}, "target", "need sm_89 or later; target a100 is sm_80"),
    ("rule_no_warp_roles", merged(SPECIALIZED, mma="scalar", head_dim=64, tile={"block_m": 32, "block_n": 64},
                                smem={"stages": 1}), {}, "warps.producer",
     "producer/consumer warp roles are not generated for scalar; use warps: {compute: 4}"),
    ("rule_no_warp_roles", merged(SPECIALIZED, mma="wmma_m16n16k16", head_dim=64, tile={"block_m": 64, "block_n": 64},
                                smem={"swizzle": {"pad_bytes": 16}, "stages": 1}), {}, "warps.producer",
     "producer/consumer warp roles are not generated for wmma_m16n16k16"),
    ("rule_warp_roles_need_a_ring", SPECIALIZED, {"smem__async_copy": False, "smem__stages": 1}, "smem.async_copy",
     "producer warps issue cp.async"),
    ("rule_warp_roles_need_a_ring", SPECIALIZED, {"smem__stages": 1}, "smem.stages", "at least 2 stages"),
    ("rule_always_rescales", SCALAR, {"softmax": {"rescale": "on_max_change"}}, "softmax.rescale",
     "rescaling only when a row's max changes is not generated for scalar; set softmax.rescale: always"),
    # before, wmma took on_max_change and always rescaled (explain said so) without a word
    ("rule_always_rescales", WMMA, {"softmax": {"rescale": "on_max_change"}}, "softmax.rescale",
     "not generated for wmma_m16n16k16; set softmax.rescale: always"),
    ("rule_variants_taken", MMA, {"softmax": {"max_chains": 4}}, "softmax.max_chains",
     "scans a row's max in one chain (four chains are generated by the forward wgmma kinds only)"),
    ("rule_max_chains", WGMMA, {"softmax": {"max_chains": 4}, "tile__block_n": 64}, "softmax.max_chains",
     "block_n 64 gives 16: use block_n 128"),
    ("rule_variants_taken", MMA, {"softmax": {"fma_exp2": 2}}, "softmax.fma_exp2",
     "exponentials on the FMA pipes are generated by the forward wgmma kinds only"),
    ("rule_variants_taken", MMA, {"softmax": {"lazy_rescale": True}}, "softmax.lazy_rescale",
     "a max kept with slack is generated by the forward wgmma kinds only"),
    ("rule_target_has_sm90a", WGMMA, {"target": "l4"}, "target", "need an sm_90a GPU"),
    ("rule_decode_no_varlen", DECODE, {"varlen": True}, "varlen", "per-sequence cache lengths"),
    ("rule_head_dim_vector_loads", WGMMA, {"head_dim": 36}, "head_dim", "multiple of 8 for 16-byte loads"),
    ("rule_head_dim_v", MMA, {"head_dim_v": 32}, "head_dim_v", "a V head dim other than head_dim is not generated"),
    ("rule_variants_taken", SCALAR, {"masks": ["none", "window"]}, "masks", "does not generate the window mask"),
    ("rule_variants_taken", SCALAR, {"scores": ["softcap"]}, "scores", "does not apply score modifiers"),
    ("rule_decode_expressions_alone", DECODE, {"scores": ["softcap"], "variant": {"mask": "kv_idx <= q_idx"}},
     "scores", "either built-in score modifiers or the spec's expressions"),
    ("rule_append_masks", DECODE, {"append": True, "masks": ["expr"], "variant": {"mask": "kv_idx <= q_idx"}},
     "masks", "an expression mask may skip those tiles"),
    ("rule_variant_expressions", MMA, {"variant": {"mask": "kv_idx <= q_idx and nope"}}, "variant.mask",
     "column 21: unknown name 'nope'"),
    ("rule_variant_expressions", MMA, {"masks": ["none", "expr"], "variant": {"mask": "kv_idx <= q_idx"}}, "masks",
     "write masks: [expr]"),
    ("rule_head_dim_v", WGMMA, {"head_dim_v": 100}, "head_dim_v", "multiple of 8 for 16-byte rows (got 100); try 104"),
    ("rule_staged_output_fits_q", WGMMA, {"head_dim": 64, "head_dim_v": 128, "epilogue": "tma"}, "epilogue",
     "stages O in the Q tile"),
    ("rule_warpgroups", WGMMA, {"warps__consumer": 6}, "warps.consumer", "warpgroups of 4 warps"),
    ("rule_warpgroups", WGMMA, {"warps__producer": 2}, "warps.producer", "the producer is one warpgroup"),
    ("rule_block_m_rows", WGMMA, {"tile__block_m": 64}, "tile.block_m", "block_m must be 128"),
    ("rule_block_n", WGMMA, {"tile__block_n": 120}, "tile.block_n", "multiple of 16 (k16 steps of P.V)"),
    ("rule_swizzle_panels", WGMMA, {"smem__swizzle": "none"}, "smem.swizzle", "128-, 64- or 32-byte swizzled panels"),
    # xor_bits 2 alone is not a TMA swizzle: 64-byte panels XOR with row >> 1
    ("rule_swizzle_panels", WGMMA, {"head_dim": 96, "smem__swizzle": {"xor_bits": 2}}, "smem.swizzle",
     "head_dim 96 takes {xor_bits: 2, row_shift: 1} without padding"),
    ("rule_async_copies", WGMMA, {"smem__async_copy": False}, "smem.async_copy", "TMA copies are asynchronous"),
    ("rule_q_in_shared", WGMMA, {"smem__q_in_registers": True}, "smem.q_in_registers", "wgmma SS"),
    ("rule_ring", WGMMA, {"smem__stages": 1}, "smem.stages", "at least 2 stages"),
    ("rule_registers", WGMMA, {"warps": {"compute": 8}}, "registers", "needs a producer warpgroup"),
    ("rule_always_rescales", WGMMA, {"softmax": {"rescale": "on_max_change"}}, "softmax.rescale", "not generated"),
    ("rule_registers", WGMMA, {"registers__consumer": 244}, "registers.consumer", "multiple of 8 (got 244)"),
    ("rule_registers", WGMMA, {"registers__consumer": 248}, "registers", "exceed the pool of 504"),
    ("rule_registers", WGMMA, {"registers": {"producer": 200, "consumer": 152}}, "registers", "at most and consumer"),
    ("rule_registers", merged(WGMMA, warps={"producer": 4, "consumer": 4}, tile={"block_m": 64, "block_n": 128}),
     {}, "registers", "leave registers unset"),
    ("rule_registers", WGMMA, {"min_blocks_per_sm": 1}, "min_blocks_per_sm", "one block per SM"),
    ("rule_epilogue_tile", WGMMA, {"epilogue_tile": "own", "schedule": {"persistent": True}}, "epilogue_tile",
     "stages nothing"),
    ("rule_epilogue_tile", WGMMA, {"epilogue_tile": "own", "epilogue": "tma"}, "epilogue_tile",
     "without schedule.persistent"),
    ("rule_epilogue_tile", WGMMA, {"epilogue_tile": "own_in_turns", "epilogue": "shared",
                                   "schedule": {"persistent": True}}, "epilogue_tile", "use epilogue: tma"),
    ("rule_epilogue_tile", merged(WGMMA, warps={"producer": 4, "consumer": 12}, tile={"block_m": 192, "block_n": 128},
                                  registers={"producer": 24, "consumer": 160}),
     {"epilogue_tile": "own_in_turns", "epilogue": "tma", "schedule": {"persistent": True}}, "epilogue_tile",
     "two consumer warpgroups"),
    ("rule_q_tiles", WGMMA, {"schedule": {"q_tiles": 2}}, "schedule.q_tiles", "without schedule.persistent: true"),
    ("rule_item_overlap", WGMMA, {"schedule": {"item_overlap": True}, "epilogue": "tma"}, "schedule.item_overlap",
     "set schedule.persistent: true and schedule.overlap: true and schedule.q_tiles: 2, or item_overlap: false"),
    ("rule_middle_pairs", WGMMA, {"schedule": {"middle_pairs": True}}, "schedule.middle_pairs",
     "set schedule.persistent: true, or middle_pairs: false"),
    ("rule_short_first", WGMMA, {"schedule": {"short_first": True}}, "schedule.short_first",
     "set schedule.persistent: true, or short_first: false"),
    ("rule_longest_alone", WGMMA, {"schedule": {"longest_alone": True}}, "schedule.longest_alone",
     "set schedule.persistent: true, or longest_alone: false"),
    ("rule_snake", WGMMA, {"schedule": {"snake": True}}, "schedule.snake", "set schedule.persistent: true, or snake: false"),
    ("rule_snake", WGMMA, {"schedule": {"snake": True, "persistent": True, "longest_alone": True}}, "schedule.snake",
     "no units for longest_alone to shape; set middle_pairs: true (the walk then chooses per call between the snake "
     "and the units), longest_alone: false, or snake: false"),
    ("rule_snake_tail", WGMMA, {"schedule": {"snake_tail": True, "snake": True, "persistent": True}}, "schedule.snake_tail",
     "set schedule.snake, middle_pairs and longest_alone: true, or snake_tail: false"),
    ("rule_item_overlap", WGMMA, {"schedule": {"item_overlap": True, "persistent": True, "overlap": True, "q_tiles": 2},
                                  "epilogue": "registers"}, "schedule.item_overlap", "set epilogue: tma (or shared)"),
    ("rule_key_halves", WGMMA, {"schedule": {"key_halves": 2, "overlap": True}, "warps": {"producer": 4, "consumer": 16},
                                "registers": DELETE}, "schedule.key_halves", "set schedule.overlap: false"),
    ("rule_key_halves", WGMMA, {"schedule": {"key_halves": 2}, "warps": {"producer": 4, "consumer": 16},
                                "registers": DELETE, "smem__stages": 3}, "schedule.key_halves",
     "set smem.stages a multiple of 2"),
    ("rule_warpgroups", WGMMA, {"schedule": {"key_halves": 2}, "warps": {"producer": 4, "consumer": 12}},
     "warps.consumer", "use 8 or 16 (got 12)"),
    ("rule_block_m_rows", WGMMA, {"schedule": {"key_halves": 2}}, "tile.block_m",
     "(2 warpgroups per row group, schedule.key_halves), so block_m must be 64 for 8 compute warps"),
    ("rule_persistent_needs_padded_calls", WGMMA, {"schedule": {"persistent": True}, "varlen": "only"},
     "schedule.persistent", "a `varlen: only` cell has none"),
    ("rule_awaiting_twins_need_padded_calls", WGMMA, {"schedule": {"awaiting_twins": True}, "varlen": "only"},
     "schedule.awaiting_twins", "a `varlen: only` cell has none"),
    ("rule_pingpong", WGMMA, {"schedule": {"pingpong": True}}, "schedule.pingpong", "set schedule.overlap: true"),
    ("rule_softmax_block", WGMMA, {"schedule": {"softmax_block": True}}, "schedule.softmax_block", "set schedule.overlap: true"),
    ("rule_kept_max_first", WGMMA, {"schedule": {"overlap": True, "softmax_block": True},
                                    "softmax": {"lazy_rescale": True, "kept_max_first": True}},
     "softmax.kept_max_first", "remove one of the two"),
    ("rule_p_buffers", WGMMA, {"schedule": {"p_buffers": 2}}, "schedule.p_buffers", "set schedule.overlap: true"),
    ("rule_p_buffers", WGMMA, {"schedule": {"overlap": True, "softmax_block": True, "p_buffers": 2}},
     "schedule.p_buffers", "drop schedule.softmax_block"),
    ("rule_pingpong", merged(WGMMA, warps={"producer": 4, "consumer": 4}, tile={"block_m": 64, "block_n": 128},
                             registers={"producer": 24, "consumer": 232}),
     {"schedule": {"overlap": True, "pingpong": True}}, "schedule.pingpong", "use warps.consumer: 8"),
    ("rule_pingpong", WGMMA, {"warps": {"compute": 8}, "registers": DELETE, "schedule": {"overlap": True, "pingpong": True}},
     "schedule.pingpong", "generated with a producer warpgroup"),
    ("rule_pingpong", WGMMA, {"warps": {"compute": 8}, "registers": DELETE, "schedule": {"persistent": True}},
     "schedule.persistent", "needs a producer warpgroup"),
    ("rule_head_dim_k32", FP8, {"head_dim": 80}, "head_dim", "multiple of 32 for e4m3 fragments"),
    ("rule_fp8_pipeline", FP8, {"head_dim": 96}, "head_dim", "6 chunks of 16 bytes per row must divide"),
    ("rule_fp8_pipeline", FP8, {"warps": {"producer": 1, "consumer": 8}}, "warps", "homogeneous warps"),
    ("rule_fp8_pipeline", FP8, {"smem__stages": 1}, "smem", "cp.async ring"),
    ("rule_fp8_pipeline", FP8, {"smem__swizzle": {"pad_bytes": 16}}, "smem.swizzle", "padded rows"),
    ("rule_fp8_calls", FP8, {"varlen": True}, "varlen", "not generated for e4m3 yet"),
    ("rule_fp8_calls", FP8, {"head_dim_v": 64}, "head_dim_v", "share Q's head dim"),
    ("rule_block_n_fp8", WGMMA_FP8, {"tile__block_n": 80}, "tile.block_n", "multiple of 32 (k32 steps of P.V"),
    ("rule_fp8_epilogue", WGMMA_FP8, {"epilogue": "tma"}, "epilogue", "write O from the registers"),
    ("rule_q_tiles", WGMMA_FP8, {"schedule": {"q_tiles": 2}}, "schedule.q_tiles", "without schedule.persistent: true"),
    ("rule_mla_homogeneous", MLA, {"warps": {"producer": 1, "consumer": 4}}, "warps", "use warps: {compute: N}"),
    ("rule_mla_rows", MLA, {"tile__block_m": 48}, "tile.block_m", "use block_m: 16 or 32"),
    ("rule_mla_rows", MLA, {"tile__block_m": 32, "warps": {"compute": 5}}, "warps.compute", "a multiple of 2"),
    ("rule_mla_keys_per_warp", MLA, {"tile__block_n": 48}, "tile.block_n", "swizzled over 8 chunks"),
    ("rule_mla_keys_per_warp", MLA, {"warps": {"compute": 8}, "head_dim_v": 512}, "tile.block_n", "multiple of 128"),
    ("rule_mla_v_columns", MLA, {"head_dim_v": 504}, "head_dim_v", "multiple of 64"),
    ("rule_mla_v_columns", MLA, {"head_dim": 448, "head_dim_v": 512}, "head_dim_v", "at most head_dim (448"),
    ("rule_mla_copy_steps", MLA, {"head_dim": 560}, "head_dim", "multiple of 64 (got 560)"),
    ("rule_mla_wgmma_target", MLA_WGMMA, {"target": "l4"}, "target", "need an sm_90a GPU"),
    ("rule_mla_refill_on_wgmma", MLA, {"refill": "during_scores"}, "refill", "leave refill unset"),
    ("rule_mla_seesaw", MLA, {"warpgroups": "seesaw"}, "warpgroups", "the wgmma form"),
    ("rule_mla_seesaw", MLA_WGMMA, {"warpgroups": "seesaw", "smem__stages": 3}, "smem.stages", "set stages: 2"),
    ("rule_mla_seesaw", MLA_WGMMA, {"warpgroups": "seesaw", "head_dim": 512, "head_dim_v": 512}, "head_dim_v",
     "first panel past V"),
    ("rule_mla_seesaw", MLA_WGMMA, {"warpgroups": "seesaw", "refill": "during_scores"}, "refill", "leave refill unset"),
    ("rule_mla_rows", MLA_WGMMA, {"tile__block_m": 32}, "tile.block_m", "use block_m: 64 and warps: {compute: 8}"),
    ("rule_mla_rows", MLA_WGMMA, {"warps": {"compute": 4}}, "tile.block_m", "over 2 warpgroups"),
    ("rule_mla_keys_per_warp", MLA_WGMMA, {"tile__block_n": 96}, "tile.block_n", "panels of 64 keys"),
    ("rule_mla_v_columns", MLA_WGMMA, {"head_dim_v": 448}, "head_dim_v", "a multiple of 128 up to 512"),
    ("rule_mla_swizzle", MLA, {"smem__swizzle": {"xor_bits": 2}}, "smem.swizzle", "xor_bits: 3"),
    ("rule_mla_ring", MLA, {"smem__stages": 1}, "smem.stages", "cp.async ring"),
    ("rule_mla_no_varlen", MLA, {"varlen": True}, "varlen", "per-sequence cache lengths"),
    ("rule_mla_no_q_registers", MLA, {"smem__q_in_registers": True}, "smem.q_in_registers", "leave q_in_registers"),
    ("rule_mla_always_rescales", MLA, {"softmax": {"rescale": "on_max_change"}}, "softmax.rescale", "at every tile"),
]


def test_a_page_size_is_now_paged():
    """A decode spec written for one page size is told the key now: one kernel reads every page size."""
    for value in (16, 256, None):
        text = to_yaml(merged(DECODE, page_size=value))
        err = spec_error(text)
        assert_where(err, line_of(text, "page_size"), "page_size")
        assert "is now paged" in err.message and "any page size" in err.message


def test_paged_plans_carry_the_page_fields():
    """A paged plan's Params has the table, pool and page size (and its shift) and a `rows` region of
    one 16-byte entry per key of each ring stage; a contiguous-only plan's has none of them."""
    from attngen.core.decode_plan import PAGE_FIELDS
    from attngen.plan import make_plan
    paged = make_plan(parse_spec(to_yaml(merged(DECODE, paged=True))))
    contiguous = make_plan(parse_spec(to_yaml(DECODE)))
    names = {f.name for f in paged.abi.fields}
    assert set(PAGE_FIELDS) <= names and not set(PAGE_FIELDS) & {f.name for f in contiguous.abi.fields}
    rows = next(r for r in paged.regions if r.name == "rows")
    assert rows.bytes == paged.stages * paged.block_n * 16 and rows.offset % 16 == 0
    assert "rows" not in {r.name for r in contiguous.regions}
    assert paged.paged and not contiguous.paged


@pytest.mark.parametrize("rule, base, changes, key, fragment", RULE_CASES,
                         ids=[f"{c[0][5:]}-{c[3]}-{i}" for i, c in enumerate(RULE_CASES)])
def test_rule(rule, base, changes, key, fragment, monkeypatch):
    text = to_yaml(merged(base, **changes))
    err = spec_error(text)
    assert_where(err, line_of(text, key), key)
    assert fragment in err.message
    # The message comes from the named rule of the spec's kind: with the kind's rules switched off
    # the spec parses, and the rule alone returns this key and message.
    model = kind_for_data(yaml.safe_load(text)).spec_model
    fn = next(r for r in model.rules + model.shared_rules if r.__name__ == rule)
    monkeypatch.setattr(model, "rules", ())
    monkeypatch.setattr(model, "shared_rules", ())
    assert fn(parse_spec(text)) == (key, err.message)


def test_refusals_name_the_spec_own_fragment_only():
    """A refusal names the feature and the spec's own mma, never another kind: which kind
    generates a feature is the registry's business, and a kind added later would make the hint
    wrong."""
    for rule, base, changes, key, fragment in RULE_CASES:
        text = to_yaml(merged(base, **changes))
        kind = kind_for_data(yaml.safe_load(text))
        message = spec_error(text).message
        others = [k.select_value for k in KINDS if k.name != kind.name and k.select_value in message]
        assert not others, f"{rule} for {kind.select_value} names {others}: {message}"


def test_wgmma_without_registers_when_accumulators_do_not_fit():
    # overlapped: S 64 + O 64 + 64 = 192 registers (sequential, 168 fit the entry cap and compile spill-free)
    err = spec_error(to_yaml(merged(WGMMA, registers=DELETE, schedule={"overlap": True})))
    assert err.key == "registers" and "gets 168 at entry" in err.message and "set registers:" in err.message


def test_every_rule_has_a_case():
    covered = {c[0] for c in RULE_CASES} | {"rule_threads"}  # rule_threads: see below
    assert {r.__name__ for k in KINDS for r in k.spec_model.rules + k.spec_model.shared_rules} <= covered


def test_rule_threads():
    # Field ranges (compute <= 16, producer <= 4) keep a parsed spec under 1024 threads, so the
    # rule is exercised on a stand-in that has only the attributes it reads.
    assert core_spec.rule_threads(SimpleNamespace(compute_warps=30, producer_warps=4)) == (
        "warps", "1088 threads per block exceed CUDA's 1024; use fewer warps")
    assert core_spec.rule_threads(SimpleNamespace(compute_warps=16, producer_warps=4)) is None


def test_first_failing_rule_wins():
    # head_dim 68 breaks the 16-byte rule and the scalar rule; the earlier, more basic one is shown.
    err = spec_error(to_yaml(merged(SCALAR, head_dim=68, tile__block_n=48)))
    assert err.key == "head_dim" and "multiple of 8" in err.message


# -- YAML and schema errors ------------------------------------------------------------------

def test_yaml_syntax_error():
    text = "schema: 1\nname: t\ntile: {block_m: 32, block_n: 64\nwarps: {compute: 4}\n"
    err = spec_error(text)
    assert err.file == "bad.yaml" and err.line is not None and err.line >= 3
    assert str(err).startswith(f"bad.yaml:{err.line}: YAML syntax error")


def test_yaml_bad_indentation():
    text = "schema: 1\nname: t\n  head_dim: 64\n"
    err = spec_error(text)
    assert str(err).startswith("bad.yaml:3: YAML syntax error")
    assert "indentation" in str(err)


def test_yaml_tab():
    text = to_yaml(SCALAR) + "softmax:\n\trescale: always\n"
    err = spec_error(text)
    assert err.line == len(text.splitlines())
    assert "YAML syntax error" in err.message


@pytest.mark.parametrize("text", ["", "- a\n- b\n", "just text\n"], ids=["empty", "list", "scalar"])
def test_not_a_mapping(text):
    err = spec_error(text)
    assert str(err).startswith("bad.yaml:1: ") and "YAML mapping" in err.message


def test_unknown_top_level_key():
    text = to_yaml(merged(SCALAR, head_dims=64))
    err = spec_error(text)
    assert_where(err, line_of(text, "head_dims"), "head_dims")
    assert "unknown key" in err.message and "attngen schema" in err.message


def test_unknown_nested_key_flow_style():
    # The typo is reported, not the block_m it leaves missing.
    text = "schema: 1\nname: t\nhead_dim: 64\ntile: {block_mm: 32}\nwarps: {compute: 4}\nmma: scalar\n"
    err = spec_error(text)
    assert_where(err, 4, "tile.block_mm")
    assert "unknown key" in err.message


def test_unknown_nested_key_block_style():
    text = to_yaml(merged(SCALAR, tile={"block_m": 32, "block_n": 64, "blockn": 64}))
    err = spec_error(text)
    assert_where(err, line_of(text, "tile.blockn"), "tile.blockn")


@pytest.mark.parametrize("changes, key", [
    ({"warps": {"computer": 4}}, "warps.computer"),
    ({"warps": {"compute": 4, "producer": 1}}, "warps.producer"),
    ({"smem__swizzle": {"padbytes": 4}}, "smem.swizzle.padbytes"),
], ids=["warps", "warps-mixed", "swizzle"])
def test_unknown_key_inside_union(changes, key):
    text = to_yaml(merged(SCALAR, **changes))
    err = spec_error(text)
    assert_where(err, line_of(text, key), key)
    assert "unknown key" in err.message


@pytest.mark.parametrize("changes, key, fragment", [
    ({"head_dim": "sixty"}, "head_dim", "valid integer (got 'sixty')"),
    ({"head_dim": 64.0}, "head_dim", "valid integer"),
    ({"smem__stages": True}, "smem.stages", "valid integer (got True)"),
    ({"smem__async_copy": "maybe"}, "smem.async_copy", "valid boolean"),
    ({"name": 5}, "name", "valid string"),
    ({"masks": "causal"}, "masks", "valid list"),
    ({"masks": ["none", "sliding"]}, "masks.1", "'none', 'causal', 'window' or 'expr' (got 'sliding')"),
    ({"mma": "tensor"}, "mma", "'scalar', 'wmma_m16n16k16', 'mma_m16n8k16' or 'wgmma_m64nNk16'"),
    ({"tile": 32}, "tile", "must be a mapping with keys block_m, block_n (got 32)"),
    ({"warps": 4}, "warps", "must be {compute: N} or {producer: P, consumer: C} (got 4)"),
    ({"smem__swizzle": "xor"}, "smem.swizzle", "must be none, {pad_bytes: N} or {xor_bits: B, row_shift: S} (got 'xor')"),
    ({"target": "v100"}, "target", "unknown target 'v100'; choose one of l4"),
    ({"name": "Bad-Name"}, "name", "must start with a lowercase letter"),
    ({"masks": ["none", "none"]}, "masks", "lists a variant twice"),
    ({"masks": []}, "masks", "must list at least 1 item (got an empty list); e.g. masks: [none, causal]"),
], ids=lambda v: v if isinstance(v, str) and v.replace(".", "").replace("_", "").isalnum() else "")
def test_wrong_type_or_value(changes, key, fragment):
    text = to_yaml(merged(SCALAR, **changes))
    err = spec_error(text)
    # a list item is reported on its own line: masks.1 is the second line after `masks:`
    line = line_of(text, "masks") + 2 if key == "masks.1" else line_of(text, key)
    assert_where(err, line, key)
    assert fragment in err.message


@pytest.mark.parametrize("changes, key, fragment", [
    ({"tile__block_m": 512}, "tile.block_m", "less than or equal to 256 (got 512)"),
    ({"tile__block_n": 0}, "tile.block_n", "greater than or equal to 1 (got 0)"),
    ({"head_dim": 512}, "head_dim", "less than or equal to 256"),
    ({"warps__compute": 40}, "warps.compute", "less than or equal to 16 (got 40)"),
    ({"smem__stages": 9}, "smem.stages", "less than or equal to 8"),
    ({"smem__swizzle": {"pad_bytes": 2}}, "smem.swizzle.pad_bytes", "greater than or equal to 4 (got 2)"),
    ({"smem__swizzle": {"xor_bits": 9}}, "smem.swizzle.xor_bits", "less than or equal to 4 (got 9)"),
], ids=lambda v: v if isinstance(v, str) and v.replace(".", "").replace("_", "").isalnum() else "")
def test_out_of_range(changes, key, fragment):
    text = to_yaml(merged(SCALAR, **changes))
    err = spec_error(text)
    assert_where(err, line_of(text, key), key)
    assert fragment in err.message


def test_missing_top_level_key():
    text = to_yaml(merged(SCALAR, mma=DELETE))
    err = spec_error(text)
    assert_where(err, 1, "mma")  # a missing key is reported where its mapping starts
    assert "required key is missing" in err.message


def test_missing_nested_key():
    text = to_yaml(merged(SCALAR, tile={"block_m": 32}))
    err = spec_error(text)
    assert_where(err, line_of(text, "tile"), "tile.block_n")
    assert "required key is missing" in err.message


@pytest.mark.parametrize("value", [2, "1", 0])
def test_wrong_schema_version(value):
    text = to_yaml(merged(SCALAR, schema=value))
    err = spec_error(text)
    assert_where(err, line_of(text, "schema"), "schema")
    assert "reads schema 1" in str(err) and "schema: 1" in str(err)


def test_missing_schema_version():
    text = to_yaml(merged(SCALAR, schema=DELETE))
    err = spec_error(text)
    assert_where(err, 1, "schema")
    assert "required key is missing" in err.message and "schema: 1" in str(err)


def test_duplicate_key():
    text = to_yaml(SCALAR) + "head_dim: 128\n"
    err = spec_error(text)
    assert_where(err, len(text.splitlines()), "head_dim")
    assert f"first on line {line_of(text, 'head_dim')}" in err.message


def test_error_is_one_line():
    err = spec_error(to_yaml(merged(SCALAR, tile__block_m=512)))
    assert "\n" not in str(err)


# -- files ------------------------------------------------------------------------------------

def test_load_spec_names_the_file(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text(to_yaml(merged(SCALAR, head_dim=68)))
    with pytest.raises(SpecError) as info:
        load_spec(p)
    assert str(info.value).startswith(f"{p}:{line_of(p.read_text(), 'head_dim')}: head_dim: ")


def test_load_spec_missing_file(tmp_path):
    with pytest.raises(SpecError, match="no such spec file"):
        load_spec(tmp_path / "nope.yaml")


def test_load_spec_not_utf8(tmp_path):
    p = tmp_path / "bin.yaml"
    p.write_bytes(b"schema: 1\nname: \xff\xfe\n")
    with pytest.raises(SpecError, match="cannot read spec"):
        load_spec(p)


# -- through the command line: exit 2, one message, no traceback ------------------------------

BAD_SPECS = {
    "yaml": "schema: 1\nname: t\ntile: {block_m: 32\n",
    "unknown_key": to_yaml(merged(SCALAR, tile={"block_m": 32, "block_n": 64, "block_mm": 32})),
    "wrong_type": to_yaml(merged(SCALAR, head_dim="sixty")),
    "out_of_range": to_yaml(merged(SCALAR, tile__block_m=512)),
    "missing": to_yaml(merged(SCALAR, mma=DELETE)),
    "schema": to_yaml(merged(SCALAR, schema=2)),
    "rule": to_yaml(merged(SCALAR, head_dim=96)),
    "duplicate": to_yaml(SCALAR) + "mma: scalar\n",
    "not_utf8": b"schema: 1\nname: \xff\n",
}


def _write(tmp_path: Path, name: str) -> Path:
    p = tmp_path / f"{name}.yaml"
    content = BAD_SPECS[name]
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    return p


def _all_output(result) -> str:
    out = result.output
    try:
        out += result.stderr
    except (ValueError, AttributeError):
        pass
    return out


@pytest.mark.parametrize("command", ["build", "explain", "compile"])
@pytest.mark.parametrize("name", sorted(BAD_SPECS))
def test_cli_bad_spec_exit_2(tmp_path, name, command):
    p = _write(tmp_path, name)
    args = [command, str(p)] + (["--out", str(tmp_path / "gen")] if command == "build" else [])
    result = CliRunner().invoke(main, args)
    out = _all_output(result)
    assert result.exit_code == 2, out
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in out
    assert str(p) in out
    assert not (tmp_path / "gen").exists() or not any((tmp_path / "gen").iterdir())


def test_cli_bad_spec_in_specs_dir(tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "a.yaml").write_text(BAD_SPECS["rule"])
    result = CliRunner().invoke(main, ["check", "--specs-dir", str(specs), "--generated", str(tmp_path / "g")])
    assert result.exit_code == 2
    assert f"a.yaml:{line_of(BAD_SPECS['rule'], 'head_dim')}: head_dim: " in _all_output(result)


@pytest.mark.parametrize("name", ["yaml", "unknown_key", "wrong_type", "not_utf8"])
def test_real_process_has_no_traceback(tmp_path, name):
    # CliRunner catches exceptions itself; a subprocess shows exactly what a user sees. The path
    # in the message is relative to the working directory.
    p = _write(tmp_path, name)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "attngen", "build", str(p), "--out", str(tmp_path / "gen")],
                          capture_output=True, text=True, cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].split(":")[0] in (p.name, str(p)), proc.stderr


def test_schema_command_lists_every_key():
    result = CliRunner().invoke(main, ["schema"])
    assert result.exit_code == 0
    import json
    schema = json.loads(result.output)
    # one alternative per kind and dtype form; each lists every key of a forward spec
    alternatives = [schema["$defs"][ref["$ref"].split("/")[-1]] for ref in schema.get("anyOf") or schema["oneOf"]]
    assert len(alternatives) == sum(len(k.forms) for k in KINDS)
    # the merge kind has no tiles: its own few keys
    merges = [alt for alt in alternatives if "merge" in alt["properties"]]
    assert len(merges) == 1
    assert set(merges[0]["properties"]) == {"schema", "name", "description", "target", "dtype", "dtypes", "cells",
                                            "base_cell", "merge", "head_dim", "warps", "max_parts"}
    assert set(merges[0]["required"]) == {"schema", "name", "merge", "head_dim"}
    for alt in (alt for alt in alternatives if "merge" not in alt["properties"]):
        # every forward kind has the forward keys; a kind may add its own (wgmma: registers, schedule, epilogue,
        # epilogue_tile, page_copies; decode: decode, max_splits, slice_cost_from_tiles, merge_rows, paged, combine, kv_dtype,
        # kv_mma, append, split_tiles; e4m3: out_dtype, and wgmma's e4m3 form k_rows; bwd_wgmma: group_split; decode_mla: refill, warpgroups)
        assert set(alt["properties"]) - {"registers", "schedule", "epilogue", "epilogue_tile", "page_copies", "decode",
                                         "max_splits",
                                         "slice_cost_from_tiles", "merge_rows", "paged", "combine", "kv_dtype", "kv_mma", "append",
                                         "split_tiles",
                                         "backward", "query_stages",
                                         "query_chunk", "warp_keys", "warp_split", "out_dtype", "group_split",
                                         "k_rows", "refill", "warpgroups"} == {
            "schema", "name", "description", "target", "dtype", "dtypes", "cells", "base_cell", "head_dim", "head_dim_v", "masks", "scores",
            "variant",
            "tile", "warps",
            "mma", "smem",
            "softmax", "min_blocks_per_sm", "varlen"}
        # the kind's selector key is required (mma, or decode / backward for those kinds)
        assert set(alt["required"]) - {"decode", "mma", "backward"} == {"schema", "name", "head_dim", "tile", "warps"}
        assert len(set(alt["required"]) & {"decode", "mma", "backward"}) == 1


def test_a_key_of_another_kind_says_which_kind_takes_it():
    err = spec_error(to_yaml(merged(MMA, epilogue="tma")))
    assert err.key == "epilogue" and "is a key of specs with mma: wgmma_m64nNk16" in err.message
    assert "this spec's mma: mma_m16n8k16 takes no epilogue" in err.message


def test_a_swizzle_mixing_two_forms_says_choose_one():
    err = spec_error(to_yaml(merged(MMA, smem__swizzle={"xor_bits": 3, "pad_bytes": 16})))
    assert err.key.startswith("smem.swizzle.") and "choose one" in err.message


def test_planner_refusals_carry_the_line(tmp_path):
    """min_blocks_per_sm and other refusals the planner makes (it sees the spec, not the file) name
    the line of their key like the rules do."""
    from attngen.render import render_spec_file
    path = tmp_path / "mb.yaml"
    path.write_text(to_yaml(merged(MMA, min_blocks_per_sm=13, target="l4")))
    with pytest.raises(SpecError) as info:
        render_spec_file(path)
    assert info.value.key == "min_blocks_per_sm" and info.value.line == line_of(path.read_text(), "min_blocks_per_sm")

"""Decode on an e4m3 KV cache (kv_dtype: e4m3), without a GPU: the spec key and its rules, the plan
(byte tiles, the scale fields of Params), the rendered kernel, the dispatch table's decode_kv_e4m3 entries
and the checks of the scales."""
from __future__ import annotations

from pathlib import Path

import pytest

from attngen.core.decode_plan import KV_SCALE_FIELDS
from attngen.plan import make_plan
from attngen.spec import load_spec, parse_spec
from attngen.errors import SpecError
from attngen.runtime.calls.decode import kv_scale_values

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "specs"
GEN = ROOT / "generated"

E4M3_CELLS = ("h200_decode_d64_kv_e4m3", "h200_decode_d128_kv_e4m3", "h200_decode_d256_kv_e4m3",
              "h200_decode_d64_kv_e4m3_contiguous", "h200_decode_d128_kv_e4m3_contiguous")


def plan_of(name: str):
    return make_plan(load_spec(SPECS / f"{name}.yaml"))


@pytest.mark.parametrize("name", E4M3_CELLS)
def test_e4m3_cells_are_family_members_with_byte_tiles(name):
    for cell in (name, name + "_bf16"):
        plan = plan_of(cell)
        assert plan.kv_dtype == "e4m3" and plan.spec.dtype in ("fp16", "bf16")
        k0 = plan.region("k0")
        # 1-byte elements, rows padded to an odd number of 16-byte chunks
        assert k0.elem_bytes == 1 and k0.pitch_bytes // 16 % 2 == 1 and k0.pitch_bytes >= plan.head_dim
        assert plan.region("q").elem_bytes == 2
        names = [f.name for f in plan.abi.fields]
        assert all(n in names for n in KV_SCALE_FIELDS)


def test_caches_in_dtype_keep_their_params():
    """A cell without kv_dtype has no scale field, not even as an omitted one (its launch record and
    Params are as before the key existed)."""
    for name in ("h200_decode_d128", "h200_decode_d128_contiguous", "h200_decode_d64_bf16", "h200_decode_d256"):
        plan = plan_of(name)
        assert plan.kv_dtype == "" and plan.kv_pitch_bytes == 0
        assert not set(KV_SCALE_FIELDS) & ({f.name for f in plan.abi.fields} | set(plan.abi.omitted))


def test_e4m3_ring_holds_half_the_bytes():
    fp16, e4m3 = plan_of("h200_decode_d128_contiguous"), plan_of("h200_decode_d128_kv_e4m3_contiguous")
    assert e4m3.unsplit_in_flight * 2 == fp16.unsplit_in_flight
    assert e4m3.kv_stage_stride < fp16.kv_stage_stride


def _text(**changes) -> str:
    base = {"schema": 1, "name": "t_kv8", "target": "h200", "dtype": "fp16", "head_dim": 128, "decode": "split_kv",
            "masks": ["none", "causal"], "tile": {"block_m": 16, "block_n": 128}, "warps": {"compute": 4},
            "smem": {"swizzle": {"xor_bits": 3}, "stages": 3, "async_copy": True, "opt_in": True},
            "kv_dtype": "e4m3"}
    base.update(changes)
    import yaml
    return yaml.safe_dump(base)


def test_rules_refuse_what_is_not_generated():
    make_plan(parse_spec(_text(), "t.yaml"))
    with pytest.raises(SpecError) as e:
        parse_spec(_text(head_dim=80, smem={"swizzle": {"xor_bits": 1}, "stages": 4,
                                           "async_copy": True, "opt_in": True}), "t.yaml")
    assert "multiples of 32" in str(e.value)
    with pytest.raises(SpecError) as e:
        parse_spec(_text(scores=["softcap"]), "t.yaml")
    assert "kv_dtype" in str(e.value)
    with pytest.raises(SpecError):
        parse_spec(_text(kv_dtype="e5m2"), "t.yaml")


def test_render_widens_bytes_in_registers():
    e4m3 = (GEN / "h200_decode_d128_kv_e4m3_split.cu").read_text()
    bf16 = (GEN / "h200_decode_d64_kv_e4m3_bf16_split.cu").read_text()      # bf16 operands (no kv_mma)
    fp16 = (GEN / "h200_decode_d128_split.cu").read_text()
    for word in ("kv_bytes", "kv_offset", "p.k_scale", "p.v_scale", "kKvFold", "ld_shared_u2"):
        assert word in e4m3 and word not in fp16
    # fp16 widens by the conversion instruction (exact values, kKvFold 1), bf16 by bit moves and one fma
    assert "cvt.rn.f16x2.e4m3x2" in e4m3 and "kv_pair" not in e4m3 and "kKvFold = 1.0f" in e4m3
    assert "fma.rn.bf16x2" in bf16 and "fma.rn.bf16x2" not in e4m3 and "kKvFold = 256.0f" in bf16
    assert "scale_log2 * kKvFold" in e4m3 and "p.kv_scale_stride" in e4m3
    assert "q_to_fp16" not in e4m3 and "q_to_fp16" not in bf16


def test_kv_mma_fp16_gives_bf16_queries_fp16_operands():
    """kv_mma: fp16 on a bf16 cell: fp16 mma and cvt widening, Q's fragments converted once with the
    power of two the softmax scale takes back, P packed as fp16, kKvFold 1; refused without an e4m3 cache
    or where Q is not held in registers; for fp16 queries it changes no code."""
    src = (GEN / "h200_decode_d128_kv_e4m3_bf16_split.cu").read_text()
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in src and ".bf16.bf16" not in src
    assert "cvt.rn.f16x2.e4m3x2" in src and "fma.rn.bf16x2" not in src and "kKvFold = 1.0f" in src
    assert "scale_log2 *= q_to_fp16(qf);" in src and "pack_p(s[mt][2 * kc][0]" in src
    plan = make_plan(parse_spec(_text(dtype="bf16", kv_mma="fp16"), "t.yaml"))
    assert (plan.widens_to_fp16, plan.converts_q, plan.kv_fold) == (True, True, 1.0)
    plain = make_plan(parse_spec(_text(dtype="bf16"), "t.yaml"))
    assert (plain.widens_to_fp16, plain.converts_q, plain.kv_fold) == (False, False, 256.0)
    same = make_plan(parse_spec(_text(kv_mma="fp16"), "t.yaml"))
    assert (same.widens_to_fp16, same.converts_q) == (True, False)
    with pytest.raises(SpecError) as e:
        parse_spec(_text(kv_dtype=None, kv_mma="fp16"), "t.yaml")
    assert "kv_mma" in str(e.value) and "kv_dtype: e4m3" in str(e.value)


def test_dispatch_routes_only_e4m3_caches_to_e4m3_specs():
    from attngen.ops.table import entry_problem, load_table, select, table_path
    entries = load_table(table_path(SPECS))
    for dtype, suffix in (("fp16", ""), ("bf16", "_bf16")):
        for head_dim in (64, 128):
            got = select(entries, "decode_kv_e4m3", "sm_90", dtype, head_dim, "causal", 32768)
            # d128, one query row per KV head past 4096 keys: the 2-stage ring (by grid: below)
            ring = "_s2" if head_dim == 128 else ""
            assert got.spec == f"h200_decode_d{head_dim}_kv_e4m3_contiguous{ring}{suffix}"
            got = select(entries, "decode_kv_e4m3", "sm_90", dtype, head_dim, "none", 8192, paged=True)
            assert got.spec == f"h200_decode_d{head_dim}_kv_e4m3{suffix}"
            plain = select(entries, "decode", "sm_90", dtype, head_dim, "causal", 8192, paged=True)
            assert "kv_e4m3" not in plain.spec
        assert select(entries, "decode_kv_e4m3", "sm_90", dtype, 256, "causal", 8192).spec == \
            f"h200_decode_d256_kv_e4m3{suffix}"
    # an fp16-cache spec cannot serve an e4m3 entry, nor the reverse
    e4m3_entry = select(entries, "decode_kv_e4m3", "sm_90", "fp16", 128, "causal", 8192, paged=True)
    plain_entry = select(entries, "decode", "sm_90", "fp16", 128, "causal", 8192, paged=True)
    assert entry_problem(e4m3_entry._replace(spec="h200_decode_d128"), plan_of("h200_decode_d128"))
    assert entry_problem(plain_entry._replace(spec="h200_decode_d128_kv_e4m3"), plan_of("h200_decode_d128_kv_e4m3"))
    assert not [e for e in entries if e.call == "decode" and "kv_e4m3" in e.spec]
    # d96 (Phi-3) has a cell of its own, contiguous and paged; a head dim that is not a multiple of 32 has none
    for dtype, suffix in (("fp16", ""), ("bf16", "_bf16")):
        for paged in (False, True):
            assert select(entries, "decode_kv_e4m3", "sm_90", dtype, 96, "causal", 8192, paged=paged).spec == \
                f"h200_decode_d96_kv_e4m3{suffix}"
    with pytest.raises(LookupError):
        select(entries, "decode_kv_e4m3", "sm_90", "fp16", 80, "causal", 8192)


# -- the scales' checks, on stand-in tensors -------------------------------------------------------

class _Dtype:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"torch.{self.name}"


class _FakeTorch:
    float32, float16 = _Dtype("float32"), _Dtype("float16")
    capturing = False

    class cuda:   # noqa: N801 - torch.cuda as the scales read it
        @staticmethod
        def is_current_stream_capturing():
            return _FakeTorch.capturing

    class Tensor:
        def __init__(self, shape, dtype, device=0, stride=None, ptr=4096):
            self.shape, self.dtype, self._device, self._ptr = tuple(shape), dtype, device, ptr
            self._stride = stride or (1,) * len(self.shape)
            self.device = f"cuda:{device}"

        def numel(self):
            n = 1
            for s in self.shape:
                n *= s
            return n

        def get_device(self):
            return self._device

        def stride(self, d=None):
            return self._stride if d is None else self._stride[d]

        def data_ptr(self):
            return self._ptr

    @classmethod
    def full(cls, shape, value, dtype, device):
        return cls.Tensor(shape, dtype, ptr=8192)


T = _FakeTorch



@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_d128_contiguous_e4m3_calls_take_the_2_stage_ring_but_on_128_blocks_and_few_long_rows(dtype):
    """The table's ring for contiguous d128 e4m3 calls (docs/decode-h200/e4m3_route_short/: route_short*.json
    timed each call, route_modes_*.json with a torch op before each, as a decode step calls): 3 stages where the
    grid is 128 blocks of one slice, one per SM, and past 4096 keys for fewer than 128 query rows of 4 per KV
    head; 2 stages elsewhere. bf16 queries take the same ring as fp16 (both on fp16 operands)."""
    from attngen.ops.table import load_table, select, table_path
    entries = load_table(table_path(SPECS))
    cell = "h200_decode_d128_kv_e4m3_contiguous"
    suffix = "_bf16" if dtype == "bf16" else ""
    for capacity, group, rows, ring in ((32768, 4, 256, "_s2"),    # B8 32/8, fp16 with an op ahead (140.5 us; 3 stages 148.7)
                                        (32768, 4, 128, "_s2"),    # B4 32/8 (76.4 us; 3 stages 78.8)
                                        (16384, 4, 64, ""),        # B2 32/8 (28.7 us; 2 stages 31.1)
                                        (8192, 4, 32, ""),         # B1 32/8
                                        (32768, 4, None, ""),
                                        (32768, 1, 32, "_s2"),     # B1 32/32 (75.7 us; 3 stages 78.0)
                                        (8192, 1, 128, "_s2"),     # B4 32/32
                                        # up to 4096 keys the 2-stage ring but where the grid is 128 blocks of one
                                        # slice, one per SM
                                        (2048, 4, 256, "_s2"),     # B8 32/8 at 2k (18.8 us; 3 stages 19.7)
                                        (4096, 4, 128, "_s2"),     # B4 32/8 at 4k
                                        (1024, 4, 32, "_s2"),      # B1 32/8
                                        (4096, 4, 512, ""),        # B16 32/8: 128 blocks (2k 25.6 us; 2 stages 27.6)
                                        (1024, 4, 512, ""),
                                        (4096, 4, 1024, "_s2"),    # B32 32/8 at 4k (72.7 us; 3 stages 74.6)
                                        (4096, 1, 64, "_s2"),      # B2 32/32 at 4k (26.9 us; 3 stages 28.5)
                                        (1024, 1, 128, ""),        # B4 32/32: 128 blocks (16.7 us; 2 stages 17.8)
                                        (2048, 1, 256, "_s2"),     # B8 32/32
                                        (4096, 1, 1024, "_s2")):   # B32 32/32
        got = select(entries, "decode_kv_e4m3", "sm_90", dtype, 128, "none", capacity, group_rows=group, rows=rows)
        assert got.spec == cell + ring + suffix, (capacity, group, rows, got.spec)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_d128_contiguous_e4m3_calls_of_few_rows_at_long_context_take_the_paged_capable_cell(dtype):
    """Contiguous d128 e4m3 calls of up to 4 query rows per KV head go to the paged-capable cell (two blocks per SM
    from 16 blocks and 128 tiles or 8 and 256; its combine kernel merges) past 16384 keys from 64 query rows and past
    65536 keys below; 128 rows and more keep the 2-stage contiguous cell (docs/decode-h200/e4m3_b1/: through the entry
    point 1.02-1.15x where the cell changed)."""
    from attngen.ops.table import load_table, select, table_path
    entries = load_table(table_path(SPECS))
    suffix = "_bf16" if dtype == "bf16" else ""
    s3, s2, paged = ("h200_decode_d128_kv_e4m3_contiguous", "h200_decode_d128_kv_e4m3_contiguous_s2",
                     "h200_decode_d128_kv_e4m3")
    for mask in ("none", "causal"):
        for capacity, group, rows, cell in ((16384, 4, 64, s3),       # B2 32/8 at 16k: level (28.6 us both)
                                            (16385, 4, 64, paged),
                                            (32768, 4, 64, paged),    # B2 32/8 at 32k (42.9 us; 46.1 before)
                                            (32768, 4, 96, paged),    # B3 32/8 (60.2 us; 68.3 before)
                                            (131072, 2, 64, paged),   # B4 16/8
                                            (65536, 4, 32, s3),       # B1 32/8 at 64k: level
                                            (65537, 4, 32, paged),
                                            (131072, 4, 32, paged),   # B1 32/8 at 128k (77.5 us; 83.0 before)
                                            (131072, 4, 128, s2),     # B4 32/8
                                            (32768, 4, 512, s2),
                                            (131072, 1, 32, s2),      # 32/32 heads: their own bucket
                                            (131072, 8, 8, s3 + "_pairs")):   # 8/1 heads: the pairs cell
            got = select(entries, "decode_kv_e4m3", "sm_90", dtype, 128, mask, capacity, group_rows=group, rows=rows)
            assert got.spec == cell + suffix, (mask, capacity, group, rows, got.spec)
            paged_call = select(entries, "decode_kv_e4m3", "sm_90", dtype, 128, mask, capacity, paged=True,
                                group_rows=group, rows=rows)
            assert paged_call.spec == paged + suffix


def test_d64_contiguous_fp16_e4m3_calls_of_few_rows_past_32k_keys_take_the_paged_capable_cell():
    """Contiguous d64 e4m3 calls of fp16 queries, up to 4 query rows per KV head and fewer than 96 query rows, go to
    the paged-capable cell (its combine kernel's two blocks per SM) past 32768 keys; 96 rows and more, 32/32 heads and
    bf16 queries keep the contiguous cell (docs/decode-h200/e4m3_b1/entry_d64_summary.txt: 1.04-1.22x where the cell
    changed; B3 32/8 0.936x back to back, so it stays)."""
    from attngen.ops.table import load_table, select, table_path
    entries = load_table(table_path(SPECS))
    contiguous, paged = "h200_decode_d64_kv_e4m3_contiguous", "h200_decode_d64_kv_e4m3"
    for mask in ("none", "causal"):
        for capacity, group, rows, cell in ((32768, 4, 32, contiguous),   # B1 32/8 at 32k: level
                                            (32769, 4, 32, paged),
                                            (65536, 4, 32, paged),        # B1 32/8 at 64k (27.45 us; 31.59 before)
                                            (131072, 4, 64, paged),       # B2 32/8 at 128k (94.85; 99.65 before)
                                            (131072, 2, 32, paged),       # B2 16/8
                                            (65536, 4, 96, contiguous),   # B3 32/8: the paged-capable cell 0.936x
                                            (65536, 4, 128, contiguous),  # B4 32/8
                                            (131072, 1, 32, contiguous),  # 32/32 heads: their own bucket
                                            (131072, 8, 8, contiguous + "_pairs")):
            got = select(entries, "decode_kv_e4m3", "sm_90", "fp16", 64, mask, capacity, group_rows=group, rows=rows)
            assert got.spec == cell, (mask, capacity, group, rows, got.spec)
        assert select(entries, "decode_kv_e4m3", "sm_90", "bf16", 64, mask, 131072, group_rows=4,
                      rows=32).spec == contiguous + "_bf16"


def test_2_stage_cells_count_two_blocks_per_sm_from_16_tiles():
    """A merging cell of a 2-stage ring keeps one tile in flight per block: it counts its second block per SM
    from 32 blocks and 16 tiles (measured best at 2k-6k keys, docs/decode-h200/e4m3_issue/short_counts.json);
    the 3-stage cell and the combine-kernel cells keep their thresholds."""
    from attngen.core.launch_rules import row_blocks
    from attngen.runtime.calls.decode import num_splits_for
    from attngen.runtime.kernel import bundle_of
    plans = {n: bundle_of(f"specs/h200_decode_d128_kv_e4m3{n}.yaml")[0]
             for n in ("_contiguous_s2", "_contiguous_s2_bf16", "_contiguous", "")}
    assert [p.co_resident_min_tiles for p in plans.values()] == [16, 16, 0, 0]

    def picks(plan, batch, heads, kv_heads):
        blocks = batch * kv_heads * row_blocks(plan, heads, kv_heads, 1)
        return [num_splits_for(plan, blocks, -(-keys // plan.block_n), 132) for keys in (2048, 4096, 6144, 8192)]
    s2, s3 = plans["_contiguous_s2"], plans["_contiguous"]
    assert picks(s2, 8, 32, 8) == [4, 4, 4, 4] and picks(s3, 8, 32, 8) == [2, 2, 2, 4]     # B8 32/8: 64 blocks
    assert picks(s2, 4, 32, 8) == [8, 8, 8, 8] and picks(s3, 4, 32, 8) == [4, 4, 4, 8]     # B4 32/8: 32 blocks
    assert picks(s2, 8, 8, 1)[:3] == picks(s3, 8, 8, 1)[:3]                                 # 8 blocks: unchanged
    assert "the cache 16 tiles or more" in (GEN / "h200_decode_d128_kv_e4m3_contiguous_s2_split.cu").read_text()


def test_widening_reads_the_words_halves_in_place():
    """cvt.rn.f16x2.e4m3x2 takes either half of a 32-bit register (F2FP .H1): K's byte pairs are its word's
    halves, V's share one permute (0,2 low, 1,3 high)."""
    src = (GEN / "h200_decode_d128_kv_e4m3_contiguous_s2_split.cu").read_text()
    assert "mov.b32 {lo, hi}, %1;\\ncvt.rn.f16x2.e4m3x2 %0, hi;" in src
    assert "__byte_perm(w, 0u, 0x3120)" in src and "(kJ << 4) | kI" not in src


def made_here(make, index):
    """gpu.persistent's stand-in: the fake torch makes its tensors where it is called."""
    return make()


def test_scales_per_tensor_per_head_numbers_and_none():
    one = T.Tensor((), T.float32, ptr=100)
    heads = T.Tensor((8,), T.float32, ptr=200)
    assert kv_scale_values(T, (one, T.Tensor((1,), T.float32, ptr=300)), 8, 0, {}) == (100, 300, 0)
    assert kv_scale_values(T, (heads, T.Tensor((8,), T.float32, ptr=400)), 8, 0, {}) == (200, 400, 1)
    assert kv_scale_values(T, (None, None), 8, 0, {}) == (0, 0, 0)
    seen = {}
    assert kv_scale_values(T, (0.5, None), 8, 0, seen, made_here) == (8192, 0, 0) and (0, 0.5) in seen
    for value in range(1, 200):          # per-layer numbers: each kept, none freed (a graph may hold it)
        kv_scale_values(T, (float(value), None), 8, 0, seen, made_here)
    assert len(seen) == 200 and seen[(0, 0.5)] is not None


def test_a_new_number_scale_under_graph_capture_is_refused(monkeypatch):
    """Under capture a number's tensor would be allocated but not filled until the graph replays: a
    number seen before is fine, a new one is refused with what to do instead."""
    monkeypatch.setattr(T, "capturing", True)
    seen = {}
    with pytest.raises(ValueError, match="fp32 tensors"):
        kv_scale_values(T, (0.25, None), 8, 0, seen, made_here)
    monkeypatch.setattr(T, "capturing", False)
    kv_scale_values(T, (0.25, None), 8, 0, seen, made_here)
    monkeypatch.setattr(T, "capturing", True)
    assert kv_scale_values(T, (0.25, None), 8, 0, seen, made_here)[0] == 8192


@pytest.mark.parametrize("scales, error, words", [
    ((T.Tensor((8,), T.float16), None), TypeError, "float32"),
    ((T.Tensor((4,), T.float32), None), ValueError, "per KV head"),
    ((T.Tensor((8,), T.float32, stride=(2,)), None), ValueError, "per KV head"),
    ((T.Tensor((1,), T.float32, device=1), None), ValueError, "cuda:0"),
    ((T.Tensor((1,), T.float32), T.Tensor((8,), T.float32)), ValueError, "per tensor or both per KV head"),
    ((-1.0, None), ValueError, "positive"),
    ((float("nan"), None), ValueError, "positive"),
    (("1.0", None), TypeError, "number"),
    ((True, None), TypeError, "number"),
])
def test_scales_refused_with_the_reason(scales, error, words):
    with pytest.raises(error) as e:
        kv_scale_values(T, scales, 8, 0, {})
    assert words in str(e.value)


def test_attention_with_kvcache_takes_the_scales():
    """The entry point's keywords (read from its source: the package needs torch to import it)."""
    import ast
    tree = ast.parse((ROOT / "attngen" / "ops" / "__init__.py").read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "attention_with_kvcache")
    assert {"k_scale", "v_scale"} <= {a.arg for a in fn.args.kwonlyargs}


def test_a_programmatic_split_launch_of_few_blocks_asks_for_a_lone_blocks_shared_memory():
    """Where two blocks fit an SM, a programmatic split launch over no more blocks than SMs asks for more than
    half the SM (docs/decode-h200/pdl_packing/smem_floor.json): no two of its blocks can then share one."""
    from attngen.core.launch_rules import launches_alone, lone_block_smem
    from attngen.runtime.calls.decode import DecodeKernel
    from attngen.runtime.kernel import Function
    sm, reserved = 233472, 1024                     # an H200 SM's bytes, the system's per block
    alone = lone_block_smem(115200, sm, reserved)   # the 3-stage e4m3 d128 cell
    assert 2 * (115200 + reserved) <= sm < 2 * (alone + reserved) and alone + reserved <= sm
    assert lone_block_smem(172032, sm, reserved) == 172032     # one block per SM already
    assert lone_block_smem(115200, 0, 0) == 115200             # the SM's size not known
    assert launches_alone(True, 128, 132) and not launches_alone(True, 256, 132)
    assert not launches_alone(False, 128, 132)                 # launched the usual way: placed as any grid

    class Info:
        smem_per_sm, smem_reserved, smem_optin, sm_count = sm, reserved, 232448, 132
    split = Function("split", 1, 128, 115200, True)
    combine = Function("combine", 2, 128, 0, True)
    few = DecodeKernel._alone(Info, ((split, 11, (1, 128, 1)), (combine, 12, (4, 1, 1))))
    assert few[0][0].smem_dynamic == alone and few[0][1:] == (11, (1, 128, 1)) and few[1][0] is combine
    many = ((split, 11, (2, 128, 1)),)
    assert DecodeKernel._alone(Info, many) is many
    usual = ((split._replace(programmatic=False), 11, (1, 128, 1)),)
    assert DecodeKernel._alone(Info, usual) is usual


def test_a_prepared_e4m3_call_takes_only_the_scale_pointers_it_may():
    """_scale_pointer (a repeated call's scales): a tensor's address, 0 for None, the kept tensor of a number seen on
    the device; None (the full path, which checks and says why) for a number not kept yet, a bool (whose key equals
    1.0's) or anything that is no real number."""
    from attngen.runtime.calls.decode import DecodeKernel

    class Tensor:
        def __init__(self, ptr):
            self.ptr = ptr

        def data_ptr(self):
            return self.ptr

    kernel = DecodeKernel.__new__(DecodeKernel)
    kernel._tensor_type = Tensor
    kernel._scale_tensors = {(0, 1.0): Tensor(4096), (0, 0.5): Tensor(8192)}
    assert kernel._scale_pointer(None, 0) == 0
    assert kernel._scale_pointer(Tensor(1234), 0) == 1234
    assert kernel._scale_pointer(1.0, 0) == 4096 and kernel._scale_pointer(1, 0) == 4096
    assert kernel._scale_pointer(0.5, 0) == 8192
    assert kernel._scale_pointer(0.5, 1) is None           # another device: its own tensor, made by the full path
    assert kernel._scale_pointer(2.0, 0) is None
    for odd in (True, False, 1 + 0j, "1.0", [1.0]):
        assert kernel._scale_pointer(odd, 0) is None

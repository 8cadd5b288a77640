"""The model zoo: the attention layers of public models (their configs only: random weights, nothing
downloaded), each run through attngen's entry points as the cells a model needs:

- `train`: a training step, forward and backward through `attngen.attention`;
- `varlen_prefill`: a varlen prefill, three packed sequences of different lengths through `attention_varlen`;
- `paged_decode`: a paged decode step, one new token for each of four sequences through
  `attention_with_kvcache` with a block table over pages of 16 keys.

Each served cell is judged against a written-out fp32 reference (GQA, scale, softcap, ALiBi, the
causal mask, the sliding window and learned sinks, each a line of torch below, none of attngen's
code) under FlashAttention's error rule: every output (and, training, every gradient) within twice
the error of the same written-out attention evaluated by torch in the inputs' dtype, plus a floor
(`verify.cases.error_bound`). A cell the dispatch table does not serve is refused by attngen before
anything runs (LookupError, NotImplementedError); `EXPECTED_REFUSALS` lists the refusals on sm_90
and `table_cell` predicts them from the committed table without torch or a GPU.

tests/test_model_zoo.py checks the table and the predictions, tests/test_gpu_model_zoo.py runs every
cell on an H100/H200, docs/zoo-h200/model_zoo.py times the cells beside torch's backends
(docs/model-zoo.md). Shapes are small (a few thousand tokens) and some layers run fewer heads than
the model has, in the model's ratio of query to KV heads; a layer with a sliding window runs more
tokens than its window holds.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

CELLS = ("train", "varlen_prefill", "paged_decode")
PAGE_SIZE = 16
ARCH = "sm_90"              # the arch EXPECTED_REFUSALS describes (H100, H200)
TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


@dataclass(frozen=True)
class Layer:
    """One attention layer of a model: what attngen is called with, and the shapes the zoo runs."""

    name: str                       # the zoo's id: model and layer kind
    model: str                      # the model, as its card names it
    head_dim: int
    heads: int                      # query heads run here (the model's, or fewer in its ratio)
    kv_heads: int
    model_heads: tuple[int, int]    # the model's (query heads, KV heads)
    head_dim_v: int = 0             # V's head dim where it differs (0: head_dim)
    causal: bool = True
    window: int | None = None       # the model's sliding window W: a query sees itself and W - 1 keys back
    softcap: float | None = None
    alibi: bool = False             # ALiBi slopes as MPT makes them (alibi_bias_max 8)
    sinks: bool = False             # learned sinks: one fp32 logit per query head
    scale: float | None = None      # None: 1 / sqrt(head_dim)
    latent: bool = False            # one latent cache: V is each K row's first head_dim_v columns (MLA's absorbed
                                    # decode); the call passes v_cache = k_cache[..., :head_dim_v]
    dtype: str = "bf16"
    batch: int = 2
    seqlen: int = 1024
    cells: tuple[str, ...] = CELLS
    note: str = ""

    @property
    def v_dim(self) -> int:
        return self.head_dim_v or self.head_dim

    @property
    def softmax_scale(self) -> float:
        return self.scale if self.scale is not None else self.head_dim ** -0.5

    @property
    def window_size(self) -> tuple[int, int] | None:
        """FlashAttention's window_size of the layer's calls: (W - 1, 0), causal closing the right side."""
        return None if self.window is None else (self.window - 1, 0)

    @property
    def varlen_lengths(self) -> tuple[int, ...]:
        """Three sequences packed back to back: the layer's seqlen (past the window where it has one), a
        middle one and a short one, none a multiple of a tile but the first."""
        return (self.seqlen, self.seqlen // 2 + 77, 129)

    @property
    def decode_lengths(self) -> tuple[int, ...]:
        """Keys per sequence of the decode step (the new token included): the longest one past the window."""
        return (self.seqlen, self.seqlen // 2 + 33, 300, 1)

    @property
    def label(self) -> str:
        heads = f"{self.heads}/{self.kv_heads}"
        d = f"d{self.head_dim}" + (f"/{self.head_dim_v}" if self.head_dim_v else "")
        parts = [d, heads, "causal" if self.causal else "non-causal"]
        if self.window is not None:
            parts.append(f"window {self.window}")
        if self.softcap is not None:
            parts.append(f"softcap {self.softcap:g}")
        if self.alibi:
            parts.append("ALiBi")
        if self.sinks:
            parts.append("sinks")
        if self.scale is not None:
            parts.append(f"scale {self.scale:.4g}")
        return ", ".join(parts) + f", {self.dtype}"


def _deepseek_scale() -> float:
    """DeepSeek-V3's softmax scale: 1/sqrt(192) times YaRN's mscale squared (factor 40, mscale_all_dim 1)."""
    mscale = 0.1 * math.log(40) + 1.0
    return 192 ** -0.5 * mscale * mscale


LAYERS: tuple[Layer, ...] = (
    Layer("llama3_8b", "Llama 3 8B", 128, 32, 8, (32, 8)),
    Layer("mistral_7b", "Mistral 7B", 128, 8, 2, (32, 8), window=4096, batch=1, seqlen=5000),
    Layer("gemma2_9b_local", "Gemma 2 9B", 256, 8, 4, (16, 8), window=4096, softcap=50.0, scale=1 / 16,
          batch=1, seqlen=5000, note="local (sliding-window) layers; query_pre_attn_scalar 256"),
    Layer("gemma2_9b_global", "Gemma 2 9B", 256, 16, 8, (16, 8), softcap=50.0, scale=1 / 16,
          note="global layers"),
    Layer("gemma3_27b_local", "Gemma 3 27B", 128, 16, 8, (32, 16), window=1024, scale=168 ** -0.5,
          batch=1, seqlen=2048, note="local layers; query_pre_attn_scalar 168"),
    Layer("gemma3_27b_global", "Gemma 3 27B", 128, 16, 8, (32, 16), scale=168 ** -0.5, note="global layers"),
    Layer("gemma3_12b_local", "Gemma 3 12B", 256, 16, 8, (16, 8), window=1024, scale=1 / 16, batch=1, seqlen=2048,
          note="local layers; query_pre_attn_scalar 256"),
    Layer("gemma3_12b_global", "Gemma 3 12B", 256, 16, 8, (16, 8), scale=1 / 16, note="global layers"),
    Layer("gptoss_20b_local", "gpt-oss 20B", 64, 16, 2, (64, 8), window=128, sinks=True,
          note="sliding-window layers (alternate)"),
    Layer("gptoss_20b_global", "gpt-oss 20B", 64, 16, 2, (64, 8), sinks=True, note="full-attention layers"),
    Layer("phi3_mini", "Phi-3 mini", 96, 32, 32, (32, 32)),
    Layer("deepseek_v3_mla", "DeepSeek-V3", 192, 16, 16, (128, 128), head_dim_v=128, scale=_deepseek_scale(),
          cells=("train", "varlen_prefill"),
          note="MLA prefill and training (q/k 192 = 128 + 64 rotary, v 128); its decode attends in the "
               "absorbed form (q/k 576, v 512, one KV head), the next layer"),
    Layer("deepseek_v3_mla_decode", "DeepSeek-V3", 576, 128, 1, (128, 1), head_dim_v=512, scale=_deepseek_scale(),
          latent=True, cells=("paged_decode",),
          note="MLA decode, up-projections absorbed: q 576 (512 latent + 64 rotary) against one latent cache "
               "of 576 whose first 512 columns are V; all 128 heads on one GPU (data-parallel attention)"),
    Layer("qwen3", "Qwen3-235B-A22B", 128, 32, 2, (64, 4)),
    Layer("falcon_7b", "Falcon 7B", 64, 71, 1, (71, 1), note="MQA with an odd head count"),
    Layer("mpt_7b", "MPT 7B", 128, 32, 32, (32, 32), alibi=True),
    Layer("sd15_d40", "Stable Diffusion 1.5 UNet", 40, 8, 8, (8, 8), causal=False, dtype="fp16", batch=1,
          seqlen=4096, cells=("train", "varlen_prefill"), note="self-attention at 64x64 latents (320 channels)"),
    Layer("sd15_d80", "Stable Diffusion 1.5 UNet", 80, 8, 8, (8, 8), causal=False, dtype="fp16",
          cells=("train", "varlen_prefill"), note="self-attention at 32x32 latents (640 channels)"),
    Layer("sd15_d160", "Stable Diffusion 1.5 UNet", 160, 8, 8, (8, 8), causal=False, dtype="fp16", seqlen=256,
          cells=("train", "varlen_prefill"), note="self-attention at 16x16 latents (1280 channels)"),
    Layer("sdxl_d64", "Stable Diffusion XL UNet", 64, 10, 10, (10, 10), causal=False, dtype="fp16", batch=1,
          seqlen=4096, cells=("train", "varlen_prefill"), note="self-attention at 64x64 latents (640 channels)"),
    Layer("vit_b16", "ViT-B/16", 64, 12, 12, (12, 12), causal=False, batch=4, seqlen=197,
          cells=("train", "varlen_prefill"), note="224x224 images: 196 patches and the class token"),
)

LAYER = {layer.name: layer for layer in LAYERS}

# The cells attngen refuses on sm_90 (H100, H200), with why: a cell served from now on fails
# tests/test_gpu_model_zoo.py until it leaves this list, and so does a cell refused that is not in it.
EXPECTED_REFUSALS: dict[tuple[str, str], str] = {}


def zoo_cells() -> list[tuple[Layer, str]]:
    """Every (layer, cell) the zoo runs, in table order."""
    return [(layer, cell) for layer in LAYERS for cell in layer.cells]


def cell_id(layer: Layer, cell: str) -> str:
    return f"{layer.name}-{cell}"


# -- the dispatch table's answer, without torch or a GPU -------------------------------------------

def _scores(layer: Layer, *, sinks: bool = True) -> str:
    """The score modifiers the call asks for, joined as the table keys them (ops.library.call_scores)."""
    from ..core.variants import SCORES
    given = {"softcap": layer.softcap is not None, "alibi_slopes": layer.alibi, "sinks": layer.sinks and sinks}
    return "+".join(s.name for s in SCORES.values() if given.get(s.argument))


def _mask(layer: Layer) -> str:
    from ..core.variants import call_mask
    return call_mask(layer.causal, layer.window_size)


@dataclass(frozen=True)
class TableCell:
    """What the committed dispatch table says of one cell on an arch: the specs its call loads (forward
    before backward), or the refusal."""

    specs: tuple[str, ...] = ()
    refusal: str | None = None


def table_cell(layer: Layer, cell: str, arch: str = ARCH, entries=None) -> TableCell:
    """The table's entries for the cell's calls, keyed as attngen.attention & co. key them
    (ops/library.py): a training step needs its backward entry (the table keys the backward without
    sinks: the LSE holds them) and its forward entry; a varlen prefill its varlen entry; a decode
    step its decode entry for the cache's capacity, page size and query rows per KV head. V's head dim
    keys every entry where it differs from q's."""
    from ..ops.table import select
    if entries is None:
        entries = committed_entries()
    dtype, d, mask = layer.dtype, layer.head_dim, _mask(layer)
    dv = layer.head_dim_v if layer.head_dim_v != d else 0      # V's head dim keys an entry where it differs
    try:
        if cell == "train":
            try:
                backward = select(entries, "backward", arch, dtype, d, mask, layer.seqlen, head_dim_v=dv,
                                  scores=_scores(layer, sinks=False))
            except LookupError as exc:
                return TableCell(refusal=f"attngen has no backward for this call yet: {exc}")
            forward = select(entries, "forward", arch, dtype, d, mask, layer.seqlen, head_dim_v=dv,
                             scores=_scores(layer), rows=layer.batch * layer.heads * layer.seqlen)
            return TableCell(specs=(forward.spec, backward.spec))
        if cell == "varlen_prefill":
            entry = select(entries, "varlen", arch, dtype, d, mask, max(layer.varlen_lengths), head_dim_v=dv,
                           scores=_scores(layer))
            return TableCell(specs=(entry.spec,))
        if cell == "paged_decode":
            pages = -(-max(layer.decode_lengths) // PAGE_SIZE)
            entry = select(entries, "decode", arch, dtype, d, mask, pages * PAGE_SIZE, paged=True,
                           group_rows=layer.heads // layer.kv_heads, head_dim_v=dv, scores=_scores(layer))
            return TableCell(specs=(entry.spec,))
    except LookupError as exc:
        return TableCell(refusal=str(exc))
    raise ValueError(f"unknown cell {cell!r}; the cells are {', '.join(CELLS)}")


def committed_entries():
    """The entries of the dispatch table attngen.attention serves from."""
    from ..ops.dispatch import SPECS_DIR
    from ..ops.table import load_table, table_path
    return load_table(table_path(SPECS_DIR))


def table_refusals(arch: str = ARCH, entries=None) -> dict[tuple[str, str], str]:
    """{(layer, cell): the refusal} of every zoo cell the table does not serve on `arch`."""
    entries = committed_entries() if entries is None else entries
    out = {}
    for layer, cell in zoo_cells():
        found = table_cell(layer, cell, arch, entries)
        if found.refusal is not None:
            out[(layer.name, cell)] = found.refusal
    return out


def served_specs(arch: str = ARCH, entries=None) -> list[str]:
    """The specs the zoo's served cells load on `arch` (what `attngen warm` needs to compile)."""
    entries = committed_entries() if entries is None else entries
    return sorted({s for layer, cell in zoo_cells() for s in table_cell(layer, cell, arch, entries).specs})


# -- inputs and the reference ------------------------------------------------------------------------

def mpt_alibi_slopes(heads: int, bias_max: float = 8.0) -> list[float]:
    """MPT's ALiBi slopes (gen_slopes): 1 / 2^(bias_max * i / n) for i = 1..n over the next power of two n,
    interleaved when the head count is not a power of two."""
    n = 1 << math.ceil(math.log2(heads))
    slopes = [1.0 / 2 ** (i * bias_max / n) for i in range(1, n + 1)]
    if n != heads:
        slopes = (slopes[1::2] + slopes[::2])[:heads]
    return slopes


def reference_attention(torch, q, k, v, layer: Layer, slopes=None, sinks=None):
    """softmax(scores) v for q (B, Hq, Sq, D) and k, v (B, Hkv, Sk, D), computed in q's dtype as
    FlashAttention's tests write it out (their attention_ref, not upcast): K and V repeated over each
    KV head's query heads; scores scaled, then capped (cap * tanh(s / cap)), then ALiBi's fp32 bias
    -slope * |i + Sk - Sq - j| added; keys past the query's position (causal: j > i + Sk - Sq) and
    further back than the window (j < i + Sk - Sq - (W - 1)) hidden; each head's sink (if any) one more
    logit in the softmax, whose column is dropped before P V. Every query sees a key here."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * layer.softmax_scale
    if layer.softcap is not None:
        scores = layer.softcap * torch.tanh(scores / layer.softcap)
    sq, sk = scores.shape[-2:]
    pos = torch.arange(sq, device=q.device)[:, None] + (sk - sq)        # each query's position among the keys
    key = torch.arange(sk, device=q.device)[None, :]
    if slopes is not None:
        scores = scores - slopes.float().reshape(1, -1, 1, 1) * (pos - key).abs().float()   # fp32, as FA's ref
    hidden = torch.zeros(sq, sk, dtype=torch.bool, device=q.device)
    if layer.causal:
        hidden |= key > pos
    if layer.window is not None:
        hidden |= key < pos - (layer.window - 1)
    scores = scores.masked_fill(hidden, float("-inf"))
    if sinks is not None:
        column = sinks.to(scores.dtype).reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        probs = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs.to(v.dtype), v)


@dataclass
class Prepared:
    """One cell's inputs, attngen's call and the reference: run() gives attngen's outputs (names),
    reference(dtype) the written-out ones in dtype (torch.float32: the reference; the inputs' dtype:
    the low-precision peer that sets the bound)."""

    layer: Layer
    cell: str
    tensors: dict
    names: tuple[str, ...]
    run: object
    reference: object
    extra: dict = field(default_factory=dict)


def _randn(torch, gen, shape, dtype):
    return torch.randn(shape, generator=gen, device="cuda").to(dtype)


def _variant_tensors(torch, layer: Layer, gen) -> dict:
    out = {}
    if layer.alibi:
        out["alibi_slopes"] = torch.tensor(mpt_alibi_slopes(layer.heads), dtype=torch.float32, device="cuda")
    if layer.sinks:
        out["sinks"] = torch.randn(layer.heads, generator=gen, device="cuda") * 2
    return out


def _keywords(layer: Layer, tensors: dict, sinks=None) -> dict:
    """attngen's keywords for the layer's call."""
    kw = {"causal": layer.causal, "scale": layer.softmax_scale}
    if layer.window is not None:
        kw["window"] = layer.window_size
    if layer.softcap is not None:
        kw["softcap"] = layer.softcap
    if layer.alibi:
        kw["alibi_slopes"] = tensors["alibi_slopes"]
    if layer.sinks:
        kw["sinks"] = tensors["sinks"] if sinks is None else sinks
    return kw


def prepare(torch, layer: Layer, cell: str, seed: int = 0) -> Prepared:
    """The cell's inputs (seeded), attngen's call and the reference, on the current CUDA device."""
    dt = getattr(torch, TORCH_DTYPES[layer.dtype])
    gen = torch.Generator(device="cuda").manual_seed(seed)
    variants = _variant_tensors(torch, layer, gen)
    if cell == "train":
        return _prepare_train(torch, layer, dt, gen, variants)
    if cell == "varlen_prefill":
        return _prepare_varlen(torch, layer, dt, gen, variants)
    if cell == "paged_decode":
        return _prepare_decode(torch, layer, dt, gen, variants)
    raise ValueError(f"unknown cell {cell!r}; the cells are {', '.join(CELLS)}")


def _prepare_train(torch, layer, dt, gen, variants) -> Prepared:
    import attngen
    b, s, hq, hk, d, dv = layer.batch, layer.seqlen, layer.heads, layer.kv_heads, layer.head_dim, layer.v_dim
    t = {"q": _randn(torch, gen, (b, hq, s, d), dt), "k": _randn(torch, gen, (b, hk, s, d), dt),
         "v": _randn(torch, gen, (b, hk, s, dv), dt), "dout": _randn(torch, gen, (b, hq, s, dv), dt), **variants}
    names = ("out", "dq", "dk", "dv") + (("dsinks",) if layer.sinks else ())

    def leaves(dtype):
        out = [t[n].detach().to(dtype).requires_grad_() for n in ("q", "k", "v")]
        if layer.sinks:
            out.append(t["sinks"].detach().to(dtype).requires_grad_())   # the sinks in the peer's dtype too
        return out

    def run():
        xs = [t[n].detach().requires_grad_() for n in ("q", "k", "v")]
        if layer.sinks:
            xs.append(t["sinks"].detach().clone().requires_grad_())   # fp32, as attngen takes them
        o = attngen.attention(*xs[:3], **_keywords(layer, t, xs[3] if layer.sinks else None))
        grads = torch.autograd.grad(o, xs, t["dout"])
        return (o.detach(), *grads)

    def reference(dtype):
        xs = leaves(dtype)
        o = reference_attention(torch, *xs[:3], layer, t.get("alibi_slopes"), xs[3] if layer.sinks else None)
        grads = torch.autograd.grad(o, xs, t["dout"].to(dtype))
        return (o.detach(), *grads)

    return Prepared(layer, "train", t, names, run, reference)


def _prepare_varlen(torch, layer, dt, gen, variants) -> Prepared:
    import attngen
    from ..runtime.calls.varlen import cu_seqlens
    lengths = layer.varlen_lengths
    total, longest = sum(lengths), max(lengths)
    hq, hk, d, dv = layer.heads, layer.kv_heads, layer.head_dim, layer.v_dim
    t = {"q": _randn(torch, gen, (total, hq, d), dt), "k": _randn(torch, gen, (total, hk, d), dt),
         "v": _randn(torch, gen, (total, hk, dv), dt), "cu_seqlens": cu_seqlens(torch, lengths, "cuda"), **variants}

    def run():
        with torch.no_grad():
            o = attngen.attention_varlen(t["q"], t["k"], t["v"], t["cu_seqlens"], t["cu_seqlens"], longest, longest,
                                         **_keywords(layer, t))
        return (o,)

    def reference(dtype):
        outs, at = [], 0
        with torch.no_grad():
            for n in lengths:
                q, k, v = (t[x][at:at + n].transpose(0, 1)[None].to(dtype) for x in ("q", "k", "v"))
                o = reference_attention(torch, q, k, v, layer, t.get("alibi_slopes"), t.get("sinks"))
                outs.append(o[0].transpose(0, 1))
                at += n
        return (torch.cat(outs, dim=0),)

    return Prepared(layer, "varlen_prefill", t, ("out",), run, reference, {"lengths": lengths})


def _prepare_decode(torch, layer, dt, gen, variants) -> Prepared:
    import attngen
    from .verify.decode import paged_cache
    lengths = layer.decode_lengths
    b = len(lengths)
    capacity = -(-max(lengths) // PAGE_SIZE) * PAGE_SIZE
    hq, hk, d, dv = layer.heads, layer.kv_heads, layer.head_dim, layer.v_dim
    k_full, v_full = _randn(torch, gen, (b, hk, capacity, d), dt), _randn(torch, gen, (b, hk, capacity, dv), dt)
    if layer.latent:    # one cache: each key's value is its own row's first dv columns
        v_full = k_full[..., :dv]
    k_pool, v_pool, table = paged_cache(torch, k_full, v_full, list(lengths), PAGE_SIZE, "bhsd", generator=gen)
    if layer.latent:
        v_pool = k_pool[..., :dv]
    t = {"q": _randn(torch, gen, (b, hq, 1, d), dt), "k_cache": k_full, "v_cache": v_full, "k_pool": k_pool,
         "v_pool": v_pool, "block_table": table,
         "cache_seqlens": torch.tensor(lengths, dtype=torch.int32, device="cuda"), **variants}

    def run():
        with torch.no_grad():
            o = attngen.attention_with_kvcache(t["q"], t["k_pool"], t["v_pool"], cache_seqlens=t["cache_seqlens"],
                                               block_table=t["block_table"], **_keywords(layer, t))
        return (o,)

    def reference(dtype):
        outs = []
        with torch.no_grad():
            for i, n in enumerate(lengths):
                q = t["q"][i:i + 1].to(dtype)
                k, v = (t[x][i:i + 1, :, :n].to(dtype) for x in ("k_cache", "v_cache"))
                outs.append(reference_attention(torch, q, k, v, layer, t.get("alibi_slopes"), t.get("sinks")))
        return (torch.cat(outs, dim=0),)

    return Prepared(layer, "paged_decode", t, ("out",), run, reference, {"lengths": lengths, "capacity": capacity})


# -- judging a cell ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Output:
    """One output's max |attngen - fp32 reference|, torch's own error in the inputs' dtype, and the bound."""

    name: str
    err: float
    low_err: float
    bound: float

    @property
    def passed(self) -> bool:
        return self.err <= self.bound      # NaN fails


@dataclass(frozen=True)
class CellResult:
    layer: str
    cell: str
    status: str                     # "served" or "refused"
    message: str = ""               # the refusal
    outputs: tuple[Output, ...] = ()

    @property
    def passed(self) -> bool:
        return self.status == "served" and bool(self.outputs) and all(o.passed for o in self.outputs)

    @property
    def worst(self) -> Output | None:
        """The output nearest its bound (err / bound largest)."""
        return max(self.outputs, key=lambda o: o.err / o.bound if o.bound else math.inf, default=None)

    def problems(self) -> str:
        return "; ".join(f"{o.name}: {o.err:.3g} > bound {o.bound:.3g} (torch {o.low_err:.3g})"
                         for o in self.outputs if not o.passed)


_NO_KERNEL = re.compile(r"\bno\b[^.]*\b(kernel|spec|entry|backward)\b", re.IGNORECASE)


def refusal_of(exc: BaseException) -> str | None:
    """The refusal an exception states, or None for an exception that is not attngen saying it has no
    kernel for the call (LookupError from the table, NotImplementedError, a ValueError naming no kernel)."""
    if isinstance(exc, (LookupError, NotImplementedError)) or \
            (isinstance(exc, ValueError) and _NO_KERNEL.search(str(exc))):
        return " ".join(str(exc).split()) or type(exc).__name__
    return None


def judge(torch, names, got, ref, low) -> tuple[Output, ...]:
    from .verify.cases import error_bound
    out = []
    for name, a, r, lo in zip(names, got, ref, low, strict=True):
        if a is None or tuple(a.shape) != tuple(r.shape):
            out.append(Output(name, math.nan, math.nan, 0.0))
            continue
        err = (a.float() - r.float()).abs().max().item()
        low_err = (lo.float() - r.float()).abs().max().item()
        out.append(Output(name, err, low_err, error_bound(low_err)))
    return tuple(out)


def check(torch, prepared: Prepared) -> CellResult:
    """Call the prepared cell through attngen's entry point: a refusal is recorded, any other error
    raises; a served cell's outputs are judged against the fp32 reference under the error rule."""
    from .verify.cases import exact_fp32_matmul
    layer, cell = prepared.layer, prepared.cell
    try:
        got = prepared.run()
    except (LookupError, NotImplementedError, ValueError) as exc:
        message = refusal_of(exc)
        if message is None:
            raise
        return CellResult(layer.name, cell, "refused", message)
    torch.cuda.synchronize()
    with exact_fp32_matmul(torch):
        ref = prepared.reference(torch.float32)
    low = prepared.reference(got[0].dtype)
    return CellResult(layer.name, cell, "served", outputs=judge(torch, prepared.names, got, ref, low))


def run_cell(torch, layer: Layer, cell: str, seed: int = 0) -> CellResult:
    """check() of the cell's seeded inputs."""
    return check(torch, prepare(torch, layer, cell, seed))


__all__ = ["ARCH", "CELLS", "EXPECTED_REFUSALS", "LAYER", "LAYERS", "PAGE_SIZE", "CellResult", "Layer", "Output",
           "Prepared", "TableCell", "cell_id", "check", "committed_entries", "judge", "mpt_alibi_slopes", "prepare",
           "reference_attention", "refusal_of", "run_cell", "served_specs", "table_cell", "table_refusals",
           "zoo_cells"]

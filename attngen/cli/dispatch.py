"""`attngen dispatch`: which spec a library call picks and why, or the table rewritten from reports."""
from __future__ import annotations

import json
from pathlib import Path

import click

from ..ops.table import CALLS as DISPATCH_CALLS
from .options import MAX_GROUP_ROWS, MAX_HEAD_DIM, MAX_INT32, MAX_PAGE_SIZE


def padding_text(head_dim: int, head_dim_v: int, pair: tuple[int, int]) -> str:
    """What a padded call pads, e.g. "q, k and v zero-padded to head_dim 64", "v zero-padded to head_dim 96"."""
    qk, v = pair[0] != head_dim, pair[1] != head_dim_v
    if qk and v and pair[0] == pair[1]:
        return f"q, k and v zero-padded to head_dim {pair[0]}"
    if qk and v:
        return f"q and k zero-padded to head_dim {pair[0]}, v to {pair[1]}"
    return f"q and k zero-padded to head_dim {pair[0]}" if qk else f"v zero-padded to head_dim {pair[1]}"


@click.command()
@click.option("--call", type=click.Choice(DISPATCH_CALLS), default=DISPATCH_CALLS[0], show_default=True)
@click.option("--arch", default="sm_90", show_default=True, help="the GPU's arch (H100/H200: sm_90, L4: sm_89)")
@click.option("--dtype", type=click.Choice(["fp16", "bf16", "e4m3"]), default=None,
              help="the inputs' element type  [default: fp16; e4m3 for --call forward_fp8]")
@click.option("--head-dim", type=click.IntRange(1, MAX_HEAD_DIM), default=128, show_default=True)
@click.option("--causal", is_flag=True)
@click.option("--seqlen", type=click.IntRange(0, MAX_INT32), default=2048, show_default=True,
              help="seqlen_k (varlen, varlen_backward: max_seqlen_k; backward: seqlen_q; decode: the cache's capacity)")
@click.option("--head-dim-v", type=click.IntRange(0, MAX_HEAD_DIM), default=0,
              help="V's head dim where it differs from --head-dim (DeepSeek MLA: --head-dim 192 --head-dim-v 128; its "
                   "decode: --head-dim 576 --head-dim-v 512)")
@click.option("--window", is_flag=True, help="a sliding-window call (window=(left, right) bounding a side)")
@click.option("--window-keys", type=click.IntRange(1, MAX_INT32), default=None, metavar="N",
              help="with --window: the keys a row's window spans, left + 1 + right (a causal call's right is 0), "
                   "where the table picks by width (entries with max_window)  [default: an unbounded side]")
@click.option("--scores", default="", metavar="MODS",
              help="the call's score modifiers joined by +, as the table keys them: softcap, alibi, softcap+alibi")
@click.option("--page-size", type=click.IntRange(0, MAX_PAGE_SIZE), default=0, show_default=True,
              help="decode and varlen: keys per page of a paged cache, a power of two (any one a paged spec reads); "
                   "0 contiguous")
@click.option("--group-rows", type=click.IntRange(1, MAX_GROUP_ROWS), default=1, show_default=True,
              help="decode: query rows per KV head (heads / kv_heads x new tokens)")
@click.option("--rows", type=click.IntRange(1, MAX_INT32), default=None,
              help="the call's query rows, batch x heads x seqlen_q, where a bucket's winner depends on the "
                   "grid's size (entries with min_rows)  [default: the entry for any size]")
@click.option("--from", "--from-bench", "bench_files", multiple=True, type=click.Path(dir_okay=False, exists=True),
              help="with --write: `attngen bench --json` or `attngen sweep --json` reports whose winners replace "
                   "the table's forward entries of their keys (backward entries from a bench of backward specs; "
                   "repeatable)")
@click.option("--serve", "serve_specs", multiple=True, metavar="SPEC",
              help="add unmeasured entries for every key SPEC (a spec file: each cell of it; or one cell by its "
              "path) serves that the table lacks; prints them, and writes them with --write (repeatable)")
@click.option("--coverage", is_flag=True, help="what the table serves on --arch in --dtype: per call, score modifiers "
              "and mask, each of FlashAttention's test head dims served, padded or refused")
@click.option("--write", is_flag=True, help="write the table from --from reports (or --serve's entries)")
@click.option("--json", "as_json", is_flag=True, help="print the choice (or the written entries) as JSON")
@click.option("--specs-dir", default=None, help="the specs whose dispatch/table.yaml to read [default: the "
                                                  "ones attngen.attention serves: specs/ of this checkout, or "
                                                  "those installed with attngen]")
def dispatch(call, arch, dtype, head_dim, head_dim_v, causal, seqlen, window, window_keys, scores, page_size, group_rows,
             rows, bench_files, serve_specs, coverage, write, as_json, specs_dir):
    """Show which spec attngen.attention (or attention_varlen, attention_with_kvcache) picks for a
    call, and why; or, with --from REPORT ... --write, rewrite the table from measurements.

    \b
    The table is specs/dispatch/table.yaml: per GPU arch, call, dtype, head dim and mask, the
    measured winner per sequence-length bucket with its runner-up. No GPU needed.
      attngen dispatch --head-dim 64 --causal --seqlen 4096
      attngen dispatch --head-dim 64 --seqlen 1024 --rows 262144      (batch 16 x 16 heads x 1024)
      attngen dispatch --call decode --group-rows 4 --page-size 16 --seqlen 8192
      attngen dispatch --call decode --head-dim 576 --head-dim-v 512 --group-rows 128 --dtype bf16   (MLA decode)
      attngen dispatch --head-dim 128 --window --seqlen 32768      (window=(4096, 0) and the like)
      attngen dispatch --head-dim 64 --window --window-keys 128 --causal --scores sink --dtype bf16   (gpt-oss)
      attngen dispatch --head-dim 128 --causal --scores softcap --seqlen 8192
      attngen bench --json grid.json ... && attngen dispatch --from grid.json --write
      attngen bench --json bwd.json specs/h100_bwd_d64_wgmma.yaml && attngen dispatch --from bwd.json --write
      attngen sweep SPEC --shapes ... --json s.json --write-best specs && attngen dispatch --from s.json --write
      attngen dispatch --call forward_fp8 --arch sm_89 --head-dim 128 --causal   (attngen.attention_fp8)
      attngen dispatch --serve specs/h100_wgmma_d256.yaml --write    (a new member: its keys, unmeasured)
      attngen dispatch --coverage --dtype bf16     (every head dim and variant: served, padded or refused)
    """
    from ..core.calls import table_call
    from ..ops.dispatch import CALL_DTYPES, SPECS_DIR
    from ..ops.table import call_text, candidates, load_table, padded_dims, select, sinks_apart, table_path
    dtype = dtype or CALL_DTYPES.get(call, ("fp16",))[0]
    path = table_path(specs_dir or SPECS_DIR)
    entries = load_table(path)
    if coverage:
        _coverage(entries, arch, dtype, path, as_json)
        return
    if serve_specs:
        if bench_files:
            raise click.UsageError("--serve adds unmeasured entries and --from measured ones: one at a time")
        _serve(serve_specs, entries, path, write, as_json)
        return
    if write or bench_files:
        if not (write and bench_files):
            raise click.UsageError("--write and --from go together: the reports to write the table from")
        from ..eval.dispatch_table import bench_entries, dropped_elsewhere, entries_summary, merge, read_reports
        try:
            reports = read_reports(bench_files)
            new = bench_entries(reports)
        except (KeyError, ValueError, TypeError, json.JSONDecodeError) as exc:
            raise click.BadParameter(f"not an `attngen bench --json` or `attngen sweep --json` report: {exc}",
                                     param_hint="--from")
        where = Path(specs_dir or SPECS_DIR)
        from ..core.spec_cells import names_spec
        missing = sorted({n for e in new for n in (e.spec, e.runner_up) if n and not names_spec(where, n)})
        if missing:
            raise click.UsageError(f"the reports name specs that are not in {where}/: {', '.join(missing)}; commit "
                                   f"them first (`attngen sweep ... --write-best {where}` writes a sweep's winners)")
        merged = merge(entries, new)
        _write_table(path, merged)
        click.echo(json.dumps([e._asdict() for e in new], indent=2) if as_json else
                   f"wrote {path}: {entries_summary(new)} from {len(bench_files)} report(s)")
        dropped = dropped_elsewhere(entries, merged, {cited for cited, _ in reports})
        if dropped:
            click.echo(f"attngen dispatch: warning: {sum(dropped.values())} entries measured by other reports were "
                       "replaced (a report rewrites every entry of its keys): "
                       + ", ".join(f"{n} of {src}" for src, n in sorted(dropped.items()))
                       + "; to keep them, give those reports with --from too", err=True)
        return
    if window_keys is not None and not window:
        raise click.BadParameter("the width of a window call: give --window with it", param_hint="--window-keys")
    mask = "window" if window else "causal" if causal else "none"
    head_dim_v = 0 if head_dim_v == head_dim else head_dim_v
    if page_size & (page_size - 1):
        raise click.BadParameter(f"a page size is a power of two from 1 to {MAX_PAGE_SIZE} (got {page_size})",
                                 param_hint="--page-size")
    paged = page_size > 0
    asked, asked_scores = head_dim, scores
    joined = ""
    from ..eval.dispatch_table import JOINS_SINKS
    if call in JOINS_SINKS and sinks_apart(entries, call, arch, dtype, head_dim, head_dim_v, mask, scores,
                                           paged if table_call(call).paged else None):
        # as the entry points run it: the kernel of the other modifiers, the sinks joined after it
        scores = "+".join(n for n in scores.split("+") if n != "sink")
        joined = " (learned sinks joined after it: no kernel of these modifiers takes them)"
    # as the entry points ask: a head dim whose kernels lack this mask or these score modifiers runs
    # padded at one that has them (the packed varlen call keys paged false, as a decode call its cache)
    pair = padded_dims(entries, call, arch, dtype, head_dim, head_dim_v, mask, scores,
                       paged if table_call(call).paged else None)
    asked_v = head_dim_v
    if pair:        # the call runs at served head dims, q, k and v zero-padded (docs/dispatch.md)
        head_dim, head_dim_v = pair[0], (pair[1] if pair[1] != pair[0] else 0)
    padded = pair[0] if pair else 0
    padding = f" ({padding_text(asked, asked_v or asked, pair)})" if pair else ""
    try:
        e = select(entries, call, arch, dtype, head_dim, mask, seqlen, paged=paged, group_rows=group_rows,
                   head_dim_v=head_dim_v, scores=scores, rows=rows, window=window_keys, page=page_size or None)
    except LookupError as exc:
        raise click.UsageError(str(exc) + (f"\n(head_dim {asked} is served padded{padding})" if pair else "")) \
            from None
    others = candidates(entries, call, arch, dtype, head_dim, mask, paged, head_dim_v, scores)
    launch = ("" if table_call(call).varlen else   # varlen functions have no twin
              awaiting_twin_text(Path(specs_dir or SPECS_DIR) / f"{e.spec}.yaml", mask, seqlen, rows))
    # as ops.library runs it: forward_variant (score modifiers or a window) takes the route at the call's own head dim
    # where the decode table serves it there, before padding; forward() pads first. (`pair` is the padding of the
    # call without sinks where they are joined apart; the library asks with them, and takes the route in the
    # sink-free call it makes then. No sm_90 forward call joins sinks apart today, so the two agree.)
    own_dim = bool(pair) and bool(asked_scores or mask == "window")
    one_row = (own_dim and one_row_text(entries, call, arch, dtype, asked, asked_v, mask, asked_scores, seqlen,
                                        forward_pads=True)) \
        or one_row_text(entries, call, arch, dtype, head_dim, head_dim_v, mask, asked_scores, seqlen)
    if as_json:
        click.echo(json.dumps({"spec": e.spec, "entry": e._asdict(), "bucket": [o._asdict() for o in others],
                               "launch": launch or None,
                               "sinks_joined_after": bool(joined),
                               "padded_head_dim": padded or None,
                               "padded_head_dim_v": (pair[1] if pair and asked_v and asked_v != asked else None),
                               "one_query_row": one_row or None},
                              indent=2))
        return
    click.echo(f"{call_text(call, arch, dtype, asked, mask, seqlen, page_size, group_rows, asked_v, asked_scores)}"
               f"{f' window {window_keys} keys' if window_keys else ''}{f' rows {rows}' if rows else ''} -> {e.spec}"
               + padding + joined)
    click.echo(f"  why: {e.why}")
    if launch:
        click.echo(f"  launch: {launch}")
    if one_row:
        click.echo(f"  few query rows: {one_row}")
    click.echo(f"  buckets of this key ({path}):")
    for o in others:
        limit = f"<= {o.upto}" if o.upto is not None else "longer"
        group = f", group rows <= {o.max_group_rows}" if o.max_group_rows else ""
        width = f", window <= {o.max_window} keys" if o.max_window else ""
        grid = f", rows >= {o.min_rows}" if o.min_rows else ""
        pages = f", pages >= {o.min_page}" if o.min_page else ""
        click.echo(f"    seqlen {limit:<8}{group}{width}{grid}{pages}: {o.why}{'   <- chosen' if o is e else ''}")



def _write_table(path, entries) -> None:
    """The table at `path` rewritten with `entries`, under its own header comment."""
    from .. import fsutil
    from ..ops.table import dump_table
    header = "".join(line[2:] + "\n" if line.startswith("# ") else "\n"
                     for line in path.read_text().splitlines() if line.startswith("#"))
    fsutil.atomic_write_text(path, dump_table(entries, header.rstrip("\n")))


def _serve(spec_files, entries, path, write: bool, as_json: bool) -> None:
    """dispatch --serve: the entries the specs' cells serve that the table lacks (eval.dispatch_table.
    serving_entries), printed, and written into the table with --write."""
    from ..eval.dispatch_table import entries_summary, merge, serving_entries
    from ..ops.table import key_text
    from ..plan import make_plan
    from ..spec import load_spec
    from .spec_files import spec_files as cells_of
    plans = [make_plan(load_spec(cell), file=str(cell)) for cell in cells_of(tuple(spec_files), "")]
    new = serving_entries(plans, entries)
    if write and new:
        _write_table(path, merge(entries, new))
    if as_json:
        click.echo(json.dumps([e._asdict() for e in new], indent=2))
        return
    for e in new:           # each key as a miss names it
        click.echo(f"  {e.call} {key_text(e.call, e.arch, e.dtype, e.head_dim, e.mask, e.paged, e.head_dim_v, e.scores)}"
                   f" -> {e.spec}")
    what = f"{entries_summary(new)}" if new else "no entries: the table has every key these specs serve"
    click.echo(f"wrote {path}: {what} (unmeasured)" if write and new else
               f"{what}{' (unmeasured; --write adds them)' if new else ''}")


COVERAGE_MARK = {"served": "Y", "padded": "p", "window": "w", "sinks after": "s", "refused": "."}


def _coverage(entries, arch: str, dtype: str, path, as_json: bool) -> None:
    """dispatch --coverage: eval.dispatch_table.coverage as a table (or JSON)."""
    from ..eval.dispatch_table import COVERAGE_HEAD_DIMS, coverage
    rows = coverage(entries, arch, dtype)
    if as_json:
        click.echo(json.dumps({"arch": arch, "dtype": dtype, "rows": rows}, indent=2))
        return
    click.echo(f"{path}: {arch} {dtype}, V of q's head dim (Y: a kernel of that head dim; p: padded to the next "
               f"served one; w: the window function, with a window wider than every sequence; s: the kernel "
               f"without the sinks, the sinks joined after it; .: refused)")
    click.echo(f"{'call':<21}{'scores':<20}{'mask':<8}" + "".join(f"{d:>5}" for d in COVERAGE_HEAD_DIMS))
    for r in rows:
        call = r["call"] + (" paged" if r["paged"] else "")
        click.echo(f"{call:<21}{r['scores'] or '-':<20}{r['mask']:<8}"
                   + "".join(f"{COVERAGE_MARK[r['head_dims'][d]]:>5}" for d in COVERAGE_HEAD_DIMS))
    click.echo("Learned sinks train through the backward of their mask (no backward entry of their own).")


def one_row_text(entries, call: str, arch: str, dtype: str, head_dim: int, head_dim_v: int, mask: str, scores: str,
                 seqlen: int, forward_pads: bool = False) -> str:
    """What attngen.attention does instead for a forward call of a few query rows (ops.library, OneRowDecode: no
    mask, or causal aligned bottom-right; no input that requires a gradient; one row with the variants its table call
    names, from its work threshold on), where the decode table serves the head dim the call runs at (its own, or the
    one the forward pads it to), with the call's variants: the command that shows its kernel; "" for any other call.
    `forward_pads`: the forward would run the call padded (head_dim is the call's own), so the route takes a variant
    call whatever its work, as ops.library's _route_takes."""
    from ..core.calls import table_call
    from ..ops.table import serves_joining_sinks
    taken = table_call(call)
    instead = taken.one_row_call
    variants = [name for name in scores.split("+") if name] + (["window"] if mask == "window" else [])
    decode_mask = "window" if mask == "window" else "none"   # one row aligned bottom-right sees every key causal gives
    # as ops.library's _decode_serves: the sinks may be joined after the decode kernel of the other modifiers
    if not instead or head_dim_v or not set(variants) <= set(taken.one_row_variants) or not serves_joining_sinks(
            entries, instead, arch, dtype, head_dim, 0, decode_mask, scores):
        return ""
    if variants and forward_pads:
        where = f"one query row with {'+'.join(variants)}, whatever its work (the forward would pad the call)"
    elif variants:
        where = (f"one query row with {'+'.join(variants)} where batch x query heads x the keys it sees reach "
                 f"{taken.one_row_variant_min_work:,}")
    else:
        where = f"up to {taken.one_row_max_rows} query rows per head, no mask or causal"
    return (f"attngen.attention runs the {instead} call on the whole cache instead for {where}, aligned bottom-right "
            f"(each row sees the keys up to its own position), and no input requiring a gradient: attngen dispatch "
            f"--call {instead} --dtype {dtype} --head-dim {head_dim} --seqlen {seqlen} --group-rows HEADS/KV_HEADS x "
            f"ROWS --rows BATCHxHEADSxROWS" + (f" --scores {scores}" if scores else "")
            + (" --window --window-keys KEYS" if mask == "window" else ""))


def awaiting_twin_text(spec_path: Path, mask: str, seqlen: int, rows: int | None) -> str:
    """How a call of the chosen spec is launched where the spec has an awaiting twin for the mask (only
    forward specs have them; core.launch_rules.launches_awaiting_twin); '' otherwise, or where its
    launch record is not committed and current."""
    from ..core.launch_rules import AWAITING_TWIN_MAX_SCORES, launches_awaiting_twin
    from ..shipped import committed_launch
    found = committed_launch(spec_path)
    twin = found[0].awaiting_entry_functions.get(mask) if found is not None else None
    if twin is None:
        return ""
    causal = mask == "causal"
    text = (f"{twin} (its awaiting twin, a programmatic dependent) where rows x seqlen_k{' / 2' if causal else ''} "
            f"<= {AWAITING_TWIN_MAX_SCORES:,}, else {found[0].entry_functions[mask]}")
    if rows:
        text += ("; this call: the twin" if launches_awaiting_twin(1, 1, rows, seqlen, causal)
                 else "; this call: the usual function")
    return text

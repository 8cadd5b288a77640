"""The dispatch table: which committed spec serves a call, per GPU arch, call convention, dtype,
head dim, mask and sequence-length bucket. It lives in specs/dispatch/table.yaml beside the specs
it names, is written from measurements (`attngen dispatch --from REPORT --write`), and read here with no
torch and no GPU, so `attngen check` can prove that every entry names a spec that exists. Loading
checks every value's type and range: a table the dispatcher could not serve from is refused in one
line, not at a call.

An entry:
    {call: forward, arch: sm_90, dtype: fp16, head_dim: 64, mask: causal, upto: 1024,
     spec: h100_wgmma_d64_n128c1hs2oet, us: 9.5, runner_up: h100_wgmma_d64_n128c1hs2o,
     runner_up_us: 9.7, measured: "docs/hopper-h200/round3/grid_fp16.json 1x8x512x64"}
`upto`: the largest seqlen_k (forward; varlen and varlen_backward: max_seqlen_k; backward: seqlen_q, whose
query blocks a block of keys walks; decode: cache capacity) the entry serves; null for no limit. `min_rows`: the
fewest query rows (batch x heads x seqlen_q) of a call the entry serves, where a bucket's winner depends on the
grid's size (a persistent spec loses on grids with fewer query blocks than SMs; a decode cell whose last block
merges the slices wins back large grids of many query rows per KV head): of a bucket's entries, a call takes the
one with the largest min_rows it reaches. An entry without `us` is unmeasured (chosen from its spec's target).
Decode and varlen entries also key on `paged` (true: a paged cache through a block table, of any page
size the spec's kernel reads; left out: contiguous caches or packed varlen K/V) and may set `max_group_rows`: the
most query rows per KV head (heads / kv_heads x seqlen_q) they serve. A paged entry may set `min_page`: the
smallest page size it serves, where a bucket's winner depends on the pages (a kernel that copies a page's rows at
a time loses on small pages); of a bucket's entries a paged call takes the one with the largest min_page its page
size reaches (then min_rows as above). A window entry may set `max_window`: the
widest window it serves, in keys a query row may see (left + 1 + right, a causal call's right 0), where a
narrow window's winner differs from a wide one's. Entries for a spec with score
modifiers key on them too: `scores: softcap`, `alibi`, `softcap+alibi`, `sink` (the spec's `scores`, joined).
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import operator
import os
import re
from pathlib import Path
from typing import NamedTuple

from .. import fsutil
from ..core.calls import CALLS as CONVENTIONS, TABLE_CALLS, table_call
from ..core.launch_rules import MAX_PAGE_SIZE, page_shift
from ..errors import AttngenError, SpecError

# The calls the table serves and what serves each, from the one list of call conventions
# (core.calls): a call's convention is the one a spec's kind must have to serve it (a varlen call
# is the varlen function of a forward-convention kernel; backward serves the gradients of a forward
# call, varlen_backward those of a varlen call: the varlen functions of a backward-convention kernel).
CALLS = tuple(t.name for t in TABLE_CALLS)
CONVENTION = {t.name: call.name for call in CONVENTIONS for t in call.table}
# The output type of each call where the table fixes it: attngen.attention_fp8 returns bf16 (as
# FlashAttention-3's fp8 forward), so torch.compile knows its output without loading a kernel.
OUT_DTYPE = {t.name: call.out_dtype for call in CONVENTIONS for t in call.table if call.out_dtype}
VARLEN_CALLS = tuple(t.name for t in TABLE_CALLS if t.varlen)   # calls served by a spec's varlen functions
TABLE_FILE = Path("dispatch") / "table.yaml"     # under the specs folder


class Entry(NamedTuple):
    # A NamedTuple, not a frozen dataclass: a first call defines this class (core.frozen says why).
    call: str
    arch: str
    dtype: str
    head_dim: int
    mask: str
    spec: str
    upto: int | None = None
    paged: bool = False                 # decode: a paged cache (any page size), not a contiguous one
    max_group_rows: int | None = None
    min_rows: int | None = None
    us: float | None = None
    runner_up: str | None = None
    runner_up_us: float | None = None
    measured: str | None = None
    head_dim_v: int = 0                 # V's and O's head dim where it differs from head_dim (0: the same)
    scores: str = ""                    # the spec's score modifiers joined by "+" ("": none)
    max_window: int | None = None       # window entries: the widest window served, in keys a query row may see
                                        # (left + 1 + right; a causal call's right is 0); null: every window
    min_page: int | None = None         # paged entries: the smallest page size served (a power of two); null: any

    @property
    def why(self) -> str:
        if self.us is None:
            return f"{self.spec}: unmeasured (the spec's target GPU class)"
        runner_us = f" {self.runner_up_us:.1f} us" if self.runner_up_us is not None else ""
        runner = f", runner-up {self.runner_up}{runner_us}" if self.runner_up else ""
        return f"{self.spec}: {self.us:.1f} us measured ({self.measured}){runner}"

    def key(self) -> tuple:
        return _KEY_FIELDS(self)


# An entry's key (what a call looks up) and its bucket (the key and where in it the entry sits), by field
# name once: itemgetters over the entry's fields, which a first call's checks of 800 entries map in C.
KEY_FIELDS = ("call", "arch", "dtype", "head_dim", "mask", "paged", "head_dim_v", "scores")
_KEY_FIELDS = operator.itemgetter(*map(Entry._fields.index, KEY_FIELDS))
_BUCKET_FIELDS = operator.itemgetter(*map(Entry._fields.index, KEY_FIELDS + ("upto", "max_group_rows", "max_window",
                                                                            "min_rows", "min_page")))
_SPEC_FIELD = operator.itemgetter(Entry._fields.index("spec"))


def table_path(specs_dir) -> Path:
    return Path(specs_dir) / TABLE_FILE


def load_table(path) -> tuple[Entry, ...]:
    """Every entry of the table at `path`. A table that is missing, not a small regular file, not
    YAML, nested too deep, or holds a key, value or entry that the dispatcher cannot take (see
    entry_problem_of) is one SpecError naming the file, the entry, its line and the fix.

    The file is read every time, but text parsed once is not parsed again: its entries are kept for
    the process and in the user's cache (see "the prepared table" below), keyed by its sha256."""
    path = Path(path)
    text = read_table_text(path)
    key = memo_key(text)
    entries = _PARSED.get(key)
    if entries is None:
        entries = read_memo(key) or read_memo(key, prepared_path(key))
        if entries is None:
            entries = parse_table(text, str(path))
            write_memo(key, entries)
        if len(_PARSED) >= PARSED_ENTRIES:
            _PARSED.clear()
        _PARSED[key] = entries
    return entries


def parse_table(text: str, file: str) -> tuple[Entry, ...]:
    """The entries of table text (as load_table; `file` names it in errors)."""
    data, node = _compose(text, file)
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise SpecError("a dispatch table is a mapping with a list under `entries`", file=file, key="entries",
                        line=_line(node, ("entries",)))
    extra = [k for k in data if k != "entries"]
    if extra:
        raise SpecError(f"unknown top-level key {_key_shown(extra[0])}; a dispatch table holds only `entries`",
                        file=file, line=_line(node, (extra[0],)), hint="remove it")
    out = []
    for i, raw in enumerate(data["entries"]):
        where, line = f"entries[{i}]", _line(node, ("entries", i))
        if not isinstance(raw, dict):
            raise SpecError("each entry is a mapping", file=file, key=where, line=line,
                            hint="write it as {call: ..., arch: ..., dtype: ..., head_dim: ..., mask: ..., spec: ...}")
        unknown = set(raw) - FIELDS
        if unknown:
            raise SpecError(f"unknown key(s) {', '.join(sorted(map(_key_shown, unknown)))}; keys are "
                            f"{', '.join(sorted(FIELDS))} (a value with a comma in a flow mapping needs quotes)",
                            file=file, key=where, line=line)
        found = entry_problem_of(raw)
        if found:
            field, problem, fix = found
            raise SpecError(problem, file=file, key=f"{where}.{field}" if field else where, hint=fix,
                            line=_line(node, ("entries", i, field)) if field else line)
        out.append(Entry(**raw))
    clash = duplicate_bucket(out)
    if clash:
        first, second = clash
        raise SpecError(f"serves the same calls as entries[{first}] (line {_line(node, ('entries', first))}) but "
                        f"names spec {out[second].spec}, not {out[first].spec}", file=file, key=f"entries[{second}]",
                        line=_line(node, ("entries", second)),
                        hint="keep the one measured faster; a bucket (key, upto, max_group_rows, max_window, min_rows, "
                             "min_page) names one spec")
    return tuple(out)


# -- reading the table's file ----------------------------------------------------------------

# The committed table is under 100 KiB: 8 MiB leaves it room to grow and refuses a file no one reviews.
MAX_TABLE_BYTES = 8 * 1024 * 1024
# A table nests four levels (document, entries, entry, value); deeper is not a table.
MAX_TABLE_DEPTH = 8
TOO_LARGE = f"is over {MAX_TABLE_BYTES // (1024 * 1024)} MiB, not a dispatch table"


def read_table_text(path: Path) -> str:
    """The text of the table: only a regular file of at most MAX_TABLE_BYTES of UTF-8; a link is followed
    (a project may keep its table elsewhere), a FIFO or device refused without being opened."""
    name = str(path)
    try:
        data = fsutil.read_regular(name, MAX_TABLE_BYTES, follow=True)
    except FileNotFoundError:
        raise SpecError("there is no dispatch table", file=name, hint=MISSING_FIX.format(path=name)) from None
    except fsutil.NotRegular:
        raise SpecError("is not a regular file; the dispatch table is a YAML file", file=name,
                        hint=MISSING_FIX.format(path=name)) from None
    except fsutil.TooLarge:
        raise SpecError(TOO_LARGE, file=name) from None
    except (fsutil.ReadRefused, OSError) as exc:
        raise SpecError(f"cannot read the dispatch table: {fsutil.reason(exc)}", file=name) from None
    try:
        return fsutil.utf8_text(data)
    except fsutil.NotUtf8 as exc:
        raise SpecError(str(exc), file=name, line=exc.line, hint="save the file as UTF-8") from None


MISSING_FIX = ("restore it (`git checkout -- {path}`), or start one holding the line `entries: []` and fill it "
               "with `attngen dispatch --from REPORT.json --write`")


def table_expected(specs_dir) -> bool:
    """Whether `attngen check` must find a table in specs_dir: there is a file or link by its name, the folder
    has a dispatch/ folder, or it is the folder attngen.attention serves (whose calls fail without one). A
    folder of specs alone (a test's, a project's own) need not have a table."""
    from ..shipped import shipped
    specs_dir = Path(specs_dir)
    path = table_path(specs_dir)
    return (os.path.lexists(path) or path.parent.is_dir()
            or specs_dir.resolve() == shipped("specs").resolve())


class _Refused(Exception):
    def __init__(self, message: str, line: int | None, hint: str | None = None):
        super().__init__(message)
        self.message, self.line, self.hint = message, line, hint


# Made on first use: the dispatcher imports this module, and a process that never reads the table
# need not import YAML.
@functools.cache
def _table_loader():
    import yaml
    from ..core.specio import SpecLoader

    class TableLoader(SpecLoader):
        """SpecLoader's scalars (plain decimal integers and floats, true/false, null; anything else
        is text, so `.nan`, `0100` and `yes` stay as written and are refused by type) with the
        table's depth bound, and no anchors, aliases or tags: an entry says everything on its line."""

        def compose_node(self, parent, index):
            event = self.peek_event()
            line = event.start_mark.line + 1
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None \
                    or getattr(event, "tag", None) is not None:
                raise _Refused("YAML anchors, aliases and tags are not allowed in the dispatch table", line,
                               "write each entry out in full")
            self._depth += 1
            try:
                if self._depth > MAX_TABLE_DEPTH:
                    raise _Refused(f"nested more than {MAX_TABLE_DEPTH} levels deep; a table nests 4 (document, "
                                   "entries, an entry, its values)", line)
                return yaml.composer.Composer.compose_node(self, parent, index)
            finally:
                self._depth -= 1

    return TableLoader


def _long_integer(node):
    """The first integer scalar with more digits than any table value, found before Python converts it."""
    import yaml
    from ..core.specio import MAX_INT_DIGITS
    if isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    elif isinstance(node, yaml.SequenceNode):
        children = node.value
    else:
        return node if node.tag == "tag:yaml.org,2002:int" and len(node.value.lstrip("+-")) > MAX_INT_DIGITS else None
    return next((found for child in children if (found := _long_integer(child)) is not None), None)


def _compose(text: str, file: str):
    """(data, node tree) of table text; one SpecError for YAML it cannot take."""
    import yaml
    from ..core.specio import duplicate_key
    loader = None
    try:
        loader = _table_loader()(text)
        node = loader.get_single_node()
        long = _long_integer(node) if node is not None else None
        if long is not None:
            raise _Refused(f"integer {long.value[:20]}... has {len(long.value.lstrip('+-'))} digits, more than any "
                           "table value", long.start_mark.line + 1)
        data = loader.construct_document(node) if node is not None else None
    except _Refused as exc:
        raise SpecError(exc.message, file=file, line=exc.line, hint=exc.hint) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = " ".join(str(exc.problem or exc.context or "not YAML").split())
        raise SpecError(f"not valid YAML: {problem}", file=file, line=mark.line + 1 if mark else None,
                        hint="each entry is one flow mapping `- {call: ..., spec: ...}` under `entries:`") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"not valid YAML: {' '.join(str(exc).split())}", file=file) from None
    finally:
        if loader is not None:
            loader.dispose()
    dup = duplicate_key(node) if node is not None else None
    if dup:
        key, line, first = dup
        raise SpecError(f"key given twice (first on line {first}); YAML would keep only the last", file=file,
                        line=line, key=re.sub(r"\.([0-9]+)(?=\.|$)", r"[\1]", key), hint="keep one")
    return data, node


def _line(node, path: tuple) -> int | None:
    from ..core.specio import line_of
    return line_of(node, path)


# -- the prepared table ------------------------------------------------------------------------
#
# Parsing the table's YAML strictly takes a few hundred milliseconds, the bulk of a process's first
# call. Text accepted once is the same entries every time, so the entries are kept, keyed by the
# sha256 of the text and of the code that judged it (this module and the YAML rules it shares with
# specs): per process in _PARSED, and across processes as JSON in the user's cache. The cache is
# writable by anyone who runs as the user, so a memo proves nothing: it is read bounded, and each
# entry goes through the same checks as the YAML's (entry_problem_of, one spec per bucket). A memo
# that fails any of them is ignored and written again from the YAML.
#
# A memo holds each entry as a row, its values in the order of ENTRY_FIELDS (which it names), so
# reading it takes few Python steps per entry: the rows' types and lengths are checked at once,
# each field's values once per distinct value (a table repeats most), and the rows become entries
# as they are.

MEMO_FORMAT = 2
MEMO_FOLDER = "tables"               # under the user cache folder (attngen.fsutil.cache_dir)
PARSED_ENTRIES = 16                  # tables a process keeps (one, unless a test writes others)
_PARSED: dict = {}                   # memo key -> entries
# The YAML rules the table shares with specs (SpecLoader, duplicate keys, suspicious scalars), by
# path: hashing it must not import YAML.
RULES_SHARED = Path(__file__).resolve().parent.parent / "core" / "specio.py"


@functools.cache
def _rules_digest() -> bytes:
    """The sha256 of the code that accepts or refuses a table: a memo written under other rules is not read."""
    h = hashlib.sha256(f"table memo {MEMO_FORMAT}".encode())
    for source in (__file__, RULES_SHARED):
        try:
            h.update(Path(source).read_bytes())
        except OSError:
            h.update(os.urandom(16))   # code that cannot be read cannot vouch for a memo: never matches
    return h.digest()


def memo_key(text: str) -> str:
    """The key of table text: its sha256 together with the rules that judged it."""
    return hashlib.sha256(_rules_digest() + text.encode()).hexdigest()


def memo_path(key: str) -> Path:
    return fsutil.cache_dir() / MEMO_FOLDER / f"{key}.json"


TABLES = "tables"                    # under attngen.shipped.prebuilt_dir(): the shipped table, prepared


def prepared_path(key: str) -> Path:
    """Where a built wheel keeps its table's memo (written by write_prepared when the wheel is built):
    read, and checked, as a memo of the user's cache is, so a process of a fresh install parses no YAML."""
    from ..shipped import prebuilt_dir
    return prebuilt_dir() / TABLES / f"{key}.json"


def write_prepared(table_file, folder) -> None:
    """Parse and check the table at `table_file` and write its memo into `folder` (a wheel's build)."""
    text = read_table_text(Path(table_file))
    key = memo_key(text)
    write_memo(key, parse_table(text, str(table_file)), Path(folder) / f"{key}.json", strict=True)


def read_memo(key: str, path: Path | None = None) -> tuple[Entry, ...] | None:
    """The entries the memo of `key` (at `path`, default its place in the user's cache) holds, each
    checked as a table's entries are; None when there is no memo or it is not one this module wrote
    for that key."""
    try:
        data = fsutil.read_regular(path or memo_path(key), MAX_TABLE_BYTES * 2)
        # No depth check before parsing (1.5 ms of a first call): CPython's decoder raises RecursionError
        # on deep text, caught below, and _checked_entries takes only flat rows of scalars.
        memo = json.loads(fsutil.utf8_text(data))
        if not isinstance(memo, dict) or memo.get("format") != MEMO_FORMAT or memo.get("key") != key \
                or memo.get("fields") != list(ENTRY_FIELDS) or not isinstance(memo.get("entries"), list):
            return None
        return _checked_entries(memo["entries"])
    except (OSError, fsutil.ReadRefused, ValueError, TypeError, RecursionError):
        return None


NUMBER_TYPES = frozenset((int, float, bool))   # the JSON values of different types that can be equal


def _checked_entries(rows: list) -> tuple[Entry, ...] | None:
    """Entries from their rows (values in ENTRY_FIELDS order), when every value is what the table takes
    for its field and no bucket names two specs."""
    if not rows:
        return ()
    if set(map(type, rows)) != {list} or set(map(len, rows)) != {len(ENTRY_FIELDS)}:
        return None
    for name, column in zip(ENTRY_FIELDS, zip(*rows)):
        try:
            if len(NUMBER_TYPES.intersection(map(type, column))) > 1:
                # 1, 1.0 and True are equal, so one set would check one of them: each is checked as itself
                distinct = [value for _type, value in set(zip(map(type, column), column))]
            else:
                distinct = set(column)
        except TypeError:              # unhashable: a list or a mapping, which no field takes
            return None
        if any(value_problem(name, value) is not None for value in distinct):
            return None
    out = tuple(map(Entry._make, rows))
    return None if duplicate_bucket(out) else out


def write_memo(key: str, entries: tuple[Entry, ...], path: Path | None = None, *, strict: bool = False) -> None:
    """Keep parsed entries for later processes (at `path`, default the user's cache); a cache that
    cannot be written only costs the next process a parse (strict: a wheel's build says so)."""
    memo = {"format": MEMO_FORMAT, "key": key, "fields": list(ENTRY_FIELDS), "entries": [list(e) for e in entries]}
    try:
        path = path or memo_path(key)
        fsutil.ensure_dir(path.parent)
        fsutil.atomic_write_text(path, json.dumps(memo, separators=(",", ":")))
    except (OSError, AttngenError):
        if strict:
            raise


# -- what an entry holds ---------------------------------------------------------------------

ENTRY_FIELDS = Entry._fields
FIELDS = set(ENTRY_FIELDS)
REQUIRED = tuple(name for name in ENTRY_FIELDS if name not in Entry._field_defaults)
NULLABLE = {name for name, default in Entry._field_defaults.items() if default is None}
# Integer fields and their least value: a bucket serves seqlen_k from 1; 0 means "none" where allowed.
INTEGERS = {"head_dim": 1, "upto": 1, "max_group_rows": 1, "min_rows": 1, "head_dim_v": 0, "max_window": 1,
            "min_page": 1}
BOOLEANS = ("paged",)
# Far above any call's length or rows (batch x heads x seqlen_q), and exact as a float: a hostile
# number is refused here, not an overflow in the bucketing's square roots.
MAX_INTEGER = 2 ** 48
TIMES = ("us", "runner_up_us")
NAMES = ("spec", "runner_up")
# A spec's name is its file's stem in the specs folder: no folder, no `..`, no leading dot or dash.
SPEC_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
WORDS = {"arch": re.compile(r"sm_[0-9]{2,3}"), "dtype": re.compile(r"[a-z][a-z0-9]{0,15}"),
         "mask": re.compile(r"[a-z][a-z0-9_]{0,31}"),
         "scores": re.compile(r"(?:[a-z][a-z0-9_]{0,31}(?:\+[a-z][a-z0-9_]{0,31}){0,7})?")}
WORD_FIX = {"arch": "an arch is written sm_90, sm_89, ...", "dtype": "fp16, bf16 or e4m3",
            "mask": "none, causal, window or expr", "scores": "the spec's score variants joined by + in their order (softcap, alibi, "
                                                  "softcap+alibi, sink, ...); leave it out for none"}
MAX_MEASURED = 1000


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _key_shown(key) -> str:
    """A key as a message names it: as written when it is a plain word or number, else quoted and cut short."""
    return str(key) if re.fullmatch(r"[A-Za-z0-9_]{1,40}", str(key)) else _shown(key)


def _yaml_note(value) -> tuple[str, str] | None:
    """(what YAML 1.1 or 1.2 would read, the fix) for text that some reader takes for a number or a
    boolean (`0100`, `.nan`, `yes`); None for other values and for quoted plain numbers."""
    from ..core.specio import suspicious_scalar
    if not isinstance(value, str) or re.fullmatch(r"[-+]?(?:0|[1-9][0-9]*)(?:\.[0-9]*)?", value):
        return None
    return suspicious_scalar(value)


def _as_written(value) -> str:
    """How a refused value reads: its repr, and what YAML 1.1 would make of it where that differs."""
    note = _yaml_note(value)
    return _shown(value) + (f", {note[0]}" if note else "")


def _integer_problem(name: str, value) -> tuple[str, str] | None:
    least = INTEGERS[name]
    if type(value) is not int:
        note = _yaml_note(value)
        quoted = isinstance(value, str) and re.fullmatch(r"[-+]?[0-9]+", value)
        fix = note[1] if note else "write the number without quotes" if quoted else "write a plain decimal integer"
        return f"must be an integer >= {least} (got {_as_written(value)})", fix
    if value < least:
        return f"must be an integer >= {least} (got {value})", \
            ("leave `upto` out for no limit" if name == "upto" else f"write an integer of at least {least}")
    if value > MAX_INTEGER:
        return f"is larger than any call's (got {_shown(value)}, over {MAX_INTEGER})", "write the value measured"
    return None


def _time_problem(name: str, value) -> tuple[str, str] | None:
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        return (f"must be a finite number of microseconds >= 0 (got {_as_written(value)})",
                f"write the measured median, or leave `{name}` out for an unmeasured entry")
    return None


def _text_problem(name: str, value) -> tuple[str, str] | None:
    if not isinstance(value, str):
        return f"must be text (got {_shown(value)})", "quote it"
    if name in NAMES:
        if not SPEC_NAME.fullmatch(value) or ".." in value:
            return (f"must be a spec's bare name, the stem of its file in the specs folder (got {_shown(value)})",
                    "name a spec of this folder without a path, `..` or extension")
    elif name == "call":
        if value not in CALLS:
            return f"must be one of {', '.join(CALLS)} (got {_shown(value)})", "use one of those calls"
    elif name in WORDS:
        if not WORDS[name].fullmatch(value):
            return f"is not a valid {name} (got {_shown(value)})", WORD_FIX[name]
    elif len(value) > MAX_MEASURED or not value.isprintable():
        return (f"must be one line of printable text of at most {MAX_MEASURED} characters (got {_shown(value)})",
                "name the report and its cell")
    return None


def value_problem(name: str, value) -> tuple[str, str] | None:
    """(problem, fix) when `value` is not what the table takes for field `name`, else None."""
    if value is None:
        return None if name in NULLABLE else ("is required (got null)", f"give the entry its {name}")
    if name in INTEGERS:
        return _integer_problem(name, value)
    if name in BOOLEANS:
        return None if type(value) is bool else (f"must be true or false (got {_as_written(value)})",
                                                 "write true, or leave the key out for false")
    if name in TIMES:
        return _time_problem(name, value)
    return _text_problem(name, value)


def entry_problem_of(raw: dict) -> tuple[str | None, str, str] | None:
    """(field or None, problem, fix) of the first thing in `raw`, an entry's keys and values, that the
    dispatcher cannot take: a required key missing, or a value of the wrong type or range (int fields
    are integers, not booleans or text; times are finite and not negative; specs are bare names)."""
    missing = [name for name in REQUIRED if name not in raw]
    if missing:
        return None, f"missing key(s) {', '.join(missing)}", f"an entry names its {', '.join(REQUIRED)}"
    for name, value in raw.items():
        found = value_problem(name, value)
        if found:
            return (name, *found)
    if raw.get("max_window") is not None and raw["mask"] != "window":
        return ("max_window", f"max_window bounds a window call's width; this entry's mask is {raw['mask']}",
                "leave max_window out, or make the entry's mask window")
    page = raw.get("min_page")
    if page is not None and not raw.get("paged"):
        return ("min_page", "min_page bounds a paged call's page size; this entry is not paged",
                "leave min_page out, or make the entry paged: true")
    if page is not None and page_shift(page) is None:
        return ("min_page", f"must be a page size, a power of two from 1 to {MAX_PAGE_SIZE} (got {page})",
                "write the smallest page size measured")
    return None


def bucket(e: Entry) -> tuple:
    """The calls an entry serves: its key and where in the key it sits."""
    return _BUCKET_FIELDS(e)


def duplicate_bucket(entries) -> tuple[int, int] | None:
    """(first, second) indexes of two entries of one bucket naming different specs, else None: select
    would take whichever sorts first, so the table would not say which spec serves."""
    # the common answer first, in C (a first call checks 800 entries): as many buckets as (bucket, spec) pairs
    buckets = list(map(_BUCKET_FIELDS, entries))
    if len(set(buckets)) == len(set(zip(buckets, map(_SPEC_FIELD, entries)))):
        return None
    seen: dict = {}
    for i, e in enumerate(entries):
        first = seen.setdefault(bucket(e), i)
        if entries[first].spec != e.spec:
            return first, i
    return None


def check_entry(e: Entry, source: str) -> None:
    """SpecError naming `source` (where the entry came from: a report and its cell) when the table
    would refuse `e` on load, so that `attngen dispatch --write` never writes what `check` refuses."""
    found = entry_problem_of(e._asdict())
    if found:
        field, problem, fix = found
        raise SpecError(f"{problem}; the dispatch table does not take it, so nothing was written",
                        file=_printable(source), key=field, hint=fix)


def _printable(text: str) -> str:
    """`text` when it is one short printable line, else its repr cut short: a message stays one line."""
    return text if isinstance(text, str) and text.isprintable() and len(text) <= 200 else _shown(text)


def dump_table(entries, header: str) -> str:
    """The table's YAML: one flow mapping per entry, sorted by key then upto, so a change to one
    entry is a one-line diff. SpecError when load_table would refuse the text (a bad value, two specs
    for one bucket): what is written always loads."""
    import yaml
    lines = [f"# {line}" if line else "#" for line in header.splitlines()] + ["entries:"]
    order = sorted(entries, key=lambda e: (e.key(), math.inf if e.upto is None else e.upto,
                                           e.max_group_rows or 0, e.max_window or 0, e.min_rows or 0, e.min_page or 0))
    for e in order:
        row = {name: value for name, value in e._asdict().items()
               if value not in (None,) and not (name in ("paged", "head_dim_v", "scores") and not value)}
        text = yaml.safe_dump(row, default_flow_style=True, sort_keys=False, width=10_000).strip()
        lines.append(f"  - {text}")
    text = "\n".join(lines) + "\n"
    parse_table(text, "(the dispatch table to write, not written)")
    return text


def call_text(call: str, arch: str, dtype: str, head_dim: int, mask: str, seqlen: int, page_size: int = 0,
              group_rows: int = 1, head_dim_v: int = 0, scores: str = "") -> str:
    """A call's dispatch key in words (page size, 0 for a contiguous cache, and group rows only for a call
    with a KV cache: decode)."""
    t = table_call(call)
    decode = (f" page_size {page_size}" + ("" if t.varlen else f" group_rows {group_rows}")) if t.paged else ""
    v = f" head_dim_v {head_dim_v}" if head_dim_v else ""
    mods = f" scores {scores}" if scores else ""
    return f"{call} {arch} {dtype} head_dim {head_dim}{v} {mask}{mods} seqlen {seqlen}{decode}"


def scores_key(plan) -> str:
    """A plan's score modifiers as an entry's `scores`."""
    return "+".join(s.name for s in getattr(plan, "score_variants", ()))


def entry_problem(e: Entry, plan) -> str | None:
    """Why the spec whose plan is `plan` cannot serve entry `e`: another call convention, dtype or
    head_dim, no function for the entry's mask (varlen: its varlen function), or contiguous caches
    only for a paged entry; None when it serves it."""
    from ..core.varlen_plan import varlen_key
    if plan.kind.calls != CONVENTION[e.call]:
        return f"{e.spec} is a {plan.kind.calls} spec, not one for {e.call} calls"
    if (plan.spec.dtype, plan.head_dim) != (e.dtype, e.head_dim):
        return f"{e.spec} is {plan.spec.dtype} head_dim {plan.head_dim}, the entry {e.dtype} {e.head_dim}"
    if e.call in OUT_DTYPE and plan.spec.out_dtype != OUT_DTYPE[e.call]:
        return f"{e.spec} writes {plan.spec.out_dtype}, {e.call} calls return {OUT_DTYPE[e.call]}"
    if plan.head_dim_v != e.head_dim_v:
        return f"{e.spec} has head_dim_v {plan.v_dim}, the entry {e.head_dim_v or e.head_dim}"
    if scores_key(plan) != e.scores:
        return f"{e.spec} applies scores [{scores_key(plan)}], the entry [{e.scores}]"
    varlen = e.call in VARLEN_CALLS
    if (varlen_key(e.mask) if varlen else e.mask) not in plan.entry_functions:
        return f"{e.spec} has no {e.mask} {'varlen ' if varlen else ''}function"
    kv_dtype = table_call(e.call).kv_dtype
    if getattr(plan, "kv_dtype", "") != kv_dtype:
        return (f"{e.spec} reads a {plan.kv_dtype or plan.spec.dtype} KV cache, {e.call} calls bring "
                f"{kv_dtype or 'the queries dtype'}")
    if e.paged and not getattr(plan, "paged", False):
        return f"{e.spec} reads contiguous caches only (paged: false), the entry is paged"
    if bool(getattr(plan, "append", False)) != table_call(e.call).appends:
        return (f"{e.spec} appends new tokens (append: true): it serves {e.call} calls only through an entry of a "
                f"call that appends" if getattr(plan, "append", False) else
                f"{e.spec} does not append new tokens; {e.call} calls need a spec with append: true")
    return None


def candidates(entries, call: str, arch: str, dtype: str, head_dim: int, mask: str, paged: bool = False,
               head_dim_v: int = 0, scores: str = "") -> list:
    """The entries of one key, by upto (no limit last), then max_group_rows, max_window (no limit last)
    and min_rows; head_dim_v 0: V's head dim is head_dim."""
    keyed = [e for e in entries if e.key() == (call, arch, dtype, head_dim, mask, paged, head_dim_v, scores)]
    return sorted(keyed, key=lambda e: (math.inf if e.upto is None else e.upto, e.max_group_rows or math.inf,
                                        e.max_window or math.inf, e.min_rows or 0))


NEAREST_SHOWN = 5   # a miss lists this many keys: the whole table is hundreds and buries the fix


def key_text(call: str, arch: str, dtype: str, head_dim: int, mask: str, paged: bool, head_dim_v: int,
              scores: str) -> str:
    """One key of the table as a miss names it (paged or contiguous only where a call has a KV cache: decode)."""
    return (f"{arch} {dtype} head_dim {head_dim}" + (f" head_dim_v {head_dim_v}" if head_dim_v else "")
            + f" mask {mask}" + (f" scores {scores}" if scores else "")
            + ((" paged" if paged else " contiguous") if table_call(call).paged else ""))


def nearest_keys(entries, call: str, arch: str, dtype: str, head_dim: int, mask: str, paged: bool = False,
                 head_dim_v: int = 0, scores: str = "") -> list[str]:
    """The keys of the call's entries, nearest the wanted one first: the same arch, then the same
    dtype, then the closest head dim, then the same V head dim, mask, scores and cache (paged or not)."""
    def distance(e):
        return (e.arch != arch, e.dtype != dtype, abs(e.head_dim - head_dim), e.head_dim,
                e.head_dim_v != head_dim_v, e.mask != mask, e.scores != scores, e.paged != paged)
    nearest: dict[str, tuple] = {}
    for e in entries:
        if e.call == call:
            text = key_text(call, e.arch, e.dtype, e.head_dim, e.mask, e.paged, e.head_dim_v, e.scores)
            nearest[text] = min(nearest.get(text, distance(e)), distance(e))
    return sorted(nearest, key=lambda text: (nearest[text], text))


def miss_message(entries, call: str, arch: str, dtype: str, head_dim: int, mask: str, paged: bool = False,
                 head_dim_v: int = 0, scores: str = "") -> str:
    """Why a call has no kernel, in a few lines: the key, the table's nearest keys and a count of
    the rest, and how to add the missing one."""
    keys = nearest_keys(entries, call, arch, dtype, head_dim, mask, paged, head_dim_v, scores)
    shown = keys[:NEAREST_SHOWN]
    lines = [f"attngen has no {call} kernel for "
             f"{key_text(call, arch, dtype, head_dim, mask, paged, head_dim_v, scores)}."]
    if shown:
        lines.append(f"The dispatch table's nearest {call} entries ({len(shown)} of {len(keys)}):")
        lines += [f"  {text}" for text in shown]
        if len(keys) > len(shown):
            lines.append(f"  and {len(keys) - len(shown)} more in the dispatch table")
    else:
        lines.append(f"The dispatch table has no {call} entries.")
    lines.append(f"Add one: write a spec for it (`attngen explain SPEC` checks it; `attngen sweep SPEC --shapes "
                 f"1x16x2048x{head_dim}` finds faster variants), time it on that GPU with `attngen bench SPEC --json "
                 f"REPORT.json`, then `attngen dispatch --from REPORT.json --write`.")
    return "\n".join(lines)


# A varlen backward call without a window (mask none or causal) whose score modifiers the table's
# varlen backward serves only under a window runs that window function with a window wider than every
# sequence, which hides no key the mask shows (ops.library.varlen_backward_mask; at d160-d256, non-causal
# ALiBi's own deterministic function spills). dispatch --coverage reports such a cell as the window's.
WINDOW_STANDS_IN = ("varlen_backward",)


def window_stands_in(call: str, mask: str, scores: str) -> bool:
    """Whether a `call` of `mask` and `scores` may run its window function when its own mask has none."""
    return call in WINDOW_STANDS_IN and bool(scores) and mask in ("none", "causal")


def padded_dims(entries, call: str, arch: str, dtype: str, head_dim: int, head_dim_v: int = 0,
                mask: str | None = None, scores: str = "", paged: bool | None = None) -> tuple[int, int] | None:
    """(q and k's head dim, V's head dim) a call runs at where the table serves no kernel of its own on
    `arch` in `dtype`: q and k zero-padded to the first, v to the second (attngen.ops.library), which
    changes no score and gives zero output columns past V's. None where the call's own head dims are
    served or nothing above them is. A call whose V has q's head dim (head_dim_v 0 or head_dim) takes
    the smallest single head dim above it; one whose V differs takes the served pair at or above both
    that costs the fewest columns: an entry with a V head dim of its own (96/64 at 128/64) or one head
    dim for all three (256/128 at 256). With `mask` (and `scores`, `paged` where not None) "served"
    means an entry of that mask and those score modifiers: a window or softcap call at a head dim whose
    kernels have no such variant runs padded at one that has it; without, any entry of the call."""
    v = head_dim_v or head_dim
    served = _served_dims(entries, call, arch, dtype, mask, scores, paged)
    if (head_dim, v) in served:
        return None
    if v == head_dim:    # q's head dim for V too: one head dim for all three, as before pairs were padded
        above = [(d, dv) for d, dv in served if d == dv and d > head_dim]
    else:
        above = [(d, dv) for d, dv in served if d >= head_dim and dv >= v]
    return min(above, key=lambda pair: (pair[0] + pair[1], pair)) if above else None


def _served_dims(entries, call: str, arch: str, dtype: str, mask: str | None, scores: str,
                 paged: bool | None) -> set[tuple[int, int]]:
    """The (head dim, V's head dim) pairs the table serves a call of `mask` and `scores` at (any mask
    and modifiers where mask is None; paged or not where paged is None)."""
    return {(e.head_dim, e.head_dim_v or e.head_dim) for e in entries
            if e.call == call and e.arch == arch and e.dtype == dtype
            and (mask is None or (e.mask == mask and e.scores == scores))
            and (paged is None or e.paged == paged)}


def sinks_apart(entries, call: str, arch: str, dtype: str, head_dim: int, head_dim_v: int, mask: str, scores: str,
                paged: bool | None = None) -> bool:
    """Whether a call with learned sinks runs without them and takes them after (ops.library.join_sinks):
    the table serves its score modifiers with the sinks at no head dim at or above the call's (its own
    or padded), and without them it does. A sink is a key with no value, so it changes only the rows'
    denominators: a kernel of the other modifiers and one rescale of its output give the same result."""
    names = scores.split("+")
    if "sink" not in names:
        return False
    without = "+".join(n for n in names if n != "sink")

    def served(modifiers: str) -> bool:
        pairs = _served_dims(entries, call, arch, dtype, mask, modifiers, paged)
        return ((head_dim, head_dim_v or head_dim) in pairs
                or padded_dims(entries, call, arch, dtype, head_dim, head_dim_v, mask, modifiers, paged) is not None)

    return not served(scores) and served(without)


def serves_joining_sinks(entries, call: str, arch: str, dtype: str, head_dim: int, head_dim_v: int, mask: str,
                         scores: str, paged: bool = False) -> bool:
    """Whether the table runs a call of these score modifiers at this head dim itself: an entry of them, or, for
    learned sinks no entry of the others holds, one of the others with the sinks joined after it (sinks_apart)."""
    if candidates(entries, call, arch, dtype, head_dim, mask, paged, head_dim_v, scores):
        return True
    names = scores.split("+")
    return ("sink" in names and sinks_apart(entries, call, arch, dtype, head_dim, head_dim_v, mask, scores, paged)
            and bool(candidates(entries, call, arch, dtype, head_dim, mask, paged, head_dim_v,
                                "+".join(n for n in names if n != "sink"))))


def padded_head_dim(entries, call: str, arch: str, dtype: str, head_dim: int, head_dim_v: int = 0,
                    mask: str | None = None, scores: str = "", paged: bool | None = None) -> int:
    """padded_dims's one head dim for a call whose V has q's head dim: the smallest served head dim above
    it (q, k and v zero-padded to it), or 0 where it is served itself, V's head dim differs (see
    padded_dims) or nothing above it is served."""
    if head_dim_v and head_dim_v != head_dim:
        return 0
    pair = padded_dims(entries, call, arch, dtype, head_dim, head_dim_v, mask, scores, paged)
    return pair[0] if pair else 0


def select(entries, call: str, arch: str, dtype: str, head_dim: int, mask: str, seqlen: int, *,
           paged: bool = False, group_rows: int = 1, head_dim_v: int = 0, scores: str = "",
           rows: int | None = None, window: int | None = None, page: int | None = None) -> Entry:
    """The entry serving a call: among its key's entries, the first bucket whose upto covers
    `seqlen` (and whose max_group_rows covers `group_rows` and max_window the call's `window`, the
    keys a row's window spans, None for an unbounded side; the last bucket serves longer
    sequences), and of that bucket's entries those of the largest min_page that `page` (a paged call's page
    size; None: the entries without min_page) reaches, and of those the one with the largest min_rows that
    `rows` (the call's batch x heads x seqlen_q; None: the entry without min_rows) reaches.
    LookupError with what exists and how to add the key when the key has no entry."""
    keyed = candidates(entries, call, arch, dtype, head_dim, mask, paged, head_dim_v, scores)
    keyed = [e for e in keyed if e.max_group_rows is None or group_rows <= e.max_group_rows] or keyed
    keyed = [e for e in keyed if e.max_window is None or (window is not None and window <= e.max_window)] or keyed
    if not keyed:
        raise LookupError(miss_message(entries, call, arch, dtype, head_dim, mask, paged, head_dim_v, scores))
    bucket = next((e for e in keyed if e.upto is None or seqlen <= e.upto), keyed[-1])
    same = [e for e in keyed if (e.upto, e.max_group_rows, e.max_window)
            == (bucket.upto, bucket.max_group_rows, bucket.max_window)]
    if any(e.min_page for e in same):
        reached = [e for e in same if (e.min_page or 0) <= (page or 0)] or same
        top = max(e.min_page or 0 for e in reached) if page else min(e.min_page or 0 for e in reached)
        same = [e for e in reached if (e.min_page or 0) == top]
    return max((e for e in same if (e.min_rows or 0) <= (rows or 0)), key=lambda e: e.min_rows or 0,
               default=min(same, key=lambda e: e.min_rows or 0))


__all__ = ["CALLS", "CONVENTION", "OUT_DTYPE", "Entry", "call_text", "scores_key", "entry_problem", "TABLE_FILE",
           "candidates", "check_entry", "dump_table", "entry_problem_of", "load_table", "miss_message",
           "key_text", "nearest_keys", "padded_dims", "padded_head_dim", "parse_table", "select",
           "table_expected", "table_path"]

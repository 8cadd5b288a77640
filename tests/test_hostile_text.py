"""Spec text never becomes code.

Text a spec supplies (its description, its expressions as written, its param names, the spec itself
echoed in the header) reaches a generated file only as comment text, through
attngen/core/comment_text.py; expressions reach code only as the compiler's output from their parse
tree. These tests tokenize generated files as a C preprocessor does and check:

- every committed generated file: its only directives are the templates' own, no line splices;
- every string of a spec of every kind, carrying every line separator and payload an attacker
  would try (#define, #include, */, a trailing backslash, bidi overrides): refused in one line, or
  rendered to exactly the code of the spec without it;
- param names are identifiers a compiler reads as nothing else; expressions are bounded in size
  and depth before any recursive pass, and what a spec can ask for is answered within seconds.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from attngen.cli import main
from attngen.core.comment_text import comment_line, comment_lines
from attngen.core.expressions import (MAX_DEPTH, MAX_NODES, ExpressionError, param_name_problem, parse)
from attngen.errors import SpecError
from attngen.plan import make_plan
from attngen.render import render_parts
from attngen.spec import parse_spec
from spec_sample import sampled, spec_text

ROOT = Path(__file__).resolve().parents[1]
SECONDS = 10.0

# One spec per kind, each with the string fields that kind takes (expressions where it has them).
BASES = {
    "fwd_scalar": "phase4.yaml",
    "fwd_wmma": "phase5_wmma.yaml",
    "fwd_mma": "lab/h100_mma_d128_expr_window.yaml",
    "fwd_wgmma": "lab/h100_wgmma_d128_expr_window.yaml",
    "fwd_wgmma_score": "lab/h100_wgmma_d128_expr_softcap.yaml",
    "fwd_wgmma_e4m3": "h100_wgmma_d128_fp8.yaml",
    "fwd_mma_e4m3": "l4_mma_d64_fp8.yaml",
    "decode_mma": "lab/h200_decode_d128_expr_prefix_lm.yaml",
    "bwd_mma": "lab/h100_bwd_d128_expr_softcap_alibi.yaml",
    "bwd_wgmma": "lab/h100_bwd_d64_wgmma_expr_window.yaml",
}

# Every line break Python's str.splitlines() or a C preprocessor knows.
SEPARATORS = ["\n", "\r", "\r\n", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
DIRECTIVES = ["#define __syncthreads() do {} while (0)", "#define exp2f(x) (x)", '#include "/etc/hostname"',
              "#pragma message(\"hostile\")", "#undef __syncthreads"]
PAYLOADS = ([sep + d + sep for sep in SEPARATORS for d in DIRECTIVES[:1]]
            + ["\n" + d + "\n// 1)" for d in DIRECTIVES]
            + [" */ int hostile; /* ", " /* ", " \\", "\\\n#define HOSTILE 1", "x\u202e", "\u200b\u2066",
               "??/\n#define HOSTILE 1", "\t\x00\x07\x1b[31m"])


# -- a C preprocessor's view of a file ---------------------------------------------------------------

def code_of(src: str) -> str:
    """`src` as the compiler sees it after translation phases 2-3: splices joined, comments replaced
    by one space, string and character literals kept. Raises on an unterminated comment."""
    src = src.replace("\\\n", "")
    out, i, n = [], 0, len(src)
    while i < n:
        ch = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
            out.append(" ")
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            assert j >= 0, f"an unterminated /* at {i}"
            i = j + 2
            out.append(" ")
        elif ch in "\"'":
            j = i + 1
            while j < n and src[j] != ch:
                j += 2 if src[j] == "\\" else 1
            out.append(src[i:j + 1])
            i = j + 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def directives(code: str) -> list[str]:
    """The preprocessor directives of comment-free code, whitespace normalised."""
    return [" ".join(ln.split()) for ln in code.split("\n") if ln.strip().startswith("#")]


def template_directive_patterns() -> list[re.Pattern]:
    """The directives the templates write, a binding ({{ ... }}) matching any one word or path."""
    pats = set()
    for path in (ROOT / "templates").rglob("*.j2"):
        for ln in path.read_text().splitlines():
            s = ln.strip()
            if s.startswith("#") and not s.startswith("{#"):
                parts = re.split(r"\{\{.*?\}\}", " ".join(s.split()))
                pats.add("".join(re.escape(p) if k % 2 == 0 else "" for k, p in enumerate(parts))
                         if len(parts) == 1 else r"[\w./]+".join(re.escape(p) for p in parts))
    return [re.compile(p) for p in sorted(pats)]


PATTERNS = template_directive_patterns()


def foreign_directives(src: str) -> list[str]:
    return [d for d in directives(code_of(src)) if not any(p.fullmatch(d) for p in PATTERNS)]


def assert_no_spec_code(src: str, where: str) -> None:
    """Only the templates' directives, no line splice, no character a line split would act on."""
    assert not foreign_directives(src), f"{where}: directives from no template: {foreign_directives(src)}"
    assert "\\\n" not in src, f"{where}: a line splice"
    assert src.splitlines() == src.split("\n")[:-1], f"{where}: a line break other than LF"


# -- the committed files -------------------------------------------------------------------------------

def test_committed_generated_files_hold_only_template_directives():
    files = sorted((ROOT / "generated").glob("*.cu"))
    assert len(files) > 300
    for path in files:
        assert_no_spec_code(path.read_text(), path.name)


def test_the_tokenizer_finds_what_it_must():
    """The checks above can fail: a directive outside a comment, one behind a splice, an unknown one."""
    assert foreign_directives("// a\n#define X 1\n") == ["#define X 1"]
    assert foreign_directives("// a \\\n#define X 1\n") == []            # spliced into the comment
    assert foreign_directives("/* a */ #pragma unroll\n") == []          # a template's own
    assert foreign_directives("int a; /*\n*/\n#include \"/etc/hostname\"\n") == ['#include "/etc/hostname"']
    assert foreign_directives('const char* s = "#define X";\n') == []
    with pytest.raises(AssertionError):
        assert_no_spec_code("// x\x1c#define Y\n", "sample")


# -- comment text ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("payload", PAYLOADS)
def test_comment_line_cannot_end_its_comment(payload):
    line = comment_line("text " + payload)
    src = f"// {line}\nint kept;\n"
    assert code_of(src).split() == ["int", "kept;"], line
    assert_no_spec_code(src, repr(payload))
    assert "/*" not in line and "*/" not in line and not line.rstrip().endswith("\\")


def test_comment_text_is_identity_on_ordinary_text():
    text = "ping-pong wgmma + TMA, 128x128 tiles, 2-stage ring; µ × — \"quoted\" 'x' 50% (a/b)\tend"
    assert comment_line(text) == text
    assert comment_lines("a: 1\n\nb: [2, 3]\n") == ["a: 1", "", "b: [2, 3]"]


def test_comment_text_shows_hidden_characters():
    assert comment_line("x\u202ey") == "x<U+202E>y"
    assert comment_line("a\u2028b") == "a<U+2028>b"
    assert comment_line("end \\") == "end <U+005C>"
    assert comment_line("a */ b /* c ??/") == "a *<U+002F> b /<U+002A> c ?<U+003F>/"


# -- every string of a spec of every kind, with every payload ----------------------------------------------

def string_paths(data, path=()):
    """(path, value) of every string in a spec's data; every dict key counts too, as (path + (key,), None)."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield path + (k,), None
            yield from string_paths(v, path + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from string_paths(v, path + (i,))
    elif isinstance(data, str):
        yield path, data


def with_payload(data, path, value, payload):
    """A copy of `data` with the string at `path` (value None: the dict key at path) carrying payload."""
    data = json.loads(json.dumps(data))
    parent = data
    for k in path[:-1]:
        parent = parent[k]
    if value is None:
        parent[path[-1] + payload] = parent.pop(path[-1])
    else:
        parent[path[-1]] = value + payload
    return data


def render_text(text: str):
    spec = parse_spec(text, file="hostile.yaml")
    return render_parts(make_plan(spec, file="hostile.yaml"), "specs/hostile.yaml", text)


def code_parts(parts) -> list[str]:
    return [" ".join(code_of(p.source).split()) for p in parts]


def answer(text: str):
    """The parts of a render, or the one-line SpecError refusing it (never another exception)."""
    try:
        return render_text(text)
    except SpecError as exc:
        message = str(exc)
        assert "\n" not in message.strip() and "Traceback" not in message, message
        return None


@pytest.mark.parametrize("kind", sampled(sorted(BASES), {"fwd_scalar", "fwd_mma"}.__contains__, sorted(BASES)))   # two by default
def test_every_spec_string_with_every_payload(kind):
    base_text = spec_text(ROOT / "specs" / BASES[kind])
    base = yaml.safe_load(base_text)
    base_code = code_parts(render_text(base_text))
    strings = list(string_paths(base))
    assert any(p[-1] == "description" for p, _ in strings)
    rendered = 0
    for path, value in strings:
        # Free text takes every payload at once (one render covers each); a field that refuses the
        # whole is tried payload by payload.
        for payload in ["".join(PAYLOADS), *PAYLOADS]:
            start = time.monotonic()
            hostile = with_payload(base, path, value, payload)
            parts = answer(yaml.safe_dump(hostile, sort_keys=False, allow_unicode=True, width=10 ** 6))
            assert time.monotonic() - start < SECONDS
            if parts is None:
                continue
            rendered += 1
            for p in parts:
                assert_no_spec_code(p.source, f"{kind} {path} {payload!r}")
            assert code_parts(parts) == base_code, f"{kind}: {path} with {payload!r} changed the code"
            if payload == "".join(PAYLOADS):
                break
    assert rendered >= 1     # the description at least renders with every payload


@pytest.mark.parametrize("kind", ["fwd_wgmma", "decode_mma", "bwd_mma"])
def test_raw_spec_text_in_the_header(kind):
    """The spec file itself, echoed in the header, carrying the payloads in YAML comments and in a
    quoted description: code unchanged, payload only in comments."""
    base_text = spec_text(ROOT / "specs" / BASES[kind])
    base_code = code_parts(render_text(base_text))
    for payload in PAYLOADS:
        if any(c in payload for c in "\x00\x07\x1b\x1c\x1d\x1e\v\f\u200b\u2066\u202e"):
            continue       # characters YAML refuses in a file: the data-level test carries them
        text = base_text.replace("\nschema:", f"\n# {payload.replace(chr(10), chr(10) + '# ')}\nschema:", 1)
        parts = answer(text)
        assert parts is not None, payload
        for p in parts:
            assert_no_spec_code(p.source, f"{kind} header {payload!r}")
        assert code_parts(parts) == base_code


def test_the_reported_injection_is_refused():
    text = spec_text(ROOT / "specs" / BASES["fwd_wgmma"])
    hostile = re.sub(r"mask: .*", 'mask: "(kv_idx <= q_idx + causal_offset\\n#define ATTNGEN_HOSTILE 1\\n'
                                  '#define __syncthreads() do {} while (0)\\n// 1)"', text)
    with pytest.raises(SpecError, match=r"variant.mask.*a comment \(#\) is not in the expression grammar"):
        render_text(hostile)


# -- names -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["x; }; __global__ void f() { asm(\"trap;\"); } struct Z { int y", "int", "this",
                                  "NULL", "__CUDA_ARCH__", "_x", "a b", "1x", "a-b", "x\u202e", "ｑ", "offsetof",
                                  "stdout", "linux", "INFINITY", "M_PI", "cudaStreamDefault", "a__b", "true",
                                  "score", "q_idx", "where", "", "x" * 49])
def test_param_names_that_are_not_plain_identifiers_are_refused(name):
    assert param_name_problem(name)


@pytest.mark.parametrize("name", ["scale", "batch"])
def test_param_names_of_internal_fields_are_refused_in_one_line(name, tmp_path):
    text = spec_text(ROOT / "specs" / BASES["fwd_wgmma"]).replace("{left: int}", f"{{left: int, {name}: int}}")
    path = tmp_path / "s.yaml"
    path.write_text(text)
    res = CliRunner().invoke(main, ["build", "--out", str(tmp_path / "out"), str(path)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert f"variant.params.{name}" in res.output and "Params field" in res.output
    res = CliRunner().invoke(main, ["build", "--json", "--out", str(tmp_path / "out"), str(path)])
    report = json.loads(res.stdout)
    assert res.exit_code == 2 and "Params field" in json.dumps(report)


def test_plain_param_names_pass():
    for name in ("cap", "slope", "left", "prefix", "window_left", "n2", "Nwin", "softcap_value"):
        assert param_name_problem(name) is None, name


@pytest.mark.nvcc
def test_every_macro_of_the_kernel_headers_is_refused_as_a_param_name(tmp_path):
    """The macros nvcc predefines with the headers every kernel includes (prelude.j2)."""
    import shutil
    import subprocess
    nvcc = shutil.which("nvcc")
    src = tmp_path / "m.cu"
    src.write_text("".join(f"#include <{h}>\n" for h in ("cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h", "stddef.h",
                                                         "stdint.h")))
    out = tmp_path / "m.txt"
    subprocess.run([nvcc, "-std=c++17", "-arch=sm_90a", "-E", "-Xcompiler", "-dM", str(src), "-o", str(out)],
                   check=True, capture_output=True)
    names = set(re.findall(r"^#define ([A-Za-z_]\w*)", out.read_text(), re.M))
    assert len(names) > 500
    accepted = sorted(n for n in names if param_name_problem(n) is None)
    assert not accepted, accepted


# -- bounded expressions -------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "+".join(["q_idx"] * 480) + " > 0",                        # a long chain: deep left-nested tree
    " and ".join(f"kv_idx != q_idx + {i}" for i in range(2500)),
    "-" * 3000 + "q_idx > 0",
    "(" * 300 + "q_idx > 0" + ")" * 300,
    "not " * 900 + "q_idx > 0",
    "where(" * 200 + "q_idx > 0" + ", 1 > 0, 0 > 1)" * 200,
    "q_idx" + " < q_idx" * 600,
    "q_idx > 1e39", "q_idx > -1e39",
])
def test_oversized_or_unbounded_expressions_are_refused_fast(text):
    start = time.monotonic()
    with pytest.raises(ExpressionError):
        parse(text, {})
    assert time.monotonic() - start < 1.0


def test_the_largest_accepted_expressions_render_and_explain_within_seconds(tmp_path):
    """At the bounds, every recursive pass (derivative, classifier, explain's samples) finishes."""
    score, n = "score", 0
    while True:      # the deepest nest of the derivative's hardest rules the bounds let through
        deeper = f"cap * tanh(({score}) / cap) + exp2(score / cap) * {n}"
        try:
            parse(deeper, {"cap": "float"}, score=True)
        except ExpressionError:
            break
        score, n = deeper, n + 1
    assert n >= 5
    for kind, key, text in (("bwd_mma", "score", score),
                            ("fwd_wgmma", "mask", " and ".join(f"kv_idx <= q_idx + causal_offset + {i}"
                                                              for i in range(MAX_NODES // 7 - 1)))):
        base = spec_text(ROOT / "specs" / BASES[kind])
        data = yaml.safe_load(base)
        data["variant"][key] = text
        if key == "score":
            data["variant"]["params"] = {"cap": "float"}
            data["variant"]["verify"] = {"cap": [2, 50]}
        path = tmp_path / f"{kind}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        for command in (["explain", str(path)], ["build", "--out", str(tmp_path / "out"), str(path)]):
            start = time.monotonic()
            res = CliRunner().invoke(main, command)
            assert res.exit_code == 0, res.output[-2000:]
            assert time.monotonic() - start < SECONDS, (command, time.monotonic() - start)


def test_a_huge_number_in_the_description_is_free_text(tmp_path):
    from attngen.description import description_drift
    text = spec_text(ROOT / "specs" / "phase4.yaml")
    data = yaml.safe_load(text)
    data["description"] = "9" * 5000 + "x64 tiles, " + "7" * 5000 + "-stage"
    plan = make_plan(parse_spec(yaml.safe_dump(data, width=10 ** 6)))
    drift = description_drift(plan)
    assert drift and all(len(d) < 300 for d in drift)

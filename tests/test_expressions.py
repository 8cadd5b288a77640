"""The score and mask expression language: the grammar and its one-line errors, the torch
reference, the CUDA emitted, and block classification checked point by point."""
from __future__ import annotations

import itertools
import math
import random
import shutil
import subprocess

import pytest

from attngen.core.expressions import (CLASSIFY_HELPERS, CUDA_HELPERS, EMPTY, FULL, PARTIAL, ExpressionError, bounds,
                                      classify, parse, to_cuda, to_cuda_classifier, to_torch, uses_helpers)

PARAMS = {"cap": "float", "window": "int", "bias": "float[heads]"}
WINDOW = "kv_idx <= q_idx + causal_offset and q_idx - kv_idx < window"
SCORE = "cap * tanh(score / cap) + bias[h] * (kv_idx - q_idx)"


def test_the_issue_examples_parse_and_type():
    mask, score = parse(WINDOW, PARAMS), parse(SCORE, PARAMS, score=True)
    assert mask.tree.type == "bool" and mask.tree.op == "and"
    assert score.tree.type == "float"
    assert parse("q_idx - kv_idx", {}, score=True).tree.type == "float"    # an int score is promoted
    assert parse("0 <= q_idx - kv_idx < window", PARAMS).tree.op == "and"  # a chained comparison


@pytest.mark.parametrize("text, score, column, words", [
    ("kv_idx <= q_idx + windw", False, 19, "unknown name 'windw'"),
    ("tanh(score, cap)", True, 1, "tanh takes 1 argument(s), got 2"),
    ("q_idx % 1.5 == 0", False, 9, "a float where an int is needed"),
    ("score > 0", False, 1, "score is known in score expressions only"),
    ("bias[q_idx] > 0", False, 6, "index it with [h]"),
    ("bias > 0", False, 1, "index it with [h]"),
    ("q_idx.real > 0", False, 1, "attribute is not in the expression grammar"),
    ("q_idx ** 2 > 0", False, 1, "binop is not in the expression grammar"),
    ("__import__('os')", True, 12, "\"'\" is not in the expression grammar"),   # strings: refused by character
    ("__import__(os)", True, 1, "unknown function '__import__'"),
    ("q_idx + 1", False, 1, "a mask expression gives a bool (a comparison), this one a int"),
    ("(q_idx < 3) + 1 > 0", False, 2, "a bool where a number is needed"),
    ("q_idx < ", False, None, "not an expression"),     # the column is Python's parser's
    ("where(q_idx, 1, 2) > 0", False, 7, "a int where a bool (a comparison) is needed"),
])
def test_errors_name_the_column_and_the_fix(text, score, column, words):
    with pytest.raises(ExpressionError) as info:
        parse(text, PARAMS, score=score)
    assert column in (None, info.value.column) and words in info.value.message, str(info.value)
    assert "\n" not in str(info.value)


def test_literals_columns_and_depth():
    with pytest.raises(ExpressionError, match="beyond the kernel's 32-bit numbers"):
        parse("q_idx < 3000000000", {})
    with pytest.raises(ExpressionError, match="beyond the kernel's 32-bit numbers"):
        parse("score * 1e400", {}, score=True)
    with pytest.raises(ExpressionError) as info:
        parse("   q_idx < windw", {})
    assert info.value.column == 12            # counted in the text as written, leading spaces too
    with pytest.raises(ExpressionError, match="nested more than 48 levels"):
        parse("1" + "+1" * 1000 + " < q_idx", {})
    with pytest.raises(ExpressionError, match="at most 4096"):
        parse("1" + "+1" * 5000 + " < q_idx", {})


def test_declared_params_are_checked():
    with pytest.raises(ExpressionError, match="has type 'double'"):
        parse("q_idx < 3", {"x": "double"})
    with pytest.raises(ExpressionError, match="shadows a built-in"):
        parse("q_idx < 3", {"h": "int"})


def test_torch_reference():
    torch = pytest.importorskip("torch")
    sq, sk, heads = 37, 53, 3
    q = torch.arange(sq).view(sq, 1)
    k = torch.arange(sk).view(1, sk)
    env = {"q_idx": q, "kv_idx": k, "seqlen_q": sq, "seqlen_k": sk, "causal_offset": sk - sq, "window": 7,
           "cap": 30.0, "bias": torch.tensor([0.5, 0.25, 0.125]), "h": 2, "b": 0}
    mask = to_torch(parse(WINDOW, PARAMS), torch, env)
    want = (k <= q + sk - sq) & (q - k < 7)
    assert torch.equal(mask, want)
    s = torch.randn(sq, sk)
    got = to_torch(parse(SCORE, PARAMS, score=True), torch, {**env, "score": s})
    assert torch.allclose(got, 30.0 * torch.tanh(s / 30.0) + 0.125 * (k - q))
    # floor semantics of % and // on negative numbers, as Python has them
    d = to_torch(parse("(kv_idx - q_idx) // 4 == (kv_idx - q_idx) % 3", {}), torch, env)
    assert all(bool(d[i, j]) == ((j - i) // 4 == (j - i) % 3) for i in range(sq) for j in range(sk))
    z = to_torch(parse("q_idx % kv_idx == q_idx // kv_idx", {}), torch, env)   # x % 0 == x // 0 == 0
    assert bool(z[:, 0].all())


def test_cuda_spelling():
    mask = to_cuda(parse(WINDOW, PARAMS), lambda n: n if n in ("q_idx", "kv_idx") else f"p.{n}",
                   lambda n, by: f"p.{n}[{by}]")
    assert mask == "((kv_idx <= (q_idx + p.causal_offset)) && ((q_idx - kv_idx) < p.window))"
    score = to_cuda(parse(SCORE, PARAMS, score=True), lambda n: n if n != "cap" else "p.cap",
                    lambda n, by: f"p.{n}[{by}]")
    assert score == ("((p.cap * tanhf(static_cast<float>((static_cast<float>(score) * (1.0f / static_cast<float>(p.cap)))))) + "
                     "(p.bias[h] * (kv_idx - q_idx)))")
    mod = parse("q_idx % 3 == 0", {})
    assert to_cuda(mod, str, str) == "(attngen_floor_mod(q_idx, 3) == 0)" and uses_helpers(mod)
    assert "attngen_floor_mod" in CUDA_HELPERS and not uses_helpers(parse(WINDOW, PARAMS))
    # a chain of // grows linearly (helpers, not repeated operands)
    assert len(to_cuda(parse("q_idx" + " // 2" * 20 + " == 0", {}), str, str)) < 600
    assert to_cuda(parse("2.5 * abs(score) + min(q_idx, 3)", {}, score=True), str, str) == \
        "((2.5f * fabsf(score)) + min(q_idx, 3))"


def brute(expr, rows, keys, env) -> set:
    return {bounds(expr, {**env, "q_idx": (i, i), "kv_idx": (j, j)})
            for i in range(rows[0], rows[1] + 1) for j in range(keys[0], keys[1] + 1)}


@pytest.mark.parametrize("text, params, exact", [
    ("kv_idx <= q_idx + causal_offset", {}, True),        # one affine comparison: exact
    (WINDOW, {"window": "int"}, False),
    ("q_idx - kv_idx < window and kv_idx - q_idx < window", {"window": "int"}, False),
    ("not (kv_idx // 16 == q_idx // 16) or kv_idx % 16 < 8", {}, False),
    ("where(q_idx < 40, kv_idx < 20, kv_idx >= 20)", {}, False),
])
def test_classification_is_sound(text, params, exact):
    """EMPTY only where every point is hidden, FULL only where every point is seen (checked point
    by point on random 16 x 16 blocks); one affine comparison is classified exactly, and the
    window mask finds empty and full blocks, not only partial ones."""
    expr = parse(text, params)
    rng = random.Random(0)
    seen = set()
    for _ in range(200):
        env = {"window": rng.choice([0, 1, 15, 16, 17, 100]), "causal_offset": rng.randint(-40, 40),
               "seqlen_q": 64, "seqlen_k": 64, "b": 0, "h": 0}
        r0, c0 = rng.randrange(0, 96, 16), rng.randrange(0, 96, 16)
        rows, keys = (r0, r0 + 15), (c0, c0 + 15)
        got = classify(expr, rows, keys, env)
        points = brute(expr, rows, keys, env)
        assert points <= {True, False} and got in (EMPTY, FULL, PARTIAL)
        if got == EMPTY:
            assert points == {False}, (rows, keys, env)
        elif got == FULL:
            assert points == {True}, (rows, keys, env)
        elif exact:
            assert len(points) == 2, (rows, keys, env)
        seen.add(got)
    if "window" in text:
        assert seen == {EMPTY, FULL, PARTIAL}


@pytest.mark.parametrize("text, rows, keys", [
    # an unbounded // (a divisor that is not a constant) must not turn into NaN and then a number
    ("min(0, ((q_idx - kv_idx) // (kv_idx + 1)) // 2) == 0", (0, 15), (0, 15)),
    # fp32: exp2 overflows at 2^128, and inf - inf is NaN (False) in the kernel
    ("exp2(q_idx / 8.0) - exp2(kv_idx / 8.0) >= 0", (2048, 2111), (1024, 1087)),
    # int32: 49990^2 wraps around in the kernel
    ("(q_idx - kv_idx) * (q_idx - kv_idx) <= 4096", (50000, 50063), (0, 63)),
])
def test_classification_never_decides_what_the_kernel_may_compute_otherwise(text, rows, keys):
    assert classify(parse(text, {}), rows, keys, {}) == PARTIAL


def test_interval_arithmetic_bounds_every_point():
    expr = parse("cap * tanh(score / cap) - abs(kv_idx - q_idx) * bias[h]", PARAMS, score=True)
    env = {"cap": (30.0, 30.0), "bias": (0.0, 0.5), "h": (0, 7), "score": (-100.0, 100.0)}
    lo, hi = bounds(expr, {**env, "q_idx": (0, 15), "kv_idx": (16, 31)})
    for s, i, j, bias in itertools.product((-100.0, 0.0, 100.0), (0, 15), (16, 31), (0.0, 0.5)):
        v = 30.0 * math.tanh(s / 30.0) - abs(j - i) * bias
        assert lo - 1e-9 <= v <= hi + 1e-9


# -- the classifier the kernels run: the same verdicts as `classify`, compiled as C++ ------------------

CLASSIFIER_MASKS = [
    ("kv_idx <= q_idx + causal_offset", {}),
    (WINDOW, {"window": "int"}),
    ("q_idx - kv_idx < window and kv_idx - q_idx < window", {"window": "int"}),
    ("not (kv_idx // 16 == q_idx // 16) or kv_idx % 16 < 8", {}),
    ("where(q_idx < 40, kv_idx < 20, kv_idx >= 20)", {}),
    ("abs(q_idx - kv_idx) * 0.5 <= window / 2 + 1.5", {"window": "int"}),
    ("exp2(q_idx / 8.0) - exp2(kv_idx / 8.0) >= 0", {}),
    ("(q_idx - kv_idx) * (q_idx - kv_idx) <= 4096", {}),
    ("min(0, ((q_idx - kv_idx) // (kv_idx + 1)) // 2) == 0", {}),
    ("tanh(q_idx - kv_idx + 0.0) > -0.5 or max(q_idx, kv_idx) % 7 != 3", {}),
]


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a C++ compiler (g++) to build the classifier")
@pytest.mark.parametrize("text, params", CLASSIFIER_MASKS, ids=range(len(CLASSIFIER_MASKS)))
def test_emitted_classifier_gives_the_same_verdicts(text, params, tmp_path):
    """to_cuda_classifier's C++ (built here as host code) against `classify` on random blocks, small
    and near the 32-bit edges: the kernel skips and unmasks exactly the blocks the reference would."""
    expr = parse(text, params)
    body = to_cuda_classifier(expr, lambda n: f"p.{n}", lambda n, by: f"p.{n}[{by}]")
    src = tmp_path / "c.cpp"
    src.write_text("#include <cmath>\n#include <cstdio>\n#define __host__\n#define __device__\n" + CLASSIFY_HELPERS
                   + "struct P { int window, causal_offset, seqlen_q, seqlen_k, b, h; };\n"
                   + "int classify_block(const P& p, int q_lo, int q_hi, int k_lo, int k_hi) {\n"
                   + body + "\nreturn verdict;\n}\n"
                   + "int main() { P p{}; int a, b, c, d;\n"
                   + "  while (scanf(\"%d %d %d %d %d %d\", &p.window, &p.causal_offset, &a, &b, &c, &d) == 6)\n"
                   + "    printf(\"%d\\n\", classify_block(p, a, b, c, d)); }\n")
    exe = tmp_path / "c"
    subprocess.run(["g++", "-O1", "-std=c++17", "-o", str(exe), str(src)], check=True, capture_output=True)
    rng = random.Random(1)
    cases = []
    for _ in range(400):
        base = rng.choice([0, 0, 1000, 2 ** 31 - 300])
        r0, c0 = base + rng.randrange(0, 160, 16), rng.choice([base, 0]) + rng.randrange(0, 160, 16)
        env = {"window": rng.choice([0, 1, 15, 16, 17, 100]), "causal_offset": rng.randint(-40, 40),
               "seqlen_q": 64, "seqlen_k": 64, "b": 0, "h": 0}
        size = rng.choice([1, 16, 64])
        cases.append((env, (r0, min(r0 + size - 1, 2 ** 31 - 1)), (c0, min(c0 + size - 1, 2 ** 31 - 1))))
    stdin = "".join(f"{e['window']} {e['causal_offset']} {r[0]} {r[1]} {k[0]} {k[1]}\n" for e, r, k in cases)
    out = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, check=True).stdout.split()
    code = {FULL: "1", EMPTY: "0", PARTIAL: "-1"}
    for (env, rows, keys), got in zip(cases, out):
        assert got == code[classify(expr, rows, keys, env)], (text, env, rows, keys)
    assert len(out) == len(cases)


DERIVATIVE_CASES = [
    "cap * tanh(score / cap)",
    "cap * tanh(score / cap) - bias[h] * abs(q_idx + causal_offset - kv_idx)",
    "where(kv_idx <= q_idx, score * 2.0, exp2(score) - 1)",
    "min(score, cap) + max(score * score, 0.5) / (1 + abs(score))",
    "-score / cap + (q_idx % 3) * score",
    "score",
    "3.0",
]


@pytest.mark.parametrize("text", DERIVATIVE_CASES)
def test_derivative_matches_finite_differences(text):
    from attngen.core.expressions import derivative, evaluate
    e = parse(text, {"cap": "float", "bias": "float[heads]"}, score=True)
    de = derivative(e)
    assert de.tree.type == "float"
    import random
    rnd = random.Random(0)
    for _ in range(40):
        env = {"q_idx": rnd.randint(0, 50), "kv_idx": rnd.randint(0, 50), "b": 0, "h": rnd.randint(0, 2),
               "seqlen_q": 51, "seqlen_k": 60, "causal_offset": 9, "cap": rnd.uniform(2, 30),
               "bias": [0.1, 0.2, 0.3], "score": rnd.uniform(-5, 5)}
        step = 1e-6
        hi, lo = (evaluate(e, {**env, "score": env["score"] + d}) for d in (step, -step))
        numeric = (hi - lo) / (2 * step)
        assert evaluate(de, env) == pytest.approx(numeric, rel=1e-4, abs=1e-5), (text, env)
    # the derivative renders like any score expression
    assert to_cuda(de, lambda n: n, lambda n, by: f"{n}[{by}]")


def test_derivative_prunes_what_does_not_depend_on_score():
    from attngen.core.expressions import derivative
    assert to_cuda(derivative(parse("score - bias[h] * abs(q_idx - kv_idx)", {"bias": "float[heads]"}, score=True)),
                   str, str) == "1.0f"
    assert to_cuda(derivative(parse("2.5", {}, score=True)), str, str) == "0.0f"

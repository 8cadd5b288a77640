"""Score and mask expressions (a spec's `variant`: `mask: "..."`, `score: "..."`): a whitelisted
grammar written in Python's expression syntax. The text is parsed with `ast` and every node is
checked against the grammar; no text ever reaches Python's eval. A parsed, type-checked tree has
several readers, so the kernel and its test cannot disagree:

- `to_torch`: the reference, on broadcast index tensors (verify);
- `to_cuda`: one C++ expression for the score or mask hook;
- `bounds`: interval arithmetic over a (query block, key block) pair, which decides whether a mask
  hides every key of the pair (empty: the block is skipped), none (full: no mask applied) or some
  (partial). It is exact on the boundaries of causal and window masks and conservative elsewhere.
- `to_cuda_classifier`: the same interval rules as C++ statements (with CLASSIFY_HELPERS), so a
  kernel classifies each block pair with the call's own values;
- `evaluate`: one point in Python (tests, explain);
- `derivative`: d(score expression)/d(score) as another tree, for a backward kernel.

Grammar: numbers, `+ - * /`, `%` and `//` on ints (floor semantics, as Python and torch have them),
comparisons (chained ones too), `and or not`, `where(c, a, b)`, `tanh exp2 abs min max`, the indices
`b h q_idx kv_idx`, `score` (score expressions only), the per-call lengths `seqlen_q seqlen_k
causal_offset` (= seqlen_k - seqlen_q), and the spec's declared params: scalars (`int`, `float`) or
per-head / per-batch tensors (`float[heads]`, `int[batch]`, ...) indexed by `h` or `b`.
"""
from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from typing import Callable

INT, FLOAT, BOOL = "int", "float", "bool"
INT_MIN, INT_MAX = -2 ** 31, 2 ** 31 - 1     # the kernel's ints
FLOAT_MAX = 3.4028234663852886e38            # the kernel's floats (fp32)
INDICES = {"b": INT, "h": INT, "q_idx": INT, "kv_idx": INT}
LENGTHS = {"seqlen_q": INT, "seqlen_k": INT, "causal_offset": INT}
PARAM_TYPES = {f"{t}{shape}": (t, by) for t in (INT, FLOAT)
               for shape, by in (("", None), ("[heads]", "h"), ("[batch]", "b"))}
FUNCTIONS = {"tanh": 1, "exp2": 1, "abs": 1, "min": 2, "max": 2, "where": 3}
ARITHMETIC = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Mod: "%", ast.FloorDiv: "//"}
COMPARISONS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}


# A param's name becomes a C++ member name in the kernel (VariantEnv, Params as variant_<name>): an
# ASCII identifier that no compiler or preprocessor reads as anything else.
PARAM_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
PARAM_NAME_CHARS = 48
CXX_KEYWORDS = frozenset("""
    alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t char32_t class
    co_await co_return co_yield compl concept const const_cast consteval constexpr constinit continue decltype
    default delete do double dynamic_cast else enum explicit export extern false float for friend goto if inline
    int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected public register
    reinterpret_cast requires return short signed sizeof static static_assert static_cast struct switch template
    this thread_local throw true try typedef typeid typename union unsigned using virtual void volatile wchar_t
    while xor xor_eq restrict
""".split())
# Macros of the C, POSIX and CUDA headers a kernel includes whose names are not all capitals (those
# are refused by pattern), and the GNU dialect's predefined ones: as a member name, each would expand.
LOWERCASE_MACROS = frozenset("""
    alloca assert assert_perror errno offsetof stderr stdin stdout math_errhandling strdupa strndupa toascii
    isascii issubnormal signbit isnan isinf isfinite isnormal fpclassify isgreater isgreaterequal isless
    islessequal islessgreater isunordered va_arg va_start va_end va_copy setjmp longjmp unix linux i386
    major minor makedev be16toh be32toh be64toh htobe16 htobe32 htobe64 htole16 htole32 htole64 le16toh
    le32toh le64toh
""".split())


def param_name_problem(name) -> str | None:
    """Why `name` cannot name a param (None: it can): the rule it breaks and what to write instead."""
    if isinstance(name, str) and re.fullmatch(r"_\w*", name, re.A):
        return (f"param name {name!r} starts with _, which C++ reserves for the implementation (_X, __x); "
                f"start it with a letter")
    if not isinstance(name, str) or not PARAM_NAME.fullmatch(name):
        return (f"param name {name!r} is not an identifier: ASCII letters, digits and _, starting with a letter "
                f"(e.g. window_left)")
    if len(name) > PARAM_NAME_CHARS:
        return f"param name {name!r} is longer than {PARAM_NAME_CHARS} characters"
    if "__" in name:
        return f"param name {name!r} holds __, which C++ reserves for the implementation; use one _"
    if name in CXX_KEYWORDS:
        return f"param name {name!r} is a C++ keyword; rename it (e.g. {name}_value)"
    if name in LOWERCASE_MACROS or name.endswith("_l") and name[:-2] in LOWERCASE_MACROS | {
            "isalnum", "isalpha", "isblank", "iscntrl", "isdigit", "isgraph", "islower", "isprint", "ispunct",
            "isspace", "isupper", "isxdigit", "toascii"}:
        return f"param name {name!r} is a macro of the C or CUDA headers the kernel includes; rename it"
    if re.match(r"[A-Z][A-Z0-9]*(?:_|$)", name) or re.match(r"cuda[A-Z]|CU[A-Z_]|NV", name):
        return (f"param name {name!r} looks like a macro (capitals before the first _, or a CUDA prefix), which "
                f"the kernel's headers may define; use lowercase (e.g. {name.lower()})")
    if name in INDICES or name in LENGTHS or name == "score" or name in FUNCTIONS:
        return f"param {name!r} shadows a built-in name; rename it"
    return None


class ExpressionError(ValueError):
    """A one-line reason and the 1-based column of the text where it starts."""

    def __init__(self, message: str, column: int):
        super().__init__(f"column {column}: {message}")
        self.message, self.column = message, column


@dataclass(frozen=True)
class Node:
    op: str                 # num, name, index, neg, not, arith (+ - * / % //), cmp (< ...), and, or, call
    type: str               # int, float or bool
    args: tuple = ()        # child nodes
    value: object = None    # num: the number; name / index: the name; arith / cmp: the operator; call: the function
    by: str | None = None   # index: h or b


@dataclass(frozen=True)
class Expression:
    text: str
    tree: Node
    params: dict            # name -> declared type text (float, int[heads], ...)


def parse(text: str, params: dict[str, str] | None = None, *, score: bool = False) -> Expression:
    """The checked tree of a mask (score False: a bool) or score (a number) expression.
    ExpressionError with the column for anything outside the grammar or ill-typed."""
    params = dict(params or {})
    for name, kind in params.items():
        if kind not in PARAM_TYPES:
            raise ExpressionError(f"param {name!r} has type {kind!r}; use one of {', '.join(sorted(PARAM_TYPES))}", 1)
        problem = param_name_problem(name)
        if problem:
            raise ExpressionError(problem, 1)
    check_text(text)
    lead = len(text) - len(text.lstrip())      # columns count from the text as written
    try:
        body = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise ExpressionError(f"not an expression: {exc.msg}", (exc.offset or 1) + lead) from None
    except (RecursionError, MemoryError):
        raise ExpressionError(f"nested too deeply (at most {MAX_DEPTH} levels); simplify it", 1) from None
    check_size(body)
    tree = _Checker(params, score, lead).node(body)
    want = FLOAT if score else BOOL
    if score and tree.type == INT:
        tree = Node("call", FLOAT, (tree,), "float")
    if tree.type != want:
        raise ExpressionError(f"a {'score' if score else 'mask'} expression gives a "
                              f"{'number' if score else 'bool (a comparison)'}, this one a {tree.type}", 1)
    return Expression(text, tree, params)


# What an expression may be made of, checked before Python's parser sees it: the grammar's
# characters only. Python's own syntax would also take comments (`#` to the end of the line), line
# continuations, string literals and non-ASCII identifiers, none of which the grammar has, and a
# comment would let the text say one thing while the tree says another.
EXPRESSION_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"
                             " \t\n\r+-*/%<>=!()[],.")
MAX_CHARS = 4096         # an expression's text
MAX_NODES = 400          # nodes of its Python parse: every later pass (the derivative, the classifier,
MAX_DEPTH = 48           # explain's samples) is linear in these and recursion stays far below Python's limit


def check_text(text: str) -> None:
    """Refuse text outside the grammar's characters or beyond MAX_CHARS, before any parsing."""
    if not isinstance(text, str):
        raise ExpressionError(f"an expression is text, got {type(text).__name__}", 1)
    if len(text) > MAX_CHARS:
        raise ExpressionError(f"{len(text)} characters; an expression has at most {MAX_CHARS}", 1)
    for i, ch in enumerate(text):
        if ch not in EXPRESSION_CHARS:
            what = "a comment (#)" if ch == "#" else repr(ch)
            raise ExpressionError(f"{what} is not in the expression grammar (names, numbers, + - * / % //, "
                                  f"comparisons, parentheses, brackets and commas)", i + 1)


def check_size(body: ast.AST) -> None:
    """Refuse a parse tree beyond MAX_NODES nodes or MAX_DEPTH levels, walking it without recursion
    (the recursive passes run only on trees this lets through)."""
    count, stack = 0, [(body, 1)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise ExpressionError(f"more than {MAX_NODES} terms and operators; split the expression or "
                                  f"simplify it", 1)
        if depth > MAX_DEPTH:
            raise ExpressionError(f"nested more than {MAX_DEPTH} levels deep (a chain of n operators nests n "
                                  f"levels); simplify it, or group a long chain with parentheses", 1)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node)
                     if not isinstance(child, (ast.expr_context, ast.operator, ast.boolop, ast.cmpop,
                                               ast.unaryop)))


class _Checker:
    def __init__(self, params: dict, score: bool, lead: int = 0):
        self.params, self.score, self.lead = params, score, lead

    def col(self, n: ast.AST) -> int:
        return getattr(n, "col_offset", 0) + 1 + self.lead

    def node(self, n: ast.AST) -> Node:
        col = self.col(n)
        if isinstance(n, ast.Constant) and type(n.value) in (int, float, bool):
            v = n.value
            if isinstance(v, float) and not abs(v) <= FLOAT_MAX or type(v) is int and not INT_MIN <= v <= INT_MAX:
                raise ExpressionError(f"the literal {ast.unparse(n)} is beyond the kernel's 32-bit numbers", col)
            return Node("num", BOOL if isinstance(v, bool) else INT if isinstance(v, int) else FLOAT, value=v)
        if isinstance(n, ast.Name):
            return self.name(n.id, col)
        if isinstance(n, ast.Subscript):
            return self.subscript(n, col)
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.USub, ast.UAdd)):
            x = self.number(n.operand)
            return x if isinstance(n.op, ast.UAdd) else Node("neg", x.type, (x,))
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not):
            return Node("not", BOOL, (self.boolean(n.operand),))
        if isinstance(n, ast.BinOp) and type(n.op) in ARITHMETIC:
            op = ARITHMETIC[type(n.op)]
            a, b = self.number(n.left), self.number(n.right)
            if op in ("%", "//"):
                for side, x in ((n.left, a), (n.right, b)):
                    if x.type != INT:
                        raise ExpressionError(f"{op} takes ints: a float where an int is needed", self.col(side))
                return Node("arith", INT, (a, b), op)
            kind = FLOAT if op == "/" or FLOAT in (a.type, b.type) else INT
            return Node("arith", kind, (a, b), op)
        if isinstance(n, ast.Compare) and all(type(o) in COMPARISONS for o in n.ops):
            terms = [self.number(x) for x in [n.left, *n.comparators]]
            pairs = [Node("cmp", BOOL, (terms[i], terms[i + 1]), COMPARISONS[type(o)]) for i, o in enumerate(n.ops)]
            return pairs[0] if len(pairs) == 1 else Node("and", BOOL, tuple(pairs))
        if isinstance(n, ast.BoolOp):
            return Node("and" if isinstance(n.op, ast.And) else "or", BOOL, tuple(self.boolean(v) for v in n.values))
        if isinstance(n, ast.Call):
            return self.call(n, col)
        what = type(n).__name__.lower()
        raise ExpressionError(f"{what} is not in the expression grammar (numbers, + - * / % //, comparisons, "
                              f"and/or/not, where, {', '.join(f for f in FUNCTIONS if f != 'where')})", col)

    def name(self, name: str, col: int) -> Node:
        if name in INDICES or name in LENGTHS:
            return Node("name", INT, value=name)
        if name == "score":
            if not self.score:
                raise ExpressionError("score is known in score expressions only, not in a mask", col)
            return Node("name", FLOAT, value="score")
        if name in self.params:
            kind, by = PARAM_TYPES[self.params[name]]
            if by:
                raise ExpressionError(f"{name} is a {self.params[name]} tensor: index it with [{by}]", col)
            return Node("name", kind, value=name)
        known = sorted([*INDICES, *LENGTHS, *self.params] + (["score"] if self.score else []))
        raise ExpressionError(f"unknown name {name!r}; known: {', '.join(known)} (declare params under variant.params)",
                              col)

    def subscript(self, n: ast.Subscript, col: int) -> Node:
        if not isinstance(n.value, ast.Name) or n.value.id not in self.params:
            raise ExpressionError("only a declared tensor param can be indexed (e.g. bias[h])", col)
        name = n.value.id
        kind, by = PARAM_TYPES[self.params[name]]
        index = n.slice
        if by is None:
            raise ExpressionError(f"{name} is a scalar {kind}; it takes no index", col)
        if not (isinstance(index, ast.Name) and index.id == by):
            raise ExpressionError(f"{name} is {self.params[name]}: index it with [{by}]", self.col(index))
        return Node("index", kind, value=name, by=by)

    def call(self, n: ast.Call, col: int) -> Node:
        fn = n.func.id if isinstance(n.func, ast.Name) else None
        if fn not in FUNCTIONS or n.keywords:
            raise ExpressionError(f"unknown function {fn or ast.unparse(n.func)!r}; use {', '.join(FUNCTIONS)}", col)
        if len(n.args) != FUNCTIONS[fn]:
            raise ExpressionError(f"{fn} takes {FUNCTIONS[fn]} argument(s), got {len(n.args)}", col)
        if fn == "where":
            c, a, b = self.boolean(n.args[0]), self.node(n.args[1]), self.node(n.args[2])
            if (a.type == BOOL) != (b.type == BOOL):
                raise ExpressionError("where's branches are both numbers or both bools", col)
            kind = BOOL if a.type == BOOL else FLOAT if FLOAT in (a.type, b.type) else INT
            return Node("call", kind, (c, a, b), fn)
        args = tuple(self.number(a) for a in n.args)
        kind = FLOAT if fn in ("tanh", "exp2") or FLOAT in (a.type for a in args) else INT
        return Node("call", kind, args, fn)

    def number(self, n: ast.AST) -> Node:
        x = self.node(n)
        if x.type == BOOL:
            raise ExpressionError("a bool where a number is needed", self.col(n))
        return x

    def boolean(self, n: ast.AST) -> Node:
        x = self.node(n)
        if x.type != BOOL:
            raise ExpressionError(f"a {x.type} where a bool (a comparison) is needed", self.col(n))
        return x


# -- the torch reference -------------------------------------------------------------------------

LEAVES = ("num", "name", "index")


def leaf_value(n: Node, env: dict):
    """A leaf's value at env: a number's own, a name's entry, a tensor param's element at h or b."""
    if n.op == "num":
        return n.value
    if n.op == "name":
        return env[n.value]
    return env[n.value][env[n.by]]


def to_torch(expr: Expression, torch, env: dict):
    """The expression on tensors: env maps each index and length name used (and score) to a tensor
    or number that broadcasts (q_idx a column, kv_idx a row, ...), and each param to its value (a
    1-D tensor for [heads] / [batch] params)."""
    def ev(n: Node):
        if n.op in LEAVES:
            return leaf_value(n, env)
        a = [ev(x) for x in n.args]
        t = [x if torch.is_tensor(x) else torch.tensor(x) for x in a]
        if n.op == "neg":
            return -t[0]
        if n.op == "not":
            return ~t[0]
        if n.op in ("and", "or"):
            out = t[0]
            for x in t[1:]:
                out = out & x if n.op == "and" else out | x
            return out
        if n.op == "cmp":
            return {"<": torch.lt, "<=": torch.le, ">": torch.gt, ">=": torch.ge, "==": torch.eq,
                    "!=": torch.ne}[n.value](t[0], t[1])
        if n.op == "arith":
            if n.value == "/":
                return torch.true_divide(t[0], t[1])
            if n.value in ("%", "//"):      # x % 0 and x // 0 are 0, as the CUDA helpers have them
                safe = torch.where(t[1] == 0, torch.ones_like(t[1]), t[1])
                out = torch.remainder(t[0], safe) if n.value == "%" else torch.div(t[0], safe, rounding_mode="floor")
                return torch.where(t[1] == 0, torch.zeros_like(out), out)
            return {"+": torch.add, "-": torch.sub, "*": torch.mul}[n.value](t[0], t[1])
        fn = n.value
        if fn == "float":
            return t[0].float()
        if fn == "where":
            return torch.where(t[0], t[1], t[2])
        if fn in ("min", "max"):      # fmin/fmax: a NaN operand loses, as with CUDA's fminf/fmaxf
            return (torch.fmin if fn == "min" else torch.fmax)(t[0], t[1])
        return {"tanh": torch.tanh, "exp2": torch.exp2, "abs": torch.abs}[fn](t[0].float() if fn != "abs" else t[0])
    return ev(expr.tree)


# -- one point, in Python ------------------------------------------------------------------------

def evaluate(expr: Expression, env: dict):
    """The expression at one point: env maps every name it reads (and score) to a number, and each
    tensor param to a sequence indexed by h or b. Python's arithmetic with the kernel's rules: ints
    floor-divide (% and // by 0 give 0), `/` is true division, min/max let a NaN operand lose."""
    def ev(n: Node):
        if n.op in LEAVES:
            return leaf_value(n, env)
        a = [ev(x) for x in n.args]
        if n.op == "neg":
            return -a[0]
        if n.op == "not":
            return not a[0]
        if n.op == "and":
            return all(a)
        if n.op == "or":
            return any(a)
        if n.op == "cmp":
            x, y = a
            return {"<": x < y, "<=": x <= y, ">": x > y, ">=": x >= y, "==": x == y, "!=": x != y}[n.value]
        if n.op == "arith":
            x, y = a
            if n.value == "/":
                return x / y if y else math.copysign(math.inf, x) if x else math.nan
            if n.value in ("%", "//"):
                return 0 if y == 0 else (x % y if n.value == "%" else x // y)
            return {"+": x + y, "-": x - y, "*": x * y}[n.value]
        fn = n.value
        if fn == "float":
            return float(a[0])
        if fn == "where":
            return a[1] if a[0] else a[2]
        if fn in ("min", "max"):
            x, y = a
            if isinstance(x, float) and math.isnan(x):
                return y
            if isinstance(y, float) and math.isnan(y):
                return x
            return min(x, y) if fn == "min" else max(x, y)
        if fn == "abs":
            return abs(a[0])
        if fn == "tanh":
            return math.tanh(a[0])
        return 2.0 ** a[0] if a[0] < 128 else math.inf
    return ev(expr.tree)


# -- the derivative, for backward ---------------------------------------------------------------

LN2 = math.log(2.0)    # d exp2(x) = exp2(x) ln 2 dx
_ZERO, _ONE = Node("num", FLOAT, value=0.0), Node("num", FLOAT, value=1.0)


def derivative(score_expr: Expression) -> Expression:
    """d(score expression) / d(score) as an expression of the same names: what a backward kernel
    multiplies dS by. Every function of the grammar has one (abs, min, max and where take the
    branch they take forward; ints do not depend on score). The tree is pruned of zero terms."""
    def is_zero(n: Node) -> bool:
        return n.op == "num" and n.value == 0

    def is_one(n: Node) -> bool:
        return n.op == "num" and n.value == 1

    def mul(a: Node, b: Node) -> Node:
        if is_zero(a) or is_zero(b):
            return _ZERO
        if is_one(a):
            return as_float(b)
        if is_one(b):
            return as_float(a)
        return Node("arith", FLOAT, (a, b), "*")

    def add(a: Node, b: Node, op: str = "+") -> Node:
        if is_zero(b):
            return a
        if is_zero(a):
            return b if op == "+" else Node("neg", FLOAT, (b,))
        return Node("arith", FLOAT, (a, b), op)

    def as_float(n: Node) -> Node:
        return n if n.type == FLOAT else Node("call", FLOAT, (n,), "float")

    def pick(c: Node, a: Node, b: Node) -> Node:
        return _ZERO if is_zero(a) and is_zero(b) else Node("call", FLOAT, (c, as_float(a), as_float(b)), "where")

    def d(n: Node) -> Node:
        if n.type != FLOAT and n.op != "call":
            return _ZERO                                    # ints and bools do not depend on score
        if n.op == "name":
            return _ONE if n.value == "score" else _ZERO
        if n.op in ("num", "index"):
            return _ZERO
        if n.op == "neg":
            inner = d(n.args[0])
            return _ZERO if is_zero(inner) else Node("neg", FLOAT, (inner,))
        if n.op == "arith":
            a, b = n.args
            da, db = d(a), d(b)
            if n.value in ("+", "-"):
                return add(da, db, n.value)
            if n.value == "*":
                return add(mul(da, b), mul(a, db))
            if n.value == "/":                               # (a' - (a / b) * b') / b
                top = add(da, mul(Node("arith", FLOAT, (a, b), "/"), db), "-")
                return _ZERO if is_zero(top) else Node("arith", FLOAT, (top, b), "/")
            return _ZERO                                     # % and // are on ints
        fn, args = n.value, n.args
        if fn == "float":
            return _ZERO if args[0].type == INT else d(args[0])
        if fn == "where":
            return pick(args[0], d(args[1]), d(args[2]))
        if fn in ("min", "max"):
            a, b = args
            return pick(Node("cmp", BOOL, (a, b), "<=" if fn == "min" else ">="), d(a), d(b))
        x = args[0]
        dx = d(x)
        if is_zero(dx):
            return _ZERO
        if fn == "abs":
            return pick(Node("cmp", BOOL, (x, Node("num", INT, value=0)), ">="), dx, Node("neg", FLOAT, (dx,)))
        if fn == "tanh":                                     # 1 - tanh(x)^2
            t = Node("call", FLOAT, (x,), "tanh")
            return mul(Node("arith", FLOAT, (_ONE, Node("arith", FLOAT, (t, t), "*")), "-"), dx)
        return mul(Node("arith", FLOAT, (Node("call", FLOAT, (x,), "exp2"), Node("num", FLOAT, value=LN2)), "*"), dx)

    if score_expr.tree.type != FLOAT:
        raise ValueError("derivative takes a score expression")
    return Expression(f"d({score_expr.text})/d(score)", as_float(d(score_expr.tree)), score_expr.params)


# -- CUDA ----------------------------------------------------------------------------------------

def to_cuda(expr: Expression, name: Callable[[str], str], index: Callable[[str, str], str]) -> str:
    """One parenthesised C++ expression; `name` spells an index, length, param or score in the hook
    (e.g. q_idx -> "q_idx", window -> "p.window"), `index` a tensor param at h or b."""
    def c(n: Node) -> str:
        if n.op == "num":
            if n.type == BOOL:
                return "true" if n.value else "false"
            return repr(int(n.value)) if n.type == INT else f"{float(n.value)!r}f"
        if n.op == "name":
            return name(n.value)
        if n.op == "index":
            return index(n.value, n.by)
        a = [c(x) for x in n.args]
        if n.op == "neg":
            return f"(-{a[0]})"
        if n.op == "not":
            return f"(!{a[0]})"
        if n.op in ("and", "or"):
            return "(" + (" && " if n.op == "and" else " || ").join(a) + ")"
        if n.op == "cmp":
            return f"({a[0]} {n.value} {a[1]})"
        if n.op == "arith":
            x, y = a
            if n.value == "/":   # a reciprocal the compiler computes once where y does not change (a param)
                return f"(static_cast<float>({x}) * (1.0f / static_cast<float>({y})))"
            if n.value in ("%", "//"):      # CUDA_HELPERS: Python's floor semantics for every sign
                return f"attngen_floor_{'mod' if n.value == '%' else 'div'}({x}, {y})"
            return f"({x} {n.value} {y})"
        fn, floats = n.value, n.type == FLOAT
        if fn == "float":
            return f"static_cast<float>({a[0]})"
        if fn == "where":
            return f"({a[0]} ? {a[1]} : {a[2]})"
        if fn in ("min", "max"):
            return f"{'f' + fn + 'f' if floats else fn}({a[0]}, {a[1]})"
        if fn == "abs":
            return f"{'fabsf' if floats else 'abs'}({a[0]})"
        return f"{fn}f(static_cast<float>({a[0]}))"
    return c(expr.tree)


# What to_cuda's output calls for % and //: Python's floor modulo and division on ints, 0 for a zero
# divisor (as to_torch has them). A hook that uses an expression with % or // includes these once.
CUDA_HELPERS = """\
__device__ __forceinline__ int attngen_floor_mod(int x, int y) { return y ? ((x % y) + y) % y : 0; }
__device__ __forceinline__ int attngen_floor_div(int x, int y) { return y ? (x - attngen_floor_mod(x, y)) / y : 0; }
"""


def reads_head(expr: Expression) -> bool:
    """Whether the expression's value can differ between heads: it reads h or a per-head param."""
    def walk(n: Node) -> bool:
        return (n.op == "name" and n.value == "h") or (n.op == "index" and n.by == "h") or any(walk(x) for x in n.args)
    return walk(expr.tree)


def uses_helpers(expr: Expression) -> bool:
    """Whether to_cuda's output calls CUDA_HELPERS."""
    def walk(n: Node) -> bool:
        return n.op == "arith" and n.value in ("%", "//") or any(walk(x) for x in n.args)
    return walk(expr.tree)


# -- block classification ------------------------------------------------------------------------

EMPTY, FULL, PARTIAL = "empty", "full", "partial"


def bounds(expr: Expression, ranges: dict):
    """Interval evaluation: `ranges` maps every name the expression uses to (lo, hi) (a number's
    own value twice; a tensor param its min and max). A number node gives (lo, hi); a bool node
    True (every point), False (none) or None (some, or unknown). Sound for the kernel's arithmetic:
    an int interval that could leave 32 bits, or any NaN, widens to unbounded, and a comparison
    involving floats decides only with a margin for fp32 rounding and never on infinite bounds."""
    def num(x):
        return (x, x) if not isinstance(x, tuple) else x

    def ev(n: Node):
        out = raw(n)
        return out if n.type == BOOL else _sound(n.type, *out)

    def raw(n: Node):
        if n.op == "num":
            return n.value if n.type == BOOL else (n.value, n.value)
        if n.op in ("name", "index"):
            return num(ranges[n.value])
        a = [ev(x) for x in n.args]
        if n.op == "neg":
            return (-a[0][1], -a[0][0])
        if n.op == "not":
            return None if a[0] is None else not a[0]
        if n.op == "and":
            return False if any(x is False for x in a) else True if all(x is True for x in a) else None
        if n.op == "or":
            return True if any(x is True for x in a) else False if all(x is False for x in a) else None
        if n.op == "cmp":
            exact = all(x.type == INT for x in n.args)
            return _compare(n.value, a[0], a[1]) if exact else _compare_floats(n.value, a[0], a[1])
        if n.op == "arith":
            return _arith(n.value, a[0], a[1])
        fn = n.value
        if fn == "float":
            return a[0]
        if fn == "where":
            c, x, y = a
            if c is True or c is False:
                return x if c else y
            if n.type == BOOL:
                return x if x == y and x is not None else None
            return (min(x[0], y[0]), max(x[1], y[1]))
        if fn in ("min", "max"):
            f = min if fn == "min" else max
            return (f(a[0][0], a[1][0]), f(a[0][1], a[1][1]))
        lo, hi = a[0]
        if fn == "abs":
            return (0 if lo <= 0 <= hi else min(abs(lo), abs(hi)), max(abs(lo), abs(hi)))
        f = math.tanh if fn == "tanh" else (lambda v: 2.0 ** v if v < 128 else math.inf)   # fp32 overflows at 2^128
        return (f(lo), f(hi))      # both monotonic
    return ev(expr.tree)


def _sound(kind: str, lo, hi) -> tuple:
    """An interval the kernel's numbers stay inside: unbounded where a NaN appeared or an int could
    wrap around 32 bits."""
    if math.isnan(lo) or math.isnan(hi):
        return (-math.inf, math.inf)
    if kind == INT and (lo < INT_MIN or hi > INT_MAX):
        return (-math.inf, math.inf)
    return (lo, hi)


def _compare_floats(op: str, a, b):
    """A comparison on fp32 values: no verdict on infinite bounds (inf - inf is NaN in the kernel),
    and a verdict only with a relative margin that covers fp32 rounding on either side."""
    if max(abs(x) for x in (*a, *b)) > FLOAT_MAX:     # infinite (or so in fp32): inf - inf is NaN there
        return None
    margin = 1e-5 * max(1.0, *(abs(x) for x in (*a, *b)))
    if op in ("<", "<=", ">", ">="):
        first, second = (a, b) if op in ("<", "<=") else (b, a)
        if first[1] + margin < second[0]:
            return True
        if first[0] > second[1] + margin:
            return False
        return None
    return _compare(op, a, b) if a[0] == a[1] == b[0] == b[1] else (
        (op == "!=") if a[1] + margin < b[0] or b[1] + margin < a[0] else None)


def _compare(op: str, a, b):
    (alo, ahi), (blo, bhi) = a, b
    if op in (">", ">="):
        return _compare("<" if op == ">" else "<=", b, a)
    if op == "<":
        return True if ahi < blo else False if alo >= bhi else None
    if op == "<=":
        return True if ahi <= blo else False if alo > bhi else None
    same = alo == ahi == blo == bhi
    apart = ahi < blo or bhi < alo
    if op == "==":
        return True if same else False if apart else None
    return False if same else True if apart else None


def _arith(op: str, a, b):
    (alo, ahi), (blo, bhi) = a, b
    if op == "+":
        return (alo + blo, ahi + bhi)
    if op == "-":
        return (alo - bhi, ahi - blo)
    if op == "*":
        products = [x * y for x in (alo, ahi) for y in (blo, bhi) if not (math.isinf(x) and y == 0 or math.isinf(y) and x == 0)]
        return (min(products, default=0), max(products, default=0))
    if op == "/":
        if blo <= 0 <= bhi:
            return (-math.inf, math.inf)
        q = [x / y for x in (alo, ahi) for y in (blo, bhi)]
        return (min(q), max(q))
    if blo == bhi and blo > 0:     # % and // by a positive constant; anything else: unbounded
        if op == "//":
            return (alo // blo, ahi // blo)
        return (alo % blo, ahi % blo) if alo // blo == ahi // blo else (0, blo - 1)
    return (-math.inf, math.inf)


def classify(mask: Expression, q_rows: tuple[int, int], keys: tuple[int, int], ranges: dict) -> str:
    """EMPTY when the mask hides every key of query rows q_rows (inclusive) x keys, FULL when it
    hides none, else PARTIAL; `ranges` bounds every other name (b, h, lengths, params)."""
    verdict = bounds(mask, {**ranges, "q_idx": q_rows, "kv_idx": keys})
    return FULL if verdict is True else EMPTY if verdict is False else PARTIAL


# -- block classification in the kernel ----------------------------------------------------------
# The same interval rules as `bounds`, emitted as C++ so that a kernel classifies each (query block,
# key block) pair with the call's own values: every name but q_idx and kv_idx is one value (the
# block's b and h pick a tensor param's element), the two indices are the block's ranges. Intervals
# are doubles, as Python's numbers are here: ints stay exact far beyond 32 bits, so the checks that
# widen a result that could wrap (or a NaN) read the same as `_sound`. The helpers use <cmath>'s
# double functions and HUGE_VAL, which CUDA provides on the device too.

CLASSIFY_HELPERS = """\
struct AttngenIv { double lo, hi; };    // a closed interval; a bool is 1 (every point), 0 (none) or -1 (unknown)
__host__ __device__ inline AttngenIv attngen_iv_sound(AttngenIv a, bool is_int) {
    const double inf = HUGE_VAL;
    if (a.lo != a.lo || a.hi != a.hi) return {-inf, inf};
    if (is_int && (a.lo < -2147483648.0 || a.hi > 2147483647.0)) return {-inf, inf};
    return a;
}
__host__ __device__ inline double attngen_min2(double a, double b) { return a < b ? a : b; }
__host__ __device__ inline double attngen_max2(double a, double b) { return a > b ? a : b; }
__host__ __device__ inline bool attngen_isinf(double x) { return x == HUGE_VAL || x == -HUGE_VAL; }
__host__ __device__ inline AttngenIv attngen_iv_mul(AttngenIv a, AttngenIv b) {
    const double xs[2] = {a.lo, a.hi}, ys[2] = {b.lo, b.hi};
    double lo = 0, hi = 0;
    bool any = false;
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) {
            if ((attngen_isinf(xs[i]) && ys[j] == 0) || (attngen_isinf(ys[j]) && xs[i] == 0)) continue;
            const double p = xs[i] * ys[j];
            lo = any ? attngen_min2(lo, p) : p;
            hi = any ? attngen_max2(hi, p) : p;
            any = true;
        }
    return {lo, hi};
}
__host__ __device__ inline AttngenIv attngen_iv_div(AttngenIv a, AttngenIv b) {
    const double inf = HUGE_VAL;
    if (b.lo <= 0 && 0 <= b.hi) return {-inf, inf};
    const double q[4] = {a.lo / b.lo, a.lo / b.hi, a.hi / b.lo, a.hi / b.hi};
    double lo = q[0], hi = q[0];
    for (int i = 1; i < 4; ++i) { lo = attngen_min2(lo, q[i]); hi = attngen_max2(hi, q[i]); }
    return {lo, hi};
}
__host__ __device__ inline double attngen_floor_div_d(double x, double y) { return floor(x / y); }
__host__ __device__ inline AttngenIv attngen_iv_floordiv(AttngenIv a, AttngenIv b) {   // // by a positive constant
    const double inf = HUGE_VAL;
    if (!(b.lo == b.hi && b.lo > 0)) return {-inf, inf};
    return {attngen_floor_div_d(a.lo, b.lo), attngen_floor_div_d(a.hi, b.lo)};
}
__host__ __device__ inline AttngenIv attngen_iv_mod(AttngenIv a, AttngenIv b) {        // % by a positive constant
    const double inf = HUGE_VAL;
    if (!(b.lo == b.hi && b.lo > 0)) return {-inf, inf};
    const double ql = attngen_floor_div_d(a.lo, b.lo), qh = attngen_floor_div_d(a.hi, b.lo);
    if (ql == qh && !attngen_isinf(ql)) return {a.lo - b.lo * ql, a.hi - b.lo * qh};
    return {0, b.lo - 1};
}
__host__ __device__ inline AttngenIv attngen_iv_abs(AttngenIv a) {
    const double l = a.lo < 0 ? -a.lo : a.lo, h = a.hi < 0 ? -a.hi : a.hi;
    return {(a.lo <= 0 && 0 <= a.hi) ? 0 : attngen_min2(l, h), attngen_max2(l, h)};
}
__host__ __device__ inline double attngen_exp2_d(double v) { return v < 128 ? exp2(v) : HUGE_VAL; }
// Comparisons (op: 0 <, 1 <=, 2 >, 3 >=, 4 ==, 5 !=). Exact on ints; on floats a verdict only with a
// margin for fp32 rounding and never on bounds beyond fp32.
__host__ __device__ inline int attngen_cmp_exact(int op, AttngenIv a, AttngenIv b) {
    if (op == 2 || op == 3) return attngen_cmp_exact(op == 2 ? 0 : 1, b, a);
    if (op == 0) return a.hi < b.lo ? 1 : a.lo >= b.hi ? 0 : -1;
    if (op == 1) return a.hi <= b.lo ? 1 : a.lo > b.hi ? 0 : -1;
    const bool same = a.lo == a.hi && a.hi == b.lo && b.lo == b.hi, apart = a.hi < b.lo || b.hi < a.lo;
    if (op == 4) return same ? 1 : apart ? 0 : -1;
    return same ? 0 : apart ? 1 : -1;
}
__host__ __device__ inline int attngen_cmp_float(int op, AttngenIv a, AttngenIv b) {
    const double m = attngen_max2(attngen_max2(fabs(a.lo), fabs(a.hi)),
                                  attngen_max2(fabs(b.lo), fabs(b.hi)));
    if (m > 3.4028234663852886e38) return -1;
    const double margin = 1e-5 * attngen_max2(1.0, m);
    if (op <= 3) {
        const AttngenIv f = op <= 1 ? a : b, s = op <= 1 ? b : a;
        return f.hi + margin < s.lo ? 1 : f.lo > s.hi + margin ? 0 : -1;
    }
    if (a.lo == a.hi && a.hi == b.lo && b.lo == b.hi) return attngen_cmp_exact(op, a, b);
    return (a.hi + margin < b.lo || b.hi + margin < a.lo) ? (op == 5 ? 1 : 0) : -1;
}
__host__ __device__ inline int attngen_tri_not(int a) { return a < 0 ? -1 : !a; }
"""

def classify_helpers_for(code: str) -> str:
    """The part of CLASSIFY_HELPERS that `code` (a to_cuda_classifier output) calls, with what those
    call in turn, in CLASSIFY_HELPERS' order: a generated file defines nothing it does not use."""
    import re
    chunks, current = [], []
    for line in CLASSIFY_HELPERS.splitlines():
        if (line.startswith(("__host__", "struct")) or line.startswith("//")) and current and not current[-1].startswith("//"):
            chunks.append(current)
            current = []
        current.append(line)
    chunks.append(current)
    named = []
    for chunk in chunks:
        body = "\n".join(chunk)
        m = re.search(r"(?:struct|inline [\w ]+?)\s+(attngen_\w+|AttngenIv)\b", body)
        named.append((m.group(1) if m else "", body))
    need, text = set(), code
    changed = True
    while changed:
        changed = False
        for name, body in named:
            if name and name not in need and re.search(rf"\b{name}\b", text):
                need.add(name)
                text += "\n" + body.split("{", 1)[1] if "{" in body else ""
                changed = True
    need.add("AttngenIv")
    return "\n".join(body for name, body in named if name in need).rstrip("\n") + "\n"


_CMP_CODE = {"<": 0, "<=": 1, ">": 2, ">=": 3, "==": 4, "!=": 5}


def to_cuda_classifier(mask: Expression, name: Callable[[str], str], index: Callable[[str, str], str],
                       rows: tuple[str, str] = ("q_lo", "q_hi"), keys: tuple[str, str] = ("k_lo", "k_hi")) -> str:
    """C++ statements that leave in `verdict` 1 (every key of the block is visible: FULL), 0 (none:
    EMPTY) or -1 (PARTIAL) by `bounds`' rules. `rows` and `keys` name the C++ values of the block's
    first and last query row and key; `name` and `index` spell every other name as `to_cuda` does.
    Needs CLASSIFY_HELPERS."""
    lines: list[str] = []
    counter = iter(range(1 << 30))

    def new(kind: str, expr: str) -> str:
        var = f"v{next(counter)}"
        lines.append(f"const {kind} {var} = {expr};")
        return var

    def iv(n: Node) -> str:
        """A numeric node's interval variable, widened as `_sound` widens it (an int leaf, one 32-bit
        value or range, is sound as it is)."""
        if n.type == INT and n.op in ("num", "name", "index"):
            return new("AttngenIv", raw(n))
        return new("AttngenIv", f"attngen_iv_sound({raw(n)}, {'true' if n.type == INT else 'false'})")

    def tri(n: Node) -> str:
        return new("int", raw(n))

    def raw(n: Node) -> str:
        if n.op == "num":
            if n.type == BOOL:
                return "1" if n.value else "0"
            return f"AttngenIv{{{float(n.value)!r}, {float(n.value)!r}}}"
        if n.op == "name" and n.value in ("q_idx", "kv_idx"):
            lo, hi = rows if n.value == "q_idx" else keys
            return f"AttngenIv{{static_cast<double>({lo}), static_cast<double>({hi})}}"
        if n.op in ("name", "index"):
            spelled = name(n.value) if n.op == "name" else index(n.value, n.by)
            return f"AttngenIv{{static_cast<double>({spelled}), static_cast<double>({spelled})}}"
        if n.type == BOOL and n.op not in ("call",):
            if n.op == "not":
                return f"attngen_tri_not({tri(n.args[0])})"
            if n.op in ("and", "or"):
                parts = [tri(x) for x in n.args]
                decide, other = ("0", "1") if n.op == "and" else ("1", "0")
                any_decides = " || ".join(f"{p} == {decide}" for p in parts)
                all_other = " && ".join(f"{p} == {other}" for p in parts)
                return f"(({any_decides}) ? {decide} : ({all_other}) ? {other} : -1)"
            a, b = (iv(x) for x in n.args)
            exact = all(x.type == INT for x in n.args)
            return f"attngen_cmp_{'exact' if exact else 'float'}({_CMP_CODE[n.value]}, {a}, {b})"
        if n.op == "neg":
            a = iv(n.args[0])
            return f"AttngenIv{{-{a}.hi, -{a}.lo}}"
        if n.op == "arith":
            a, b = (iv(x) for x in n.args)
            op = n.value
            if op == "+":
                return f"AttngenIv{{{a}.lo + {b}.lo, {a}.hi + {b}.hi}}"
            if op == "-":
                return f"AttngenIv{{{a}.lo - {b}.hi, {a}.hi - {b}.lo}}"
            return {"*": "attngen_iv_mul", "/": "attngen_iv_div", "//": "attngen_iv_floordiv",
                    "%": "attngen_iv_mod"}[op] + f"({a}, {b})"
        fn = n.value
        if fn == "where":
            c = tri(n.args[0])
            if n.type == BOOL:
                x, y = tri(n.args[1]), tri(n.args[2])
                return f"({c} == 1 ? {x} : {c} == 0 ? {y} : ({x} == {y} && {x} >= 0) ? {x} : -1)"
            x, y = iv(n.args[1]), iv(n.args[2])
            return (f"({c} == 1 ? {x} : {c} == 0 ? {y} : AttngenIv{{attngen_min2({x}.lo, {y}.lo), "
                    f"attngen_max2({x}.hi, {y}.hi)}})")
        a = [iv(x) for x in n.args]
        if fn == "float":
            return a[0]
        if fn in ("min", "max"):
            f = f"attngen_{fn}2"
            return f"AttngenIv{{{f}({a[0]}.lo, {a[1]}.lo), {f}({a[0]}.hi, {a[1]}.hi)}}"
        if fn == "abs":
            return f"attngen_iv_abs({a[0]})"
        f = "tanh" if fn == "tanh" else "attngen_exp2_d"
        return f"AttngenIv{{{f}({a[0]}.lo), {f}({a[0]}.hi)}}"     # both monotonic

    verdict = tri(mask.tree)
    lines.append(f"const int verdict = {verdict};")
    return "\n".join(lines)

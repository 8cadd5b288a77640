"""A minimal stand-in for einops' rearrange and repeat on torch tensors (this folder's own code), put on
PYTHONPATH by docs/fa-tests/run.sh only where the real einops cannot be imported.

Patterns: axis names, literal sizes (1 on either side; n > 1 on the right of repeat), parenthesized
groups (merged on the right, split on the left: at most one unknown size per group, the others given
as keyword sizes), and one "..." outside parentheses on the left (anywhere on the right). That covers
every pattern FlashAttention's tests/test_flash_attn.py uses; anything else raises EinopsError.
"""
from __future__ import annotations

import math
import re

__all__ = ["EinopsError", "rearrange", "repeat"]
__version__ = "0.0-lite"

_TOKEN = re.compile(r"\s*(\.\.\.|\(|\)|[A-Za-z_][A-Za-z0-9_]*|\d+)")
_ELLIPSIS = "..."


class EinopsError(ValueError):
    pass


def _parse(side: str) -> list[list[str]]:
    """One side of a pattern as its groups: a bare axis is a group of one; "()" a group of none."""
    groups, group, at = [], None, 0
    side = side.strip()
    while at < len(side):
        match = _TOKEN.match(side, at)
        if not match:
            raise EinopsError(f"cannot read {side[at:]!r} in {side!r}")
        token, at = match.group(1), match.end()
        if token == "(":
            if group is not None:
                raise EinopsError(f"nested parentheses in {side!r}")
            group = []
        elif token == ")":
            if group is None:
                raise EinopsError(f"unbalanced ')' in {side!r}")
            groups.append(group)
            group = None
        elif group is not None:
            group.append(token)
        else:
            groups.append([token])
    if group is not None:
        raise EinopsError(f"unbalanced '(' in {side!r}")
    return groups


def _expand_ellipsis(left, right, ndim: int):
    """"..." as as many anonymous axes as the tensor has beyond the left's other groups."""
    if not any(_ELLIPSIS in g for g in left + right):
        return left, right
    if [_ELLIPSIS] not in left or sum(g.count(_ELLIPSIS) for g in left) != 1:
        raise EinopsError("'...' must stand once, outside parentheses, on the left")
    count = ndim - (len(left) - 1)
    if count < 0:
        raise EinopsError(f"the pattern has more axes than the tensor's {ndim}")
    names = [f"...{i}" for i in range(count)]
    new_left, new_right = [], []
    for group in left:
        if group == [_ELLIPSIS]:
            new_left.extend([name] for name in names)
        else:
            new_left.append(group)
    for group in right:
        if group == [_ELLIPSIS]:
            new_right.extend([name] for name in names)
        else:
            new_right.append([a for token in group for a in (names if token == _ELLIPSIS else [token])])
    return new_left, new_right


def _transform(tensor, pattern: str, sizes: dict, new_axes: bool):
    if "->" not in pattern:
        raise EinopsError(f"pattern {pattern!r} has no '->'")
    left_side, right_side = pattern.split("->")
    left, right = _expand_ellipsis(_parse(left_side), _parse(right_side), tensor.ndim)
    if len(left) != tensor.ndim:
        raise EinopsError(f"pattern {pattern!r} has {len(left)} axes on the left, the tensor {tensor.ndim}")
    known = {name: int(size) for name, size in sizes.items()}
    flat_left = []
    for group, dim in zip(left, tensor.shape):
        unknown = [a for a in group if not a.isdigit() and a not in known]
        if len(set(unknown)) > 1:
            raise EinopsError(f"group {group} of {pattern!r} has more than one unknown size")
        given = math.prod(int(a) if a.isdigit() else known[a] for a in group if a not in unknown)
        if unknown:
            if given == 0 or dim % given:
                raise EinopsError(f"cannot split {dim} into {group} with {sizes}")
            known[unknown[0]] = dim // given
        elif given != dim:
            raise EinopsError(f"group {group} of {pattern!r} is {given}, the tensor's axis {dim}")
        flat_left.extend(group)
    names = [a for a in flat_left if not a.isdigit()]
    if len(set(names)) != len(names):
        raise EinopsError(f"an axis name stands twice on the left of {pattern!r}")
    for a in flat_left:
        if a.isdigit() and a != "1":
            raise EinopsError(f"literal {a} on the left of {pattern!r} (only 1 is taken)")
    flat_right = [a for g in right for a in g]
    right_names = [a for a in flat_right if not a.isdigit()]
    if len(set(right_names)) != len(right_names):
        raise EinopsError(f"an axis name stands twice on the right of {pattern!r}")
    missing = [a for a in names if a not in right_names]
    if missing:
        raise EinopsError(f"axes {missing} of {pattern!r} are dropped (einops reduces only in reduce)")
    x = tensor.reshape([known[a] for a in names])       # split the left groups, drop literal 1s
    x = x.permute([names.index(a) for a in flat_right if a in names])
    view, target = [], []
    for a in flat_right:
        if a in names:
            view.append(known[a])
            target.append(known[a])
            continue
        size = int(a) if a.isdigit() else sizes.get(a)
        if size is None:
            raise EinopsError(f"axis {a} of {pattern!r} is new: give its size")
        if not new_axes and size != 1:
            raise EinopsError(f"rearrange cannot add axis {a} of size {size}; use repeat")
        view.append(1)
        target.append(int(size))
    x = x.reshape(view)
    if target != view:
        x = x.expand(target)
    group_sizes = []
    at = 0
    for g in right:
        group_sizes.append(math.prod(target[at:at + len(g)]))
        at += len(g)
    return x.reshape(group_sizes)


def rearrange(tensor, pattern: str, **sizes):
    """einops.rearrange for the patterns named in this module's docstring."""
    return _transform(tensor, pattern, sizes, new_axes=False)


def repeat(tensor, pattern: str, **sizes):
    """einops.repeat for the patterns named in this module's docstring."""
    return _transform(tensor, pattern, sizes, new_axes=True)

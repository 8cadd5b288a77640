"""One list of kernel parameters makes both the C struct and the Python packing.

Each field is declared once: name, C type, size, alignment, meaning and the struct format of its
value. The generated struct carries a static_assert per offset and one for its size, so the C and
Python sides cannot drift: adding a field (a page-table pointer, a 64-byte aligned 128-byte tensor
map) is one more entry in a list.
"""
from __future__ import annotations

import struct

from .frozen import Frozen

PARAMS_MAX = 4096          # bytes: CUDA's limit for a kernel's parameters (the planner refuses more)


class AbiField(Frozen):
    """One field of a Params struct."""

    # Frozen, not a frozen dataclass: a first call defines this class (core.frozen says why).
    __slots__ = ("name", "ctype", "size", "align", "pack", "meaning", "default", "array")

    def __init__(self, name: str,
                 ctype: str,              # C declaration type ("const void*", "long long", ...)
                 size: int,               # bytes
                 align: int,              # bytes
                 pack: str,               # struct format of one value ("Q", "q", "i", "f", "128s")
                 meaning: str,
                 default: object = None,  # value packed when the caller gives none (None: the caller must give one)
                 array: int = 0):         # > 0: declared as ctype name[array] (an opaque byte blob)
        super().__init__(name, ctype, size, align, pack, meaning, default, array)
        if self.align < 1 or self.align & (self.align - 1):
            raise ValueError(f"ABI field {self.name}: alignment {self.align} is not a power of two")
        if self.array and self.size % self.array:
            raise ValueError(f"ABI field {self.name}: {self.size} bytes are not {self.array} equal elements")
        if self.align < self.natural_align:
            raise ValueError(f"ABI field {self.name}: alignment {self.align} is below the {self.natural_align} "
                             f"bytes of {self.ctype}; C cannot lower it")

    @property
    def natural_align(self) -> int:
        """The alignment C gives the declared type: its element's size (char 1, int 4, pointer 8)."""
        return self.size // self.array if self.array else self.size

    def declaration(self) -> str:
        """The C member. alignas whenever the field's alignment exceeds its type's own, so C puts
        it at the offset Python computes (a 16-byte, 8-aligned blob after an int is at +8, not +4)."""
        align = f"alignas({self.align}) " if self.align > self.natural_align else ""
        dims = f"[{self.array}]" if self.array else ""
        return f"{align}{self.ctype} {self.name}{dims};"


def pointer(name: str, meaning: str, *, const: bool = True, optional: bool = False) -> AbiField:
    return AbiField(name, "const void*" if const else "void*", 8, 8, "Q", meaning, 0 if optional else None)


def float_pointer(name: str, meaning: str, *, optional: bool = False) -> AbiField:
    return AbiField(name, "float*", 8, 8, "Q", meaning, 0 if optional else None)


def int_pointer(name: str, meaning: str, *, optional: bool = False) -> AbiField:
    return AbiField(name, "const int*", 8, 8, "Q", meaning, 0 if optional else None)


def int64(name: str, meaning: str, default: int | None = None) -> AbiField:
    return AbiField(name, "long long", 8, 8, "q", meaning, default)


def int32(name: str, meaning: str, default: int | None = None) -> AbiField:
    return AbiField(name, "int", 4, 4, "i", meaning, default)


def float32(name: str, meaning: str) -> AbiField:
    return AbiField(name, "float", 4, 4, "f", meaning)


def array(name: str, ctype: str, elem_size: int, count: int, meaning: str) -> AbiField:
    """`count` values of a C type (pointers, long long), declared ctype name[count] and packed as their
    bytes (array_bytes): a list a kernel indexes, of a length the plan fixes."""
    return AbiField(name, ctype, elem_size * count, elem_size, f"{elem_size * count}s", meaning, array=count)


def array_bytes(field: AbiField, fmt: str, values) -> bytes:
    """The bytes of an array field holding `values` (struct format `fmt` of one), zeros past them."""
    values = tuple(values)
    count = field.array
    if len(values) > count:
        raise ValueError(f"ABI field {field.name} holds {count} values (got {len(values)})")
    return struct.pack(f"<{count}{fmt}", *values, *([0] * (count - len(values))))


def blob(name: str, size: int, align: int, meaning: str) -> AbiField:
    """Opaque bytes, e.g. a CUtensorMap (128 B, 64-byte aligned)."""
    return AbiField(name, "unsigned char", size, align, f"{size}s", meaning, array=size)


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


class Abi(Frozen):
    """A by-value parameter struct: fields in order, each at its natural alignment.

    A plan's Params holds only the fields its kernels read; `omitted` names the fields of the list
    it was cut from (Abi.without) that it leaves out, so one call convention's packing can name
    every field of the list and skip those this plan does not carry, while a misspelt name is
    still refused."""

    # Frozen, not a frozen dataclass: a first call defines this class (core.frozen says why).
    __slots__ = ("name", "fields", "omitted")

    def __init__(self, name: str, fields: tuple[AbiField, ...], omitted: frozenset = frozenset()):
        super().__init__(name, fields, omitted)
        names = [f.name for f in self.fields]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"ABI {self.name}: field(s) declared twice: {', '.join(sorted(dup))}")

    @property
    def offsets(self) -> tuple[int, ...]:
        out, offset = [], 0
        for f in self.fields:
            offset = _round_up(offset, f.align)
            out.append(offset)
            offset += f.size
        return tuple(out)

    @property
    def align(self) -> int:
        return max((f.align for f in self.fields), default=1)

    @property
    def size(self) -> int:
        if not self.fields:
            return 0
        return _round_up(self.offsets[-1] + self.fields[-1].size, self.align)

    def rows(self) -> list[tuple[AbiField, int]]:
        return list(zip(self.fields, self.offsets))

    def pack(self, values: dict) -> bytes:
        """The struct's bytes; every field without a default must be in `values`, and nothing else.
        A blob takes exactly its size in bytes: struct would pad a short one and cut a long one."""
        unknown = set(values) - {f.name for f in self.fields} - self.omitted
        if unknown:
            raise ValueError(f"ABI {self.name} has no field(s) {', '.join(sorted(unknown))}")
        buf = bytearray(self.size)
        for f, offset in self.rows():
            value = values.get(f.name, f.default)
            if value is None:
                raise ValueError(f"ABI {self.name}: no value for {f.name} ({f.meaning})")
            if f.array:
                if not isinstance(value, (bytes, bytearray, memoryview)):
                    raise ValueError(f"ABI {self.name}: {f.name} takes {f.size} bytes (got {type(value).__name__})")
                if len(value) != f.size:
                    raise ValueError(f"ABI {self.name}: {f.name} takes {f.size} bytes (got {len(value)})")
            struct.pack_into("<" + f.pack, buf, offset, value)
        return bytes(buf)

    def with_fields(self, extra: tuple[AbiField, ...]) -> "Abi":
        return Abi(self.name, self.fields + tuple(extra), self.omitted)

    def without(self, names) -> "Abi":
        """This Params less the fields `names` (which must be in it): a plan's kernels do not read them."""
        names = set(names)
        unknown = names - {f.name for f in self.fields}
        if unknown:
            raise ValueError(f"ABI {self.name} has no field(s) {', '.join(sorted(unknown))}")
        return Abi(self.name, tuple(f for f in self.fields if f.name not in names), self.omitted | names)

    def view(self, names) -> list[tuple[str, int, AbiField | None]]:
        """The struct of a kernel that reads only `names`, byte for byte this Params: those fields at
        their offsets and the bytes between them as reserved arrays. One launch's bytes then serve
        two kernels (a decode bundle's split and combine) while each declares only what it reads.
        Rows of (C member, offset, field or None for reserved bytes)."""
        names = set(names)
        unknown = names - {f.name for f in self.fields}
        if unknown:
            raise ValueError(f"ABI {self.name} has no field(s) {', '.join(sorted(unknown))}")
        rows, at = [], 0
        for f, offset in self.rows():
            if f.name not in names:
                continue
            if offset > at:
                rows.append((f"unsigned char reserved_{at}[{offset - at}];", at, None))
            rows.append((f.declaration(), offset, f))
            at = offset + f.size
        if self.size > at:
            rows.append((f"unsigned char reserved_{at}[{self.size - at}];", at, None))
        return rows

    def struct_format(self) -> str:
        """One struct format for the whole Params, padding included: the bytes `pack` lays out."""
        parts, at = ["<"], 0
        for f, offset in self.rows():
            if offset > at:
                parts.append(f"{offset - at}x")
            parts.append(f.pack)
            at = offset + f.size
        if self.size > at:
            parts.append(f"{self.size - at}x")
        return "".join(parts)

    def patch(self, names: tuple[str, ...]) -> "Patch":
        """A Patch that rewrites `names` (any order: its values come in that order) in Params bytes laid
        out before."""
        return Patch(self, tuple(names))

    def packer(self, per_call: tuple[str, ...], fixed: dict | None = None) -> "Packer":
        """A Packer for calls that give the `per_call` fields in that order; every other field
        takes its value from `fixed` or its default, once, here."""
        return Packer(self, tuple(per_call), dict(fixed or {}))


class Packer:
    """The Params of one call convention, laid out once at load: a call passes only the values of
    the fields that change (in the order given to Abi.packer) and one struct.pack_into writes them
    all. The checks of Abi.pack (names, sizes, missing values) run here, once."""

    def __init__(self, abi: Abi, per_call: tuple[str, ...], fixed: dict):
        names = [f.name for f in abi.fields]
        fixed = {n: v for n, v in fixed.items() if n not in abi.omitted}
        unknown = (set(per_call) | set(fixed)) - set(names) - abi.omitted
        if unknown:
            raise ValueError(f"ABI {abi.name} has no field(s) {', '.join(sorted(unknown))}")
        both = set(per_call) & set(fixed)
        if both:
            raise ValueError(f"ABI {abi.name}: field(s) {', '.join(sorted(both))} both fixed and per call")
        base = []
        for f in abi.fields:
            value = fixed.get(f.name, f.default)
            if value is None and f.name not in per_call:
                raise ValueError(f"ABI {abi.name}: no value for {f.name} ({f.meaning})")
            base.append(value if value is not None else 0)
        self.abi = abi
        self.per_call = per_call
        self.size = abi.size
        self._struct = struct.Struct(abi.struct_format())
        self._base = base
        # (Params slot, index in per_call) of each per-call value this Params carries
        self._slots = tuple((names.index(n), i) for i, n in enumerate(per_call) if n not in abi.omitted)
        assert self._struct.size == abi.size, (self._struct.size, abi.size)

    def pack_into(self, buffer, offset: int, values) -> None:
        """Write the Params into `buffer` at `offset`; `values` in per_call order (the values of
        fields this Params omits are skipped)."""
        row = self._base.copy()
        for slot, i in self._slots:
            row[slot] = values[i]
        self._struct.pack_into(buffer, offset, *row)

    def pack(self, values) -> bytes:
        buf = bytearray(self.size)
        self.pack_into(buf, 0, values)
        return bytes(buf)


class Patch:
    """Rewrites a few fields of Params bytes laid out before (a prepared call's template): the
    fields that change on every call of one shape, its pointers. The names come in the caller's
    order; adjacent fields (in ABI order) are written by one struct each, so q, k, v, o and lse
    take one pack_into."""

    def __init__(self, abi: Abi, names: tuple[str, ...]):
        rows = {f.name: (i, f, offset) for i, (f, offset) in enumerate(abi.rows())}
        unknown = set(names) - set(rows) - abi.omitted
        if unknown:
            raise ValueError(f"ABI {abi.name} has no field(s) {', '.join(sorted(unknown))}")
        # The values to write, as indices into the caller's: the fields this Params omits dropped, the
        # rest in ABI order (None: the caller's values as they are).
        kept = [i for i, n in enumerate(names) if n not in abi.omitted]
        take = tuple(sorted(kept, key=lambda i: rows[names[i]][0]))
        self._take = None if take == tuple(range(len(names))) else take
        names = tuple(names[i] for i in take)
        runs, start = [], 0
        for at in range(1, len(names) + 1):
            if at == len(names) or rows[names[at]][0] != rows[names[at - 1]][0] + 1:
                fmt, offset0, end = ["<"], rows[names[start]][2], rows[names[start]][2]
                for n in names[start:at]:
                    _, f, offset = rows[n]
                    if offset > end:
                        fmt.append(f"{offset - end}x")
                    fmt.append(f.pack)
                    end = offset + f.size
                runs.append((offset0, struct.Struct("".join(fmt)), start, at))
                start = at
        self.names = tuple(names)
        self._runs = tuple(runs)
        self._single = runs[0][:2] if len(runs) == 1 else None

    def pack_into(self, buffer, offset: int, values) -> None:
        """Write `values` (in the order of the names given, omitted fields included) into Params
        bytes that start at `offset`."""
        if self._take is not None:
            values = [values[i] for i in self._take]
        if self._single is not None:
            self._single[1].pack_into(buffer, offset + self._single[0], *values)
            return
        for at, fmt, start, end in self._runs:
            fmt.pack_into(buffer, offset + at, *values[start:end])

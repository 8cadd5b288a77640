"""A generated file carries only what its kernels use.

The shared template library defines more than any one kernel needs: the plan's constants, element
helpers, addressing, mbarrier and copy primitives. Rather than each template guessing which of them
its spec will name (a list that drifts), rendering leaves out every namespace-scope definition that
nothing else in the file names, repeating until none is left: a helper used only by a left-out
helper goes too. The C++ the kernels compile is unchanged; a reviewer reads only what runs.

A definition is one statement at the start of a line: a `constexpr` constant, a `__device__`
function (with its `template <...>` line), a `struct`, `enum` or `using` alias, with the comment
lines right above it. A comment that opens a paragraph of definitions (no blank line between them)
heads the group and stays while any of the group does. Kernel entry points, `Params`, its
static_asserts and anything else are never left out.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

IDENT = r"[A-Za-z_]\w*"
WORD = re.compile(r"\w+")
STARTS = re.compile(r"^(?:template\s*<|constexpr\s|__device__\s|struct\s|enum\s|using\s)")
NEVER = ("Params",)       # the ABI: packed by the runtime, checked by its static_asserts


def code_of(text: str) -> str:
    """`text` without comments and string literals (their words name nothing)."""
    if "/" not in text and '"' not in text:
        return text                       # (most lines: nothing to take out)
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)


@dataclass
class Definition:
    first: int          # line index of its first code line
    last: int           # line index of its last line
    lead: int           # line index of the first comment line above it (== first when none)
    name: str
    heads_group: bool   # its lead comment opens a paragraph: kept while a later member is


def defined_name(head: str) -> str | None:
    """The name a statement beginning with `head` (comment- and string-free) defines, or None."""
    head = re.sub(r"^template\s*<[^{;]*?>\s*", "", head.strip())
    if re.match(r"(?:struct|enum(?:\s+class)?)\s", head):
        m = re.match(rf"(?:struct|enum(?:\s+class)?)\s+({IDENT})\s*[{{:]", head)
        return m.group(1) if m else None
    if head.startswith("using"):
        m = re.match(rf"using\s+({IDENT})\s*=", head)
        return m.group(1) if m else None
    stop = re.search(r"[(=;{]", head)
    if stop is None:
        return None
    before = re.sub(r"<[^<>]*>", "", head[:stop.start()])     # float2_to<half2>( names float2_to
    names = re.findall(IDENT, before)
    return names[-1] if names else None


def definitions(lines: list[str]) -> list[Definition]:
    """The namespace-scope definitions of `lines`, in order."""
    found, i, n = [], 0, len(lines)
    prev_end = -1                         # last line of the previous definition in this paragraph
    while i < n:
        line = lines[i]
        if not line.strip():
            prev_end = -1
            i += 1
            continue
        if not STARTS.match(line):
            if not line.lstrip().startswith("//"):
                prev_end = -1             # other code ends the paragraph's run of definitions
            i += 1
            continue
        lead = i
        while lead > 0 and lines[lead - 1].startswith("//"):   # comments at the start of a line
            lead -= 1
        heads_group = lead < i and prev_end < 0
        depth, j, text = 0, i, ""
        while j < n:
            code = code_of(lines[j])
            text += code + "\n"
            depth += code.count("{") - code.count("}")
            stripped = code.strip()
            if depth <= 0 and (stripped.endswith(";") or stripped.endswith("}")):
                break
            j += 1
        name = defined_name(text)
        if name is not None and "__global__" not in text:
            found.append(Definition(i, j, lead, name, heads_group))
        prev_end = j
        i = j + 1
    return found


def drop_unnamed(source: str) -> str:
    """`source` without the definitions nothing else in it names (see the module's docstring)."""
    lines = source.split("\n")
    defs = [d for d in definitions(lines) if d.name not in NEVER]
    # Words are counted once: the file's, and each definition's own. A name is used where it stands
    # as a whole word (\bname\b), i.e. where a maximal run of word characters equals it, outside its
    # own definitions; dropping a definition takes its words off the file's count. (A regex search
    # per name made `attngen check` spend 50 of its 57 s here, recounting every pass 9 of `build`'s 24.)
    words = Counter(WORD.findall(code_of(source)))
    own_words = [Counter(WORD.findall(code_of("\n".join(lines[d.first:d.last + 1])))) for d in defs]
    by_name: dict[str, list[int]] = {}
    for i, d in enumerate(defs):
        by_name.setdefault(d.name, []).append(i)
    dropped: set[int] = set()            # indices into defs
    while True:
        newly = set()
        for name, indices in by_name.items():
            own = [i for i in indices if i not in dropped]
            if own and words[name] - sum(own_words[i][name] for i in own) <= 0:
                newly.update(own)
        if not newly:
            break
        for i in newly:
            words.subtract(own_words[i])
        dropped |= newly
    if not dropped:
        return source
    gone = set()
    for i in dropped:
        d = defs[i]
        gone.update(range(d.first, d.last + 1))
        if not d.heads_group:
            gone.update(range(d.lead, d.first))
    # a group's heading comment goes when every definition of its paragraph does
    for i, d in enumerate(defs):
        if not d.heads_group or i not in dropped:
            continue
        members = [i]
        for k in range(i + 1, len(defs)):
            if defs[k].heads_group or any(not lines[x].strip() for x in range(defs[k - 1].last + 1, defs[k].lead)):
                break
            members.append(k)
        if all(m in dropped for m in members):
            gone.update(range(d.lead, d.first))
    return "\n".join(ln for k, ln in enumerate(lines) if k not in gone)

"""The reference of every setting, read from the config dataclasses themselves: each section
of the TOML, each key's type (an alias's values spelled out), default and doc (the string
after the field in the source; the plain list shows its first sentence, whole). ``docs/config.md`` is this text (``dcco config --list`` prints it;
``tests/test_docs.py`` fails when the file is stale).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
from dataclasses import MISSING, fields
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from dcco.config import RunConfig, to_toml_value

HEADER = """# Every setting

Generated from the config dataclasses by `dcco config --list --markdown` (do not edit by
hand: `tests/test_docs.py` fails when this file and the code disagree). A config file is
TOML with these sections; `--set section.key=value` overrides one key with a TOML value, and
`dcco.fit(settings={"section.key": value})` takes the same keys. Optional keys (a type with
`None`) take `"none"` in TOML. Each key's full doc is in the code, one module a section
(`src/dcco/config/`: `sections.py` for `[data]` and `[train]`, then `model_config.py`,
`augment_config.py`, `loss_config.py`, `optim_config.py`, `eval_config.py`,
`privacy_config.py`, `table_config.py`)."""


def field_docs(cls: type) -> dict[str, str]:
    """Each field's doc: the string literal right after its annotated assignment in the
    class body (the convention of every config dataclass here), whitespace joined."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, after in zip(body, [*body[1:], None], strict=True):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


ABBREVIATIONS = ("e.g.", "i.e.", "et al.", "cf.", "vs.", "approx.", "resp.", "Fig.", "Eq.",
                 "eq.", "No.")
"""Words ending in a full stop that do not end a sentence."""


def first_sentence(text: str) -> str:
    """The doc's first sentence, whole: up to the first full stop followed by a space that
    ends no abbreviation (``ABBREVIATIONS``) nor an initial, and is not inside brackets; the
    whole doc if it is one sentence."""
    depth = 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(depth - 1, 0)
        elif ch == "." and depth == 0 and text[i + 1:i + 2] == " ":
            head = text[: i + 1]
            if any(head.endswith(a) for a in ABBREVIATIONS):
                continue
            word = head.rsplit(" ", 1)[-1]
            if len(word) == 2 and word[0].isupper():  # an initial: "J. Smith"
                continue
            return head
    return text


def type_text(kind: Any) -> str:
    """A field's type as a reader needs it: an alias of a ``Literal`` shows its values
    (``"gn" | "bn"``), unions and containers their parts."""
    origin, args = get_origin(kind), get_args(kind)
    if origin is Literal:
        return " | ".join(to_toml_value(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join(type_text(a) for a in args)
    if origin is not None and args:
        inner = ", ".join("..." if a is Ellipsis else type_text(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if kind is type(None):
        return "None"
    return getattr(kind, "__name__", str(kind))


def _default(f: Any) -> str:
    if f.default is not MISSING:
        value = f.default
    elif f.default_factory is not MISSING:
        value = f.default_factory()
    else:
        return "(required)"
    try:
        return to_toml_value(value)
    except TypeError:
        return repr(value)


def sections() -> list[tuple[str, type, str]]:
    """(section name, its dataclass, the class's one-line doc), in ``RunConfig``'s order."""
    out = []
    for f in fields(RunConfig):
        cls = type(RunConfig().__getattribute__(f.name))
        doc = " ".join((inspect.getdoc(cls) or "").split("\n\n")[0].split())
        out.append((f.name, cls, doc))
    return out


def reference(markdown: bool = True) -> str:
    """The reference as Markdown (a table per section) or plain text (a line per key)."""
    lines = [HEADER, ""] if markdown else []
    for name, cls, doc in sections():
        docs, hints = field_docs(cls), get_type_hints(cls)
        if markdown:
            lines += [f"## [{name}]", "", doc, "", "| key | type | default | what |",
                      "|---|---|---|---|"]
        else:
            lines += [f"[{name}]  {doc}"]
        for f in fields(cls):
            doc = docs.get(f.name, "")
            what = doc.replace("|", "\\|") if markdown else first_sentence(doc)
            kind = type_text(hints[f.name])
            kind = kind.replace("|", "\\|") if markdown else kind
            if markdown:
                lines.append(f"| `{name}.{f.name}` | `{kind}` | `{_default(f)}` | {what} |")
            else:
                lines.append(f"  {name}.{f.name} = {_default(f)}   ({kind})  {what}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


__all__ = ["field_docs", "first_sentence", "reference", "sections", "type_text"]

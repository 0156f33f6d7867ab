"""The reference of every setting, read from the config dataclasses themselves: each section
of the TOML, each key's type, default and the first sentence of its doc (the string after
the field in the source). ``docs/config.md`` is this text (``dcco config --list`` prints it;
``tests/test_docs.py`` fails when the file is stale).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import MISSING, fields
from typing import Any

from dcco.config import RunConfig, to_toml_value

HEADER = """# Every setting

Generated from the config dataclasses by `dcco config --list --markdown` (do not edit by
hand: `tests/test_docs.py` fails when this file and the code disagree). A config file is
TOML with these sections; `--set section.key=value` overrides one key with a TOML value, and
`dcco.fit(settings={"section.key": value})` takes the same keys. Optional keys (a type with
`None`) take `"none"` in TOML. Each key's full doc is in the code, one module a section
(`src/dcco/config/`: `sections.py` for `[data]` and `[train]`, then `model.py`, `augment.py`,
`loss.py`, `optim.py`, `eval.py`, `privacy.py`, `table.py`)."""


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


def _first_sentence(text: str, most: int = 240) -> str:
    """The doc's first sentence (to its first ". " after a few words), at most ``most``
    characters (cut at a word, with "…")."""
    cut = text.find(". ", 30)
    if cut > 0:
        text = text[: cut + 1]
    if len(text) > most:
        text = text[: text.rfind(" ", 0, most - 1)] + " …"
    return text


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
        docs = field_docs(cls)
        if markdown:
            lines += [f"## [{name}]", "", doc, "", "| key | type | default | what |",
                      "|---|---|---|---|"]
        else:
            lines += [f"[{name}]  {doc}"]
        for f in fields(cls):
            what = _first_sentence(docs.get(f.name, "")).replace("|", "\\|")
            kind = str(f.type).replace("|", "\\|") if markdown else str(f.type)
            if markdown:
                lines.append(f"| `{name}.{f.name}` | `{kind}` | `{_default(f)}` | {what} |")
            else:
                lines.append(f"  {name}.{f.name} = {_default(f)}   ({kind})  {what}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


__all__ = ["field_docs", "reference", "sections"]

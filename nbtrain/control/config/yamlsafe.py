"""YAML read with bounds: the one way nbtrain parses a config or a lab preset.

``yaml.safe_load`` builds nothing dangerous, but it expands aliases: nine nested levels of ``*a`` (the
"billion laughs") turn a few hundred bytes into billions of values and gigabytes of memory. Here the text
is size-checked first, composed into its node graph (where an alias is one shared node, so composing costs
only the text's size), the graph's expanded size counted without expanding it, and only then constructed
with the safe constructor. A document that refers to itself, one nested past the parser's depth, one over
``MAX_BYTES`` or one expanding past ``MAX_VALUES`` is refused with a ``YamlLimit`` saying which.

Two more things ``yaml.safe_load`` does quietly are refused here: a key given twice in one mapping (it
keeps the last and drops the other), as ``DuplicateKeys`` naming both lines; and a syntax error is a
``YamlSyntax`` saying in plain words what is wrong and where (line and column, 1-based), instead of the
parser's own terms ("mapping values are not allowed here", "expected <block end>").

One thing is read as YAML 1.2 does, not 1.1: a number with an exponent and no dot (``2e-4``, ``1E5``) is a
float, as a person (and the panel, and Python) reads it, not the text PyYAML's 1.1 rules make of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml


class _Loader(yaml.SafeLoader):
    """The safe loader, with YAML 1.2's floats: ``2e-4`` is 0.0002 (1.1 wants ``2.0e-4``)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)

MAX_BYTES = 2**20  # a config or preset is a page of keys; data belongs in data files
MAX_VALUES = 100_000  # keys, values and list items, counting every alias as what it expands to


class YamlProblem(ValueError):
    """A YAML document that was not read; ``line`` and ``column`` (1-based) where known."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None) -> None:
        super().__init__(message)
        self.line = line
        self.column = column


class YamlLimit(YamlProblem):
    """A YAML document refused before it was built: too large, expanding too far, nested too deep."""


class YamlSyntax(YamlProblem):
    """Not valid YAML; the message says what is wrong in plain words."""


@dataclass(frozen=True)
class DuplicateKey:
    path: tuple[str, ...]  # the key's path as written, e.g. ("train", "max_steps")
    first: int  # 1-based line where it is given first
    again: int  # 1-based line where it is given again
    column: int  # 1-based column of the second one

    def message(self) -> str:
        return (
            f"'{self.path[-1]}' is given twice in one section, on line {self.first} and again on line "
            f"{self.again}; YAML would keep only the last and silently drop the other: remove one"
        )


class DuplicateKeys(YamlProblem):
    """Keys given twice in one mapping, every one found (``found``, in the order of their lines)."""

    def __init__(self, found: list[DuplicateKey]) -> None:
        super().__init__("; ".join(d.message() for d in found), found[0].again, found[0].column)
        self.found = found


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_expansion(root: yaml.Node) -> None:
    """Count the values ``root`` expands to (each node once, its size memoised), refusing a cycle."""
    sizes: dict[int, int] = {}
    path: set[int] = set()  # the nodes being counted: the current node's ancestors
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            path.discard(key)
            sizes[key] = 1 + sum(sizes[id(c)] for c in _children(node))
            if sizes[key] > MAX_VALUES:
                raise YamlLimit(
                    f"YAML aliases (*name) expand this document to more than {MAX_VALUES} values, past what "
                    f"nbtrain reads (a config needs a few dozen; an alias bomb needs billions): write the "
                    f"values out, or use fewer nested aliases",
                    node.start_mark.line + 1,
                )
            continue
        if key in sizes:
            continue
        if key in path:
            raise YamlLimit(
                "a YAML alias refers to itself (an anchor used inside its own value), which makes an "
                "endless value; write the value out",
                node.start_mark.line + 1,
            )
        path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in sizes)


def _key_identity(loader: yaml.SafeLoader, key: yaml.Node) -> Any:
    """What a key becomes in the built mapping (``1``, ``1.0`` and ``true`` are one key there), else its
    tag and text (a key that cannot be built fails later, with its own message)."""
    try:
        value = loader.construct_object(key)
        hash(value)
        return value
    except (yaml.YAMLError, TypeError):
        return (key.tag, key.value)


def _duplicates(loader: yaml.SafeLoader, root: yaml.Node) -> list[DuplicateKey]:
    """Keys written twice in one mapping (``<<`` merges are not looked into: a key written beside a merge
    overrides the merged one on purpose). Each node is looked at once, however often it is aliased."""
    found: list[DuplicateKey] = []
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, tuple[str, ...]]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, yaml.Node] = {}
            for key, value in node.value:
                name = str(key.value) if isinstance(key, yaml.ScalarNode) else "?"
                if isinstance(key, yaml.ScalarNode):
                    ident = _key_identity(loader, key)
                    if ident in first:
                        found.append(
                            DuplicateKey(
                                (*path, name),
                                first[ident].start_mark.line + 1,
                                key.start_mark.line + 1,
                                key.start_mark.column + 1,
                            )
                        )
                    else:
                        first[ident] = key
                stack.append((value, (*path, name)))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((v, (*path, str(i))) for i, v in enumerate(node.value))
    return sorted(found, key=lambda d: (d.again, d.column))


# ------------------------------------------------------------------------------------- syntax errors


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _has_value(line: str) -> bool:
    """``key: value`` (not ``key:`` opening a section below it); comments aside."""
    code = re.split(r"\s#", line, maxsplit=1)[0].rstrip()
    return bool(code) and not code.endswith(":") and not code.lstrip().startswith("#")


def _plain(e: yaml.YAMLError, text: str) -> YamlSyntax:
    """The parser's error in words a person can act on, at the place to fix (1-based line, column)."""
    lines = text.splitlines()

    def src(n: int) -> str:
        return lines[n - 1] if 1 <= n <= len(lines) else ""

    def before(n: int) -> int | None:
        """The nearest line above line ``n`` that holds something other than a comment."""
        for m in range(n - 1, 0, -1):
            stripped = src(m).strip()
            if stripped and not stripped.startswith("#"):
                return m
        return None

    if isinstance(e, yaml.reader.ReaderError):
        pos = max(0, min(e.position, len(text)))
        char = e.character if isinstance(e.character, int) else ord(str(e.character)[:1] or "?")
        return YamlSyntax(
            f"an invisible control character (U+{char:04X}) that YAML does not allow: delete it (it often "
            f"comes with text pasted from elsewhere)",
            text.count("\n", 0, pos) + 1,
            pos - (text.rfind("\n", 0, pos) + 1) + 1,
        )
    if not isinstance(e, yaml.MarkedYAMLError):
        return YamlSyntax(f"YAML cannot read this: {e}")
    problem, context = e.problem or "", e.context or ""
    pm, cm = e.problem_mark, e.context_mark
    mark = pm or cm
    line: int | None = mark.line + 1 if mark else None
    col: int | None = mark.column + 1 if mark else None
    ctx_line, ctx_col = (cm.line + 1, cm.column + 1) if cm else (line or 1, col or 1)
    here = src(line) if line else ""

    if problem == "mapping values are not allowed here" and line:
        prev = before(line)
        if prev is not None and _indent(here) > _indent(src(prev)) and _has_value(src(prev)):
            return YamlSyntax(
                "this line is indented more than the one above it, which already has a value, so nothing "
                "can go under that key: line this key up with the key above",
                line,
                _indent(here) + 1,
            )
        if prev is not None and re.match(r"^\s*[^\s:#'\"][^:#]*:\S", src(prev)) and ": " not in src(prev):
            key, _, value = src(prev).strip().partition(":")
            return YamlSyntax(
                f"'{src(prev).strip()}' needs a space after the colon: write '{key}: {value}' (without it "
                f"YAML reads the whole line as text)",
                prev,
                _indent(src(prev)) + len(key) + 2,
            )
        if col and ": " in here[: col - 1]:
            return YamlSyntax(
                "a second ': ' on one line: a value that holds ': ' goes in quotes (key: 'a: b'), and a "
                "key of its own goes on its own line",
                line,
                col,
            )
        return YamlSyntax(
            "a ':' YAML cannot place here: check this line's indentation, and quote a value that holds ': '",
            line,
            col,
        )
    if problem.startswith("expected <block end>, but found") and line:
        found = problem.removeprefix("expected <block end>, but found").strip()
        prev = before(line)
        above = _indent(src(prev)) if prev is not None else 0
        if found in ("'<block mapping start>'", "'<block sequence start>'"):
            what = "list item" if "sequence" in found else "line"
            n = _indent(here)
            return YamlSyntax(
                f"this {what} is indented {n} space{'s' if n != 1 else ''}, which lines up with nothing "
                f"above it (the line above has {above}): indent it exactly like the keys or items it "
                f"belongs with",
                line,
                _indent(here) + 1,
            )
        if found == "'-'":
            return YamlSyntax(
                "a list item ('- ') among keys: a section holds either keys or list items; put the list "
                "under a key of its own, indented",
                line,
                col,
            )
        if found == "'<scalar>'" and col and col > 1 and here[: col - 1].rstrip()[-1:] in ("'", '"'):
            return YamlSyntax(
                "text after the closing quote of a value: quote the whole value (a quote inside 'single "
                "quotes' is written twice: 'it''s')",
                line,
                col,
            )
        return YamlSyntax(
            "this line does not fit the structure above it: check its indentation (keys of one section "
            "line up; a list's '- ' items line up)",
            line,
            _indent(here) + 1,
        )
    if problem == "found character '\\t' that cannot start any token":
        return YamlSyntax(
            "a tab character: YAML indents with spaces only; replace the tab with spaces", line, col
        )
    if m := re.match(r"found character '(.+)' that cannot start any token", problem):
        return YamlSyntax(
            f"a value cannot start with {m.group(1)!r} in YAML: put the value in quotes", line, col
        )
    if problem == "could not find expected ':'" and cm:
        key = src(ctx_line).strip()
        return YamlSyntax(
            f"'{key}' has no ':' after it: a key is written 'key: value', or 'key:' with its values on the "
            f"indented lines below",
            ctx_line,
            ctx_col,
        )
    if problem == "found unexpected end of stream" and "quoted scalar" in context:
        quote = src(ctx_line)[ctx_col - 1 : ctx_col] or "'"
        return YamlSyntax(
            f"the quote ({quote}) that opens this value is never closed: add the closing {quote}",
            ctx_line,
            ctx_col,
        )
    if m := re.match(r"found unknown escape character '(.*)'", problem):
        return YamlSyntax(
            f"'\\{m.group(1)}' is not an escape YAML knows inside \"double quotes\": write \\\\ for a "
            f"backslash, or use 'single quotes' (a backslash is an ordinary character there)",
            line,
            col,
        )
    if context in ("while parsing a flow sequence", "while parsing a flow mapping"):
        opening, closing = ("[", "]") if "sequence" in context else ("{", "}")
        return YamlSyntax(
            f"the '{opening}' opened here is never closed with '{closing}' (the items between them are "
            f"separated by commas)",
            ctx_line,
            ctx_col,
        )
    if problem in ("sequence entries are not allowed here", "block sequence entries are not allowed here"):
        return YamlSyntax(
            "a list item ('- ') cannot follow a key on the same line: start the list on the next line, "
            "indented, or write it as [a, b]",
            line,
            col,
        )
    if m := re.match(r"found undefined alias '(.*)'", problem):
        return YamlSyntax(
            f"*{m.group(1)} names no anchor (&{m.group(1)}) defined above it: define the anchor first, or "
            f"quote the value if the '*' is meant literally",
            line,
            col,
        )
    if m := re.match(r"found duplicate anchor '(.*)'", context):
        return YamlSyntax(
            f"the anchor &{m.group(1)} is defined twice (first on line {ctx_line}): give each anchor its "
            f"own name",
            line,
            col,
        )
    if problem == "but found another document":
        return YamlSyntax(
            "a second YAML document starts here ('---'): a config is one document; remove the '---' line "
            "and keep the keys in one place",
            line,
            col,
        )
    if m := re.match(r"could not determine a constructor for the tag '(.*)'", problem):
        tag = m.group(1).replace("tag:yaml.org,2002:", "!!")
        return YamlSyntax(
            f"the tag {tag} is not read: nbtrain reads plain YAML (keys, text, numbers, lists), never "
            f"objects; remove the tag",
            line,
            col,
        )
    if problem.startswith("expected chomping or indentation indicators"):
        return YamlSyntax(
            "after '|' or '>' (a block of text) the text starts on the next line, indented", line, col
        )
    what = re.sub(r"'?<([a-z ]+)>'?", r"\1", problem)  # "<block end>" -> "block end"
    return YamlSyntax(f"YAML cannot read this: {what}" + (f" ({context})" if context else ""), line, col)


def load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)`` within the bounds above; raises ``YamlLimit``, ``YamlSyntax`` or
    ``DuplicateKeys`` (all ``YamlProblem``)."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_BYTES:
        raise YamlLimit(
            f"the document is {size / 2**20:.1f} MiB; nbtrain reads at most {MAX_BYTES / 2**20:g} MiB of "
            f"YAML (a config is a page of keys: put rows in data files and point data: train: at them)"
        )
    try:
        loader = _Loader(text)
    except yaml.YAMLError as e:  # the reader checks the characters first
        raise _plain(e, text) from None
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise YamlLimit("the YAML is nested too deeply to read (hundreds of levels)") from None
        if node is None:
            return None
        _check_expansion(node)
        duplicates = _duplicates(loader, node)
        if duplicates:
            raise DuplicateKeys(duplicates)
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        raise _plain(e, text) from None
    finally:
        loader.dispose()


__all__ = [
    "MAX_BYTES",
    "MAX_VALUES",
    "DuplicateKey",
    "DuplicateKeys",
    "YamlLimit",
    "YamlProblem",
    "YamlSyntax",
    "load_yaml",
]

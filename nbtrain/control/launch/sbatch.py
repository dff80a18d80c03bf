"""How sbatch reads the ``#SBATCH`` lines of a script, and how to write a value it reads back as written.

sbatch (SLURM 22.05, ``src/sbatch/opt.c`` and ``src/common/slurm_opt.c``) splits the rest of every
``#SBATCH`` line into words -- whitespace between words, ``"..."`` and ``'...'`` group, a backslash escapes
the next character, an unescaped ``#`` ends the line -- joins the words of all the lines into one argument
list and reads it with ``getopt_long`` (POSIX mode): ``--name=value`` or ``--name value``, a long name
abbreviated to any unambiguous prefix (``--part=big``), short options with their value attached or in the
next word (``-pbig``, ``-p big``; ``-p=big`` gives ``=big``), several short flags in one word (``-Qpbig``),
and a value taken from the next word even when it starts with ``-``. For the same option, the later one wins.

``directives`` reads the options a list of lines gives the way sbatch does, so a check sees what sbatch
will see (nbtrain.control.config.preset checks ``slurm: extra:`` with it under a course preset); ``value``
and ``output_path`` write what sbatch reads back unchanged (the run directory in ``--output=``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NO, REQUIRED, OPTIONAL = "no", "required", "optional"

# sbatch's options in SLURM 22.05 (slurm_opt.c's common_options that sbatch takes): long name -> (argument,
# short letter). tasks-per-node is ntasks-per-node's other name; tres-per-task is 23.02's, listed so that
# its meaning is known where a newer sbatch reads the script.
OPTIONS: dict[str, tuple[str, str]] = {
    "account": (REQUIRED, "A"), "acctg-freq": (REQUIRED, ""), "array": (REQUIRED, "a"),
    "batch": (REQUIRED, ""), "begin": (REQUIRED, "b"), "bb": (REQUIRED, ""), "bbf": (REQUIRED, ""),
    "cluster-constraint": (REQUIRED, ""), "chdir": (REQUIRED, "D"), "cluster": (REQUIRED, ""),
    "clusters": (REQUIRED, "M"), "comment": (REQUIRED, ""), "container": (REQUIRED, ""),
    "context": (REQUIRED, ""), "contiguous": (NO, ""), "constraint": (REQUIRED, "C"),
    "core-spec": (REQUIRED, "S"), "cores-per-socket": (REQUIRED, ""), "cpu-freq": (REQUIRED, ""),
    "cpus-per-gpu": (REQUIRED, ""), "cpus-per-task": (REQUIRED, "c"), "deadline": (REQUIRED, ""),
    "delay-boot": (REQUIRED, ""), "dependency": (REQUIRED, "d"), "distribution": (REQUIRED, "m"),
    "error": (REQUIRED, "e"), "exclude": (REQUIRED, "x"), "exclusive": (OPTIONAL, ""),
    "export": (REQUIRED, ""), "export-file": (REQUIRED, ""), "extra-node-info": (REQUIRED, "B"),
    "get-user-env": (OPTIONAL, ""), "gid": (REQUIRED, ""), "gpu-bind": (REQUIRED, ""),
    "gpu-freq": (REQUIRED, ""), "gpus": (REQUIRED, "G"), "gpus-per-node": (REQUIRED, ""),
    "gpus-per-socket": (REQUIRED, ""), "gpus-per-task": (REQUIRED, ""), "gres": (REQUIRED, ""),
    "gres-flags": (REQUIRED, ""), "help": (NO, "h"), "hint": (REQUIRED, ""), "hold": (NO, "H"),
    "ignore-pbs": (NO, ""), "input": (REQUIRED, "i"), "job-name": (REQUIRED, "J"),
    "kill-on-invalid-dep": (REQUIRED, ""), "licenses": (REQUIRED, "L"), "mail-type": (REQUIRED, ""),
    "mail-user": (REQUIRED, ""), "mcs-label": (REQUIRED, ""), "mem": (REQUIRED, ""),
    "mem-bind": (REQUIRED, ""), "mem-per-cpu": (REQUIRED, ""), "mem-per-gpu": (REQUIRED, ""),
    "mincpus": (REQUIRED, ""), "network": (REQUIRED, ""), "nice": (OPTIONAL, ""), "no-kill": (OPTIONAL, "k"),
    "no-requeue": (NO, ""), "nodefile": (REQUIRED, "F"), "nodelist": (REQUIRED, "w"),
    "nodes": (REQUIRED, "N"),
    "ntasks": (REQUIRED, "n"), "ntasks-per-core": (REQUIRED, ""), "ntasks-per-gpu": (REQUIRED, ""),
    "ntasks-per-node": (REQUIRED, ""), "ntasks-per-socket": (REQUIRED, ""), "ntasks-per-tres": (REQUIRED, ""),
    "open-mode": (REQUIRED, ""), "output": (REQUIRED, "o"), "overcommit": (NO, "O"),
    "oversubscribe": (NO, "s"), "parsable": (NO, ""), "partition": (REQUIRED, "p"), "power": (REQUIRED, ""),
    "prefer": (REQUIRED, ""), "priority": (REQUIRED, ""), "profile": (REQUIRED, ""),
    "propagate": (OPTIONAL, ""), "qos": (REQUIRED, "q"), "quiet": (NO, "Q"), "reboot": (NO, ""),
    "requeue": (NO, ""), "reservation": (REQUIRED, ""), "signal": (REQUIRED, ""),
    "sockets-per-node": (REQUIRED, ""), "spread-job": (NO, ""), "switches": (REQUIRED, ""),
    "tasks-per-node": (REQUIRED, ""), "test-only": (NO, ""), "thread-spec": (REQUIRED, ""),
    "threads-per-core": (REQUIRED, ""), "time": (REQUIRED, "t"), "time-min": (REQUIRED, ""),
    "tmp": (REQUIRED, ""), "tres-per-task": (REQUIRED, ""), "uid": (REQUIRED, ""), "use-min-nodes": (NO, ""),
    "verbose": (NO, "v"), "version": (NO, "V"), "usage": (NO, ""), "wait": (NO, "W"),
    "wait-all-nodes": (REQUIRED, ""), "wckey": (REQUIRED, ""), "wrap": (REQUIRED, ""),
}  # fmt: skip
ALIASES = {"tasks-per-node": "ntasks-per-node"}
SHORT = {letter: name for name, (_, letter) in OPTIONS.items() if letter}


@dataclass(frozen=True)
class Directive:
    """One option sbatch reads: ``name`` its long name (an alias under its own name), ``value`` what it
    is set to (None: a flag), ``line`` the index of the line it came from, ``spelled`` how it was written.
    ``name`` is "" for a word sbatch does not take as an option (``spelled`` says which; sbatch refuses
    the script), ``candidates`` the options an ambiguous abbreviation could mean (sbatch refuses it too)."""

    name: str
    value: str | None
    line: int
    spelled: str
    candidates: tuple[str, ...] = ()


def words(line: str) -> list[str]:
    """The words sbatch reads from the rest of one ``#SBATCH`` line (its ``get_argument``); an unmatched
    quote keeps the rest of the line as one word (sbatch refuses such a line)."""
    out: list[str] = []
    i, n = 0, len(line)
    while i < n:
        while i < n and line[i].isspace():
            i += 1
        for sep in ("packjob", "hetjob"):  # a heterogeneous job's separator word is dropped from the line
            end = i + len(sep)
            if line[i:end].lower() == sep and (end == n or line[end].isspace()):
                i = end
        if i >= n:
            break
        word: list[str] = []
        quote, escaped = "", False
        while i < n and (quote or not line[i].isspace()):  # an escaped space ends the word too, as there
            c = line[i]
            i += 1
            if escaped:
                escaped = False
                word.append(c)
            elif c == "\\":
                escaped = True
            elif quote:
                if c == quote:
                    quote = ""
                else:
                    word.append(c)
            elif c in "\"'":
                quote = c
            elif c == "#":
                return out + (["".join(word)] if word else [])
            else:
                word.append(c)
        if word:  # ("" ends the line's reading there; the words after it are read too, to be safe)
            out.append("".join(word))
    return out


def _long(name: str) -> tuple[str, ...]:
    """The options a long name given as ``name`` means: itself, else those it is a prefix of."""
    if name in OPTIONS:
        return (name,)
    found = tuple(o for o in OPTIONS if o.startswith(name))
    same = {(ALIASES.get(o, o), OPTIONS[o][0]) for o in found}
    return found[:1] if len(same) == 1 else found  # glibc: one meaning under several names is no ambiguity


def directives(lines: list[str]) -> list[Directive]:
    """The options ``lines`` (each the text after ``#SBATCH``) give sbatch, in order, read as getopt_long
    reads them. Words sbatch would refuse are kept as directives with no ``name`` and the reading goes
    on after them, so a check sees every option any reading could give."""
    argv = [(w, k) for k, line in enumerate(lines) for w in words(line)]
    out: list[Directive] = []
    i = 0
    while i < len(argv):
        word, k = argv[i]
        i += 1
        if word == "--":  # getopt's end of options: what follows is no option (sbatch refuses the script)
            continue
        if word.startswith("--"):
            given, eq, attached = word[2:].partition("=")
            found = _long(given)
            if not found:
                out.append(Directive("", None, k, word))
                continue
            has_arg = OPTIONS[found[0]][0] if len(found) == 1 else REQUIRED
            value: str | None = attached if eq else None
            if not eq and has_arg == REQUIRED and i < len(argv):
                value, i = argv[i][0], i + 1
            spelled = word if eq or has_arg != REQUIRED else f"{word} {value}"
            if len(found) > 1:
                out.append(Directive("", value, k, spelled, tuple(ALIASES.get(o, o) for o in found)))
            else:
                out.append(Directive(ALIASES.get(found[0], found[0]), value, k, spelled))
            continue
        if not word.startswith("-") or word == "-":
            out.append(Directive("", None, k, word))
            continue
        j = 1
        while j < len(word):  # short options, several flags in one word
            letter = word[j]
            name = SHORT.get(letter)
            j += 1
            if name is None:
                out.append(Directive("", None, k, f"-{letter}"))
                continue
            has_arg = OPTIONS[name][0]
            if has_arg == NO:
                out.append(Directive(name, None, k, f"-{letter}"))
                continue
            if j < len(word):  # the rest of the word is its value ("-pbig", "-p=big" gives "=big")
                out.append(Directive(name, word[j:], k, f"-{letter}{word[j:]}"))
            elif has_arg == REQUIRED and i < len(argv):
                out.append(Directive(name, argv[i][0], k, f"-{letter} {argv[i][0]}"))
                i += 1
            else:
                out.append(Directive(name, None, k, f"-{letter}"))
            break
    return out


class Unwritable(ValueError):
    """A value no ``#SBATCH`` line can carry as it is."""


def value(text: str) -> str:
    """``text`` as one word of an ``#SBATCH`` line that sbatch reads back as ``text``: as it is when
    nothing in it means something to sbatch, else in double quotes with ``\\`` and ``"`` escaped (a space,
    ``#`` or quote in a path no longer splits or ends it)."""
    if "\n" in text or "\r" in text or "\0" in text:
        raise Unwritable(f"{text!r} holds a line break or NUL, which an #SBATCH line cannot carry")
    if text and not any(c.isspace() or c in "\"'\\#" for c in text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def output_path(path: str, pattern: str) -> str:
    """``path`` (a folder and file name, taken literally) followed by SLURM's filename ``pattern`` (such as
    ``%j``), as ``--output=`` takes it: ``%`` doubled so SLURM keeps it. SLURM drops every backslash of an
    output path and then expands nothing, so a path with one cannot be written."""
    if "\\" in path:
        raise Unwritable(f"{path!r} holds a backslash, which SLURM removes from an output path")
    return value(path.replace("%", "%%") + pattern)


__all__ = ["OPTIONS", "Directive", "Unwritable", "directives", "output_path", "value", "words"]


def slurm_seconds(text: str) -> int | None:
    """A SLURM time ("30", "30:00", "1:30:00", "2-12", "2-12:30", "2-12:30:00") in seconds; None if not."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if m is None:
        return None
    days, a, b, c = (int(x) if x else None for x in m.groups())
    if days is not None:  # D-H, D-H:M, D-H:M:S
        return days * 86400 + (a or 0) * 3600 + (b or 0) * 60 + (c or 0)
    if c is not None:  # H:M:S
        return (a or 0) * 3600 + (b or 0) * 60 + c
    if b is not None:  # M:S
        return (a or 0) * 60 + b
    return (a or 0) * 60  # M

"""A C++ token scanner that keeps every byte it does not rewrite.

The front ends rewrite a handful of tokens (address spaces, swizzles) and must
leave line numbers and everything else exactly as the user wrote them, so a
compiler's diagnostics still point at the user's lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<comment>//[^\n]*|/\*.*?\*/)
  | (?P<string>[uUL]?8?R"(?P<delim>[^(\s]*)\(.*?\)(?P=delim)"|[uUL]?8?"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')
  | (?P<pp>\#(?:\\.|[^\\\n])*)  # continuation lines (backslash-newline) included
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<number>\.?[0-9](?:[eEpP][+-]|[A-Za-z0-9_.'])*)
  | (?P<punct>::|->|\[\[|\]\]|<<=|>>=|[-+*/%&|^!=<>]=|&&|\|\||\+\+|--|<<|>>|.)
""", re.VERBOSE | re.DOTALL)


@dataclass
class Token:
    kind: str  # ws | comment | string | pp | ident | number | punct
    text: str


def tokenize(source: str) -> list[Token]:
    tokens, pos = [], 0
    while pos < len(source):
        m = _TOKEN.match(source, pos)
        kind = m.lastgroup if m.lastgroup != "delim" else "string"
        tokens.append(Token(kind, m.group()))
        pos = m.end()
    return tokens


def identifiers(source: str) -> set[str]:
    """Identifiers the source mentions outside comments and strings (preprocessor lines included)."""
    found = set()
    for t in tokenize(source):
        if t.kind == "ident":
            found.add(t.text)
        elif t.kind == "pp":
            found.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", t.text))
    return found


def untokenize(tokens: list[Token]) -> str:
    return "".join(t.text for t in tokens)

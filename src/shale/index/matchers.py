"""Label matchers in Prometheus syntax: ``{topic="app", level=~"ERROR|WARN", host!="db1", dt!~"2024-.*"}``.

Regular expressions run on RE2 (the engine Prometheus uses, through Go's regexp): matching takes time linear in
the value, so no selector can pin the metastore's CPU with catastrophic backtracking, and the syntax is
Prometheus's (no backreferences or lookarounds). As in Prometheus 3, a regex is fully anchored and ``.`` also
matches a newline: ``x=~"v"`` means the whole value matches ``(?s:v)``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import re2

from shale.block import MORE_LABEL_SETS, check_label_name
from shale.errors import InvalidNameError

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a bad pattern is the caller's error, answered as such; not a line on stderr
_SELECTOR = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')


@dataclass(frozen=True)
class Matcher:
    name: str
    op: str  # "=", "!=", "=~", "!~"
    value: str
    _regex: Any = field(default=None, compare=False, repr=False)  # a compiled RE2 pattern (re2 has no types)

    @classmethod
    def of(cls, name: str, op: str, value: str) -> Matcher:
        check_label_name(name)
        if op not in ("=", "!=", "=~", "!~"):
            raise InvalidNameError(f"matcher operator {op!r} is not one of =, !=, =~, !~")
        regex = None
        if op in ("=~", "!~"):
            try:
                regex = re2.compile(f"(?s:{value})", options=_RE2_OPTIONS)
            except re2.error as exc:
                detail = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) \
                    else str(exc)
                raise InvalidNameError(f"{name}{op}{value!r}: not a valid regular expression ({detail}); the "
                                       "syntax is RE2's, as in Prometheus") from None
        return cls(name, op, value, regex)

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Prometheus semantics: a missing label has the value "" (so ``x!="a"`` matches when x is absent)."""
        actual = labels.get(self.name, "")
        if self.op == "=":
            return actual == self.value
        if self.op == "!=":
            return actual != self.value
        assert self._regex is not None
        hit = self._regex.fullmatch(actual) is not None
        return hit if self.op == "=~" else not hit

    def __str__(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"')
        return f'{self.name}{self.op}"{escaped}"'


def parse_matchers(text: str) -> list[Matcher]:
    """Parse a selector ``{a="b", c=~"d.*"}`` (the braces are optional; empty means no matchers)."""
    body = text.strip()
    if body.startswith("{"):
        if not body.endswith("}"):
            raise InvalidNameError(f"selector {text!r} opens with '{{' but does not close with '}}'")
        body = body[1:-1]
    matchers: list[Matcher] = []
    pos = 0
    body = body.strip()
    while pos < len(body):
        match = _SELECTOR.match(body, pos)
        if match is None:
            raise InvalidNameError(
                f"cannot parse selector {text!r} at {body[pos:]!r}; write it like "
                '{topic="app", level=~"ERROR|WARN"}')
        value = re.sub(r"\\(.)", r"\1", match.group(3))
        matchers.append(Matcher.of(match.group(1), match.group(2), value))
        pos = match.end()
    return matchers


def match_label_sets(label_sets: Sequence[Mapping[str, str]], matchers: Sequence[Matcher]) -> bool:
    """Does any label set satisfy every matcher? With no matchers, everything matches. A "more" set (a dataset
    with more label sets than its block keeps: ``shale.block.names.MORE_LABEL_SETS``) satisfies any matcher on a
    label it does not hold: the rows it stands for may have any value there."""
    if not matchers:
        return True
    return any(all(m.matches(ls) or (MORE_LABEL_SETS in ls and m.name not in ls) for m in matchers)
               for ls in label_sets)


def matching_datasets(datasets: Iterable[tuple[int, int, Sequence[Mapping[str, str]]]], start: int, end: int,
                      matchers: Sequence[Matcher]) -> list[int]:
    """Dataset pruning, the one rule every block source applies: the positions of the datasets, given as
    (min_time, max_time, label sets with the implicit ``topic``, ``kind`` and ``group`` labels), whose data time
    overlaps ``[start, end]`` (ms, inclusive) and whose labels match."""
    return [i for i, (low, high, sets) in enumerate(datasets)
            if high >= start and low <= end and match_label_sets(sets, matchers)]

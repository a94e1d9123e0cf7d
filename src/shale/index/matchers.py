"""Label matchers in Prometheus syntax: ``{topic="app", level=~"ERROR|WARN", host!="db1", dt!~"2024-.*"}``."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from shale.block.names import check_label_name
from shale.errors import InvalidNameError

_SELECTOR = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')


@dataclass(frozen=True)
class Matcher:
    name: str
    op: str  # "=", "!=", "=~", "!~"
    value: str
    _regex: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, name: str, op: str, value: str) -> Matcher:
        check_label_name(name)
        if op not in ("=", "!=", "=~", "!~"):
            raise InvalidNameError(f"matcher operator {op!r} is not one of =, !=, =~, !~")
        regex = None
        if op in ("=~", "!~"):
            try:
                regex = re.compile(f"(?:{value})")
            except re.error as exc:
                raise InvalidNameError(f"{name}{op}{value!r}: not a valid regular expression ({exc})") from None
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
    """Does any label set satisfy every matcher? With no matchers, everything matches."""
    if not matchers:
        return True
    return any(all(m.matches(ls) for m in matchers) for ls in label_sets)

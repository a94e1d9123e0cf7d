"""A small evaluator of Prometheus expressions, for testing Shale's alert rules against scraped metrics.

promql-parser (PyPI) parses the expression; this module evaluates the subset the rules use, with Prometheus's
semantics: instant and range selectors over a series store filled by scrapes, rate/increase/delta/time and the
*_over_time functions, sum/max/min/avg/count with by/without, arithmetic and comparison operators (filtering),
and/or/unless, and vector matching with on()/ignoring() and group_left/group_right.
"""

from __future__ import annotations

import itertools
import math
import operator
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import promql_parser as pp
from prometheus_client.parser import text_string_to_metric_families

Labels = frozenset[tuple[str, str]]
Vector = dict[Labels, float]
LOOKBACK = 300.0


@dataclass
class SeriesStore:
    samples: dict[Labels, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))

    def scrape(self, text: str, at: float, extra: dict[str, str] | None = None) -> None:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = {**sample.labels, **(extra or {}), "__name__": sample.name}
                self.samples[frozenset(labels.items())].append((at, float(sample.value)))


def _matches(matcher: pp.Matcher, labels: dict[str, str]) -> bool:
    value = labels.get(matcher.name, "")
    op = str(matcher.op)
    if op.endswith("Equal") and "Not" not in op:
        return value == matcher.value
    if op.endswith("NotEqual"):
        return value != matcher.value
    hit = re.fullmatch(matcher.value, value) is not None
    return hit if "NotRe" not in op else not hit


def _select(store: SeriesStore, selector: pp.VectorSelector) -> list[tuple[Labels, list[tuple[float, float]]]]:
    out = []
    for labels, points in store.samples.items():
        as_dict = dict(labels)
        if selector.name and as_dict.get("__name__") != selector.name:
            continue
        if all(_matches(m, as_dict) for m in selector.matchers.matchers):
            out.append((labels, points))
    return out


def _drop_name(labels: Labels) -> Labels:
    return frozenset((k, v) for k, v in labels if k != "__name__")


ARITH: dict[str, Callable[[float, float], float]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul,
    "/": lambda a, b: a / b if b else math.copysign(math.inf, a) if a else math.nan}
COMPARE: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt, "<": operator.lt, ">=": operator.ge, "<=": operator.le, "==": operator.eq, "!=": operator.ne}


class Evaluator:
    def __init__(self, store: SeriesStore, at: float) -> None:
        self.store = store
        self.at = at

    def eval(self, expr: object) -> Vector | float:
        if isinstance(expr, pp.NumberLiteral):
            return float(expr.val)
        if isinstance(expr, pp.ParenExpr):
            return self.eval(expr.expr)
        if isinstance(expr, pp.UnaryExpr):
            value = self.eval(expr.expr)
            return -value if isinstance(value, float) else {k: -v for k, v in value.items()}
        if isinstance(expr, pp.VectorSelector):
            out: Vector = {}
            for labels, points in _select(self.store, expr):
                recent = [(t, v) for t, v in points if self.at - LOOKBACK <= t <= self.at]
                if recent:
                    out[labels] = recent[-1][1]
            return out
        if isinstance(expr, pp.Call):
            return self._call(expr)
        if isinstance(expr, pp.AggregateExpr):
            return self._aggregate(expr)
        if isinstance(expr, pp.BinaryExpr):
            return self._binary(expr)
        raise NotImplementedError(f"expression {type(expr).__name__} is not supported: {expr}")

    def _range(self, expr: pp.MatrixSelector) -> list[tuple[Labels, list[tuple[float, float]]]]:
        window = expr.range.total_seconds()
        return [(labels, [(t, v) for t, v in points if self.at - window <= t <= self.at])
                for labels, points in _select(self.store, expr.vector_selector)]

    def _call(self, call: pp.Call) -> Vector | float:
        name = call.func.name
        if name == "time":
            return float(self.at)
        series = self._range(call.args[0])
        out: Vector = {}
        for labels, points in series:
            if not points:
                continue
            values = [v for _, v in points]
            key = _drop_name(labels)
            if name in ("increase", "rate", "delta"):
                if len(points) < 2:
                    continue
                if name == "delta":
                    change = values[-1] - values[0]
                else:
                    change = sum(b - a if b >= a else b for a, b in itertools.pairwise(values))
                span = points[-1][0] - points[0][0]
                out[key] = change / span if name == "rate" and span else change
            elif name == "max_over_time":
                out[key] = max(values)
            elif name == "min_over_time":
                out[key] = min(values)
            elif name == "avg_over_time":
                out[key] = sum(values) / len(values)
            else:
                raise NotImplementedError(f"function {name} is not supported")
        return out

    def _aggregate(self, agg: pp.AggregateExpr) -> Vector:
        inner = self.eval(agg.expr)
        assert isinstance(inner, dict)
        groups: dict[Labels, list[float]] = defaultdict(list)
        names = set(agg.modifier.labels) if agg.modifier is not None else set()
        without = agg.modifier is not None and "Without" in str(agg.modifier.type)
        for labels, value in inner.items():
            kept = frozenset((k, v) for k, v in labels if k != "__name__" and ((k not in names) if without
                                                                             else (k in names)))
            groups[kept].append(value)
        fn = {"sum": sum, "max": max, "min": min, "count": len,
              "avg": lambda v: sum(v) / len(v)}[str(agg.op)]
        return {k: float(fn(v)) for k, v in groups.items()}

    def _key(self, labels: Labels, modifier: object) -> Labels:
        labels = _drop_name(labels)
        if modifier is None or modifier.matching is None:
            return labels
        names = set(modifier.matching.labels)
        if "Ignoring" in str(modifier.matching.type):
            return frozenset((k, v) for k, v in labels if k not in names)
        return frozenset((k, v) for k, v in labels if k in names)

    def _binary(self, expr: pp.BinaryExpr) -> Vector | float:
        op = str(expr.op)
        lhs, rhs = self.eval(expr.lhs), self.eval(expr.rhs)
        modifier = expr.modifier
        if op in ("and", "or", "unless"):
            assert isinstance(lhs, dict)
            assert isinstance(rhs, dict)
            right_keys = {self._key(k, modifier) for k in rhs}
            if op == "and":
                return {k: v for k, v in lhs.items() if self._key(k, modifier) in right_keys}
            if op == "unless":
                return {k: v for k, v in lhs.items() if self._key(k, modifier) not in right_keys}
            left_keys = {self._key(k, modifier) for k in lhs}
            return {**lhs, **{k: v for k, v in rhs.items() if self._key(k, modifier) not in left_keys}}
        apply = ARITH.get(op)
        compare = COMPARE.get(op)
        if isinstance(lhs, float) and isinstance(rhs, float):
            return apply(lhs, rhs) if apply else float(compare(lhs, rhs))  # type: ignore[misc]
        if isinstance(rhs, float) or isinstance(lhs, float):
            vector, scalar, vec_left = (lhs, rhs, True) if isinstance(rhs, float) else (rhs, lhs, False)
            assert isinstance(vector, dict)
            out: Vector = {}
            for k, v in vector.items():
                a, b = (v, scalar) if vec_left else (scalar, v)
                if apply:
                    out[_drop_name(k)] = apply(a, b)
                elif compare(a, b):  # type: ignore[misc]
                    out[k] = v
            return out
        assert isinstance(lhs, dict)
        assert isinstance(rhs, dict)
        group_right = modifier is not None and "OneToMany" in str(modifier.card)
        index: dict[Labels, tuple[Labels, float]] = {}
        one, many = (lhs, rhs) if group_right else (rhs, lhs)
        for k, v in one.items():
            index[self._key(k, modifier)] = (k, v)
        out = {}
        for k, v in many.items():
            match = index.get(self._key(k, modifier))
            if match is None:
                continue
            a, b = (v, match[1]) if many is lhs else (match[1], v)
            if apply:
                out[_drop_name(k)] = apply(a, b)
            elif compare(a, b):  # type: ignore[misc]
                out[k] = a
        return out


def evaluate(expression: str, store: SeriesStore, at: float) -> Vector:
    """The alerts an expression fires at ``at``: the output vector (a scalar result is not an alert)."""
    result = Evaluator(store, at).eval(pp.parse(expression))
    return result if isinstance(result, dict) else {}

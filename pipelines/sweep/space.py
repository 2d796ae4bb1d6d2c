"""The search space of a sweep (:mod:`pipelines.sweep`): ``--search KEY=KIND(ARGS)`` parsed and
checked against the experiment's config schema, then turned into Ray Tune domains.

Syntax (one ``--search`` per key; ``KEY`` a dotted config key of the experiment's schema)::

    optimizer.lr=loguniform(1e-3,1e-1)     # float, log-uniform on [low, high), 0 < low < high
    sst.output_dropout=uniform(0.2,0.6)    # float, uniform on [low, high), low < high
    sst.state_size=randint(64,301)         # int, uniform on low..high-1 (Ray Tune: upper bound excluded)
    sst.state_size=choice(100,150,300)     # one of the values, drawn at random per sample
    optimizer.name=grid(adagrad,adam)      # every value, in order, for each sample (Ray Tune grid_search)

Values are read as YAML scalars (``1e-3``, ``true``, ``adam``) and each must pass the key's
:class:`pipelines.config.Field` check (type, bounds, choices); a bad spec raises
:class:`pipelines.config.ConfigError` naming the key, the value and the spec as given.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import re
from typing import Any, Mapping, Sequence

import yaml

from pipelines.config import ConfigError, Field

__all__ = ["KINDS", "SearchSpec", "parse_search", "parse_searches", "param_space"]

#: The distributions ``--search`` accepts.
KINDS = ("loguniform", "uniform", "randint", "choice", "grid")
_SOURCE = "--search"
_SPEC = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*=\s*([A-Za-z_]+)\s*\((.*)\)\s*$", re.S)


@dataclasses.dataclass(frozen=True)
class SearchSpec:
    """One searched key: ``kind`` (one of :data:`KINDS`) over ``values`` (``(low, high)`` for
    the ranges, the listed values for ``choice`` / ``grid``); ``text``: the spec as given."""

    key: str
    kind: str
    values: tuple
    text: str

    def domain(self) -> Any:
        """The Ray Tune search domain (``tune.loguniform`` ... ``tune.grid_search``)."""
        from ray import tune

        if self.kind == "loguniform":
            return tune.loguniform(*self.values)
        if self.kind == "uniform":
            return tune.uniform(*self.values)
        if self.kind == "randint":
            return tune.randint(*self.values)
        if self.kind == "choice":
            return tune.choice(list(self.values))
        return tune.grid_search(list(self.values))

    def to_json(self) -> dict:
        return {"key": self.key, "kind": self.kind, "values": list(self.values), "text": self.text}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "SearchSpec":
        return cls(d["key"], d["kind"], tuple(d["values"]), d["text"])


def _split_args(raw: str) -> list[str]:
    """``"1e-3, 1e-1"`` -> ``["1e-3", "1e-1"]`` (commas inside brackets/quotes kept)."""
    out, depth, quote, cur = [], 0, None, []
    for c in raw:
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "[{(":
            depth += 1
        elif c in "]})":
            depth -= 1
        elif c == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
            continue
        cur.append(c)
    last = "".join(cur).strip()
    if last or out:
        out.append(last)
    return out


def _value(key: str, raw: str, field: Field, src: str) -> Any:
    if raw == "":
        raise ConfigError("empty value", key, src)
    try:
        v = yaml.safe_load(raw)
    except yaml.YAMLError:
        raise ConfigError(f"cannot read value {raw!r}", key, src) from None
    if field.type is str and v is not None:
        v = raw.strip("'\"")
    return field.check(key, v, src)


def parse_search(text: str, schema: Mapping[str, Field]) -> SearchSpec:
    """``"optimizer.lr=loguniform(1e-3,1e-1)"`` -> :class:`SearchSpec`, checked against ``schema``
    (a merged experiment schema); :class:`ConfigError` naming the key and value otherwise."""
    m = _SPEC.match(text)
    if not m:
        raise ConfigError(f"{text!r} is not KEY=KIND(ARGS), e.g. optimizer.lr=loguniform(1e-3,1e-1); "
                          f"KIND is one of {', '.join(KINDS)}", source=_SOURCE)
    key, kind, raw = m.group(1), m.group(2), m.group(3)
    src = f"{_SOURCE} {text.strip()!r}"
    if key not in schema:
        near = difflib.get_close_matches(key, list(schema), n=1) or [
            k for k in schema if k.split(".")[-1] == key.split(".")[-1]]
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise ConfigError(f"unknown key{hint}", key, src)
    field = schema[key]
    if field.type is dict:
        raise ConfigError("a whole section cannot be searched; search its keys", key, src)
    if kind not in KINDS:
        raise ConfigError(f"unknown distribution {kind!r}; use one of {', '.join(KINDS)}", key, src)
    args = _split_args(raw)
    types = field.type if isinstance(field.type, tuple) else (field.type,)
    if kind in ("loguniform", "uniform", "randint"):
        if len(args) != 2:
            raise ConfigError(f"{kind} takes two bounds (low, high), got {len(args)}", key, src)
        want = int if kind == "randint" else float
        if want not in types:
            raise ConfigError(f"{kind} draws {want.__name__}s but the key takes "
                              f"{'/'.join(t.__name__ for t in types)}; use choice(...) or grid(...)",
                              key, src)
        low, high = (_value(key, a, field, src) for a in args)
        if not low < high:
            raise ConfigError(f"low {low!r} must be below high {high!r}", key, src)
        if kind == "loguniform" and not low > 0:
            raise ConfigError(f"loguniform needs 0 < low, got {low!r}", key, src)
        if kind != "randint" and not (math.isfinite(low) and math.isfinite(high)):
            raise ConfigError("bounds must be finite", key, src)
        return SearchSpec(key, kind, (low, high), text.strip())
    if not args:
        raise ConfigError(f"{kind} needs at least one value", key, src)
    values = tuple(_value(key, a, field, src) for a in args)
    dup = [v for i, v in enumerate(values) if v in values[:i]]
    if dup:
        raise ConfigError(f"value {dup[0]!r} is listed twice", key, src)
    return SearchSpec(key, kind, values, text.strip())


def parse_searches(texts: Sequence[str], schema: Mapping[str, Field], fixed: Sequence[str] = ()) -> list[SearchSpec]:
    """Every ``--search`` spec parsed; a key searched twice, or one in ``fixed`` (keys the sweep
    sets itself, e.g. ``seed`` under ``--seeds``), is a :class:`ConfigError`."""
    specs: list[SearchSpec] = []
    for t in texts:
        s = parse_search(t, schema)
        o = next((o for o in specs if o.key == s.key), None)
        if o is not None:
            raise ConfigError(f"searched twice ({o.text!r} and {s.text!r})", s.key, _SOURCE)
        if s.key in fixed:
            raise ConfigError(f"set by the sweep itself ({s.text!r}); drop it or the option that sets it", s.key,
                              _SOURCE)
        specs.append(s)
    return specs


def param_space(specs: Sequence[SearchSpec], seeds: Sequence[int] = ()) -> dict[str, Any]:
    """The Tuner's ``param_space``: dotted key -> Tune domain, plus ``seed`` as a grid over
    ``seeds`` when given."""
    from ray import tune

    space = {s.key: s.domain() for s in specs}
    if seeds:
        space["seed"] = tune.grid_search(list(seeds))
    return space

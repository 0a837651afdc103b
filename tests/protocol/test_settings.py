"""protocol.settings: the config validator every layer shares (pydantic models, errors naming the key)."""
from __future__ import annotations

from typing import Literal

import pytest
from pydantic import AliasChoices, Field, ValidationError, field_validator, model_validator

from protocol.settings import Invalid, Settings, parse_env


class Rule(Settings):
    kind: Literal["a", "b"]
    value: int = Field(ge=1)


class Inner(Settings):
    n: int = Field(5, ge=1, le=10)
    share: float = Field(0.5, gt=0, le=1)
    name: str | None = Field(None, validation_alias=AliasChoices("name", "alias"))
    rules: list[Rule] = Field(default_factory=list)

    @field_validator("rules", mode="before")
    @classmethod
    def _one_or_many(cls, v):
        return [v] if isinstance(v, dict) else v


class Outer(Settings):
    inner: Inner = Field(default_factory=Inner)
    lo: float = Field(1.0, ge=0.05, le=86_400.0)
    hi: float = 2.0

    @model_validator(mode="after")
    def _ordered(self):
        if self.lo >= self.hi:
            raise Invalid("must be less than hi", "lo")
        return self


@pytest.mark.parametrize("d, key, message", [
    ({"inner": {"n": "x"}}, "inner.n", "expected an integer in 1..10, got 'x'"),
    ({"inner": {"n": True}}, "inner.n", "expected an integer in 1..10, got True"),
    ({"inner": {"n": 1.0}}, "inner.n", "expected an integer in 1..10, got 1.0"),
    ({"inner": {"n": 11}}, "inner.n", "expected a value in 1..10, got 11"),
    ({"inner": {"share": 0}}, "inner.share", "expected a value in (0, 1], got 0"),
    ({"lo": "soon"}, "lo", "expected a number in 0.05..86400, got 'soon'"),
    ({"inner": {"nn": 1}}, "inner.nn", "unknown key (allowed: alias, n, name, rules, share)"),
    ({"inner": 3}, "inner", "expected a table, got 3"),
    ({"inner": {"alias": 3}}, "inner.alias", "expected a string, got 3"),
    ({"inner": {"rules": {"kind": "c", "value": 1}}}, "inner.rules.kind", "expected one of a, b, got 'c'"),
    ({"inner": {"rules": [{"kind": "a", "value": 1}, {"kind": "a"}]}}, "inner.rules[1].value", "missing"),
    ({"inner": {"rules": {"kind": "a", "value": 0}}}, "inner.rules.value", "expected a value >= 1, got 0"),
    ({"lo": 3}, "lo", "must be less than hi"),
])
def test_errors_name_the_key_as_written_and_what_was_expected(d, key, message):
    with pytest.raises(Invalid) as err:
        Outer.from_dict(d)
    assert (err.value.loc, err.value.message) == ((key,), message)


def test_defaults_and_direct_construction():
    assert Outer.from_dict({}) == Outer() and Outer().inner.n == 5
    assert Outer.from_dict({"lo": 1}).lo == 1.0 and isinstance(Outer.from_dict({"lo": 1}).lo, float)
    assert Inner.from_dict({"alias": "x"}).name == "x"
    with pytest.raises(ValidationError):       # built directly: pydantic's own error (a ValueError)
        Outer(lo=5)


def test_parse_env():
    assert (parse_env(" 7 ", int), parse_env("0.5", float), parse_env("Yes", bool), parse_env("", bool)) == \
        (7, 0.5, True, False)
    assert parse_env(" x ", str) == " x "
    for raw, typ, words in (("abc", int, "expected an integer, got 'abc'"), ("maybe", bool, "true or false"),
                            ("1,5", float, "expected a number")):
        with pytest.raises(Invalid, match=words):
            parse_env(raw, typ)

"""Hypothesis profiles for the protocol tests.

default: modest example counts so `make test` stays fast. long: many more examples, selected with
``--hypothesis-profile=long`` (``make fuzz``). NPLT_FUZZ=1 also selects "long".
"""
from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", max_examples=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    "long", max_examples=3000, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
if os.environ.get("NPLT_FUZZ"):
    settings.load_profile("long")
elif settings.get_current_profile_name() == "default":
    settings.load_profile("default")    # activate the re-registered default; keep any --hypothesis-profile

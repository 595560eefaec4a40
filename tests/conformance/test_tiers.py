"""The tier registry: every tier takes one `cases(ctx)`, and tier 1 reads `ctx.quick`."""
from __future__ import annotations

import pytest

from portkit import backends
from portkit.conformance import suite
from portkit.conformance.case import Context
from portkit.conformance.suite import Options


@pytest.mark.parametrize("number", sorted(suite.TIERS))
def test_every_tier_meets_the_protocol(number):
    module = suite.tier(number)
    assert isinstance(module, suite.Tier) and module.TIER == number


def _roundtrips(quick: bool) -> set[str]:
    ctx = Context(backends.load("interpreter").capabilities, quick=quick)
    cases, _ = suite.collect(ctx, Options(tiers=(1,), quick=quick))
    return {c.id for c in cases if c.id.startswith("runtime/roundtrip/")}


def test_the_full_run_round_trips_64_mib_and_the_quick_run_does_not():
    # Tier 1 once took `quick: bool` and was handed the (always true) Context: the full run
    # silently lost its largest round trip.
    assert f"runtime/roundtrip/{64 << 20}" in _roundtrips(quick=False)
    assert f"runtime/roundtrip/{64 << 20}" not in _roundtrips(quick=True)
    assert f"runtime/roundtrip/{1 << 20}" in _roundtrips(quick=True)


def test_a_tier_with_another_signature_is_refused(monkeypatch):
    from portkit.conformance import tier1_runtime

    monkeypatch.setattr(tier1_runtime, "cases", lambda quick: [])
    with pytest.raises(TypeError, match=r"cases\(quick\)"):
        suite.tier(1)

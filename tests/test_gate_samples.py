"""The sample table is well formed; tests/integration/test_opa_gate_live.py runs it live."""

from __future__ import annotations

from tests.gate_samples import ROUTING_ENGINE, VERDICTS, load_samples


def test_gate_samples_each_has_a_verdict_per_engine_kind() -> None:
    table = load_samples()
    assert table.samples
    for sample in table.samples:
        assert sample.refuse in VERDICTS and sample.route in VERDICTS, sample.name
        # Only the routing engine routes.
        assert sample.refuse != "routed", sample.name


def test_gate_samples_names_are_unique() -> None:
    names = [s.name for s in load_samples().samples]
    assert len(names) == len(set(names))


def test_gate_samples_cover_each_verdict_of_each_engine_kind() -> None:
    table = load_samples()
    assert {s.verdict("opa") for s in table.samples} == {"allowed", "refused"}
    assert {s.verdict(ROUTING_ENGINE) for s in table.samples} == set(VERDICTS)

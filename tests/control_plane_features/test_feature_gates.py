"""Feature gates a Kubernetes version knows, and how the list is read from Kubernetes sources."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.control_plane_features.feature_gates import (
    FIRST_VERSION,
    SOURCE,
    unknown_gate_problem,
)
from tools.feature_gates import SOURCES, gates

_KUBE = """
const (
	// owner: @someone
	InPlacePodVerticalScaling featuregate.Feature = "InPlacePodVerticalScaling"
	NewThing featuregate.Feature = "NewThing"
)

var defaultVersionedKubernetesFeatureGates = map[featuregate.Feature]featuregate.VersionedSpecs{
	InPlacePodVerticalScaling: {
		{Version: version.MustParse("1.27"), Default: false, PreRelease: featuregate.Alpha},
		{Version: version.MustParse("1.33"), Default: true, PreRelease: featuregate.Beta},
	},

	genericfeatures.WatchList: {
		// a comment between the key and its first spec
		{Version: version.MustParse("1.27"), Default: false, PreRelease: featuregate.Alpha},
	},

	NewThing: {
		{Version: version.MustParse("1.37"), Default: false, PreRelease: featuregate.Alpha},
	},
}
"""


def test_feature_gates_are_read_with_the_version_they_first_appear_in(tmp_path: Path) -> None:
    for module, path in SOURCES:
        file = tmp_path / module.format(kube="1.37.2", staging="0.37.2") / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(_KUBE if module.startswith("k8s.io/kubernetes") else "")
    assert gates(tmp_path, "v1.37.2") == {
        "InPlacePodVerticalScaling": "1.27",
        "NewThing": "1.37",
        "WatchList": "1.27",
    }


def test_feature_gates_data_covers_the_gates_the_stacks_set() -> None:
    assert SOURCE == "Kubernetes v1.37.2"
    assert FIRST_VERSION["InPlacePodVerticalScaling"] == (1, 27)
    assert len(FIRST_VERSION) > 200


@pytest.mark.parametrize("version", ["v1.35.0", "v1.37.2"])
def test_feature_gates_known_gate_passes(version: str) -> None:
    assert unknown_gate_problem("InPlacePodVerticalScaling", version) is None
    assert unknown_gate_problem("AllAlpha", version) is None


def test_feature_gates_too_new_for_the_version_are_refused() -> None:
    # DRAConsumableCapacity appeared in v1.34: a v1.30 API server would refuse to start on it.
    assert "first appears in v1.34" in str(unknown_gate_problem("DRAConsumableCapacity", "v1.30.0"))

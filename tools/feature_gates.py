"""Write components/control_plane_features/feature_gates.json: every feature gate Kubernetes knows, with the minor
version it first appears in, read from the Kubernetes sources in the Go module cache.

    python -m tools.feature_gates [--version v1.37.2] [--gomodcache DIR]

kube-apiserver and the kubelet register the gates of k8s.io/kubernetes/pkg/features (which also
adds those of k8s.io/apiserver, apiextensions-apiserver, controller-manager and client-go) and of
k8s.io/component-base (logs, metrics, zpages). Each gate has versioned specs
`{Version: version.MustParse("1.x"), ...}`; the first one is when the gate appeared. Gates removed
before `--version` are not in its sources; components/control_plane_features/feature_gates.py says how that is handled.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "components" / "feature_gates.json"

# (module, path inside it) of every file that declares gates kube-apiserver or the kubelet accept.
SOURCES = (
    ("k8s.io/kubernetes@v{kube}", "pkg/features/kube_features.go"),
    ("k8s.io/apiserver@v{staging}", "pkg/features/kube_features.go"),
    ("k8s.io/apiextensions-apiserver@v{staging}", "pkg/features/kube_features.go"),
    ("k8s.io/controller-manager@v{staging}", "pkg/features/kube_features.go"),
    ("k8s.io/client-go@v{staging}", "features/known_features.go"),
    ("k8s.io/component-base@v{staging}", "logs/api/v1/kube_features.go"),
    ("k8s.io/component-base@v{staging}", "metrics/features/kube_features.go"),
    ("k8s.io/component-base@v{staging}", "zpages/features/kube_features.go"),
)
_CONST = re.compile(r'^\s*(\w+)\s+(?:featuregate\.)?Feature\s*=\s*"(\w+)"', re.M)
_ENTRY = re.compile(
    r"^\t+(?:\w+\.)?(\w+): \{\n(?:\s*//.*\n)*\s*\{Version: version\.MustParse\(\"(\d+\.\d+)\"\)",
    re.M,
)


def gates(gomodcache: Path, version: str) -> dict[str, str]:
    """{gate name: first minor version "1.x"} from the sources of `version` (e.g. v1.37.2)."""
    kube = version.removeprefix("v")
    staging = "0." + kube.split(".", 1)[1]
    names: dict[str, str] = {}
    first: dict[str, str] = {}
    texts = []
    for module, path in SOURCES:
        file = gomodcache / module.format(kube=kube, staging=staging) / path
        texts.append(file.read_text())
    for text in texts:
        names.update(_CONST.findall(text))
    for text in texts:
        for const, since in _ENTRY.findall(text):
            name = names.get(const, const)
            known = first.get(name)
            if known is None or tuple(map(int, since.split("."))) < tuple(
                map(int, known.split("."))
            ):
                first[name] = since
    return dict(sorted(first.items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default="v1.37.2")
    default_cache = (
        os.environ.get("GOMODCACHE")
        or subprocess.run(
            ["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=False
        ).stdout.strip()
    )
    parser.add_argument("--gomodcache", type=Path, default=Path(default_cache))
    args = parser.parse_args()
    data = {"source": f"Kubernetes {args.version}", "gates": gates(args.gomodcache, args.version)}
    OUTPUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {OUTPUT.relative_to(ROOT)}: {len(data['gates'])} gates")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

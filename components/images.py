"""The container image references the stack config accepts: pinned by a tag or a digest."""

from __future__ import annotations

import re

from components.settings import text

# An OCI image reference with a tag or a digest (no implicit :latest): [host[:port]/]path
# [:tag][@sha256:digest], the distribution reference grammar.
# Ref: https://github.com/distribution/reference/blob/main/reference.go
_IMAGE_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(
    rf"(?:(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*"
    rf"|\[[0-9a-fA-F:]+\])(?::[0-9]+)?/)?{_IMAGE_COMPONENT}(?:/{_IMAGE_COMPONENT})*"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?",
    re.ASCII,
)


def is_pinned_image(value: str) -> bool:
    """An image reference that names a tag or a digest."""
    match = _IMAGE.fullmatch(value)
    return match is not None and bool(match.group("tag") or match.group("digest"))


IMAGE = text(
    is_pinned_image,
    "expected an image reference with a tag or a digest, e.g. "
    "registry.example.com/gpu-binpack-scheduler:v1.37.2 or ...@sha256:<64 hex digits>",
)

"""Dynamic providers for what pulumi-kubernetes cannot express (node status, taints)."""

from components.providers import serialization

serialization.install()

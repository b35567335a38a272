"""Packages generated from ``management.proto`` (package ``actorserve.v1``)."""

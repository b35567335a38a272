"""``GET /metrics`` parsed with prometheus-client's own parser, for exact assertions."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of an exposition: (sample name, labels) -> value."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: Any) -> float:
    """The value of one sample; 0.0 if the series does not exist (yet)."""
    return samples.get((name, frozenset((k, str(v)) for k, v in labels.items())), 0.0)


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}

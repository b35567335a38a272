"""LocalHistogram: observations kept locally reach the series exactly as direct
observations do, once flushed (and Metrics.refresh, run before every scrape, flushes)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from actorserve.localmetrics import LocalHistogram
from actorserve.metrics import STEP_BUCKETS, Metrics

# multiples of 1/1024 s: sums are exact in any order
GAPS = st.lists(st.integers(0, 4096).map(lambda n: n / 1024), max_size=200)


def samples(registry: CollectorRegistry) -> dict[str, float]:
    return {
        f"{s.name}{sorted(s.labels.items())}": s.value
        for family in registry.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    }


@given(GAPS, st.lists(st.integers(1, 5), max_size=20))
def test_flushed_observations_equal_direct_ones(gaps: list[float], repeats: list[int]) -> None:
    direct_registry, local_registry = CollectorRegistry(), CollectorRegistry()
    direct = Histogram("gaps", "doc", buckets=STEP_BUCKETS, registry=direct_registry)
    local = LocalHistogram(Histogram("gaps", "doc", buckets=STEP_BUCKETS, registry=local_registry))
    for i, gap in enumerate(gaps):
        times = repeats[i] if i < len(repeats) else 1
        for _ in range(times):
            direct.observe(gap)
        local.observe(gap, times)
        if i % 7 == 3:
            local.flush()  # flushing in between changes nothing
    local.flush()
    assert not local.pending
    assert samples(local_registry) == samples(direct_registry)


def test_refresh_flushes_what_a_stream_recorded_so_far() -> None:
    metrics = Metrics()
    series = metrics.front("m", "1", "rest")
    series.between_responses.observe(0.002, 3)
    before = metrics.expose().decode()
    assert (
        'actorserve_time_between_responses_seconds_count{model="m",transport="rest",version="1"} 0.0'
        in before
    )
    metrics.refresh()  # what GET /metrics does first
    after = metrics.expose().decode()
    assert (
        'actorserve_time_between_responses_seconds_count{model="m",transport="rest",version="1"} 3.0' in after
    )
    assert (
        'actorserve_time_between_responses_seconds_sum{model="m",transport="rest",version="1"} 0.006' in after
    )

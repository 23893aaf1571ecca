"""The serving example's ``/metrics`` (examples/serve.py): ftjit's counters and ``ftjit.batched``'s batch sizes as
prometheus_client collectors, read at each scrape. docs/serving.md lists the series.
"""

from __future__ import annotations

from typing import Any, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

import ftjit


class BatchCollector(Collector):
    """``--batch``: the batched function's batch sizes as a prometheus histogram (``ftjit_batch_size``: one
    observation per batch, of its examples), and its calls, alone calls and timeouts as counters."""

    def __init__(self, model: Any):  # serve.BatchedModel
        self.model = model

    def collect(self) -> Iterable[Any]:
        info = self.model.one.batch_info()
        counts = dict(info.sizes)
        buckets = [(str(bound), sum(c for n, c in counts.items() if n <= bound)) for bound in self.model.one.sizes]
        hist = HistogramMetricFamily("ftjit_batch_size", "Examples per batch of ftjit.batched (calls alone not included).")
        hist.add_metric([], buckets + [("+Inf", info.batches)], sum_value=sum(n * c for n, c in counts.items()))
        yield hist
        for name, value, text in (("ftjit_batched_calls", info.calls, "Calls of ftjit.batched, however they ran."),
                                  ("ftjit_batched_alone", info.alone, "Calls that ran alone (nothing to batch with)."),
                                  ("ftjit_batched_timeouts", info.timeouts, "Calls that gave up waiting.")):
            family = CounterMetricFamily(name, text)
            family.add_metric([], value)
            yield family


class FtjitCollector(Collector):
    """``ftjit.stats()`` for prometheus_client, read at each scrape: a series per function name
    (live functions that share a name, which ``ftjit.stats()`` does not tell apart, are added up)."""

    METRICS = (  # (FunctionStats field, kind, name, help); a counter is exposed as name + "_total"
        ("hits", CounterMetricFamily, "ftjit_cache_hits", "Calls served by an already compiled signature."),
        ("misses", CounterMetricFamily, "ftjit_cache_misses", "Calls that found no compiled signature."),
        ("compiles", CounterMetricFamily, "ftjit_compiles", "Successful compiles."),
        ("waits", CounterMetricFamily, "ftjit_compile_waits", "Calls that waited for another thread's compile."),
        ("failures", CounterMetricFamily, "ftjit_compile_failures", "Compiles that raised or were refused."),
        ("evictions", CounterMetricFamily, "ftjit_cache_evictions", "Compiled signatures evicted by the LRU bound."),
        ("compile_seconds", CounterMetricFamily, "ftjit_compile_seconds", "Seconds spent compiling."),
        ("wait_seconds", CounterMetricFamily, "ftjit_compile_wait_seconds", "Seconds spent waiting for compiles."),
        ("size", GaugeMetricFamily, "ftjit_cache_entries", "Compiled signatures cached now."),
    )  # fmt: skip

    def collect(self) -> Iterable[Any]:
        totals: dict[str, dict[str, float]] = {}
        for f in ftjit.stats().functions:
            row = totals.setdefault(f.name, dict.fromkeys(f._fields[1:], 0))
            for field in row:
                row[field] += getattr(f, field)
        for field, kind, name, text in self.METRICS:
            family = kind(name, text, labels=["function"])
            for function, row in sorted(totals.items()):
                family.add_metric([function], row[field])
            yield family

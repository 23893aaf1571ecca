"""The serving example's ``/metrics`` (examples/serve.py): its requests, ftjit's counters and ``ftjit.batched``'s
batch sizes as prometheus_client collectors, read at each scrape. docs/serving.md lists the series.
"""

from __future__ import annotations

import bisect
import threading
import weakref
from typing import Any, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

import ftjit


class _Tally:
    """One thread's request counts: written by that thread only, read by a scrape."""

    def __init__(self, owner: threading.Thread | None = None) -> None:
        self.owner = None if owner is None else weakref.ref(owner)  #: its thread (None: the retired threads')
        self.in_progress = 0
        self.counts: dict[tuple[str, str, str], int] = {}  #: (handler, method, code) -> requests
        self.durations: dict[str, list[float]] = {}  #: handler -> [count per bucket..., count past the last, sum]

    def ended(self) -> bool:
        """Whether its thread has ended (then nothing writes it any more)."""
        if self.owner is None:
            return False
        owner = self.owner()
        try:
            return owner is None or not owner.is_alive()
        except RuntimeError:  # a foreign thread's _DummyThread once its handle is done (after a fork): ended
            return True

    def add(self, other: _Tally) -> None:
        """Adds ``other``'s counts to this tally's."""
        self.in_progress += other.in_progress
        for key, n in dict(other.counts).items():  # a copy: the owner may add a key meanwhile
            self.counts[key] = self.counts.get(key, 0) + n
        for handler, hist in dict(other.durations).items():
            total = self.durations.setdefault(handler, [0.0] * len(hist))
            for i, value in enumerate(list(hist)):
                total[i] += value


class RequestMetrics(Collector):
    """The app's own series, with no lock per request: each thread counts into its own ``_Tally`` (a dict write
    that no other thread makes), and a scrape adds the tallies up. prometheus_client's Counter, Histogram and
    Gauge take a lock per update, one that every server thread shares: seven acquisitions a request.

    ``http_requests_total{handler,method,code}``, ``http_request_duration_seconds{handler}`` (a histogram of
    ``BUCKETS``) and ``http_requests_in_progress``. A thread's counts outlive it: when a new thread first counts,
    the tallies of threads that ended are added into one tally of the retired threads, so that there are as many
    tallies as threads alive, plus one, under a front that ends and starts threads (granian's blocking threads
    end after an idle timeout)."""

    BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
    #: The ``le`` labels, written as prometheus_client's own Histogram writes them ("1.0", not "1"): a query on
    #: the labels it wrote before still matches.
    BOUNDS = (*map(floatToGoString, BUCKETS), "+Inf")

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()  # guards _tallies and _retired: taken once per thread, and by a scrape
        self._tallies: list[_Tally] = []
        self._retired = _Tally()  # the counts of the threads that ended

    def started(self) -> _Tally:
        """Counts a request in progress in this thread's tally (returned, for ``finished``)."""
        tally = getattr(self._local, "tally", None)
        if tally is None:
            tally = _Tally(threading.current_thread())
            with self._lock:  # summed from now on, before this thread counts anything in it
                alive = []
                for old in self._tallies:  # each judged once: an ended one is added up, else kept
                    if old.ended():
                        self._retired.add(old)
                    else:
                        alive.append(old)
                self._tallies = [*alive, tally]
            self._local.tally = tally
        tally.in_progress += 1
        return tally

    def finished(self, tally: _Tally, handler: str, method: str, code: str, seconds: float) -> None:
        key = (handler, method, code)
        tally.counts[key] = tally.counts.get(key, 0) + 1
        hist = tally.durations.get(handler)
        if hist is None:
            hist = tally.durations[handler] = [0.0] * (len(self.BUCKETS) + 2)
        hist[bisect.bisect_left(self.BUCKETS, seconds)] += 1
        hist[-1] += seconds
        tally.in_progress -= 1

    def in_progress(self) -> int:
        with self._lock:
            return sum(t.in_progress for t in self._tallies)

    def tallies(self) -> int:
        """How many tallies are kept: the threads alive that counted, and the retired threads' (tests)."""
        with self._lock:
            return len(self._tallies) + 1

    def collect(self) -> Iterable[Any]:
        total = _Tally()
        with self._lock:
            total.add(self._retired)  # written under the lock only
            tallies = list(self._tallies)
        for tally in tallies:
            total.add(tally)
        counts, durations = total.counts, total.durations
        requests = CounterMetricFamily("http_requests", "Requests answered, by endpoint, method and status.",
                                       labels=["handler", "method", "code"])  # fmt: skip
        for key, n in sorted(counts.items()):
            requests.add_metric(list(key), n)
        yield requests
        latency = HistogramMetricFamily(
            "http_request_duration_seconds", "Seconds from a request reaching the app to its answer, by endpoint.",
            labels=["handler"])  # fmt: skip
        for handler, hist in sorted(durations.items()):
            cumulative, running = [], 0.0
            for bound, n in zip(self.BOUNDS, hist[:-1]):
                running += n
                cumulative.append((bound, running))
            latency.add_metric([handler], cumulative, sum_value=hist[-1])
        yield latency
        yield GaugeMetricFamily("http_requests_in_progress", "Requests the app is answering now.",
                                value=sum(t.in_progress for t in tallies))  # a retired thread has none


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

"""``python -m bench --batching``: many threads, one example each, through four ways of calling one model.

Each worker thread sends one example of its own per call (a server's request) and reads the result to the host
(``np.asarray``, as a server that answers with JSON does), for a fixed time, released by a barrier. The model
is a small MLP (16 -> hidden -> 4, f32; hidden 64 by default, as issue 41 measured). The sides, interleaved
round by round:

- ``ftjit.jit``: every call on its own (per call);
- ``hand-written``: the anchor, a batcher as one writes it by hand: a queue and one worker thread that
  collects for up to 1 ms (or 64 examples), pads to a power of two, calls ``ftjit.jit(jax.vmap(f))``, copies
  the batch to the host and hands each caller its row (collect, run and copy out in that one thread);
- ``ftjit.batched, jax Arrays`` (``to_host=False``): callers of one signature merged, jax Arrays back (rows
  split in the program);
- ``ftjit.batched (to_host)``: the default, the batch copied to the host once (numpy rows back).

Printed: calls/s (all threads together, the median of the rounds) and p50/p99 latency of one call (over every
call of every round), per thread count; then the ratios issue 41 sets targets on, each computed from the
printed rates.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import statistics
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

DEFAULT_THREADS = (1, 4, 16, 64)
MAX_BATCH = 64


@dataclasses.dataclass
class Side:
    label: str
    make: Callable[[], tuple[Callable[[Any], Any], Callable[[], None]]]  # () -> (call, stop)


@dataclasses.dataclass
class Row:
    label: str
    rates: dict[int, list[float]]  # threads -> calls/s per round
    latencies: dict[int, list[int]]  # threads -> ns of every call

    def rate(self, n: int) -> float:
        return statistics.median(self.rates[n])

    def pct(self, n: int, p: float) -> float:
        lat = sorted(self.latencies[n])
        return lat[min(len(lat) - 1, int(len(lat) * p / 100))] / 1e3 if lat else float("nan")


def _model(hidden: int) -> tuple[Callable[[Any], Any], Any]:
    import jax
    import jax.numpy as jnp

    k1, k2 = jax.random.split(jax.random.key(0))
    w1 = jax.random.normal(k1, (16, hidden), jnp.float32) / 4
    w2 = jax.random.normal(k2, (hidden, 4), jnp.float32) / 8

    def mlp(x: Any) -> Any:
        return jnp.tanh(x @ w1) @ w2

    return mlp, np.ones(16, np.float32)


class HandWritten:
    """The anchor: a queue and one worker thread (collect for up to 1 ms or 64 examples, pad to 2^k, call the
    vmapped function, copy out, hand out rows)."""

    def __init__(self, fn: Callable[[Any], Any], window_s: float = 0.001) -> None:
        import jax

        import ftjit

        self.batch_fn = ftjit.jit(jax.vmap(fn))
        self.window_s = window_s
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.stopped = False
        self.worker = threading.Thread(target=self._serve, name="hand-written-batcher", daemon=True)
        self.worker.start()

    def __call__(self, x: Any) -> Any:
        box: list[Any] = []
        done = threading.Event()
        self.inbox.put((x, box, done))
        done.wait()
        return box[0]

    def stop(self) -> None:
        self.stopped = True
        self.inbox.put(None)
        self.worker.join(10)

    def _serve(self) -> None:
        while not self.stopped:
            first = self.inbox.get()
            if first is None:
                return
            items = [first]
            until = time.perf_counter() + self.window_s
            while len(items) < MAX_BATCH:
                left = until - time.perf_counter()
                if left <= 0:
                    break
                try:
                    item = self.inbox.get(timeout=left)
                except queue.Empty:
                    break
                if item is None:
                    return
                items.append(item)
            size = 1
            while size < len(items):
                size *= 2
            xs = [it[0] for it in items]
            xs += [xs[0]] * (size - len(xs))
            out = np.asarray(self.batch_fn(np.stack(xs)))
            for i, (_, box, done) in enumerate(items):
                box.append(out[i])
                done.set()


def _sides(hidden: int) -> list[Side]:
    import ftjit

    fn, _ = _model(hidden)

    def per_call() -> tuple[Callable[[Any], Any], Callable[[], None]]:
        jf = ftjit.jit(fn)
        return jf, lambda: None

    def hand() -> tuple[Callable[[Any], Any], Callable[[], None]]:
        h = HandWritten(fn)
        return h, h.stop

    def batched(to_host: bool) -> Callable[[], tuple[Callable[[Any], Any], Callable[[], None]]]:
        def make() -> tuple[Callable[[Any], Any], Callable[[], None]]:
            b = ftjit.batched(fn, max_batch=MAX_BATCH, to_host=to_host)
            b.warmup([(np.ones(16, np.float32),)])
            return b, lambda: None

        return make

    return [Side("ftjit.jit, per call", per_call), Side("hand-written batcher", hand),
            Side("ftjit.batched, jax Arrays", batched(False)), Side("ftjit.batched (to_host)", batched(True))]


def _run(call: Callable[[Any], Any], threads: int, seconds: float) -> tuple[float, list[int]]:
    """calls/s of ``threads`` workers calling for ``seconds``, and each call's latency (ns)."""
    barrier = threading.Barrier(threads + 1)
    stop = threading.Event()
    counts = [0] * threads
    lats: list[list[int]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        x = np.full(16, (i % 7) / 7, np.float32)
        mine = lats[i]
        try:
            np.asarray(call(x))  # the first call of this thread (a copy made, a queue found) is not timed
            barrier.wait(60)
            while not stop.is_set():
                t0 = time.perf_counter_ns()
                np.asarray(call(x))
                mine.append(time.perf_counter_ns() - t0)
            counts[i] = len(mine)
        except BaseException as error:  # noqa: BLE001 - reported by the caller
            errors.append(error)
            barrier.abort()

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    barrier.wait(120)
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for w in workers:
        w.join(120)
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return sum(counts) / elapsed, [ns for mine in lats for ns in mine]


def batching_rows(threads: Sequence[int] = DEFAULT_THREADS, seconds: float = 2.0, rounds: int = 3,
                  hidden: int = 64, on_round: Callable[[int, int], None] | None = None) -> list[Row]:
    """Every side at every thread count, ``rounds`` interleaved rounds of ``seconds`` each."""
    sides = _sides(hidden)
    made = [side.make() for side in sides]
    rows = [Row(side.label, {n: [] for n in threads}, {n: [] for n in threads}) for side in sides]
    _, x = _model(hidden)
    for call, _ in made:  # compile everything first (the batched sides warmed up every size)
        np.asarray(call(x))
    try:
        for r in range(rounds):
            for n in threads:
                for row, (call, _) in zip(rows, made):
                    rate, lat = _run(call, n, seconds)
                    row.rates[n].append(rate)
                    row.latencies[n] += lat
            if on_round:
                on_round(r + 1, rounds)
    finally:
        for _, stop in made:
            stop()
    return rows


def format_batching(rows: Sequence[Row], threads: Sequence[int], hidden: int, seconds: float, rounds: int) -> str:
    """The table and the ratios (each from the printed rates), with issue 41's targets where they apply."""
    import jax

    backend = jax.default_backend()
    lines = [f"batching: one example per call, result read to the host; MLP 16->{hidden}->4 f32 on {backend} "
             f"({os.cpu_count()} CPUs); calls/s of all threads together (median of {rounds} rounds of {seconds:g} s) "
             "and one call's latency p50/p99 in µs (every call of every round)"]
    head = ["side"] + [f"{n}T calls/s" for n in threads] + [f"{n}T p50/p99" for n in threads]
    table = [head]
    for row in rows:
        table.append([row.label] + [f"{row.rate(n):,.0f}" for n in threads]
                     + [f"{row.pct(n, 50):,.0f}/{row.pct(n, 99):,.0f}" for n in threads])
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    for j, r in enumerate(table):
        lines.append("  ".join([r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]))
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    per_call, hand = rows[0], rows[1]
    lo, hi = threads[0], threads[-1]
    on_tpu = backend == "tpu"
    targets = []
    for side in rows[2:]:
        targets += [
            (f"{side.label} / per call at {hi} threads", side.rate(hi) / per_call.rate(hi), ">= 10", 10.0, on_tpu),
            (f"{side.label} / hand-written at {hi} threads", side.rate(hi) / hand.rate(hi), ">= 4", 4.0, on_tpu),
            (f"{side.label} / per call at {lo} thread{'s' if lo > 1 else ''}", side.rate(lo) / per_call.rate(lo),
             ">= 0.9", 0.9, on_tpu),
            (f"{side.label} p99 / per call's p99 at {hi} threads", side.pct(hi, 99) / per_call.pct(hi, 99), "<= 1",
             -1.0, on_tpu),
        ]
    lines.append("")
    lines.append("target (issue 41; set for a TPU)                                   value   needs  status")
    for text, value, needs, minimum, applies in targets:
        ok = value >= minimum if minimum >= 0 else value <= -minimum
        status = ("ok" if ok else "MISSED") if applies else "report"
        lines.append(f"{text:<66}  {value:5.2f}x  {needs:>6}  {status}")
    if not on_tpu:
        lines.append(f"(report: the targets are set for a TPU; this backend is {backend})")
    return "\n".join(lines)


def slicing_costs(hidden: int = 64, size: int = 64, repeat: int = 50) -> str:
    """What handing each caller its row of a batch costs, three ways, per batch of ``size`` (median of
    ``repeat``), each row read to the host as a caller does: one copy of the batch to the host, then numpy
    rows (``to_host``); the rows split inside the compiled program, each copied to the host (batched's
    default); and one slice per caller of the batch's jax Array, each copied to the host."""
    import jax

    import ftjit

    fn, x = _model(hidden)
    stacked = ftjit.jit(jax.vmap(fn))
    split = ftjit.jit(lambda xs: tuple(jax.vmap(fn)(xs)[i] for i in range(size)))
    xs = np.stack([x] * size)

    def host_once() -> None:
        out = np.asarray(stacked(xs))
        for i in range(size):
            out[i]

    def in_program() -> None:
        for row in split(xs):
            np.asarray(row)

    def per_caller() -> None:
        out = stacked(xs)
        for i in range(size):
            np.asarray(out[i])

    lines = [f"slicing a batch of {size} into callers' rows on {jax.default_backend()} (µs per batch, median of "
             f"{repeat})"]
    for label, run in (("one copy to the host, numpy rows (to_host)", host_once),
                       ("rows split in the program, each copied", in_program),
                       ("one device slice per caller, each copied", per_caller)):
        run()
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
        lines.append(f"  {label:<44} {statistics.median(times) * 1e6:10.0f}")
    return "\n".join(lines)

"""``python -m bench --batching``: many threads, one example each, through four ways of calling one model.

Each worker thread sends one example of its own per call (a server's request) and reads the result to the host
(``np.asarray``, as a server that answers with JSON does), for a fixed time, released by a barrier. The model
is a small MLP (16 -> hidden -> 4, f32; hidden 64 by default, as issue 41 measured). The sides, interleaved
round by round:

- ``ftjit.jit``: every call on its own (per call);
- ``hand-written``: the anchor, a batcher as one writes it by hand: a queue and one worker thread that
  collects for up to 1 ms (or max_batch examples), pads to a power of two, calls ``ftjit.jit(jax.vmap(f))``,
  copies the batch to the host and hands each caller its row (collect, run and copy out in that one thread);
- ``ftjit.batched, jax Arrays`` (``to_host=False``): callers of one signature merged, jax Arrays back (rows
  split in the program);
- ``ftjit.batched (to_host)``: the default, the batch copied to the host once (numpy rows back).

max_batch is 64, or the largest thread count when more (256 threads: batches of up to 256).

Printed: calls/s (all threads together, the median of the rounds) and p50/p99 latency of one call (over every
call of every round), per thread count; each batched side's ``batch_info()`` (mean batch size, the commonest
sizes) and its host overhead: the leaders' time per batch (``lead_seconds``: stacking, the program, the copy
out, waking every member) less the program's own time at the batch's size run alone, serially, on the same
stacked input (its dispatch, device time and copy to the host), per batch and per example; then the ratios
issue 45 sets targets on, each computed from the printed rates.
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


def max_batch_for(threads: Sequence[int]) -> int:
    """The batched sides' (and the hand-written batcher's) largest batch: 64, or the most threads when more."""
    return max(MAX_BATCH, max(threads))


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
    """The anchor: a queue and one worker thread (collect for up to 1 ms or max_batch examples, pad to 2^k, call
    the vmapped function, copy out, hand out rows)."""

    def __init__(self, fn: Callable[[Any], Any], window_s: float = 0.001, max_batch: int = MAX_BATCH) -> None:
        import jax

        import ftjit

        self.batch_fn = ftjit.jit(jax.vmap(fn))
        self.window_s = window_s
        self.max_batch = max_batch
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
            while len(items) < self.max_batch:
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


def _sides(hidden: int, max_batch: int) -> list[Side]:
    import ftjit

    fn, _ = _model(hidden)

    def per_call() -> tuple[Callable[[Any], Any], Callable[[], None]]:
        jf = ftjit.jit(fn)
        return jf, lambda: None

    def hand() -> tuple[Callable[[Any], Any], Callable[[], None]]:
        h = HandWritten(fn, max_batch=max_batch)
        return h, h.stop

    def batched(to_host: bool) -> Callable[[], tuple[Callable[[Any], Any], Callable[[], None]]]:
        def make() -> tuple[Callable[[Any], Any], Callable[[], None]]:
            b = ftjit.batched(fn, max_batch=max_batch, to_host=to_host)
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


@dataclasses.dataclass
class Overhead:
    """A batched side's batches at one thread count (``batch_info()`` differences over its rounds) and its host
    overhead: the leaders' time per batch less the program's own at those sizes."""

    batches: int
    examples: int
    sizes: dict[int, int]  # examples in a batch -> batches
    lead_s: float  # the leaders' time, in all
    program_s: float  # the program alone at each batch's size, in all (estimated from its median per size)

    @property
    def mean(self) -> float:
        return self.examples / self.batches if self.batches else 0.0

    def per_batch_us(self) -> float:
        return (self.lead_s - self.program_s) / self.batches * 1e6 if self.batches else float("nan")

    def per_example_us(self) -> float:
        return (self.lead_s - self.program_s) / self.examples * 1e6 if self.examples else float("nan")


def _program_seconds(b: Any, size: int, repeat: int = 30) -> float:
    """The batched program of ``b`` at ``size`` run alone (dispatch, device, the copy out), median of ``repeat``:
    on the input a batch of that size stacks (the runner's own plan and stacking)."""
    import jax
    x = np.ones(16, np.float32)
    key, leaves = b._key(x)
    runner = b._runner
    plan = runner.plan(key, (x,), {}, leaves)
    from ftjit._batch_jax import _stack

    stacked = [_stack([leaf] * size, size, kind) for leaf, kind in zip(leaves, plan.scalars)]
    times = []
    for _ in range(repeat + 1):  # as a batch ends: copied to the host (to_host), else ready on the device
        t0 = time.perf_counter()
        out = runner.many(plan, *stacked)
        np.asarray(out) if runner.to_host else jax.block_until_ready(out)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def batching_rows(threads: Sequence[int] = DEFAULT_THREADS, seconds: float = 2.0, rounds: int = 3,
                  hidden: int = 64, on_round: Callable[[int, int], None] | None = None
                  ) -> tuple[list[Row], dict[tuple[str, int], Overhead]]:
    """Every side at every thread count, ``rounds`` interleaved rounds of ``seconds`` each; and each batched
    side's batches and host overhead per thread count."""
    max_batch = max_batch_for(threads)
    sides = _sides(hidden, max_batch)
    made = [side.make() for side in sides]
    rows = [Row(side.label, {n: [] for n in threads}, {n: [] for n in threads}) for side in sides]
    infos: dict[tuple[str, int], list[dict[str, Any]]] = {}
    _, x = _model(hidden)
    for call, _ in made:  # compile everything first (the batched sides warmed up every size)
        np.asarray(call(x))
    try:
        for r in range(rounds):
            for n in threads:
                for row, (call, _) in zip(rows, made):
                    before = call._batcher.info() if hasattr(call, "_batcher") else None
                    rate, lat = _run(call, n, seconds)
                    row.rates[n].append(rate)
                    row.latencies[n] += lat
                    if before is not None:
                        infos.setdefault((row.label, n), []).append(_delta(before, call._batcher.info()))
            if on_round:
                on_round(r + 1, rounds)
        overheads = {}
        programs: dict[tuple[int, int], float] = {}
        for (label, n), deltas in infos.items():
            call = made[[row.label for row in rows].index(label)][0]
            sizes: dict[int, int] = {}
            for d in deltas:
                for k, c in d["sizes"].items():
                    sizes[k] = sizes.get(k, 0) + c
            program = 0.0
            for k, c in sizes.items():
                padded = _padded(call, k)
                if (id(call), padded) not in programs:
                    programs[(id(call), padded)] = _program_seconds(call, padded)
                program += c * programs[(id(call), padded)]
            overheads[(label, n)] = Overhead(sum(d["batches"] for d in deltas), sum(d["examples"] for d in deltas),
                                             sizes, sum(d["lead_seconds"] for d in deltas), program)
    finally:
        for _, stop in made:
            stop()
    return rows, overheads


def lone_costs(hidden: int = 64, number: int = 300, rounds: int = 15) -> str:
    """Where a lone caller's time goes (one thread, nothing else running): a call per call (``ftjit.jit``, then
    the result to the host) against ``ftjit.batched``'s lone call, and the parts that it adds: the signature key
    (``_batch_key``), the core's queue (``_Batcher.call`` around a runner that does nothing), and the runner's
    lone call (``ftjit.jit`` again, and the result to the host). Medians of ``rounds`` interleaved timings."""
    import timeit

    import ftjit

    fn, x = _model(hidden)
    per_call = ftjit.jit(fn)
    b = ftjit.batched(fn)
    b.warmup([(x,)])
    key, leaves = b._key(x)

    class Idle:
        per_call: dict[Any, None] = {}

        def alone(self, args: tuple, kwargs: dict) -> None:
            return None

    idle = Idle()
    parts: list[tuple[str, Callable[[], Any]]] = [
        ("ftjit.jit, per call (result to the host)", lambda: np.asarray(per_call(x))),
        ("ftjit.batched, a lone call", lambda: b(x)),
        ("  its signature key (_batch_key)", lambda: b._key(x)),
        ("  its queue (_Batcher.call, a runner doing nothing)", lambda: b._batcher.call(idle, key, leaves, (x,), {},
                                                                                        None)),
        ("  its runner's lone call (ftjit.jit, to the host)", lambda: b._runner.alone((x,), {})),
    ]
    for _, f in parts:
        for _ in range(200):
            f()
    times: dict[str, list[float]] = {label: [] for label, _ in parts}
    for _ in range(rounds):
        for label, f in parts:
            times[label].append(timeit.timeit(f, number=number) / number * 1e6)
    med = {label: statistics.median(v) for label, v in times.items()}
    lines = [f"a lone caller (1 thread), µs per call, median of {rounds} rounds of {number}:"]
    for label, _ in parts:
        lines.append(f"  {label:<52} {med[label]:8.2f}")
    ratio = med[parts[0][0]] / med[parts[1][0]]
    lines.append(f"  batched / per call (calls per second): {ratio:.2f}x; the batched call adds "
                 f"{med[parts[1][0]] - med[parts[0][0]]:.2f} µs")
    return "\n".join(lines)


def _padded(b: Any, n: int) -> int:
    return next(s for s in b.sizes if s >= n)


def _delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    sizes = dict(after["sizes"])
    for k, c in before["sizes"]:
        sizes[k] -= c
    return {"batches": after["batches"] - before["batches"], "examples": after["examples"] - before["examples"],
            "lead_seconds": after["lead_seconds"] - before["lead_seconds"],
            "sizes": {k: c for k, c in sizes.items() if c}}


def format_batching(rows: Sequence[Row], threads: Sequence[int], hidden: int, seconds: float, rounds: int,
                    overheads: dict[tuple[str, int], Overhead] | None = None) -> str:
    """The table, each batched side's batches and host overhead, and the ratios (each from the printed rates),
    with issue 45's targets where they apply (a TPU; 3.13t's on a free-threaded build, 3.11's on a GIL one)."""
    import sysconfig

    import jax

    backend = jax.default_backend()
    free_threaded = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    lines = [f"batching: one example per call, result read to the host; MLP 16->{hidden}->4 f32 on {backend} "
             f"({os.cpu_count()} CPUs); calls/s of all threads together (median of {rounds} rounds of {seconds:g} s) "
             f"and one call's latency p50/p99 in µs (every call of every round); max_batch {max_batch_for(threads)}"]
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
    if overheads:
        lines.append("")
        lines.append("batches and host overhead (the leaders' time per batch less the program's own at its size: "
                     "stacking, hand-off, wakes), µs")
        for (label, n), o in sorted(overheads.items(), key=lambda item: (item[0][0], item[0][1])):
            common = ", ".join(f"{k}: {c}" for k, c in sorted(o.sizes.items(), key=lambda kc: -kc[1])[:4]) or "none"
            lines.append(f"  {label:<27} {n:>4}T  {o.batches:>7} batches, mean {o.mean:6.1f} examples (commonest "
                         f"sizes {common}); overhead {o.per_batch_us():8.1f} per batch, {o.per_example_us():6.2f} "
                         "per example")
    per_call, hand = rows[0], rows[1]
    lo, hi = threads[0], threads[-1]
    mid = 64 if 64 in threads else hi
    on_tpu = backend == "tpu"
    targets = []
    host = rows[3]  # the default side, to_host
    ft = on_tpu and free_threaded
    targets.append((f"{host.label} calls/s at {mid} threads (3.13t)", host.rate(mid), ">= 25000", 25000.0, ft))
    if 256 in threads:
        targets.append((f"{host.label} calls/s at 256 threads (3.13t)", host.rate(256), ">= 50000", 50000.0, ft))
    for n in sorted({mid, hi}):
        targets.append((f"{host.label} / hand-written at {n} threads (3.13t)", host.rate(n) / hand.rate(n), ">= 2",
                        2.0, ft))
    targets += [
        (f"{host.label} / per call at {lo} thread{'s' if lo > 1 else ''}", host.rate(lo) / per_call.rate(lo),
         ">= 0.95", 0.95, True),
        (f"{host.label} p99 / per call's p99 at {mid} threads", host.pct(mid, 99) / per_call.pct(mid, 99), "<= 1",
         -1.0, on_tpu),
        (f"{host.label} / per call at {mid} threads (3.11)", host.rate(mid) / per_call.rate(mid), ">= 4", 4.0,
         on_tpu and not free_threaded),
    ]
    lines.append("")
    lines.append("target (issue 45; set for a TPU)                                         value     needs  status")
    for text, value, needs, minimum, applies in targets:
        ok = value >= minimum if minimum >= 0 else value <= -minimum
        status = ("ok" if ok else "MISSED") if applies else "report"
        shown = f"{value:9,.0f} " if minimum >= 100 else f"{value:9.2f}x"
        lines.append(f"{text:<72}  {shown}  {needs:>8}  {status}")
    if not on_tpu:
        lines.append(f"(report: the targets are set for a TPU, but for a lone caller's, which holds on any backend; "
                     f"this backend is {backend})")
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

// ftjit: _Batcher and _BatchQueue (see batcher.h): each call of a batched
// function, from joining its signature's queue to its own result, in one
// C++ call, so that no signal can land between the steps that change
// shared state. A KeyboardInterrupt (or any error) surfaces only where
// Python code runs: in a signal check between wait slices, or in a runner
// method; each such place puts the queue back in order before it goes on
// (the call leaves the queue, a leader hands its lead or its batch's
// members on), so another thread's Ctrl-C fails nobody else.
//
// The runner (ftjit/_batched.py: the JAX one, or stress.batch_runner's) is
// Python: alone(args, kwargs) runs one example by itself; batch(key, args,
// kwargs, columns, size) runs the examples of a batch (columns: one list
// per leaf, the leaf of each example in turn; size: the padded batch size)
// and returns its output; row(out, i) is example i's result of that output.
// Every member takes its own row in its own thread, after its leader woke
// it; a batch that raises an Exception is run again example by example,
// each member alone in its own thread, so that an error stays with its
// example.
//
//   | state                 | protection                                      |
//   |-----------------------|-------------------------------------------------|
//   | Batcher's options     | fixed at construction                           |
//   | Batcher's counters    | relaxed atomics                                 |
//   | QueueObject::q        | its own lock (BatchQueue)                       |
//   | QueueObject::closed   | atomic (set once, by a call that closed it)     |
//   | PyWaiter's references | its owner's and its leader's, as BatchQueue     |
//   |                       | publishes them                                  |
//   | t_active              | thread-local: the queues this thread waits in   |
//
// Lock order: the queue's lock is a leaf (BatchQueue); no Python code runs
// under it, and none is destroyed there.
#include "batch/batcher.h"

#include <Python.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "primitives/batch_queue.h"
#include "primitives/live_count.h"
#include "pyutil/errors.h"
#include "pyutil/leaf_mutex.h"
#include "pyutil/py_compat.h"

namespace nb = nanobind;

namespace ftjit {

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kSlice = std::chrono::milliseconds(100);  // how often a waiter runs signal handlers
// A running batch or lone call stops holding its running slot after
// kStallRuns times this function's mean run (lone calls, batches of every
// size, compiles included), within [kMinStall, kMaxStall],
// or kMaxStall before any run ended (the first may compile for seconds)
// (BatchQueue, "Running slots"): an example that never finishes holds its
// own callers only.
constexpr uint64_t kStallRuns = 10;
constexpr uint64_t kMinStall = 1'000'000'000;  // ns: a new size's compile (seconds) may run meanwhile
constexpr uint64_t kMaxStall = 5'000'000'000;  // ns

uint64_t Nanos(Clock::time_point t) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
}

PyObject* g_closed = nullptr;  // _BATCH_CLOSED: made at module init, then fixed
PyObject* g_alone = nullptr;   // interned method names of the runner, likewise
PyObject* g_batch = nullptr;
PyObject* g_row = nullptr;

// One call in a queue. Its references are dropped where its last holder
// lets it go: its owner or its leader, attached; a thread that CPython ends
// at interpreter shutdown (no thread state) leaks them instead.
struct PyWaiter : BatchWaiter {
  PyWaiter(nb::handle a, nb::handle k, nb::handle l) : args(nb::borrow(a)), kwargs(nb::borrow(k)), leaves(nb::borrow(l)) {}
  ~PyWaiter() {
    if (ThreadIsAttached()) return;
    args.release();
    kwargs.release();
    leaves.release();
    out.release();
  }
  PyWaiter(const PyWaiter&) = delete;
  PyWaiter& operator=(const PyWaiter&) = delete;
  nb::object args, kwargs, leaves;  // the call's, held while it is queued
  nb::object out;                   // its batch's output: written by its leader before kDone
  const Clock::time_point t0 = Clock::now();
};

using Queue = BatchQueue<LeafMutex, PyWaiter>;
using WaiterPtr = Queue::WaiterPtr;

// A batched function's options and counters, shared by its queues.
struct Batcher {
  Batcher(std::string n, size_t mb, double mw, std::vector<size_t> s, size_t mr, nb::object te)
      : name(std::move(n)), max_batch(mb),
        max_wait(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(mw))),
        sizes(std::move(s)), max_running(mr), timeout_error(std::move(te)),
        by_size(new std::atomic<uint64_t>[mb + 1]) {
    for (size_t i = 0; i <= mb; ++i) by_size[i].store(0, std::memory_order_relaxed);
  }
  size_t SizeFor(size_t n) const {
    for (size_t s : sizes) {
      if (s >= n) return s;
    }
    return n;
  }
  static void Add(std::atomic<uint64_t>& c, uint64_t n = 1) { c.fetch_add(n, std::memory_order_relaxed); }
  // A run (a batch or a lone call, holding a running slot) that started at `started` ended.
  void Ran(uint64_t started) {
    Add(run_ns, Nanos(Clock::now()) - started);
    Add(runs);
  }
  // How long a run holds its running slot (see kStallRuns).
  uint64_t StallNs() const {
    uint64_t n = runs.load(std::memory_order_relaxed);
    if (n == 0) return kMaxStall;
    uint64_t mean = run_ns.load(std::memory_order_relaxed) / n;
    return std::min(kMaxStall, std::max(kMinStall, kStallRuns * mean));
  }
  // A call's Exception (failed) or other BaseException (interrupted: Ctrl-C).
  void CountError(const nb::python_error& e) { Add(e.matches(PyExc_Exception) ? failed : interrupted); }

  const std::string name;
  const size_t max_batch;
  const Clock::duration max_wait;
  const std::vector<size_t> sizes;
  const size_t max_running;
  const nb::object timeout_error;
  std::atomic<uint64_t> calls{0}, batches{0}, alone{0}, examples{0}, padded{0}, waited_ns{0}, timeouts{0},
      failed{0}, retried{0}, interrupted{0}, fallback{0};
  // The leaders' time running the batches that ended well: from taking the batch to every member woken (its
  // stack, program, copy out and hand-off: what the bench's host overhead is read from).
  std::atomic<uint64_t> lead_ns{0};
  std::atomic<uint64_t> run_ns{0}, runs{0};  // every run that ended, however (for StallNs)
  const std::unique_ptr<std::atomic<uint64_t>[]> by_size;  // [n]: batches of n examples
};

struct BatcherObject {
  BatcherObject(std::string name, size_t max_batch, double max_wait, std::vector<size_t> sizes, size_t max_running,
                nb::object timeout_error)
      : b(std::make_shared<Batcher>(std::move(name), max_batch, max_wait, std::move(sizes), max_running,
                                    std::move(timeout_error))) {}

  nb::object Call(nb::handle runner, nb::handle key, nb::tuple leaves, nb::tuple args, nb::dict kwargs,
                  std::optional<double> timeout);

  std::shared_ptr<Batcher> b;
  // Signature key -> its queue (a _BatchQueue): a queue is put here by the
  // first call that finds none, and taken out, once closed, by the call
  // that saw it close, however that call ended (ForgetIfClosed). Single
  // dict operations, each atomic on free-threaded builds.
  nb::dict queues;
};

// The queues this thread waits in (as a member, a leader or alone), so that
// a call re-entering one on the same thread (a signal handler, a logging
// handler of a compile) runs alone instead of waiting on itself.
thread_local std::vector<const void*> t_active;

class ActiveScope {
 public:
  explicit ActiveScope(const void* q) { t_active.push_back(q); }
  ~ActiveScope() { t_active.pop_back(); }
  ActiveScope(const ActiveScope&) = delete;
  ActiveScope& operator=(const ActiveScope&) = delete;
};

// Runs `wait` with this thread detached. CPython may end a daemon thread
// at interpreter shutdown when it attaches again (a forced unwind, 3.11-
// 3.13): it is parked there, before any frame holding Python references
// unwinds (as CPython 3.14 parks such threads itself).
template <class Wait>
void Detached(Wait&& wait) {
  PyThreadState* ts = PyEval_SaveThread();
  wait();
  LeakingOnForcedUnwind([&] { PyEval_RestoreThread(ts); }, [] { ParkThreadEndedAtShutdown(); });
}

// runner.<name>(*args), or throws.
template <class... A>
nb::object CallRunner(nb::handle runner, PyObject* name, A... args) {
  PyObject* argv[] = {runner.ptr(), args...};
  return StealOrThrow(PyObject_VectorcallMethod(name, argv, 1 + sizeof...(A) | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                                nullptr));
}

void WakeAll(const std::vector<WaiterPtr>& wake) {
  for (const WaiterPtr& w : wake) w->Wake();
}

struct QueueObject {
  QueueObject(const BatcherObject& bo, nb::object k)
      : b(bo.b), q(bo.b->max_batch, bo.b->max_running), key(std::move(k)) {}

  nb::object Call(nb::handle runner, nb::tuple leaves, nb::tuple args, nb::dict kwargs, std::optional<double> timeout);

  std::shared_ptr<Batcher> b;
  Queue q;
  nb::object key;
  std::atomic<bool> closed{false};
  LiveCount<QueueObject> live;
};

// One call of a queue, on its caller's stack.
struct CallState {
  QueueObject& qo;
  Batcher& b;
  nb::handle runner;
  WaiterPtr w;
  std::optional<Clock::time_point> deadline;
  double timeout;
  uint64_t started = 0;  // when this call's run (alone, or its batch) took its running slot

  void Closed(bool closed) {
    if (closed) qo.closed.store(true, std::memory_order_relaxed);
  }

  // The call alone: a lone call, or an example retried after its batch failed.
  nb::object RunAlone() {
    try {
      return CallRunner(runner, g_alone, w->args.ptr(), w->kwargs.ptr());
    } catch (nb::python_error& e) {
      b.CountError(e);
      throw;
    }
  }

  // The queue's running slot is this call's (Join said kAlone).
  nb::object RunAloneHoldingSlot() {
    std::vector<WaiterPtr> none;
    nb::object out;
    Batcher::Add(b.alone);
    try {
      out = RunAlone();
    } catch (nb::python_error&) {
      EndRun(nullptr, kDone, &none);
      throw;
    }
    EndRun(nullptr, kDone, &none);
    return out;
  }

  // The run holding this call's running slot ended (batch: its members, or
  // null for a lone call).
  void EndRun(const std::vector<WaiterPtr>* batch, uint32_t outcome, std::vector<WaiterPtr>* wake) {
    b.Ran(started);
    Closed(qo.q.Finish(batch, w.get(), outcome, wake, started));
  }

  // Signal handlers (Ctrl-C) between wait slices; one that raises ends the
  // wait: this call leaves the queue (a leader hands the lead on).
  void CheckSignals() {
    if (PyErr_CheckSignals() == 0) return;
    nb::python_error error;  // taken: nothing below runs Python
    LeaveQueue(/*lead_too=*/true);
    b.CountError(error);
    throw error;
  }

  // Returns the state the call had (see BatchQueue::GiveUp).
  uint32_t LeaveQueue(bool lead_too) {
    WaiterPtr next;
    bool closed = false;
    uint32_t prior = qo.q.GiveUp(w.get(), lead_too, &next, &closed);
    if (next) next->Wake();
    Closed(closed);
    return prior;
  }

  [[noreturn]] void TimedOut(const char* why) {
    Batcher::Add(b.timeouts);
    char secs[32];
    std::snprintf(secs, sizeof(secs), "%g", timeout);
    std::string msg = b.name + "(): no result within timeout=" + secs + " s (" + why + ")";
    PyErr_SetString(b.timeout_error.ptr(), msg.c_str());
    throw nb::python_error();
  }

  std::chrono::nanoseconds SliceUntil(Clock::time_point until, Clock::time_point now) const {
    if (deadline && *deadline < until) until = *deadline;
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::min<Clock::duration>(until - now, kSlice));
  }

  // A member of a pending batch: waits until its leader decides (or it leads).
  nb::object Follow() {
    for (;;) {
      uint32_t s = w->Load();
      if (s == kDone) return CallRunner(runner, g_row, w->out.ptr(), nb::int_(w->index).ptr());
      if (s == kRetry) return RunAlone();
      if (s == kLead) return Lead();
      Clock::time_point now = Clock::now();
      if (deadline && now >= *deadline) {
        uint32_t prior = LeaveQueue(/*lead_too=*/false);
        if (prior == kDone || prior == kRetry || prior == kLead) continue;  // decided just now: ours after all
        TimedOut("this call's example is dropped; the other calls of its batch carry on");
      }
      Detached([&] { w->Wait(s, SliceUntil(now + kSlice, now)); });
      CheckSignals();
    }
  }

  // The leader: collects its batch, then runs it.
  nb::object Lead() {
    const Clock::time_point collect_until = Clock::now() + b.max_wait;
    std::vector<WaiterPtr> batch;
    for (;;) {
      Clock::time_point now = Clock::now();
      WaiterPtr next;
      uint32_t seen = 0;
      uint64_t stale_at = UINT64_MAX;
      if (qo.q.TryTake(w.get(), now >= collect_until, &batch, &next, &seen, Nanos(now), b.StallNs(), &stale_at)) {
        started = Nanos(now);
        if (next) next->Wake();
        break;
      }
      if (deadline && now >= *deadline) {
        LeaveQueue(/*lead_too=*/true);
        TimedOut("its batch had not started; the other calls wait for the next one");
      }
      // Else a batch must end (a wake), or go stale (at stale_at, > now).
      Clock::time_point until = now < collect_until ? collect_until : now + kSlice;
      if (now >= collect_until && stale_at != UINT64_MAX) {
        until = std::min(until, now + std::chrono::nanoseconds(stale_at - Nanos(now)));
      }
      Detached([&] { qo.q.WaitChanged(seen, SliceUntil(until, now)); });
      CheckSignals();
    }
    Clock::time_point taken = Clock::now();
    uint64_t waited = 0;
    for (const WaiterPtr& m : batch) {
      waited += std::chrono::duration_cast<std::chrono::nanoseconds>(taken - m->t0).count();
    }
    Batcher::Add(b.waited_ns, waited);
    return Run(batch);
  }

  // The leader runs its batch (w first). Out of the queue's lock.
  nb::object Run(std::vector<WaiterPtr>& batch) {
    std::vector<WaiterPtr> wake;
    const size_t n = batch.size();
    if (n == 1) {  // only the leader: a lone call
      nb::object out;
      Batcher::Add(b.alone);
      try {
        out = RunAlone();
      } catch (nb::python_error&) {
        EndRun(&batch, kDone, &wake);
        throw;
      }
      EndRun(&batch, kDone, &wake);
      return out;
    }
    const size_t size = b.SizeFor(n);
    const Clock::time_point lead_start = Clock::now();
    nb::object out;
    try {
      nb::object columns = Columns(batch);
      out = CallRunner(runner, g_batch, qo.key.ptr(), w->args.ptr(), w->kwargs.ptr(), columns.ptr(),
                       nb::int_(size).ptr());
    } catch (nb::python_error& e) {
      if (!e.matches(PyExc_Exception)) {
        // This thread was interrupted (Ctrl-C): the others go back, unharmed.
        b.Ran(started);
        Closed(qo.q.Requeue(batch, w.get(), &wake, started));
        WakeAll(wake);
        Batcher::Add(b.interrupted);
        throw;
      }
      // The batch failed: every member runs alone, in its own thread, so
      // that only the failing examples' callers raise (their own errors).
      EndRun(&batch, kRetry, &wake);
      WakeAll(wake);
      Batcher::Add(b.failed);
      Batcher::Add(b.retried, n);
    }
    if (!out.is_valid()) return RunAlone();  // the leader's own example, retried (the batch's error dropped)
    for (const WaiterPtr& m : batch) {
      if (m != w) m->out = out;  // before kDone publishes it
    }
    EndRun(&batch, kDone, &wake);
    WakeAll(wake);
    Batcher::Add(b.lead_ns, std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - lead_start).count());
    Batcher::Add(b.batches);
    Batcher::Add(b.examples, n);
    Batcher::Add(b.padded, size - n);
    Batcher::Add(b.by_size[n]);
    return CallRunner(runner, g_row, out.ptr(), nb::int_(0).ptr());
  }

  // One list per leaf position: that leaf of each member, in batch order.
  static nb::object Columns(const std::vector<WaiterPtr>& batch) {
    const Py_ssize_t n = static_cast<Py_ssize_t>(batch.size());
    const Py_ssize_t k = PyTuple_GET_SIZE(batch[0]->leaves.ptr());
    nb::object cols = StealOrThrow(PyList_New(k));
    for (Py_ssize_t j = 0; j < k; ++j) {
      PyObject* col = PyList_New(n);
      if (!col) throw nb::python_error();
      PyList_SET_ITEM(cols.ptr(), j, col);
      for (Py_ssize_t i = 0; i < n; ++i) {
        PyList_SET_ITEM(col, i, Py_NewRef(PyTuple_GET_ITEM(batch[i]->leaves.ptr(), j)));
      }
    }
    return cols;
  }
};

nb::object QueueObject::Call(nb::handle runner, nb::tuple leaves, nb::tuple args, nb::dict kwargs,
                             std::optional<double> timeout) {
  Batcher& bt = *b;
  const void* me = this;
  if (std::find(t_active.begin(), t_active.end(), me) != t_active.end()) {
    // Re-entered on a thread that waits in this queue already: alone.
    Batcher::Add(bt.calls);
    Batcher::Add(bt.alone);
    CallState c{*this, bt, runner, std::make_shared<PyWaiter>(args, kwargs, leaves), std::nullopt, 0.0};
    return c.RunAlone();
  }
  // Held outside the body below: should CPython end this thread at shutdown
  // inside it, it is parked before this reference could be dropped.
  WaiterPtr w = std::make_shared<PyWaiter>(args, kwargs, leaves);
  const uint64_t joined = Nanos(Clock::now());
  Queue::Role role = q.Join(w, joined);
  if (role == Queue::Role::kClosed) {
    closed.store(true, std::memory_order_relaxed);
    return nb::borrow(g_closed);
  }
  Batcher::Add(bt.calls);
  CallState c{*this, bt, runner, w, std::nullopt, timeout.value_or(0.0), joined};
  if (timeout) {
    c.deadline = w->t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(*timeout));
  }
  ActiveScope active(me);
  return LeakingOnForcedUnwind(
      [&] {
        switch (role) {
          case Queue::Role::kAlone:
            return c.RunAloneHoldingSlot();
          case Queue::Role::kLead:
            return c.Lead();
          default:
            return c.Follow();
        }
      },
      [] { ParkThreadEndedAtShutdown(); });
}

// The queue of `key` in `queues`: the one there, or a new one put there.
nb::object QueueFor(BatcherObject& bo, nb::handle key) {
  PyObject* found = nullptr;
  int r = DictGetItemRef(bo.queues.ptr(), key.ptr(), &found);
  if (r < 0) throw nb::python_error();
  if (r == 1) return nb::steal(found);
  nb::handle type = nb::type<QueueObject>();
  nb::object fresh = nb::inst_alloc(type);
  new (nb::inst_ptr<QueueObject>(fresh)) QueueObject(bo, nb::borrow(key));
  nb::inst_mark_ready(fresh);
  PyObject* kept = nullptr;
  if (DictSetDefaultRef(bo.queues.ptr(), key.ptr(), fresh.ptr(), &kept) < 0) throw nb::python_error();
  return nb::steal(kept);  // fresh, or another thread's made meanwhile
}

// Takes `q` out of `queues` if it closed and is still the one there. No
// critical section spans the look and the removal (a dict operation inside
// a critical section on the same dict suspends it, 3.13t: it spun for
// ~25 us a call): two calls may both find q closed, and the second may then
// take out a new queue that a third call put there meanwhile. That queue
// serves its callers as before and closes by itself; the next call of the
// key makes another: two queues of one signature for a while, as when two
// calls race to make the first. Keeps any error of its own out of the
// call's outcome: one is reported as unraisable (a key whose __eq__ raised)
// and the queue stays (closed: the next call of its key replaces it).
// Called with no error set (a call's own is held by the nb::python_error
// being handled).
void ForgetIfClosed(BatcherObject& bo, nb::handle key, nb::handle q) noexcept {
  if (!nb::inst_ptr<QueueObject>(q)->closed.load(std::memory_order_relaxed)) return;
  PyObject* current = nullptr;
  int r = DictGetItemRef(bo.queues.ptr(), key.ptr(), &current);
  if (r == 1 && current == q.ptr() && PyDict_DelItem(bo.queues.ptr(), key.ptr()) < 0) {
    r = PyErr_ExceptionMatches(PyExc_KeyError) ? 0 : -1;  // gone already: another call took it out
    if (r == 0) PyErr_Clear();
  }
  if (r < 0) PyErr_WriteUnraisable(bo.queues.ptr());
  Py_XDECREF(current);  // the dict's reference went first: ours is not the last (the caller holds q)
}

nb::object BatcherObject::Call(nb::handle runner, nb::handle key, nb::tuple leaves, nb::tuple args, nb::dict kwargs,
                               std::optional<double> timeout) {
  for (;;) {
    nb::object q = QueueFor(*this, key);
    nb::object out;
    try {
      out = nb::inst_ptr<QueueObject>(q)->Call(runner, leaves, args, kwargs, timeout);
    } catch (nb::python_error&) {
      ForgetIfClosed(*this, key, q);  // a call that raised (an error, a timeout, Ctrl-C) leaves nothing behind
      throw;
    } catch (std::exception&) {
      ForgetIfClosed(*this, key, q);
      throw;
    }
    ForgetIfClosed(*this, key, q);
    if (!out.is(g_closed)) return out;
  }
}

// A call that does not queue (its signature cannot be batched, or it takes
// the compiler's fallback): fn(args, kwargs), counted.
nb::object RunUnqueued(BatcherObject& bo, bool fallback, nb::handle fn, nb::tuple args, nb::dict kwargs) {
  Batcher& b = *bo.b;
  Batcher::Add(b.calls);
  Batcher::Add(fallback ? b.fallback : b.alone);
  try {
    return nb::borrow(fn)(args, kwargs);
  } catch (nb::python_error& e) {
    b.CountError(e);
    throw;
  }
}

nb::dict Info(const BatcherObject& bo) {
  const Batcher& b = *bo.b;
  auto get = [](const std::atomic<uint64_t>& c) { return c.load(std::memory_order_relaxed); };
  nb::dict d;
  d["calls"] = get(b.calls);
  d["batches"] = get(b.batches);
  d["alone"] = get(b.alone);
  d["examples"] = get(b.examples);
  d["padded"] = get(b.padded);
  d["waited_seconds"] = static_cast<double>(get(b.waited_ns)) / 1e9;
  d["timeouts"] = get(b.timeouts);
  d["failed"] = get(b.failed);
  d["retried"] = get(b.retried);
  d["interrupted"] = get(b.interrupted);
  d["fallback"] = get(b.fallback);
  d["lead_seconds"] = static_cast<double>(get(b.lead_ns)) / 1e9;
  nb::list sizes;
  for (size_t n = 0; n <= b.max_batch; ++n) {
    uint64_t count = get(b.by_size[n]);
    if (count) sizes.append(nb::make_tuple(n, count));
  }
  d["sizes"] = nb::tuple(sizes);
  return d;
}

}  // namespace

int64_t LiveBatchQueues() { return LiveCount<QueueObject>::Count(); }

void RegisterBatcher(nb::module_& m) {
  g_closed = StealOrThrow(PyObject_CallNoArgs(reinterpret_cast<PyObject*>(&PyBaseObject_Type))).release().ptr();
  g_alone = PyUnicode_InternFromString("alone");
  g_batch = PyUnicode_InternFromString("batch");
  g_row = PyUnicode_InternFromString("row");
  nb::class_<BatcherObject>(m, "_Batcher",
                            "A batched function's options and counters, which its queues share (ftjit._batched).")
      .def(nb::init<std::string, size_t, double, std::vector<size_t>, size_t, nb::object>(), nb::arg("name"),
           nb::arg("max_batch"), nb::arg("max_wait"), nb::arg("sizes"), nb::arg("max_running"),
           nb::arg("timeout_error"))
      .def("info", &Info, "A snapshot of the counters (each read atomically, not all at one instant).")
      .def("run", &RunUnqueued, nb::arg("fallback"), nb::arg("fn"), nb::arg("args"), nb::arg("kwargs"),
           "fn(args, kwargs) for a call that does not queue (alone, or the compiler's fallback), counted.")
      .def("call", &BatcherObject::Call, nb::arg("runner"), nb::arg("key"), nb::arg("leaves"), nb::arg("args"),
           nb::arg("kwargs"), nb::arg("timeout").none(),
           "This call's result, computed alone or in a batch with other threads' calls of its signature `key`\n"
           "(the queue of `key`: made when there is none, and gone once idle, however its last call ended).")
      .def_prop_ro(
          "queues", [](const BatcherObject& bo) { return bo.queues; },
          "The queues now, by signature key (the dict itself: tests and diagnostics).");
  nb::class_<QueueObject>(m, "_BatchQueue",
                          "The calls of one signature of a batched function, merged into batches "
                          "(made by _Batcher.call; the protocol: cpp/primitives/batch_queue.h).")
      .def_prop_ro(
          "closed", [](const QueueObject& q) { return q.closed.load(std::memory_order_relaxed); },
          "Whether the queue closed (it was idle): the next call needs a new one.");
}

}  // namespace ftjit

// ftjit: the core of ftjit.batched: _Batcher (a batched function's options
// and counters) and _BatchQueue (the calls of one signature, merged into
// batches by the protocol of primitives/batch_queue.h). ftjit/_batched.py
// is the Python side: it keys calls, keeps one queue per signature and runs
// batches through its runner.
#pragma once

#include <cstdint>

#include <nanobind/nanobind.h>

namespace ftjit {

// Adds _Batcher, _BatchQueue and _BATCH_CLOSED to the module.
void RegisterBatcher(nanobind::module_& m);

// _BatchQueue objects alive now (_core._live_counts).
int64_t LiveBatchQueues();

}  // namespace ftjit

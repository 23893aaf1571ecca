// ftjit: a hash map whose lookups survive re-entrant mutation from the key's equality.
//
// Contract
//   * The caller computes the hash before calling in; the map never hashes.
//     (A Python __hash__ may run arbitrary code, so it must not run in here.)
//   * Equality (`eq(stored_key, probe)`) runs with the map's lock RELEASED, on
//     a copy of the stored key. It may re-enter the map (find, insert, erase,
//     clear) from the same or another thread, and it may throw; the map stays
//     consistent and the exception propagates to the caller of Find*.
//   * Every insert stamps the slot with a sequence number taken from a
//     version counter. After the unlocked equality checks, FindOrInsert only
//     inserts if the version is unchanged; otherwise it re-checks just the
//     slots added since (an already-rejected key cannot start matching), so a
//     lookup never loops on the same keys and never inserts a duplicate.
//   * Key and Value must be cheap to copy (shared_ptr-like) and their copy
//     and destruction must not call back into code that uses this map: the
//     map copies them under its lock. Values removed by Erase*/Clear are
//     handed back to the caller so that they are destroyed outside the lock.
//
// Threading: every member function is safe to call concurrently. The lock is
// a template parameter (locks.h: StdMutex in the C++ tests, LeafMutex in the
// extension: a PyMutex on free-threaded builds, a no-op on GIL builds, where
// the GIL serialises these short, Python-free critical sections). The hit
// path does not come here: it reads entry_store.h's lock-free ready table.
//
//   | member    | protection                                                 |
//   |-----------|------------------------------------------------------------|
//   | slots_    | FTJIT_GUARDED_BY(mu_)                                      |
//   | version_  | FTJIT_GUARDED_BY(mu_)                                      |
//
// The guards are checked by clang++ -Wthread-safety (thread_annotations.h):
// every lookup and update takes mu_ itself, through LockGuard, and is
// FTJIT_EXCLUDES(mu_) (mu_ is not re-entrant: calling one with it held
// would self-deadlock).
//
// Lock order: mu_ is a leaf: nothing else is acquired while it is held.
// `eq` and `make` run with it released; EraseIf's predicate runs under it,
// so it must take no lock and run no Python.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <unordered_map>
#include <utility>
#include <vector>

#include "primitives/locks.h"
#include "primitives/small_vector.h"
#include "primitives/thread_annotations.h"

namespace ftjit {

template <class Key, class Value, class Mutex>
class ReentrantMap {
 public:
  struct Result {
    Value value;
    bool inserted;  // true when `make()` produced the value now in the map
  };

  ReentrantMap() = default;
  ReentrantMap(const ReentrantMap&) = delete;
  ReentrantMap& operator=(const ReentrantMap&) = delete;

  // Returns the value whose key equals `probe`, or a default Value.
  // May throw whatever `eq` throws.
  template <class Probe, class Eq>
  Value Find(size_t hash, const Probe& probe, Eq&& eq) const FTJIT_EXCLUDES(mu_) {
    Candidates cands;
    Collect(hash, /*since=*/0, cands);
    for (size_t i = 0; i < cands.size(); ++i) {
      if (eq(cands[i].key, probe)) return cands[i].value;
    }
    return Value();
  }

  // Finds the value for `probe` or inserts the (key, value) pair returned by
  // `make()` (called at most once, outside the lock). Exactly one value is
  // ever in the map for a class of equal keys, whatever runs concurrently.
  template <class Probe, class Eq, class Make>
  Result FindOrInsert(size_t hash, const Probe& probe, Eq&& eq, Make&& make) FTJIT_EXCLUDES(mu_) {
    uint64_t since = 0;
    bool made = false;
    std::pair<Key, Value> fresh;
    for (;;) {
      Candidates cands;
      uint64_t version = Collect(hash, since, cands);
      for (size_t i = 0; i < cands.size(); ++i) {
        if (eq(cands[i].key, probe)) return Result{cands[i].value, false};
      }
      since = version;
      if (!made) {
        fresh = make();
        made = true;
      }
      LockGuard<Mutex> lock(mu_);
      if (version_ == version) {
        uint64_t seq = ++version_;
        slots_.emplace(hash, Slot{seq, fresh.first, fresh.second});
        return Result{std::move(fresh.second), true};
      }
      // Something was inserted while `eq` ran unlocked: check the newcomers.
    }
  }

  // Whether a slot with this hash holds `value` (identity of the shared
  // handle). Python-free: never calls `eq`.
  bool ContainsValue(size_t hash, const Value& value) const FTJIT_EXCLUDES(mu_) {
    LockGuard<Mutex> lock(mu_);
    auto range = slots_.equal_range(hash);
    for (auto it = range.first; it != range.second; ++it) {
      if (it->second.value == value) return true;
    }
    return false;
  }

  // Puts `fresh` in place of `old` (identity of the shared handle) in the
  // slot with this hash that holds it, keeping that slot's key, if
  // `claim()` (called under the lock: Python-free, no lock, cannot throw)
  // agrees; false, changing nothing, when no slot holds `old` or `claim()`
  // refuses. The slot counts as inserted now (a fresh seq), so a
  // FindOrInsert racing with it re-checks it and finds `fresh`. `old` stays
  // the caller's to drop, outside the lock.
  template <class Claim>
  bool ReplaceValueIf(size_t hash, const Value& old, Claim&& claim, const Value& fresh) FTJIT_EXCLUDES(mu_) {
    LockGuard<Mutex> lock(mu_);
    auto range = slots_.equal_range(hash);
    for (auto it = range.first; it != range.second; ++it) {
      if (it->second.value == old) {
        if (!claim()) return false;
        it->second.seq = ++version_;
        it->second.value = fresh;
        return true;
      }
    }
    return false;
  }

  // Removes the slot with this hash whose value equals `value` (identity of
  // the shared handle). Returns the removed value (default if none) so the
  // caller drops it outside the lock.
  Value Erase(size_t hash, const Value& value) FTJIT_EXCLUDES(mu_) {
    std::pair<Key, Value> out;
    {
      LockGuard<Mutex> lock(mu_);
      auto range = slots_.equal_range(hash);
      for (auto it = range.first; it != range.second; ++it) {
        if (it->second.value == value) {
          out.first = std::move(it->second.key);
          out.second = std::move(it->second.value);
          slots_.erase(it);
          break;
        }
      }
    }
    return std::move(out.second);
  }

  // Removes every slot whose value satisfies `pred` (called under the lock:
  // it must be Python-free). Returns the removed pairs.
  template <class Pred>
  std::vector<std::pair<Key, Value>> EraseIf(Pred&& pred) FTJIT_EXCLUDES(mu_) {
    std::vector<std::pair<Key, Value>> out;
    LockGuard<Mutex> lock(mu_);
    for (auto it = slots_.begin(); it != slots_.end();) {
      if (pred(it->second.key, it->second.value)) {
        out.emplace_back(std::move(it->second.key), std::move(it->second.value));
        it = slots_.erase(it);
      } else {
        ++it;
      }
    }
    return out;
  }

  // Removes everything; returns the removed pairs for the caller to drop.
  std::vector<std::pair<Key, Value>> Clear() FTJIT_EXCLUDES(mu_) {
    return EraseIf([](const Key&, const Value&) { return true; });
  }

  // A snapshot of the current pairs (copies, taken under the lock).
  std::vector<std::pair<Key, Value>> Snapshot() const FTJIT_EXCLUDES(mu_) {
    std::vector<std::pair<Key, Value>> out;
    LockGuard<Mutex> lock(mu_);
    out.reserve(slots_.size());
    for (const auto& kv : slots_) out.emplace_back(kv.second.key, kv.second.value);
    return out;
  }

  size_t size() const FTJIT_EXCLUDES(mu_) {
    LockGuard<Mutex> lock(mu_);
    return slots_.size();
  }

  // In a forked child's only thread, before any use: the lock may have been
  // held by (handed to) a thread that does not exist here (leaf_mutex.h).
  void ReinitLockInChild() { ReinitInChild(mu_); }
  // Tests only: hold the lock as a thread that vanished at fork would.
  void LockForTest() const FTJIT_ACQUIRE(mu_) { mu_.lock(); }
  void UnlockForTest() const FTJIT_RELEASE(mu_) { mu_.unlock(); }

 private:
  struct Slot {
    uint64_t seq;  // value of version_ when inserted (or its value replaced: ReplaceValueIf)
    Key key;
    Value value;
  };
  struct Candidate {
    Key key;
    Value value;
  };
  using Candidates = SmallVector<Candidate, 2>;
  struct IdentityHash {
    size_t operator()(size_t h) const noexcept { return h; }
  };

  // Copies the slots with `hash` inserted after `since`; returns the version
  // the copy corresponds to.
  uint64_t Collect(size_t hash, uint64_t since, Candidates& out) const FTJIT_EXCLUDES(mu_) {
    LockGuard<Mutex> lock(mu_);
    auto range = slots_.equal_range(hash);
    for (auto it = range.first; it != range.second; ++it) {
      if (it->second.seq > since) {
        out.push_back(Candidate{it->second.key, it->second.value});
      }
    }
    return version_;
  }

  mutable Mutex mu_;  // leaf lock: nothing else is acquired while it is held
  uint64_t version_ FTJIT_GUARDED_BY(mu_) = 0;
  std::unordered_multimap<size_t, Slot, IdentityHash> slots_ FTJIT_GUARDED_BY(mu_);
};

}  // namespace ftjit

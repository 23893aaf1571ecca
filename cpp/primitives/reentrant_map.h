// ftjit: a hash map whose lookups survive re-entrant mutation from the key's
// equality. The hit path does not come here (EntryStore's ready table).
//
// Contract
//   * Every member function is safe to call concurrently.
//   * The caller computes the hash: a Python __hash__ may run arbitrary code,
//     so it must not run in here.
//   * Equality (`eq(stored_key, probe)`) runs with the lock released, on a
//     copy of the stored key. It may re-enter the map from any thread, and it
//     may throw: the map stays consistent and the exception propagates.
//   * Every insert stamps its slot with the next version. After the unlocked
//     equality checks, FindOrInsert inserts only if the version is unchanged;
//     otherwise it re-checks just the slots added since (a rejected key cannot
//     start matching), so it never loops on the same keys nor inserts a
//     duplicate.
//   * Key and Value are cheap to copy (shared_ptr-like), and their copy and
//     destruction must not call back into this map: they are copied under its
//     lock. Removed values are handed back, to be destroyed outside it.
//
//   | member    | protection                                                 |
//   |-----------|------------------------------------------------------------|
//   | slots_    | FTJIT_GUARDED_BY(mu_)                                      |
//   | version_  | FTJIT_GUARDED_BY(mu_)                                      |
//
// Lock order: mu_ is a leaf: nothing else is acquired while it is held. On
// GIL builds LeafMutex is a no-op and the GIL serialises these short,
// Python-free sections. `eq` and `make` run with it released; EraseIf's
// predicate and ReplaceValueIf's claim run under it, so they must take no
// lock and run no Python.
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

  // The value whose key equals `probe`, or a default Value.
  template <class Probe, class Eq>
  Value Find(size_t hash, const Probe& probe, Eq&& eq) const FTJIT_EXCLUDES(mu_) {
    Candidates cands;
    Collect(hash, /*since=*/0, cands);
    for (size_t i = 0; i < cands.size(); ++i) {
      if (eq(cands[i].key, probe)) return cands[i].value;
    }
    return Value();
  }

  // Finds the value for `probe` or inserts the pair `make()` returns (called
  // at most once, outside the lock). Exactly one value is ever in the map for
  // a class of equal keys, whatever runs concurrently.
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

  // Whether a slot with this hash holds `value` (identity of the handle).
  // Never calls `eq`.
  bool ContainsValue(size_t hash, const Value& value) const FTJIT_EXCLUDES(mu_) {
    LockGuard<Mutex> lock(mu_);
    auto range = slots_.equal_range(hash);
    for (auto it = range.first; it != range.second; ++it) {
      if (it->second.value == value) return true;
    }
    return false;
  }

  // Puts `fresh` in place of `old` (identity) in the slot with this hash
  // that holds it, keeping its key, if `claim()` (under the lock; cannot
  // throw) agrees; false, changing nothing, otherwise. The slot counts as
  // inserted now (a fresh seq), so a racing FindOrInsert re-checks it and
  // finds `fresh`.
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

  // Removes the slot with this hash that holds `value` (identity); returns
  // the removed value (default if none).
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

  std::vector<std::pair<Key, Value>> Clear() FTJIT_EXCLUDES(mu_) {
    return EraseIf([](const Key&, const Value&) { return true; });
  }

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

  // In a forked child's only thread, before any use (ReinitInChild).
  void ReinitLockInChild() { ReinitInChild(mu_); }
  // Tests only: hold the lock as a thread that vanished at fork would.
  void LockForTest() const FTJIT_ACQUIRE(mu_) { mu_.lock(); }
  void UnlockForTest() const FTJIT_RELEASE(mu_) { mu_.unlock(); }

 private:
  struct Slot {
    uint64_t seq;  // version_ when inserted (or its value replaced)
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
  // the copy is of.
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

  mutable Mutex mu_;  // leaf lock
  uint64_t version_ FTJIT_GUARDED_BY(mu_) = 0;
  std::unordered_multimap<size_t, Slot, IdentityHash> slots_ FTJIT_GUARDED_BY(mu_);
};

}  // namespace ftjit

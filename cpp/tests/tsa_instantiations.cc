// ftjit: every primitive's class template explicitly instantiated, and each
// member template called once, for Clang's thread-safety analysis only
// (bash dev.sh tsa compiles this file; nothing runs it).
//
// Clang analyses a template's member functions only where they are
// instantiated: a guarded field written without its lock in a member no
// test happens to call (a fork hook, a test hook, an accessor) would pass
// the analysis unseen. An explicit instantiation instantiates every member
// function of a class template; member templates are instantiated by the
// calls in UseMemberTemplates. Built twice: over StdMutex, and with
// FTJIT_TSA_LEAF_MUTEX over LeafMutex (against the venv's Python headers).
//
// Shared state: none (nothing here runs).
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "primitives/batch_queue.h"
#include "primitives/compile_latch.h"
#include "primitives/epoch.h"
#include "primitives/listing_table.h"
#include "primitives/locks.h"
#include "primitives/per_thread.h"
#include "primitives/reentrant_map.h"
#include "primitives/shared_lru.h"
#include "primitives/thread_indices.h"
#include "store/entry_store.h"

#ifdef FTJIT_TSA_LEAF_MUTEX
#include "pyutil/leaf_mutex.h"
using TsaMutex = ftjit::LeafMutex;
#else
using TsaMutex = ftjit::StdMutex;
#endif

namespace tsa {

struct Node;
using NodePtr = std::shared_ptr<Node>;
struct Node {
  ftjit::LruHook<NodePtr> lru;
};

struct Sig {
  size_t hash;
};
struct Payload {};
enum class FastEq { kEqual, kNotEqual, kUnknown };
struct Traits {
  using Sig = tsa::Sig;
  using Payload = tsa::Payload;
  using Mutex = TsaMutex;
  using LocalExe = int;
  static size_t TableHash(const Sig& s) { return s.hash; }
  static FastEq FastEquals(const Sig&, const Sig&) noexcept { return FastEq::kUnknown; }
  static bool Equals(const Sig&, const Sig&) { return true; }
  static ftjit::EpochDomain<TsaMutex>& Epochs();
};

struct BatchWaiter : ftjit::BatchWaiter {};

using Key = std::shared_ptr<int>;
using Map = ftjit::ReentrantMap<Key, Key, TsaMutex>;
using Lru = ftjit::SharedLru<NodePtr, TsaMutex>;

}  // namespace tsa

namespace ftjit {
template class ReentrantMap<tsa::Key, tsa::Key, TsaMutex>;
template class SharedLru<tsa::NodePtr, TsaMutex>;
template class EpochDomain<TsaMutex>;
template class ListingTable<tsa::Node>;
template class ThreadSlot<tsa::Traits>;
template class PerThread<tsa::Node>;
template struct StoreEntry<tsa::Traits>;
template class EntryStore<tsa::Traits>;
template class BatchQueue<TsaMutex, tsa::BatchWaiter>;
}  // namespace ftjit

namespace tsa {

bool KeyEq(const Key& stored, const int& probe) { return *stored == probe; }
bool AlwaysTrue(const NodePtr&) { return true; }

// Instantiates the member templates (never called).
void UseMemberTemplates(Map& map, Lru& lru, ftjit::ListingTable<Node>& table, TsaMutex& writer_mu,
                        const NodePtr& node) {
  map.Find(0, 1, KeyEq);
  map.FindOrInsert(0, 1, KeyEq, [] { return std::make_pair(Key(), Key()); });
  map.EraseIf([](const Key&, const Key&) { return true; });
  map.ReplaceValueIf(0, Key(), [] { return true; }, Key());
  lru.Insert(node, AlwaysTrue);
  lru.Trim(AlwaysTrue);
  lru.RemoveIf(AlwaysTrue);
  lru.RemoveEach(std::vector<NodePtr>{node}, [](const NodePtr& n) -> const NodePtr& { return n; });
  bool undecided = false;
  table.Load()->Find(0, 1, [](const Node&, const int&) noexcept { return FastEq::kUnknown; }, &undecided);
  ftjit::LockGuard<TsaMutex> lock(writer_mu);
  delete table.Insert(0, node.get(), writer_mu);
  delete table.Erase({{0, node.get()}}, writer_mu);
  (void)table.size(writer_mu);
  delete table.Take(writer_mu);
}

}  // namespace tsa

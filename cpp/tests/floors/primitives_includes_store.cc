// ftjit tests: a file of the primitives floor including a header of a floor above (store)
// must fail to compile: that header is not in the floor's include root
// (cpp/tests/CMakeLists.txt, floor_climbing_include_fails, WILL_FAIL).
#include "primitives/reentrant_map.h"
#include "store/entry_store.h"

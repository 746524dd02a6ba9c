// What an inspect::File holds: the platform's file and the size it is read against. Shared by
// the inspection library's sources only.
#pragma once

#include "platform/platform.hpp"

#include <weightcache/inspect.hpp>

#include <cstdint>

namespace weightcache::inspect {

struct File::Impl {
  platform::File file;
  platform::FileInfo info;  // the fstat the last read was made against
  std::uint64_t size = 0;   // info.size
};

}  // namespace weightcache::inspect

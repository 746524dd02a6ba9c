// A consumer of the installed weightcache/spdlog.hpp, built with find_package(weightcache) and
// find_package(spdlog) (install_test.sh). The library warns once through a plain callback (the
// reference text), once routed into an spdlog logger, whose sink must hold exactly that text at
// spdlog's warn level under the logger's name, and once after the route ended, which must go to
// stderr again (install_test.sh counts it there). Prints "routed restored" when the routed line is
// right.
#include <weightcache/spdlog.hpp>
#include <weightcache/weight_cache.hpp>

#include <spdlog/sinks/ostream_sink.h>

#include <cstdio>
#include <memory>
#include <sstream>
#include <string>

namespace {

// A cache in a directory that does not exist: the library warns that it falls back to the heap.
bool open_where_it_warns(const std::string& path) {
  weightcache::Options o;
  o.path = path;
  return weightcache::WeightCache::open(o).ok();
}

void keep(void* user, wc_log_level level, const char* message, size_t size) {
  if (level == WC_LOG_WARN) static_cast<std::string*>(user)->append(message, size);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string path = std::string(argv[1]) + ".missing/cache.wcache";

  std::string reference;
  wc_set_log_callback(&keep, &reference);
  if (!open_where_it_warns(path)) return 1;
  wc_set_log_callback(nullptr, nullptr);
  if (reference.find("heap") == std::string::npos) {
    std::fprintf(stderr, "consumer_spdlog: no heap fallback warning from the library: '%s'\n", reference.c_str());
    return 1;
  }

  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  sink->set_pattern("%l|%n|%v");
  auto logger = std::make_shared<spdlog::logger>("host", sink);
  logger->set_level(spdlog::level::info);
  {
    const auto route = weightcache::route_log_to(logger);
    if (!open_where_it_warns(path)) return 1;
  }
  const std::string want = "warning|host|" + reference + "\n";
  // At info the logger also keeps the library's info lines (none for a heap cache today): only
  // the warning is checked.
  const std::string got = out.str();
  const auto at = got.find("warning|");
  if (at == std::string::npos || got.compare(at, want.size(), want) != 0) {
    std::fprintf(stderr, "consumer_spdlog: the sink holds '%s', wanted a line '%s'\n", got.c_str(), want.c_str());
    return 1;
  }
  if (!open_where_it_warns(path)) return 1;  // the route ended: this warning goes to stderr
  if (out.str() != got) {
    std::fprintf(stderr, "consumer_spdlog: the sink got a line after the route ended: '%s'\n", out.str().c_str());
    return 1;
  }
  std::printf("routed restored\n");
  return 0;
}

#include "rewrite.hpp"

#include "output.hpp"

#include <weightcache/inspect.hpp>
#include <weightcache/weight_cache.hpp>

#include <cstdio>

namespace weightcache::cli {
namespace {

struct Failure {
  int exit_code;
  std::string message;
};
using Outcome = std::optional<Failure>;  // nullopt = success

void say_error(const std::string& msg) { std::fprintf(stderr, "weightcache: %s\n", msg.c_str()); }

int report(const Failure& f) {
  say_error(f.message);
  return f.exit_code;
}

// For files a command replaces: a symlink would be replaced by the rename, not followed.
Outcome check_replaceable(const std::string& path, bool must_exist, bool* exists) {
  auto r = inspect::replaceable(path, must_exist);
  if (!r) return Failure{kExitCannotRead, r.error().message};
  *exists = r.value();
  return std::nullopt;
}

// Running out of memory says nothing about the file: exit 5, with the one message every command
// gives for it.
Failure read_failure(const std::string& path, const Error& e) {
  if (e.code == Errc::no_memory) return {kExitIo, "out of memory"};
  return {kExitCannotRead, "cannot read '" + path + "': " + e.message};
}

Failure open_failure(const Error& e) {
  if (e.code == Errc::no_memory) return {kExitIo, "out of memory"};
  return {kExitCannotRead, e.message};
}

void print_findings(const std::string& path, const inspect::Inspection& in) {
  for (const auto& f : in.findings) std::fprintf(stderr, "%s: %s\n", path.c_str(), f.message.c_str());
}

}  // namespace

int run_compact(const std::string& path, const CompactOptions& opt) {
  bool exists = false;
  if (auto f = check_replaceable(path, true, &exists)) return report(*f);
  // What kind of file it is decides the message, not the library's verdict alone: an XPWC file
  // wants convert, a damaged one wants verify's findings.
  {
    auto file = inspect::File::open(path);
    if (!file) return report(open_failure(file.error()));
    auto in = inspect::inspect(file.value());
    if (!in) return report(read_failure(path, in.error()));
    if (in->format == inspect::FileFormat::xpwc)
      return report({kExitUsage, "'" + path + "' is an ExecuTorch XPWC file; use 'weightcache convert' to turn it "
                                 "into a weightcache file"});
    if (in->format != inspect::FileFormat::weightcache || !in->index_usable) {
      print_findings(path, in.value());
      return report({kExitCannotRead, "'" + path + "' has no valid index; nothing to compact (see 'weightcache verify')"});
    }
    if (!in->findings.empty()) {
      // Rewriting would discard whatever a damaged newer commit or slot still holds.
      print_findings(path, in.value());
      return report({kExitProblems, "'" + path + "' has problems (see 'weightcache verify'); not compacted"});
    }
  }
  // The library does the rest: the lease, the in-use lock, the copy, the read-back, the rename.
  wc_options o;
  wc_options_init(&o);
  o.path = path.c_str();
  if (opt.compat_key) {
    o.compat_key = opt.compat_key->data();
    o.compat_key_size = opt.compat_key->size();
  }
  unsigned flags = opt.compat_key ? 0u : unsigned{WC_COMPACT_ANY_KEY};
  if (opt.drop_corrupt) flags |= WC_COMPACT_DROP_CORRUPT;
  if (opt.canonical) flags |= WC_COMPACT_CANONICAL;
  wc_compact_report r;
  wc_compact_report_init(&r);
  const wc_status st = wc_compact_ex(&o, flags, &r);
  if (st != WC_OK) {
    const std::string msg = wc_last_error();
    switch (st) {
      case WC_ERR_BUSY: return report({kExitBusy, msg});
      case WC_ERR_INCOMPATIBLE:
        return report({kExitUsage, "--compat-key does not match the compatibility key '" + path +
                                       "' was written for (" + msg + ")"});
      case WC_ERR_CORRUPT: {
        // Damaged entries: name them, as verify would.
        if (auto file = inspect::File::open(path)) {
          if (auto in = inspect::inspect(file.value())) {
            Progress progress("checking entries", in->payload_bytes());
            if (inspect::check_checksums(file.value(), &in.value(), progress.callback()))
              for (const auto& f : in->findings) std::fprintf(stderr, "%s: %s\n", path.c_str(), f.message.c_str());
          }
        }
        return report({kExitProblems, "not compacted: " + msg + ". Rerun with --drop-corrupt to leave damaged entries out."});
      }
      case WC_ERR_INVALID_ARGUMENT: return report({kExitCannotRead, msg});
      case WC_ERR_NO_MEMORY: return report({kExitIo, "out of memory"});
      default: return report({kExitIo, msg});
    }
  }
  if (r.compacted == 0) {
    std::printf("%s is already compact: %llu bytes, %llu entries\n", path.c_str(),
                static_cast<unsigned long long>(r.bytes_before), static_cast<unsigned long long>(r.entries));
    return kExitOk;
  }
  std::printf("compacted %s: %llu -> %llu bytes, %llu entries", path.c_str(),
              static_cast<unsigned long long>(r.bytes_before), static_cast<unsigned long long>(r.bytes_after),
              static_cast<unsigned long long>(r.entries));
  if (r.dropped_entries != 0)
    std::printf(" (%llu damaged entries dropped)", static_cast<unsigned long long>(r.dropped_entries));
  std::printf("\n");
  return kExitOk;
}

int run_convert(const std::string& in_path, const std::string& out_path, const ConvertOptions& opt) {
  auto file = inspect::File::open(in_path);
  if (!file) return report(open_failure(file.error()));
  auto in = inspect::inspect(file.value());
  if (!in) return report(read_failure(in_path, in.error()));
  if (in->format == inspect::FileFormat::weightcache)
    return report({kExitUsage, "'" + in_path + "' is already a weightcache file"});
  if (in->format != inspect::FileFormat::xpwc) {
    print_findings(in_path, in.value());
    return report({kExitCannotRead, "'" + in_path + "' is not an ExecuTorch XPWC file"});
  }
  if (!in->index_usable || !in->findings.empty()) {
    print_findings(in_path, in.value());
    return report({kExitProblems, "'" + in_path + "' has problems; not converted"});
  }
  // A version 2 key is never empty ("#seed=N" is appended), so the name is checked on its own:
  // an entry without a name cannot be told from another entry without a name but the same seed.
  for (std::size_t i = 0; i < in->entries.size(); ++i)
    if (in->entries[i].name().empty())
      return report({kExitProblems, "entry " + std::to_string(i) + " of '" + in_path +
                                        "' has an empty name, which cannot make a weightcache key; not converted"});
  for (const auto& e : in->entries)
    if (e.key.empty() || e.key.size() > kMaxKeySize)
      return report({kExitProblems, "entry '" + inspect::display_key(e.key) + "' of '" + in_path +
                                        "' cannot be a weightcache key (keys are 1 to 4096 bytes); not converted"});

  bool exists = false;
  if (auto f = check_replaceable(out_path, false, &exists)) return report(*f);
  if (exists && !opt.force)
    return report({kExitUsage, "'" + out_path + "' exists; pass --force to replace it"});

  inspect::ConvertOptions o;
  o.compat_key = opt.compat_key;
  o.alignment = opt.alignment;
  Progress progress("converting", 2 * in->payload_bytes());  // the copy, then the read-back
  auto r = inspect::convert_xpwc(file.value(), in.value(), out_path, o, progress.callback());
  progress.finish();
  if (!r) {
    switch (r.error().code) {
      case Errc::busy: return report({kExitBusy, r.error().message});
      case Errc::corrupt: return report({kExitCannotRead, r.error().message});  // IN changed or cut short under us
      case Errc::no_memory: return report({kExitIo, "out of memory"});
      default: return report({kExitIo, r.error().message});
    }
  }
  std::printf("converted %s (ExecuTorch XPWC version %u, %llu entries) to %s (weightcache, alignment %llu, "
              "compat key hash %s)\n",
              in_path.c_str(), in->xpwc_version, static_cast<unsigned long long>(r->entries), out_path.c_str(),
              static_cast<unsigned long long>(opt.alignment), hex64(r->compat_hash).c_str());
  return kExitOk;
}

}  // namespace weightcache::cli

#include "platform/errors.hpp"

#include <cerrno>
#include <cstring>
#include <new>

namespace weightcache::platform {

std::string error_message(const std::string& what, const std::string& path, const std::string& reason,
                          const char* hint) {
  std::string msg = what + " '" + path + "': " + reason + ".";
  if (hint != nullptr) {
    msg += ' ';
    msg += hint;
  }
  return msg;
}

Errc errc_of_errno(int err) noexcept {
  switch (err) {
    case ENOSPC:
    case EFBIG:
#ifdef EDQUOT
    case EDQUOT:
#endif
      return Errc::no_space;
    case ENOMEM: return Errc::no_memory;
    case EROFS: return Errc::read_only;
    case ELOOP:
    case EISDIR:
    case ENAMETOOLONG: return Errc::invalid_argument;
    case EOPNOTSUPP:
#if defined(ENOTSUP) && ENOTSUP != EOPNOTSUPP
    case ENOTSUP:
#endif
    case ENODEV: return Errc::unsupported;
    default: return Errc::io;
  }
}

Error not_a_regular_file(const std::string& path) {
  return Error{Errc::invalid_argument, 0,
               "'" + path + "' is not a regular file; remove it or choose another cache path."};
}

Error os_error(int err, const std::string& what, const std::string& path, const char* hint) {
  return Error{errc_of_errno(err), err, error_message(what, path, std::strerror(err), hint)};
}

Error no_memory_error(const char* what, const std::string& path) noexcept {
  Error e;
  e.code = Errc::no_memory;
  try {
    e.message.reserve(std::strlen(what) + path.size() + 3);
    e.message.append(what).append(" '").append(path).append("'");
  } catch (const std::bad_alloc&) {
    try {
      e.message = what;
    } catch (const std::bad_alloc&) {
      e.message.clear();
    }
  }
  return e;
}

}  // namespace weightcache::platform

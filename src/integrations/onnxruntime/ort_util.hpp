// Small helpers over ONNX Runtime's C API for the plugin execution provider: the API tables the
// host hands over in CreateEpFactories, statuses, and logging through the host's logger.
// The provider stands on ORT's C API and weightcache's public C ABI only.
#pragma once

#include <onnxruntime_c_api.h>  // includes onnxruntime_ep_c_api.h, the plugin EP API

#include <exception>
#include <new>
#include <string>

namespace weightcache::ort {

/// The host's API tables, set once by CreateEpFactories (every factory of this library is created
/// by one ORT: a process has one libonnxruntime).
struct Api {
  const OrtApi* ort = nullptr;
  const OrtEpApi* ep = nullptr;
};
Api& api();

/// A new OrtStatus; never throws (ORT's CreateStatus copies the message).
inline OrtStatus* make_status(OrtErrorCode code, const std::string& message) noexcept {
  return api().ort->CreateStatus(code, message.c_str());
}

/// The message of a status the host returned, then releases it; "" for success.
inline std::string take_message(OrtStatus* status) {
  if (status == nullptr) return {};
  std::string m = api().ort->GetErrorMessage(status);
  api().ort->ReleaseStatus(status);
  return m;
}

/// Thrown inside the provider and turned into an OrtStatus at its C boundary.
struct OrtError {
  OrtErrorCode code;
  std::string message;
};

/// Calls an ORT function returning OrtStatus*; throws OrtError on failure.
inline void check(OrtStatus* status, const char* what) {
  if (status == nullptr) return;
  OrtErrorCode code = api().ort->GetErrorCode(status);
  std::string m = take_message(status);
  throw OrtError{code, std::string(what) + ": " + m};
}

/// Runs `body` at a C boundary: every exception becomes an OrtStatus, none escapes into ORT.
template <class Body>
OrtStatus* boundary(const char* what, Body&& body) noexcept {
  try {
    return body();
  } catch (const OrtError& e) {
    return make_status(e.code, std::string("WeightCache EP: ") + e.message);
  } catch (const std::bad_alloc&) {
    return make_status(ORT_FAIL, std::string("WeightCache EP: out of memory in ") + what);
  } catch (const std::exception& e) {
    return make_status(ORT_FAIL, std::string("WeightCache EP: ") + what + ": " + e.what());
  } catch (...) {
    return make_status(ORT_FAIL, std::string("WeightCache EP: unexpected failure in ") + what);
  }
}

/// Logs through the session's logger (ORT's own severity filter applies); never throws.
void log(const OrtLogger* logger, OrtLoggingLevel level, const std::string& message) noexcept;

}  // namespace weightcache::ort

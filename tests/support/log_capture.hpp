// Collects the library's log messages (level warn and up) while alive, through the C ABI's
// callback, then restores the default sink (stderr).
#pragma once

#include <weightcache/weightcache.h>

#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

namespace weightcache::test {

class LogCapture {
 public:
  struct Message {
    wc_log_level level;
    std::string text;
  };

  LogCapture() {
    wc_set_log_level(WC_LOG_WARN);
    wc_set_log_callback(&LogCapture::on_message, this);
  }
  ~LogCapture() { wc_set_log_callback(nullptr, nullptr); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  std::vector<Message> at_least(wc_log_level level) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Message> out;
    for (const auto& m : messages_)
      if (m.level >= level && m.level != WC_LOG_OFF) out.push_back(m);
    return out;
  }
  /// How many messages contain `needle`.
  std::size_t count(const std::string& needle) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::size_t n = 0;
    for (const auto& m : messages_) n += m.text.find(needle) != std::string::npos ? 1 : 0;
    return n;
  }
  bool contains(const std::string& needle) const { return count(needle) != 0; }
  /// Every message, one per line (for failure output).
  std::string all() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::string s;
    for (const auto& m : messages_) s += m.text + "\n";
    return s;
  }

 private:
  static void on_message(void* user, wc_log_level level, const char* message, size_t size) {
    auto* self = static_cast<LogCapture*>(user);
    std::lock_guard<std::mutex> lock(self->mu_);
    self->messages_.push_back({level, std::string(message, size)});
  }
  mutable std::mutex mu_;
  std::vector<Message> messages_;
};

}  // namespace weightcache::test

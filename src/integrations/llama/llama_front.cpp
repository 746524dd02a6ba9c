// The llama.cpp front of the ggml buffer type (include/weightcache/llama.h): which of a GGUF's
// tensors llama.cpp would repack, as tensor_buft_overrides patterns.
#include <weightcache/llama.h>

#include <gguf.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <regex>
#include <set>
#include <unordered_set>
#include <string>
#include <vector>

#include "../ggml/ggml_detail.hpp"

extern "C" void ggml_log_internal(enum ggml_log_level level, const char* format, ...);

using weightcache::ggml_detail::fail;

struct wc_llama {
  wc_ggml* g = nullptr;
  std::mutex mu;
  // Every list handed out, with the pattern strings it points to: valid until destroy.
  struct List {
    std::vector<std::string> patterns;
    std::vector<llama_model_tensor_buft_override> entries;
  };
  std::deque<List> lists;
};

namespace {

// Tensors llama.cpp reads by row (GGML_OP_GET_ROWS in its tensor table): never repacked, even when
// their type and shape would allow it.
bool read_by_row(const std::string& name) {
  static const char* const kWhole[] = {"token_embd.weight", "pos_embd.weight", "token_types.weight",
                                       "per_layer_token_embd.weight"};
  for (const char* w : kWhole)
    if (name == w) return true;
  static const char* const kSuffix[] = {".nextn.embed_tokens.weight", ".nextn.enorm.weight"};
  for (const char* s : kSuffix) {
    const std::size_t n = std::strlen(s);
    if (name.size() > n && name.compare(name.size() - n, n, s) == 0) return true;
  }
  return false;
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::strchr("\\^$.|?*+()[]{}", c) != nullptr) out += '\\';
    out += c;
  }
  return out;
}

// One pattern (std::regex, searched as llama.cpp does) that matches exactly `chosen` among `all`.
// llama.cpp compiles every pattern for every tensor it loads until one matches, so the pattern is
// short: each chosen name is matched by its shortest ending that ends no other tensor's name
// ("q.weight" for every layer's attn_q when no unrouted name ends so; ".3.ffn_down.weight" when
// layer 3's alone is routed), the endings' common tail written once. A chosen name that ends
// another tensor's name is matched whole.
std::string pattern_for(const std::vector<std::string>& all, const std::set<std::string>& chosen) {
  std::unordered_set<std::string> other_endings;  // every ending of every name not chosen
  for (const std::string& n : all)
    if (chosen.count(n) == 0)
      for (std::size_t i = 0; i <= n.size(); ++i) other_endings.insert(n.substr(i));
  std::set<std::string> endings, whole;
  for (const std::string& c : chosen) {
    std::string e;
    for (std::size_t len = 1; len <= c.size() && e.empty(); ++len)
      if (other_endings.count(c.substr(c.size() - len)) == 0) e = c.substr(c.size() - len);
    if (e.empty() || e.size() == c.size()) whole.insert(c);  // ends another name, or needs all of itself
    else endings.insert(e);
  }
  // An ending that ends another chosen ending is enough for both.
  for (auto it = endings.begin(); it != endings.end();) {
    bool covered = false;
    for (const std::string& o : endings)
      covered = covered || (o.size() < it->size() && it->compare(it->size() - o.size(), o.size(), o) == 0);
    it = covered ? endings.erase(it) : std::next(it);
  }
  std::string out;
  if (!endings.empty()) {
    std::string tail = *endings.begin();  // the endings' common tail
    for (const std::string& e : endings) {
      std::size_t n = 0;
      while (n < tail.size() && n < e.size() && tail[tail.size() - 1 - n] == e[e.size() - 1 - n]) ++n;
      tail = tail.substr(tail.size() - n);
    }
    std::string alt;
    for (const std::string& e : endings) alt += (alt.empty() ? "" : "|") + escape(e.substr(0, e.size() - tail.size()));
    out = endings.size() == 1 ? escape(*endings.begin()) + "$" : "(?:" + alt + ")" + escape(tail) + "$";
  }
  if (!whole.empty()) {
    std::string alt;
    for (const std::string& w : whole) alt += (alt.empty() ? "" : "|") + escape(w);
    out += (out.empty() ? "" : "|") + std::string("^(?:") + alt + ")$";
  }
  return out;
}

// True when `patterns` match exactly `chosen` among `all` (the grouping above, checked).
bool exact(const std::vector<std::string>& patterns, const std::vector<std::string>& all,
           const std::set<std::string>& chosen) {
  std::vector<std::regex> res;
  for (const std::string& p : patterns) res.emplace_back(p);
  for (const std::string& n : all) {
    bool hit = false;
    for (const std::regex& r : res) hit = hit || std::regex_search(n, r);
    if (hit != (chosen.count(n) != 0)) return false;
  }
  return true;
}

bool gpu_present() {
  for (std::size_t i = 0; i < ggml_backend_dev_count(); ++i) {
    const enum ggml_backend_dev_type t = ggml_backend_dev_type(ggml_backend_dev_get(i));
    if (t != GGML_BACKEND_DEVICE_TYPE_CPU && t != GGML_BACKEND_DEVICE_TYPE_ACCEL) return true;
  }
  return false;
}

}  // namespace

extern "C" {

wc_status wc_llama_create(wc_cache* cache, const wc_ggml_options* options, wc_llama** out) {
  if (out != nullptr) *out = nullptr;
  if (out == nullptr) return fail(WC_ERR_INVALID_ARGUMENT, "wc_llama_create: NULL out");
  std::unique_ptr<wc_llama> l(new (std::nothrow) wc_llama);
  if (!l) return fail(WC_ERR_NO_MEMORY, "wc_llama_create: out of memory");
  const wc_status st = wc_ggml_create(cache, options, &l->g);
  if (st != WC_OK) return st;  // wc_ggml_create said why
  *out = l.release();
  return WC_OK;
}

wc_status wc_llama_model_params(wc_llama* l, const char* gguf_path, struct llama_model_params* params,
                                size_t* routed) {
  if (routed != nullptr) *routed = 0;
  if (l == nullptr || gguf_path == nullptr || params == nullptr)
    return fail(WC_ERR_INVALID_ARGUMENT, "wc_llama_model_params: NULL front, path or params");
  if (!params->use_extra_bufts || params->vocab_only) return WC_OK;  // llama.cpp repacks nothing
  if (params->n_gpu_layers != 0 && gpu_present()) {
    ggml_log_internal(GGML_LOG_LEVEL_INFO,
                      "weightcache: llama.cpp has a GPU device and n_gpu_layers is %d: no weights routed to the "
                      "cache (it serves CPU weights only)\n",
                      static_cast<int>(params->n_gpu_layers));
    return WC_OK;
  }
  try {
    ggml_context* meta = nullptr;
    gguf_init_params gp{};
    gp.no_alloc = true;
    gp.ctx = &meta;
    gguf_context* gg = gguf_init_from_file(gguf_path, gp);
    if (gg == nullptr)
      return fail(WC_ERR_IO, std::string("wc_llama_model_params: cannot read the GGUF ") + gguf_path +
                                 " (missing, unreadable or not a GGUF file); llama.cpp's own load says more");
    std::vector<std::string> all;
    std::set<std::string> chosen;
    const std::int64_t n = gguf_get_n_tensors(gg);
    for (std::int64_t i = 0; i < n; ++i) {
      const char* name = gguf_get_tensor_name(gg, i);
      all.emplace_back(name);
      const ggml_tensor* t = ggml_get_tensor(meta, name);
      if (t != nullptr && !read_by_row(name) && wc_ggml_would_repack(t) != 0) chosen.insert(name);
    }
    gguf_free(gg);
    ggml_free(meta);
    if (chosen.empty()) return WC_OK;
    std::vector<std::string> patterns{pattern_for(all, chosen)};
    if (!exact(patterns, all, chosen)) {  // cannot happen; one exact pattern per tensor then
      patterns.clear();
      for (const std::string& c : chosen) patterns.push_back("^" + escape(c) + "$");
    }
    ggml_backend_buffer_type_t buft = wc_ggml_buffer_type(l->g);
    std::lock_guard<std::mutex> lock(l->mu);
    wc_llama::List& list = l->lists.emplace_back();
    list.patterns = std::move(patterns);
    for (const llama_model_tensor_buft_override* o = params->tensor_buft_overrides; o != nullptr && o->pattern != nullptr;
         ++o)
      list.entries.push_back(*o);
    for (const std::string& p : list.patterns) list.entries.push_back({p.c_str(), buft});
    list.entries.push_back({nullptr, nullptr});
    params->tensor_buft_overrides = list.entries.data();
    ggml_log_internal(GGML_LOG_LEVEL_DEBUG, "weightcache: %zu tensors of %s routed to the cache by the pattern %s\n",
                      chosen.size(), gguf_path, list.patterns.front().c_str());
    if (routed != nullptr) *routed = chosen.size();
    return WC_OK;
  } catch (const std::bad_alloc&) {
    return fail(WC_ERR_NO_MEMORY, "wc_llama_model_params: out of memory");
  } catch (const std::exception& e) {
    return fail(WC_ERR_INVALID_ARGUMENT, std::string("wc_llama_model_params: ") + e.what());
  }
}

wc_ggml* wc_llama_ggml(wc_llama* l) { return l != nullptr ? l->g : nullptr; }

void wc_llama_destroy(wc_llama* l) {
  if (l == nullptr) return;
  wc_ggml_destroy(l->g);
  delete l;
}

}  // extern "C"

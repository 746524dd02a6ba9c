// The llama.cpp front of the ggml buffer type (include/weightcache/llama.h): which of a GGUF's
// tensors llama.cpp would repack, as tensor_buft_overrides patterns.
#include <weightcache/llama.h>

#include <gguf.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <map>
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
};

namespace {

// Every override list any front handed out, with the pattern strings it points to. They live as
// long as the process: params keep pointing at them after wc_llama_destroy (llama.cpp reads
// them at every load with those params), and an entry of ours is told from the application's by
// its pattern's address, which no other string can then take. Identical lists are handed out
// once, so repeated calls for the same model do not grow this.
struct List {
  std::vector<std::string> patterns;
  std::vector<llama_model_tensor_buft_override> entries;
};
struct Lists {
  std::mutex mu;
  std::deque<List> all;
  std::unordered_set<const char*> ours;  // the pattern strings of every list
};
Lists& lists() {
  static Lists* l = new Lists;  // never destroyed: params may outlive any static destructor
  return *l;
}

// How llama.cpp uses a tensor, from its name: llama.cpp's tensor table (llama-arch.cpp,
// LLM_TENSOR_INFOS) gives every kind of tensor one operation. CPU_REPACK computes two of them from
// repacked weights: a matrix product (GGML_OP_MUL_MAT) of a 2-D weight, and the experts' product
// (GGML_OP_MUL_MAT_ID) of a 3-D one; any other use of a repacked tensor has no kernel and ggml's
// scheduler aborts. So a tensor is routed only when its kind's operation and its dimensions are
// one of those two (and its type and shape are repacked on this CPU: wc_ggml_would_repack).
enum class Use { matmul, experts, other };

Use use_of(const std::string& name) {
  // The kind: the name without "blk.N." (or "enc.blk.N.", "dec.blk.N.") and without ".weight".
  static const char* const kWeight = ".weight";
  if (name.size() <= 7 || name.compare(name.size() - 7, 7, kWeight) != 0) return Use::other;  // biases: added
  std::string kind = name.substr(0, name.size() - 7);
  for (const char* layered : {"blk.", "enc.blk.", "dec.blk.", "convnext.", "posnet."}) {
    const std::size_t n = std::strlen(layered);
    if (kind.compare(0, n, layered) != 0) continue;
    std::size_t i = n;
    while (i < kind.size() && kind[i] >= '0' && kind[i] <= '9') ++i;
    if (i > n && i < kind.size() && kind[i] == '.') kind = std::string(layered) + "N" + kind.substr(i);
    break;
  }
  // GGML_OP_MUL_MAT_ID: the experts.
  for (const char* e : {"_exps", "_chexps"}) {
    const std::size_t n = std::strlen(e);
    if (kind.size() > n && kind.compare(kind.size() - n, n, e) == 0) return Use::experts;
  }
  // Every kind whose operation is another than a matrix product: row look-ups (GET_ROWS), scales
  // and norms (MUL), ROPE, SCALE, DIV, ADD, the SSM and RWKV operations, convolutions (IM2COL).
  static const std::unordered_set<std::string> kOther = {
      "token_embd", "position_embd", "pos_embd", "token_types", "per_layer_token_embd", "blk.N.nextn.embed_tokens",
      "blk.N.nextn.enorm", "enc.blk.N.attn_rel_b", "dec.blk.N.attn_rel_b", "dec.blk.N.cross_attn_rel_b",
      "rope_freqs", "rope_factors_long", "rope_factors_short", "blk.N.rope_freqs", "blk.N.rope_factors_long",
      "blk.N.rope_factors_short", "blk.N.attn_sinks", "blk.N.ffn.act", "blk.N.shortconv.conv", "blk.N.ssm_conv1d",
      "blk.N.ssm_a", "blk.N.ssm_d", "blk.N.time_mix_first", "blk.N.exp_probs_b", "blk.N.time_mix_a0",
      "blk.N.time_mix_decay", "blk.N.time_mix_lerp_fused", "blk.N.time_mix_lerp_g", "blk.N.time_mix_lerp_k",
      "blk.N.time_mix_lerp_r", "blk.N.time_mix_lerp_v", "blk.N.time_mix_lerp_w", "blk.N.time_mix_v0",
      "blk.N.time_mix_w0", "blk.N.time_mix_k_a", "blk.N.time_mix_k_k", "blk.N.time_mix_lerp_x", "blk.N.time_mix_r_k",
      "blk.N.channel_mix_lerp_k", "blk.N.channel_mix_lerp_r", "blk.N.altup_correct_scale", "conv1d",
      "convnext.N.dw", "convnext.N.gamma", "posnet.N.conv1", "posnet.N.conv2"};
  if (kOther.count(kind) != 0) return Use::other;
  // Norms (MUL), whatever their prefix: every such kind's name ends in "norm" ("attn_norm_2",
  // "norm1", "norm2" too).
  const std::size_t last = kind.rfind('.');
  const std::string leaf = last == std::string::npos ? kind : kind.substr(last + 1);
  if (leaf.find("norm") != std::string::npos) return Use::other;
  return Use::matmul;  // every other kind of llama.cpp's table is a matrix product's weight
}

// Whether llama.cpp computes this tensor by an operation a repacked layout serves (the matrix
// product of a 2-D weight, the experts' product of a 3-D one), and which.
enum ggml_op product_of(const std::string& name, const ggml_tensor* t) {
  if (t == nullptr) return GGML_OP_NONE;
  switch (use_of(name)) {
    case Use::matmul: return ggml_n_dims(t) == 2 ? GGML_OP_MUL_MAT : GGML_OP_NONE;
    case Use::experts: return ggml_n_dims(t) == 3 ? GGML_OP_MUL_MAT_ID : GGML_OP_NONE;
    case Use::other: return GGML_OP_NONE;
  }
  return GGML_OP_NONE;
}

// The filter of the front's buffer types (a tensor a pattern routed by mistake fails its load).
bool computed_from_repacked(const struct ggml_tensor* t) { return product_of(t->name, t) != GGML_OP_NONE; }

// The buffer types llama.cpp tries for a CPU weight, in its order (llama-model.cpp,
// make_cpu_buft_list): an accelerator's, a GPU's host buffer type (unless no_host), the CPU
// backend's extra buffer types (AMX, KleidiAI, CPU_REPACK; when use_extra_bufts), plain CPU memory.
weightcache::ggml_detail::Candidates llama_cpu_candidates(const struct llama_model_params* params) {
  weightcache::ggml_detail::Candidates list;
  for (std::size_t i = 0; i < ggml_backend_dev_count(); ++i) {
    ggml_backend_dev_t dev = ggml_backend_dev_get(i);
    if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_ACCEL &&
        ggml_backend_dev_buffer_type(dev) != ggml_backend_cpu_buffer_type())
      list.emplace_back(dev, ggml_backend_dev_buffer_type(dev));
  }
  if (!params->no_host) {
    for (std::size_t i = 0; i < ggml_backend_dev_count(); ++i) {
      ggml_backend_dev_t dev = ggml_backend_dev_get(i);
      const enum ggml_backend_dev_type t = ggml_backend_dev_type(dev);
      if (t == GGML_BACKEND_DEVICE_TYPE_CPU || t == GGML_BACKEND_DEVICE_TYPE_ACCEL) continue;
      if (ggml_backend_buffer_type_t host = ggml_backend_dev_host_buffer_type(dev); host != nullptr) {
        list.emplace_back(dev, host);
        break;
      }
    }
  }
  if (params->use_extra_bufts) {
    const auto extras = weightcache::ggml_detail::cpu_extras();
    list.insert(list.end(), extras.begin(), extras.end());
  }
  for (std::size_t i = 0; i < ggml_backend_dev_count(); ++i) {
    ggml_backend_dev_t dev = ggml_backend_dev_get(i);
    if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU)
      list.emplace_back(dev, ggml_backend_dev_buffer_type(dev));
  }
  return list;
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::strchr("\\^$.|?*+()[]{}", c) != nullptr) out += '\\';
    out += c;
  }
  return out;
}

// A regex for exactly the strings of `endings`, each written once in a trie of their reversed
// characters: shared tails are written once (".weight" ends them all; "(?:0|3|7)\.ffn_down" for
// three layers' ffn_down). No character classes: libstdc++ compiles "[abc]" seven times slower
// than "(?:a|b|c)" (it tabulates the class for all 256 characters), and llama.cpp compiles the
// pattern for every tensor it loads.
struct Trie {
  std::map<char, Trie> kids;
  bool end = false;
};

std::string escape_char(char c) {
  std::string out;
  if (std::strchr("\\^$.|?*+()[]{}", c) != nullptr) out.push_back('\\');
  out.push_back(c);
  return out;
}

// What comes before the characters on the path to `t` (read backwards) in the strings below it.
std::string trie_regex(const Trie& t) {
  std::vector<std::string> options;
  for (const auto& [c, kid] : t.kids) options.push_back(trie_regex(kid) + escape_char(c));
  if (options.empty()) return "";
  std::string alt;
  for (const std::string& o : options) alt += (alt.empty() ? "" : "|") + o;
  if (options.size() > 1 || t.end) alt = "(?:" + alt + ")";
  return t.end ? alt + "?" : alt;  // a string may also end right here
}

std::string endings_regex(const std::set<std::string>& endings) {
  Trie root;
  for (const std::string& e : endings) {
    Trie* n = &root;
    for (auto it = e.rbegin(); it != e.rend(); ++it) n = &n->kids[*it];
    n->end = true;
  }
  return trie_regex(root);
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
  if (!endings.empty()) out = endings_regex(endings) + "$";
  if (!whole.empty()) {
    if (!out.empty()) out += '|';
    out += "^(?:";
    bool first = true;
    for (const std::string& w : whole) {
      if (!first) out += '|';
      out += escape(w);
      first = false;
    }
    out += ")$";
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

// Sets params' list to the application's entries (without any a front added earlier: params used
// again, maybe for another model or through another front, would route that model's tensors by
// another model's names) followed by `routes` (pattern, buffer type). Leaves params as they are
// when that changes nothing.
using Routes = std::vector<std::pair<std::string, ggml_backend_buffer_type_t>>;

void route(struct llama_model_params* params, Routes routes) {
  Lists& ls = lists();
  std::lock_guard<std::mutex> lock(ls.mu);
  std::vector<llama_model_tensor_buft_override> entries;
  bool stale = false;
  for (const llama_model_tensor_buft_override* o = params->tensor_buft_overrides; o != nullptr && o->pattern != nullptr; ++o) {
    if (ls.ours.count(o->pattern) != 0) stale = true;
    else entries.push_back(*o);
  }
  if (!stale && routes.empty()) return;
  const std::size_t own = entries.size();
  if (own == 0 && routes.empty()) {
    params->tensor_buft_overrides = nullptr;  // the application had none
    return;
  }
  std::vector<std::string> patterns;
  for (const auto& r : routes) patterns.push_back(r.first);
  // The same list handed out before: that one (its pattern strings are the ones issued).
  for (const List& l : ls.all) {
    if (l.entries.size() != own + routes.size() + 1 || l.patterns != patterns) continue;
    bool same = true;
    for (std::size_t i = 0; i < own && same; ++i)
      same = l.entries[i].pattern == entries[i].pattern && l.entries[i].buft == entries[i].buft;
    for (std::size_t i = 0; i < routes.size() && same; ++i) same = l.entries[own + i].buft == routes[i].second;
    if (same) {
      params->tensor_buft_overrides = l.entries.data();
      return;
    }
  }
  List& list = ls.all.emplace_back();
  list.patterns = std::move(patterns);
  list.entries.assign(entries.begin(), entries.end());
  for (std::size_t i = 0; i < routes.size(); ++i) {
    list.entries.push_back({list.patterns[i].c_str(), routes[i].second});
    ls.ours.insert(list.patterns[i].c_str());
  }
  list.entries.push_back({nullptr, nullptr});
  params->tensor_buft_overrides = list.entries.data();
}

// Why llama.cpp, with these params, puts no CPU weight in a repacking buffer type whatever the
// model (then nothing is routed), or "" when it may.
std::string why_llama_repacks_nothing(const struct llama_model_params* params) {
  if (!params->use_extra_bufts) return "use_extra_bufts is false";
  if (params->vocab_only) return "vocab_only";
  for (std::size_t i = 0; i < ggml_backend_dev_count(); ++i) {
    ggml_backend_dev_t dev = ggml_backend_dev_get(i);
    const enum ggml_backend_dev_type t = ggml_backend_dev_type(dev);
    if (t != GGML_BACKEND_DEVICE_TYPE_CPU && t != GGML_BACKEND_DEVICE_TYPE_ACCEL) {
      if (params->n_gpu_layers != 0)
        return std::string("n_gpu_layers is ") + std::to_string(params->n_gpu_layers) + " with the GPU " +
               ggml_backend_dev_name(dev) + " (the cache serves CPU weights only; offloaded layers are the GPU's)";
      if (!params->no_host && ggml_backend_dev_host_buffer_type(dev) != nullptr)
        return std::string("the GPU ") + ggml_backend_dev_name(dev) + "'s host buffer type " +
               ggml_backend_buft_name(ggml_backend_dev_host_buffer_type(dev)) + " takes CPU weights first";
    }
  }
  return "";
}

void copy_out(char* to, std::size_t n, const std::string& s) {
  const std::size_t k = std::min(n - 1, s.size());
  std::memcpy(to, s.data(), k);
  to[k] = '\0';
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
  // Defence in depth: a tensor routed by mistake (the model file replaced after
  // wc_llama_model_params) fails its allocation instead of reaching a kernel that cannot compute it.
  weightcache::ggml_detail::set_tensor_filter(l->g, computed_from_repacked);
  *out = l.release();
  return WC_OK;
}

void wc_llama_routing_init(wc_llama_routing* r) {
  if (r == nullptr) return;
  *r = wc_llama_routing{};
  r->struct_size = sizeof *r;
}

}  // extern "C"

namespace {

// wc_llama_model_params_ex; with report_only, fills the report of what stock llama.cpp does with
// these params, logs nothing and leaves params alone (l may be NULL then).
wc_status plan(wc_llama* l, const char* gguf_path, struct llama_model_params* params, wc_llama_routing* report,
               bool report_only) {
  wc_llama_routing scratch;
  wc_llama_routing_init(&scratch);
  if (report != nullptr && report->struct_size != sizeof(wc_llama_routing))
    return fail(WC_ERR_INVALID_ARGUMENT, "wc_llama_model_params_ex: routing not set up by wc_llama_routing_init");
  wc_llama_routing& out = report != nullptr ? *report : scratch;
  out.routed = 0;
  out.stock_repacked = 0;
  out.stock_buffer_types[0] = '\0';
  out.why_none[0] = '\0';
  if ((l == nullptr && !report_only) || gguf_path == nullptr || params == nullptr)
    return fail(WC_ERR_INVALID_ARGUMENT, "wc_llama_model_params: NULL front, path or params");
  // Every return but a routing one leaves params without entries a front added (stock llama.cpp).
  auto none = [&](wc_status st) {
    if (report_only) return st;
    try {
      route(params, {});
    } catch (...) {
      // No memory even for a list of the application's own entries: params stay as they are.
      ggml_log_internal(GGML_LOG_LEVEL_ERROR, "weightcache: out of memory while resetting llama_model_params\n");
    }
    return st;
  };
  // Nothing routed: why, once, on ggml's log (warn: the application asked for a cache that will
  // hold nothing of this model; info when it turned repacking off itself).
  auto nothing = [&](const std::string& why, bool expected) {
    copy_out(out.why_none, sizeof out.why_none, why);
    if (report_only) return WC_OK;
    ggml_log_internal(expected ? GGML_LOG_LEVEL_INFO : GGML_LOG_LEVEL_WARN,
                      "weightcache: no weights of %s routed to the cache: %s\n", gguf_path, why.c_str());
    return none(WC_OK);
  };
  try {
    if (const std::string why = why_llama_repacks_nothing(params); !why.empty())
      return nothing(why, !params->use_extra_bufts || params->vocab_only);
    ggml_context* meta = nullptr;
    gguf_init_params gp{};
    gp.no_alloc = true;
    gp.ctx = &meta;
    gguf_context* gg = gguf_init_from_file(gguf_path, gp);
    if (gg == nullptr)
      return none(fail(WC_ERR_IO, std::string("wc_llama_model_params: cannot read the GGUF ") + gguf_path +
                                      " (missing, unreadable or not a GGUF file); llama.cpp's own load says more"));
    // The experts used per token, for the stand-in operands of the experts' product.
    int experts_used = 1;
    if (const std::int64_t a = gguf_find_key(gg, "general.architecture");
        a >= 0 && gguf_get_kv_type(gg, a) == GGUF_TYPE_STRING) {
      const std::int64_t k = gguf_find_key(gg, (std::string(gguf_get_val_str(gg, a)) + ".expert_used_count").c_str());
      if (k >= 0 && gguf_get_kv_type(gg, k) == GGUF_TYPE_UINT32)
        experts_used = static_cast<int>(std::min<std::uint32_t>(gguf_get_val_u32(gg, k), 1024));
    }
    const weightcache::ggml_detail::Candidates candidates = llama_cpu_candidates(params);
    // The application's own entries come first in the list and decide the tensors they match:
    // those are neither llama.cpp's choice nor the cache's.
    std::vector<std::regex> own;
    {
      Lists& ls = lists();
      std::lock_guard<std::mutex> lock(ls.mu);
      for (const llama_model_tensor_buft_override* o = params->tensor_buft_overrides; o != nullptr && o->pattern != nullptr;
           ++o) {
        if (ls.ours.count(o->pattern) != 0) continue;
        try {
          own.emplace_back(o->pattern);
        } catch (const std::regex_error&) {
          // llama.cpp's own load refuses such a pattern; nothing of ours depends on it.
        }
      }
    }
    auto the_applications = [&](const char* name) {
      for (const std::regex& r : own)
        if (std::regex_search(name, r)) return true;
      return false;
    };
    // llama.cpp's answer depends on the weight's type, shape and operation: asked once per such.
    std::map<std::array<std::int64_t, GGML_MAX_DIMS + 2>, ggml_backend_buffer_type_t> asked;
    std::vector<std::string> all;
    // Per buffer type llama.cpp would put a repacked weight in: those weights, in the list's order.
    std::vector<std::pair<ggml_backend_buffer_type_t, std::set<std::string>>> stock;
    auto take = [&](gguf_context* g, ggml_context* m) {
      const std::int64_t n = gguf_get_n_tensors(g);
      for (std::int64_t i = 0; i < n; ++i) {
        const char* name = gguf_get_tensor_name(g, i);
        all.emplace_back(name);
        const ggml_tensor* t = ggml_get_tensor(m, name);
        const enum ggml_op op = product_of(name, t);
        if (op == GGML_OP_NONE || the_applications(name)) continue;
        std::array<std::int64_t, GGML_MAX_DIMS + 2> shape{};
        shape[0] = static_cast<std::int64_t>(t->type);
        shape[1] = static_cast<std::int64_t>(op);
        for (int d = 0; d < GGML_MAX_DIMS; ++d) shape[d + 2] = t->ne[d];
        auto at = asked.find(shape);
        if (at == asked.end())
          at = asked.emplace(shape, weightcache::ggml_detail::first_supporting(t, op, experts_used, candidates)).first;
        ggml_backend_buffer_type_t b = at->second;
        if (b == nullptr || b == ggml_backend_cpu_buffer_type()) continue;  // plain memory: nothing repacked
        auto it = std::find_if(stock.begin(), stock.end(), [&](const auto& e) { return e.first == b; });
        if (it == stock.end()) it = stock.insert(stock.end(), {b, {}});
        it->second.insert(name);
      }
    };
    take(gg, meta);
    // A model split over several files (llama.cpp's PREFIX-0000i-of-0000N.gguf): every file's
    // tensors, named as llama.cpp names them.
    const std::int64_t count_key = gguf_find_key(gg, "split.count");
    const int splits = count_key >= 0 && gguf_get_kv_type(gg, count_key) == GGUF_TYPE_UINT16
                           ? static_cast<int>(gguf_get_val_u16(gg, count_key))
                           : 1;
    gguf_free(gg);
    ggml_free(meta);
    if (splits > 1) {
      std::vector<char> prefix(std::strlen(gguf_path) + 1), path(std::strlen(gguf_path) + 64);
      if (llama_split_prefix(prefix.data(), prefix.size(), gguf_path, 0, splits) <= 0)
        return none(fail(WC_ERR_IO, std::string("wc_llama_model_params: ") + gguf_path + " says it is the first of " +
                                        std::to_string(splits) + " split files, but is not named PREFIX-00001-of-" +
                                        "NNNNN.gguf (stock llama.cpp repacking is kept)"));
      for (int i = 1; i < splits; ++i) {
        (void)llama_split_path(path.data(), path.size(), prefix.data(), i, splits);
        ggml_context* m = nullptr;
        gguf_init_params sp{};
        sp.no_alloc = true;
        sp.ctx = &m;
        gguf_context* g = gguf_init_from_file(path.data(), sp);
        if (g == nullptr)
          return none(fail(WC_ERR_IO, std::string("wc_llama_model_params: cannot read the split GGUF ") +
                                          path.data() + "; llama.cpp's own load says more"));
        take(g, m);
        gguf_free(g);
        ggml_free(m);
      }
    }
    // In llama.cpp's order of buffer types.
    auto rank = [&](ggml_backend_buffer_type_t b) {
      return std::find_if(candidates.begin(), candidates.end(), [&](const auto& c) { return c.second == b; }) -
             candidates.begin();
    };
    std::stable_sort(stock.begin(), stock.end(), [&](const auto& x, const auto& y) { return rank(x.first) < rank(y.first); });
    std::string counts, unserved;
    std::size_t unserved_n = 0;
    for (const auto& [b, names] : stock) {
      out.stock_repacked += names.size();
      counts += (counts.empty() ? "" : ",") + std::string(ggml_backend_buft_name(b)) + "=" + std::to_string(names.size());
      if (!weightcache::ggml_detail::is_served_layout(b)) {
        unserved += (unserved.empty() ? "" : ", ") + std::string(ggml_backend_buft_name(b));
        unserved_n += names.size();
      }
    }
    copy_out(out.stock_buffer_types, sizeof out.stock_buffer_types, counts);
    if (stock.empty())
      return nothing("llama.cpp repacks none of its weights on this CPU (their types and shapes have no repacked "
                     "layout here; the CPU's repacking buffer types: " +
                         std::string(*wc_ggml_layouts() != '\0' ? wc_ggml_layouts() : "none") + ")",
                     false);
    if (report_only) return WC_OK;
    Routes routes;
    std::size_t routed = 0;
    bool ok = true;
    for (const auto& [b, names] : stock) {
      ggml_backend_buffer_type_t ours = weightcache::ggml_detail::served_for(l->g, b);
      if (ours == nullptr) continue;
      try {
        std::vector<std::string> one{pattern_for(all, names)};
        ok = ok && exact(one, all, names);
        routes.emplace_back(std::move(one.front()), ours);
      } catch (const std::regex_error&) {
        ok = false;  // too large for std::regex (thousands of distinct endings)
      }
      routed += names.size();
    }
    if (routes.empty())
      return nothing(std::to_string(unserved_n) + " of its weights go to " + unserved +
                         ", a buffer type the cache does not serve; llama.cpp repacks them itself",
                     false);
    if (!ok) {
      // Cannot happen for a model llama.cpp names; llama.cpp's own repacking is always right.
      return nothing("no short pattern matches exactly the " + std::to_string(routed) +
                         " repacked tensors; llama.cpp repacks them itself",
                     false);
    }
    if (unserved_n > 0)
      ggml_log_internal(GGML_LOG_LEVEL_WARN,
                        "weightcache: %zu weights of %s go to %s, a buffer type the cache does not serve; llama.cpp "
                        "repacks them itself (the other %zu come from the cache)\n",
                        unserved_n, gguf_path, unserved.c_str(), routed);
    for (const auto& r : routes)
      ggml_log_internal(GGML_LOG_LEVEL_DEBUG, "weightcache: tensors of %s routed to %s by the pattern %s\n", gguf_path,
                        ggml_backend_buft_name(r.second), r.first.c_str());
    route(params, std::move(routes));
    out.routed = routed;
    return WC_OK;
  } catch (const std::bad_alloc&) {
    return none(fail(WC_ERR_NO_MEMORY, "wc_llama_model_params: out of memory"));
  } catch (const std::exception& e) {
    return none(fail(WC_ERR_INVALID_ARGUMENT, std::string("wc_llama_model_params: ") + e.what()));
  }
}

}  // namespace

extern "C" {

wc_status wc_llama_model_params_ex(wc_llama* l, const char* gguf_path, struct llama_model_params* params,
                                   wc_llama_routing* routing) {
  return plan(l, gguf_path, params, routing, false);
}

wc_status wc_llama_stock_routing(const char* gguf_path, const struct llama_model_params* params,
                                 wc_llama_routing* routing) {
  if (params == nullptr) return fail(WC_ERR_INVALID_ARGUMENT, "wc_llama_stock_routing: NULL params");
  struct llama_model_params copy = *params;
  return plan(nullptr, gguf_path, &copy, routing, true);
}

wc_status wc_llama_model_params(wc_llama* l, const char* gguf_path, struct llama_model_params* params,
                                size_t* routed) {
  wc_llama_routing r;
  wc_llama_routing_init(&r);
  const wc_status st = wc_llama_model_params_ex(l, gguf_path, params, &r);
  if (routed != nullptr) *routed = r.routed;
  return st;
}

wc_ggml* wc_llama_ggml(wc_llama* l) { return l != nullptr ? l->g : nullptr; }

void wc_llama_destroy(wc_llama* l) {
  if (l == nullptr) return;
  wc_ggml_destroy(l->g);
  delete l;
}

}  // extern "C"

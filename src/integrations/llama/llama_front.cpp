// The llama.cpp front of the ggml buffer type (include/weightcache/llama.h): which of a GGUF's
// tensors llama.cpp would repack, as tensor_buft_overrides patterns.
#include <weightcache/llama.h>

#include <gguf.h>

#include <algorithm>
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

// Whether llama.cpp, left to itself, would put this tensor in CPU_REPACK.
bool repacked_by_llama(const std::string& name, const ggml_tensor* t) {
  if (t == nullptr || wc_ggml_would_repack(t) == 0) return false;
  switch (use_of(name)) {
    case Use::matmul: return ggml_n_dims(t) == 2;
    case Use::experts: return ggml_n_dims(t) == 3;
    case Use::other: return false;
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
// another model's names) followed by `patterns` to `buft`. Leaves params as they are when that
// changes nothing.
void route(struct llama_model_params* params, ggml_backend_buffer_type_t buft, std::vector<std::string> patterns) {
  Lists& ls = lists();
  std::lock_guard<std::mutex> lock(ls.mu);
  std::vector<llama_model_tensor_buft_override> entries;
  bool stale = false;
  for (const llama_model_tensor_buft_override* o = params->tensor_buft_overrides; o != nullptr && o->pattern != nullptr; ++o) {
    if (ls.ours.count(o->pattern) != 0) stale = true;
    else entries.push_back(*o);
  }
  if (!stale && patterns.empty()) return;
  const std::size_t own = entries.size();
  for (const std::string& p : patterns) entries.push_back({p.c_str(), buft});
  if (entries.empty()) {
    params->tensor_buft_overrides = nullptr;  // the application had none
    return;
  }
  // The same list handed out before: that one (its pattern strings are the ones issued).
  for (const List& l : ls.all) {
    if (l.entries.size() != entries.size() + 1 || l.patterns != patterns) continue;
    bool same = true;
    for (std::size_t i = 0; i < own && same; ++i)
      same = l.entries[i].pattern == entries[i].pattern && l.entries[i].buft == entries[i].buft;
    for (std::size_t i = own; i < entries.size() && same; ++i) same = l.entries[i].buft == buft;
    if (same) {
      params->tensor_buft_overrides = l.entries.data();
      return;
    }
  }
  List& list = ls.all.emplace_back();
  list.patterns = std::move(patterns);
  list.entries.assign(entries.begin(), entries.begin() + static_cast<std::ptrdiff_t>(own));
  for (const std::string& p : list.patterns) {
    list.entries.push_back({p.c_str(), buft});
    ls.ours.insert(p.c_str());
  }
  list.entries.push_back({nullptr, nullptr});
  params->tensor_buft_overrides = list.entries.data();
}

// Why llama.cpp, with these params, would put no CPU weight in CPU_REPACK (then nothing is routed),
// or "" when it may. llama.cpp tries, for a CPU weight, an accelerator's buffer type, then a GPU's
// host buffer type, then the CPU's extra buffer types in order, then plain CPU memory, and takes
// the first that can hold the weight for its operation.
std::string why_llama_repacks_nothing(const struct llama_model_params* params, ggml_backend_buffer_type_t repack) {
  if (!params->use_extra_bufts) return "use_extra_bufts is false";
  if (params->vocab_only) return "vocab_only";
  for (std::size_t i = 0; i < ggml_backend_dev_count(); ++i) {
    ggml_backend_dev_t dev = ggml_backend_dev_get(i);
    const enum ggml_backend_dev_type t = ggml_backend_dev_type(dev);
    if (t == GGML_BACKEND_DEVICE_TYPE_ACCEL && ggml_backend_dev_buffer_type(dev) != ggml_backend_cpu_buffer_type())
      return std::string("the accelerator ") + ggml_backend_dev_name(dev) + " takes CPU weights first";
    if (t != GGML_BACKEND_DEVICE_TYPE_CPU && t != GGML_BACKEND_DEVICE_TYPE_ACCEL) {
      if (params->n_gpu_layers != 0)
        return std::string("n_gpu_layers is ") + std::to_string(params->n_gpu_layers) + " with the GPU " +
               ggml_backend_dev_name(dev) + " (the cache serves CPU weights only)";
      if (!params->no_host && ggml_backend_dev_host_buffer_type(dev) != nullptr)
        return std::string("the GPU ") + ggml_backend_dev_name(dev) + "'s host buffer type takes CPU weights first";
    }
  }
  ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
  auto extra = cpu == nullptr ? nullptr
                              : reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(ggml_backend_reg_get_proc_address(
                                    ggml_backend_dev_backend_reg(cpu), "ggml_backend_dev_get_extra_bufts"));
  for (ggml_backend_buffer_type_t* b = extra != nullptr ? extra(cpu) : nullptr; b != nullptr && *b != nullptr; ++b) {
    if (*b == repack) return "";
    // AMX, KleidiAI, ...: llama.cpp would give them some of these weights, in their own layout.
    return std::string("this ggml's CPU buffer type ") + ggml_backend_buft_name(*b) + " comes before CPU_REPACK";
  }
  return "this ggml's CPU backend has no CPU_REPACK";
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
  weightcache::ggml_detail::set_tensor_filter(l->g, [](const struct ggml_tensor* t) {
    return repacked_by_llama(t->name, t);
  });
  *out = l.release();
  return WC_OK;
}

wc_status wc_llama_model_params(wc_llama* l, const char* gguf_path, struct llama_model_params* params,
                                size_t* routed) {
  if (routed != nullptr) *routed = 0;
  if (l == nullptr || gguf_path == nullptr || params == nullptr)
    return fail(WC_ERR_INVALID_ARGUMENT, "wc_llama_model_params: NULL front, path or params");
  ggml_backend_buffer_type_t buft = wc_ggml_buffer_type(l->g);
  // Every return but a routing one leaves params without entries a front added (stock llama.cpp).
  auto none = [&](wc_status st) {
    try {
      route(params, buft, {});
    } catch (...) {
      // No memory even for a list of the application's own entries: params stay as they are.
      ggml_log_internal(GGML_LOG_LEVEL_ERROR, "weightcache: out of memory while resetting llama_model_params\n");
    }
    return st;
  };
  try {
    if (const std::string why = why_llama_repacks_nothing(params, weightcache::ggml_detail::repack_buffer_type());
        !why.empty()) {
      ggml_log_internal(GGML_LOG_LEVEL_INFO, "weightcache: no weights of %s routed to the cache: %s\n", gguf_path,
                        why.c_str());
      return none(WC_OK);
    }
    ggml_context* meta = nullptr;
    gguf_init_params gp{};
    gp.no_alloc = true;
    gp.ctx = &meta;
    gguf_context* gg = gguf_init_from_file(gguf_path, gp);
    if (gg == nullptr)
      return none(fail(WC_ERR_IO, std::string("wc_llama_model_params: cannot read the GGUF ") + gguf_path +
                                      " (missing, unreadable or not a GGUF file); llama.cpp's own load says more"));
    std::vector<std::string> all;
    std::set<std::string> chosen;
    auto take = [&](gguf_context* g, ggml_context* m) {
      const std::int64_t n = gguf_get_n_tensors(g);
      for (std::int64_t i = 0; i < n; ++i) {
        const char* name = gguf_get_tensor_name(g, i);
        all.emplace_back(name);
        if (repacked_by_llama(name, ggml_get_tensor(m, name))) chosen.insert(name);
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
    if (chosen.empty()) return none(WC_OK);
    std::vector<std::string> patterns;
    bool ok = false;
    try {
      patterns.push_back(pattern_for(all, chosen));
      ok = exact(patterns, all, chosen);
    } catch (const std::regex_error&) {
      ok = false;  // too large for std::regex (thousands of distinct endings)
    }
    if (!ok) {
      // Cannot happen for a model llama.cpp names; llama.cpp's own repacking is always right.
      ggml_log_internal(GGML_LOG_LEVEL_WARN,
                        "weightcache: no short pattern matches exactly the %zu repacked tensors of %s; llama.cpp "
                        "repacks them itself\n",
                        chosen.size(), gguf_path);
      return none(WC_OK);
    }
    ggml_log_internal(GGML_LOG_LEVEL_DEBUG, "weightcache: %zu tensors of %s routed to the cache by the pattern %s\n",
                      chosen.size(), gguf_path, patterns.front().c_str());
    route(params, buft, std::move(patterns));
    if (routed != nullptr) *routed = chosen.size();
    return WC_OK;
  } catch (const std::bad_alloc&) {
    return none(fail(WC_ERR_NO_MEMORY, "wc_llama_model_params: out of memory"));
  } catch (const std::exception& e) {
    return none(fail(WC_ERR_INVALID_ARGUMENT, std::string("wc_llama_model_params: ") + e.what()));
  }
}

wc_ggml* wc_llama_ggml(wc_llama* l) { return l != nullptr ? l->g : nullptr; }

void wc_llama_destroy(wc_llama* l) {
  if (l == nullptr) return;
  wc_ggml_destroy(l->g);
  delete l;
}

}  // extern "C"

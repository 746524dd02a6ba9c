// weightcache-gguf-gen: writes a llama-architecture GGUF with random weights, for the ggml tests,
// benchmarks and demo (models are generated, never downloaded). Written with ggml's own gguf
// writer (the metadata) and ggml_quantize_chunk (the weights), streamed tensor by tensor so a
// model of several GB needs no more memory than its largest tensor.
//
//   weightcache-gguf-gen --out FILE [--layers 12] [--dim 2048] [--ffn 5632] [--type q4_0]
//                        [--seed 1] [--vocab 0] [--tensor-type NAME=TYPE]... [--experts N]
//                        [--splits N]
//
// Per layer, llama.cpp's names: blk.N.attn_norm.weight (f32), blk.N.attn_{q,k,v,output}.weight,
// blk.N.ffn_norm.weight (f32), blk.N.ffn_{gate,up}.weight (dim -> ffn), blk.N.ffn_down.weight
// (ffn -> dim), all of --type; then output_norm.weight. With --vocab V (at least 259) also
// token_embd.weight and output.weight (V rows, of --type) and a byte-level SentencePiece vocabulary
// that llama.cpp's tokenizer loads: <unk>, <s>, </s>, the 256 byte tokens, then pieces ("\u2581",
// letters, "\u2581" + letter, ...) up to V. Every tensor's values come from --seed and its name, so a
// tensor's bytes do not depend on the others. --tensor-type gives one quantized tensor another
// type (a model of mixed types, as quantizers write them). --experts N makes every layer's MLP a
// mixture of N experts (blk.N.ffn_gate_inp.weight, f32, and blk.N.ffn_{gate,up,down}_exps.weight,
// 3-D, of --type; llama.expert_count N, two used). --splits N writes the model as llama.cpp's split
// GGUFs: --out names the prefix, the files are PREFIX-0000i-of-0000N.gguf, tensors in order.
#include <ggml.h>
#include <gguf.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace {

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "weightcache-gguf-gen: %s\n"
               "usage: weightcache-gguf-gen --out FILE [--layers N] [--dim D] [--ffn F] [--type q4_0|iq4_nl|q4_k|q8_0|f16|f32]"
               " [--seed S] [--vocab V] [--tensor-type NAME=TYPE]... [--experts N] [--splits N]\n",
               why);
  std::exit(2);
}

std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Values of about N(0, scale) drawn from the seed and the tensor's name.
void fill(std::vector<float>& v, std::uint64_t seed, const std::string& name, float scale, float offset) {
  std::uint64_t s = seed * 0x100000001B3ull;
  for (char c : name) s = mix(s ^ static_cast<unsigned char>(c));
  for (float& x : v) {
    s = mix(s);
    // Sum of four uniforms: close enough to a normal for weights.
    float u = 0;
    for (int i = 0; i < 4; ++i) u += static_cast<float>((s >> (i * 16)) & 0xFFFF) / 65535.0f;
    x = offset + (u - 2.0f) * scale * 1.7320508f;
  }
}

struct Spec {
  std::string name;
  std::int64_t ne0, ne1;
  bool quantized;
  std::int64_t ne2 = 1;
};

// Writes the tensors `g` holds (tensors[first], tensors[first + 1], ... in that order) with their
// metadata to `path`, through a temporary file renamed into place.
bool write_gguf(const std::string& path, gguf_context* g, const std::vector<ggml_tensor*>& tensors,
                const std::vector<Spec>& specs, std::size_t first, unsigned long long seed) {
  const std::string tmp = path + ".tmp";
  if (!gguf_write_to_file(g, tmp.c_str(), /*only_meta=*/true)) {
    std::fprintf(stderr, "weightcache-gguf-gen: cannot write %s\n", tmp.c_str());
    return false;
  }
  FILE* f = std::fopen(tmp.c_str(), "ab");
  if (f == nullptr) {
    std::fprintf(stderr, "weightcache-gguf-gen: cannot append to %s\n", tmp.c_str());
    return false;
  }
  const std::size_t meta = gguf_get_meta_size(g);
  std::vector<float> values;
  std::vector<std::uint8_t> bytes;
  bool ok = true;
  const std::int64_t n = gguf_get_n_tensors(g);
  for (std::int64_t j = 0; j < n && ok; ++j) {
    const std::size_t i = first + static_cast<std::size_t>(j);
    ggml_tensor* t = tensors[i];
    const std::size_t at = meta + gguf_get_tensor_offset(g, j);
    const long pos = std::ftell(f);
    if (pos < 0 || static_cast<std::size_t>(pos) > at) {
      ok = false;
      break;
    }
    bytes.assign(at - static_cast<std::size_t>(pos), 0);  // alignment padding
    ok = bytes.empty() || std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    values.resize(static_cast<std::size_t>(ggml_nelements(t)));
    const bool norm = specs[i].ne1 == 1;
    fill(values, seed, specs[i].name, norm ? 0.05f : 0.02f, norm ? 1.0f : 0.0f);
    if (t->type == GGML_TYPE_F32) {
      ok = ok && std::fwrite(values.data(), sizeof(float), values.size(), f) == values.size();
    } else {
      bytes.resize(ggml_nbytes(t));
      const std::size_t q =
          ggml_quantize_chunk(t->type, values.data(), bytes.data(), 0, t->ne[1] * t->ne[2], t->ne[0], nullptr);
      ok = ok && q == bytes.size() && std::fwrite(bytes.data(), 1, q, f) == q;
    }
  }
  ok = std::fflush(f) == 0 && ok;
  ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::fprintf(stderr, "weightcache-gguf-gen: writing %s failed\n", path.c_str());
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out, type_name = "q4_0";
  std::vector<std::pair<std::string, std::string>> tensor_types;  // --tensor-type NAME=TYPE
  long layers = 12, dim = 2048, ffn = 5632, vocab = 0, experts = 0, splits = 1;
  unsigned long long seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) usage(("missing value after " + a).c_str());
      return argv[++i];
    };
    if (a == "--out") out = next();
    else if (a == "--layers") layers = std::strtol(next(), nullptr, 10);
    else if (a == "--dim") dim = std::strtol(next(), nullptr, 10);
    else if (a == "--ffn") ffn = std::strtol(next(), nullptr, 10);
    else if (a == "--vocab") vocab = std::strtol(next(), nullptr, 10);
    else if (a == "--experts") experts = std::strtol(next(), nullptr, 10);
    else if (a == "--splits") splits = std::strtol(next(), nullptr, 10);
    else if (a == "--seed") seed = std::strtoull(next(), nullptr, 10);
    else if (a == "--type") type_name = next();
    else if (a == "--tensor-type") {
      const std::string v = next();
      const std::size_t eq = v.find('=');
      if (eq == std::string::npos || eq == 0) usage("--tensor-type wants NAME=TYPE");
      tensor_types.emplace_back(v.substr(0, eq), v.substr(eq + 1));
    }
    else if (a == "-h" || a == "--help") usage("writes a llama-architecture GGUF with random weights");
    else usage(("unknown argument " + a).c_str());
  }
  if (out.empty()) usage("--out is required");
  auto type_of = [](const std::string& n) -> ggml_type {
    if (n == "q4_0") return GGML_TYPE_Q4_0;
    if (n == "iq4_nl") return GGML_TYPE_IQ4_NL;
    if (n == "q4_k") return GGML_TYPE_Q4_K;
    if (n == "q8_0") return GGML_TYPE_Q8_0;
    if (n == "f16") return GGML_TYPE_F16;  // matrices ggml repacks nowhere but AMX
    if (n == "f32") return GGML_TYPE_F32;  // matrices ggml repacks nowhere
    usage(("unknown type " + n).c_str());
  };
  const ggml_type type = type_of(type_name);
  const long block = ggml_blck_size(type);
  if (layers < 1 || layers > 1000 || dim < block || dim % block != 0 || ffn < block || ffn % block != 0 || vocab < 0)
    usage("--layers 1..1000; --dim and --ffn positive multiples of the type's block size");
  if (vocab > 0 && (vocab < 259 || vocab > 1000000)) usage("--vocab 259..1000000 (the byte vocabulary needs 259)");
  if (experts < 0 || experts > 256 || splits < 1 || splits > 99) usage("--experts 0..256, --splits 1..99");

  std::vector<Spec> specs;
  if (vocab > 0) specs.push_back({"token_embd.weight", dim, vocab, true});
  for (long l = 0; l < layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    specs.push_back({p + "attn_norm.weight", dim, 1, false});
    for (const char* w : {"attn_q", "attn_k", "attn_v", "attn_output"}) specs.push_back({p + w + ".weight", dim, dim, true});
    specs.push_back({p + "ffn_norm.weight", dim, 1, false});
    if (experts > 0) {
      specs.push_back({p + "ffn_gate_inp.weight", dim, experts, false});
      specs.push_back({p + "ffn_gate_exps.weight", dim, ffn, true, experts});
      specs.push_back({p + "ffn_up_exps.weight", dim, ffn, true, experts});
      specs.push_back({p + "ffn_down_exps.weight", ffn, dim, true, experts});
    } else {
      specs.push_back({p + "ffn_gate.weight", dim, ffn, true});
      specs.push_back({p + "ffn_up.weight", dim, ffn, true});
      specs.push_back({p + "ffn_down.weight", ffn, dim, true});
    }
  }
  specs.push_back({"output_norm.weight", dim, 1, false});
  if (vocab > 0) specs.push_back({"output.weight", dim, vocab, true});

  ggml_init_params ip{};
  ip.mem_size = ggml_tensor_overhead() * (specs.size() + 8);
  ip.no_alloc = true;
  ggml_context* ctx = ggml_init(ip);
  gguf_context* g = gguf_init_empty();
  gguf_set_val_str(g, "general.architecture", "llama");
  gguf_set_val_str(g, "general.name", "weightcache generated model");
  gguf_set_val_u32(g, "general.file_type", type == GGML_TYPE_Q4_0 ? 2u : 0u);
  gguf_set_val_u32(g, "llama.block_count", static_cast<std::uint32_t>(layers));
  gguf_set_val_u32(g, "llama.embedding_length", static_cast<std::uint32_t>(dim));
  gguf_set_val_u32(g, "llama.feed_forward_length", static_cast<std::uint32_t>(ffn));
  gguf_set_val_u32(g, "llama.context_length", 2048);
  const std::uint32_t heads = static_cast<std::uint32_t>(dim % 64 == 0 ? dim / 64 : 1);
  gguf_set_val_u32(g, "llama.attention.head_count", heads);
  gguf_set_val_u32(g, "llama.attention.head_count_kv", heads);
  gguf_set_val_u32(g, "llama.rope.dimension_count", static_cast<std::uint32_t>(dim / heads));
  gguf_set_val_f32(g, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
  gguf_set_val_u32(g, "weightcache.seed", static_cast<std::uint32_t>(seed));
  if (experts > 0) {
    gguf_set_val_u32(g, "llama.expert_count", static_cast<std::uint32_t>(experts));
    gguf_set_val_u32(g, "llama.expert_used_count", static_cast<std::uint32_t>(std::min<long>(experts, 2)));
  }
  std::vector<std::string> tokens;
  if (vocab > 0) {
    // llama.cpp's SPM tokenizer: scores rank merges, types say which tokens are bytes or control.
    const std::string space = "\xe2\x96\x81";  // U+2581, SentencePiece's word boundary
    tokens = {"<unk>", "<s>", "</s>"};
    for (int b = 0; b < 256; ++b) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "<0x%02X>", b);
      tokens.emplace_back(buf);
    }
    std::vector<std::string> pieces = {space};
    for (char c = 'a'; c <= 'z'; ++c) pieces.emplace_back(1, c);
    for (char c = 'a'; c <= 'z'; ++c) pieces.push_back(space + c);
    for (std::size_t i = 0; tokens.size() < static_cast<std::size_t>(vocab); ++i)
      tokens.push_back(i < pieces.size() ? pieces[i] : "<extra_" + std::to_string(i) + ">");
    std::vector<const char*> ptrs;
    std::vector<float> scores;
    std::vector<std::int32_t> types;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      ptrs.push_back(tokens[i].c_str());
      scores.push_back(i < 259 ? 0.0f : -static_cast<float>(i));
      types.push_back(i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1);  // unknown, control, byte, normal
    }
    gguf_set_val_str(g, "tokenizer.ggml.model", "llama");
    gguf_set_arr_str(g, "tokenizer.ggml.tokens", ptrs.data(), ptrs.size());
    gguf_set_arr_data(g, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores.data(), scores.size());
    gguf_set_arr_data(g, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types.data(), types.size());
    gguf_set_val_u32(g, "tokenizer.ggml.unknown_token_id", 0);
    gguf_set_val_u32(g, "tokenizer.ggml.bos_token_id", 1);
    gguf_set_val_u32(g, "tokenizer.ggml.eos_token_id", 2);
  }
  std::vector<ggml_tensor*> tensors;
  for (const Spec& s : specs) {
    ggml_type tt = type;
    for (const auto& [name, tn] : tensor_types)
      if (name == s.name) tt = type_of(tn);
    if (s.quantized && s.ne0 % ggml_blck_size(tt) != 0) usage(("--tensor-type: " + s.name + " does not fit that type's blocks").c_str());
    ggml_tensor* t = s.ne1 == 1 ? ggml_new_tensor_1d(ctx, GGML_TYPE_F32, s.ne0)
                     : s.ne2 > 1 ? ggml_new_tensor_3d(ctx, s.quantized ? tt : GGML_TYPE_F32, s.ne0, s.ne1, s.ne2)
                                 : ggml_new_tensor_2d(ctx, s.quantized ? tt : GGML_TYPE_F32, s.ne0, s.ne1);
    ggml_set_name(t, s.name.c_str());
    tensors.push_back(t);
  }
  // Which tensors go to which file: all to --out, or in order to the splits.
  std::vector<std::string> paths;
  std::string prefix = out;
  if (splits > 1 && prefix.size() > 5 && prefix.compare(prefix.size() - 5, 5, ".gguf") == 0)
    prefix.resize(prefix.size() - 5);
  for (long i = 0; i < splits; ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "-%05ld-of-%05ld.gguf", i + 1, splits);
    paths.push_back(splits > 1 ? prefix + buf : out);
  }
  bool all_ok = true;
  for (long part = 0; part < splits && all_ok; ++part) {
    const std::size_t first = tensors.size() * static_cast<std::size_t>(part) / static_cast<std::size_t>(splits);
    const std::size_t last = tensors.size() * static_cast<std::size_t>(part + 1) / static_cast<std::size_t>(splits);
    gguf_context* gp = part == 0 ? g : gguf_init_empty();
    if (splits > 1) {
      gguf_set_val_u16(gp, "split.no", static_cast<std::uint16_t>(part));
      gguf_set_val_u16(gp, "split.count", static_cast<std::uint16_t>(splits));
      gguf_set_val_i32(gp, "split.tensors.count", static_cast<std::int32_t>(tensors.size()));
    }
    for (std::size_t i = first; i < last; ++i) gguf_add_tensor(gp, tensors[i]);
    all_ok = write_gguf(paths[static_cast<std::size_t>(part)], gp, tensors, specs, first, seed);
    if (gp != g) gguf_free(gp);
  }
  if (!all_ok) return 1;
  std::printf("weightcache-gguf-gen: %s: %ld layers of %ld (ffn %ld), %s, %zu tensors\n", paths[0].c_str(), layers, dim,
              ffn, type_name.c_str(), tensors.size());
  gguf_free(g);
  ggml_free(ctx);
  return 0;
}


// model/parameters.cpp
#include "model/parameters.h"

#include <cmath>

#include "core/error.h"
#include "core/philox.h"

namespace lockstep {

namespace {

// Builds the structure with `make(shape)` for each tensor the config has.
template <class Make>
ModelParameters build(const ModelConfig& c, Make make) {
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim, ff = c.intermediate_size;
  ModelParameters p;
  p.embed = make(Shape{c.vocab_size, h});
  p.layers.resize(size_t(c.num_hidden_layers));
  for (LayerParameters& l : p.layers) {
    l.input_norm = make(Shape{h});
    l.qkv = make(Shape{q + 2 * kv, h});
    if (c.qkv_bias) l.qkv_bias = make(Shape{q + 2 * kv});
    if (c.qk_norm) {
      l.q_norm = make(Shape{c.head_dim});
      l.k_norm = make(Shape{c.head_dim});
    }
    l.o = make(Shape{h, q});
    if (c.o_bias) l.o_bias = make(Shape{h});
    l.post_norm = make(Shape{h});
    l.gate_up = make(Shape{2 * ff, h});
    if (c.mlp_bias) l.gate_up_bias = make(Shape{2 * ff});
    l.down = make(Shape{h, ff});
    if (c.mlp_bias) l.down_bias = make(Shape{h});
  }
  p.final_norm = make(Shape{h});
  if (!c.tie_word_embeddings) p.lm_head = make(Shape{c.vocab_size, h});
  return p;
}

template <class Params, class Fn>
void visit(Params& p, Fn&& fn) {
  auto maybe = [&](const std::string& name, auto& t) {
    if (t.defined()) fn(name, t);
  };
  maybe("embed", p.embed);
  for (size_t i = 0; i < p.layers.size(); ++i) {
    auto& l = p.layers[i];
    const std::string pre = "layers." + std::to_string(i) + ".";
    maybe(pre + "input_norm", l.input_norm);
    maybe(pre + "qkv", l.qkv);
    maybe(pre + "qkv_bias", l.qkv_bias);
    maybe(pre + "q_norm", l.q_norm);
    maybe(pre + "k_norm", l.k_norm);
    maybe(pre + "o", l.o);
    maybe(pre + "o_bias", l.o_bias);
    maybe(pre + "post_norm", l.post_norm);
    maybe(pre + "gate_up", l.gate_up);
    maybe(pre + "gate_up_bias", l.gate_up_bias);
    maybe(pre + "down", l.down);
    maybe(pre + "down_bias", l.down_bias);
  }
  maybe("final_norm", p.final_norm);
  maybe("lm_head", p.lm_head);
}

bool is_norm(const std::string& name) { return name.ends_with("norm"); }
bool is_bias(const std::string& name) { return name.ends_with("bias"); }

}  // namespace

ModelParameters ModelParameters::zeros(const ModelConfig& config, Device device) {
  return build(config, [&](Shape s) { return Tensor::zeros(std::move(s), DType::f32, device); });
}

void dither_within_bf16_rounding(ModelParameters& params, uint64_t seed) {
  uint64_t stream = 0;
  params.for_each([&](const std::string& name, Tensor& t) {
    ++stream;
    if (is_norm(name) || is_bias(name)) return;
    LOCKSTEP_CHECK(t.device() == Device::cpu && t.dtype() == DType::f32,
                   "dither_within_bf16_rounding: ", name, " is not an f32 CPU tensor");
    float* v = t.data_as<float>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (v[i] == 0 || !std::isfinite(v[i])) continue;
      const float u = 0.98f * philox_uniform(philox_at(seed, stream, uint64_t(i)).v[0]) - 0.49f;
      int e;
      const float m = std::frexp(v[i], &e);  // |v| in [2^(e-1), 2^e)
      float ulp = std::ldexp(1.0f, e - 8);   // bf16 keeps 8 significant bits
      // Below a power of two the grid is twice as fine.
      if (std::fabs(m) == 0.5f && (u < 0) == (v[i] > 0)) ulp *= 0.5f;
      v[i] += u * ulp;
    }
  });
}

ModelParameters ModelParameters::initialized(const ModelConfig& config, uint64_t seed,
                                             Device device) {
  ModelParameters p = build(config, [](Shape s) { return Tensor::empty(std::move(s), DType::f32); });
  uint64_t stream = 0;
  p.for_each([&](const std::string& name, Tensor& t) {
    float* v = t.data_as<float>();
    const int64_t n = t.numel();
    if (is_norm(name) || is_bias(name)) {
      for (int64_t i = 0; i < n; ++i) v[i] = is_norm(name) ? 1.0f : 0.0f;
    } else {
      // Box-Muller on Philox uniforms: 4 words give 2 normals. Counter-based, so the threads'
      // split does not change the values (billions of them for the benchmark models).
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; i += 2) {
        const Philox4 r = philox_at(seed, stream, uint64_t(i / 2));
        const double radius = std::sqrt(-2.0 * std::log(double(philox_uniform(r.v[0]))));
        const double angle = 2.0 * M_PI * double(philox_uniform(r.v[1]));
        v[i] = float(0.02 * radius * std::cos(angle));
        if (i + 1 < n) v[i + 1] = float(0.02 * radius * std::sin(angle));
      }
    }
    ++stream;
  });
  return device == Device::cpu ? p : p.copy_to(device);
}

ModelParameters ModelParameters::copy_to(Device device) const {
  ModelParameters copy = *this;
  copy.for_each([&](const std::string&, Tensor& t) { t = t.to(device); });
  return copy;
}

void ModelParameters::for_each(const std::function<void(const std::string&, Tensor&)>& fn) {
  visit(*this, fn);
}

void ModelParameters::for_each(
    const std::function<void(const std::string&, const Tensor&)>& fn) const {
  visit(*this, fn);
}

int64_t ModelParameters::numel() const {
  int64_t n = 0;
  for_each([&](const std::string&, const Tensor& t) { n += t.numel(); });
  return n;
}

void ModelParameters::zero() {
  for_each([](const std::string&, Tensor& t) { t.fill_bytes(0); });
}

}  // namespace lockstep

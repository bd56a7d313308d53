#include "reference_model.h"

#include <fmt/format.h>

#include <cmath>

#include "cocemu/layers/transformer.h"

namespace cocemu::layers::train::reference {

namespace {

using Vec = std::vector<double>;

/// A row-major matrix of doubles.
struct Mat {
  std::int64_t rows = 0, cols = 0;
  Vec v;
  Mat() = default;
  Mat(std::int64_t r, std::int64_t c) : rows(r), cols(c), v(std::size_t(r * c), 0.0) {}
  double& operator()(std::int64_t i, std::int64_t j) { return v[std::size_t(i * cols + j)]; }
  double operator()(std::int64_t i, std::int64_t j) const { return v[std::size_t(i * cols + j)]; }
};

Mat from(const Tensor& t) {
  Mat m(t.size(0), t.size(1));
  for (std::int64_t i = 0; i < t.numel(); ++i)
    m.v[std::size_t(i)] = t.item(i);
  return m;
}

/// y = x · wᵀ (x [n, k], w [m, k]).
Mat mul_t(const Mat& x, const Mat& w) {
  Mat y(x.rows, w.rows);
  for (std::int64_t i = 0; i < x.rows; ++i)
    for (std::int64_t j = 0; j < w.rows; ++j) {
      double s = 0;
      for (std::int64_t k = 0; k < x.cols; ++k)
        s += x(i, k) * w(j, k);
      y(i, j) = s;
    }
  return y;
}

/// dx += dy · w (dy [n, m], w [m, k]); dw += dyᵀ · x.
void mul_t_backward(const Mat& x, const Mat& w, const Mat& dy, Mat* dx, Mat& dw) {
  for (std::int64_t i = 0; i < dy.rows; ++i)
    for (std::int64_t j = 0; j < dy.cols; ++j) {
      const double g = dy(i, j);
      if (dx)
        for (std::int64_t k = 0; k < x.cols; ++k)
          (*dx)(i, k) += g * w(j, k);
      for (std::int64_t k = 0; k < x.cols; ++k)
        dw(j, k) += g * x(i, k);
    }
}

struct Norm {
  Mat y;
  Vec rms;
};

Norm rmsnorm(const Mat& x) {
  Norm n{Mat(x.rows, x.cols), Vec(std::size_t(x.rows))};
  for (std::int64_t i = 0; i < x.rows; ++i) {
    double ss = 0;
    for (std::int64_t j = 0; j < x.cols; ++j)
      ss += x(i, j) * x(i, j);
    const double r = std::sqrt(ss / double(x.cols) + 1e-6);
    n.rms[std::size_t(i)] = r;
    for (std::int64_t j = 0; j < x.cols; ++j)
      n.y(i, j) = x(i, j) / r;
  }
  return n;
}

/// dx += (dy − x̂·mean(dy·x̂)) / rms.
void rmsnorm_backward(const Mat& x, const Vec& rms, const Mat& dy, Mat& dx) {
  for (std::int64_t i = 0; i < x.rows; ++i) {
    const double r = rms[std::size_t(i)];
    double dot = 0;
    for (std::int64_t j = 0; j < x.cols; ++j)
      dot += dy(i, j) * x(i, j) / r;
    dot /= double(x.cols);
    for (std::int64_t j = 0; j < x.cols; ++j)
      dx(i, j) += (dy(i, j) - x(i, j) / r * dot) / r;
  }
}

double sigmoid(double x) {
  return 1 / (1 + std::exp(-x));
}

struct Weights {
  Mat emb, head;
  std::vector<Mat> qkv, out, up, down;
};

struct Shape {
  std::int64_t s, h, a, g, d, f;
};

/// One sequence through one layer: what the backward needs.
struct LayerCache {
  Mat x, h1, qkv, attn, up, act;
  Norm n1, n2;
  std::vector<Mat> p;  ///< per head: causal softmax probabilities [s, s]
};

Mat layer_forward(const Shape& sh, const Weights& w, int l, const Mat& x, LayerCache& c) {
  c.x = x;
  c.n1 = rmsnorm(x);
  c.qkv = mul_t(c.n1.y, w.qkv[std::size_t(l)]);
  c.attn = Mat(sh.s, sh.h);
  c.p.assign(std::size_t(sh.a), Mat(sh.s, sh.s));
  const double scale = 1 / std::sqrt(double(sh.d));
  for (std::int64_t hd = 0; hd < sh.a; ++hd) {
    const std::int64_t grp = hd / (sh.a / sh.g);
    const std::int64_t qc = hd * sh.d, kc = sh.h + grp * sh.d, vc = sh.h + sh.g * sh.d + grp * sh.d;
    Mat& p = c.p[std::size_t(hd)];
    for (std::int64_t i = 0; i < sh.s; ++i) {
      double mx = -INFINITY;
      for (std::int64_t j = 0; j <= i; ++j) {
        double sc = 0;
        for (std::int64_t e = 0; e < sh.d; ++e)
          sc += c.qkv(i, qc + e) * c.qkv(j, kc + e);
        p(i, j) = sc * scale;
        mx = std::max(mx, p(i, j));
      }
      double z = 0;
      for (std::int64_t j = 0; j <= i; ++j)
        z += (p(i, j) = std::exp(p(i, j) - mx));
      for (std::int64_t j = 0; j <= i; ++j)
        p(i, j) /= z;
      for (std::int64_t e = 0; e < sh.d; ++e) {
        double o = 0;
        for (std::int64_t j = 0; j <= i; ++j)
          o += p(i, j) * c.qkv(j, vc + e);
        c.attn(i, qc + e) = o;
      }
    }
  }
  const Mat proj = mul_t(c.attn, w.out[std::size_t(l)]);
  c.h1 = x;
  for (std::size_t i = 0; i < c.h1.v.size(); ++i)
    c.h1.v[i] += proj.v[i];
  c.n2 = rmsnorm(c.h1);
  c.up = mul_t(c.n2.y, w.up[std::size_t(l)]);
  c.act = Mat(sh.s, sh.f);
  for (std::int64_t i = 0; i < sh.s; ++i)
    for (std::int64_t j = 0; j < sh.f; ++j) {
      const double gte = c.up(i, j), u = c.up(i, sh.f + j);
      c.act(i, j) = gte * sigmoid(gte) * u;
    }
  const Mat mlp = mul_t(c.act, w.down[std::size_t(l)]);
  Mat y = c.h1;
  for (std::size_t i = 0; i < y.v.size(); ++i)
    y.v[i] += mlp.v[i];
  return y;
}

Mat layer_backward(const Shape& sh, const Weights& w, Weights& g, int l, const LayerCache& c,
                   const Mat& dy) {
  Mat dact(sh.s, sh.f);
  mul_t_backward(c.act, w.down[std::size_t(l)], dy, &dact, g.down[std::size_t(l)]);
  Mat dup(sh.s, 2 * sh.f);
  for (std::int64_t i = 0; i < sh.s; ++i)
    for (std::int64_t j = 0; j < sh.f; ++j) {
      const double gte = c.up(i, j), u = c.up(i, sh.f + j), da = dact(i, j), sg = sigmoid(gte);
      dup(i, j) = da * u * sg * (1 + gte * (1 - sg));
      dup(i, sh.f + j) = da * gte * sg;
    }
  Mat dn2(sh.s, sh.h);
  mul_t_backward(c.n2.y, w.up[std::size_t(l)], dup, &dn2, g.up[std::size_t(l)]);
  Mat dh1 = dy;
  rmsnorm_backward(c.h1, c.n2.rms, dn2, dh1);
  Mat dattn(sh.s, sh.h);
  mul_t_backward(c.attn, w.out[std::size_t(l)], dh1, &dattn, g.out[std::size_t(l)]);
  Mat dqkv(sh.s, c.qkv.cols);
  const double scale = 1 / std::sqrt(double(sh.d));
  for (std::int64_t hd = 0; hd < sh.a; ++hd) {
    const std::int64_t grp = hd / (sh.a / sh.g);
    const std::int64_t qc = hd * sh.d, kc = sh.h + grp * sh.d, vc = sh.h + sh.g * sh.d + grp * sh.d;
    const Mat& p = c.p[std::size_t(hd)];
    for (std::int64_t i = 0; i < sh.s; ++i) {
      Vec dp(std::size_t(i + 1));
      double rowdot = 0;
      for (std::int64_t j = 0; j <= i; ++j) {
        double v = 0;
        for (std::int64_t e = 0; e < sh.d; ++e) {
          v += dattn(i, qc + e) * c.qkv(j, vc + e);
          dqkv(j, vc + e) += p(i, j) * dattn(i, qc + e);
        }
        dp[std::size_t(j)] = v;
        rowdot += v * p(i, j);
      }
      for (std::int64_t j = 0; j <= i; ++j) {
        const double ds = p(i, j) * (dp[std::size_t(j)] - rowdot) * scale;
        for (std::int64_t e = 0; e < sh.d; ++e) {
          dqkv(i, qc + e) += ds * c.qkv(j, kc + e);
          dqkv(j, kc + e) += ds * c.qkv(i, qc + e);
        }
      }
    }
  }
  Mat dn1(sh.s, sh.h);
  mul_t_backward(c.n1.y, w.qkv[std::size_t(l)], dqkv, &dn1, g.qkv[std::size_t(l)]);
  Mat dx = dh1;
  rmsnorm_backward(c.x, c.n1.rms, dn1, dx);
  return dx;
}

/// The rows [r·n, (r+1)·n) of each block [start, start + len·tp) of a weight.
Tensor rows_of(const Mat& m, const std::vector<std::pair<std::int64_t, std::int64_t>>& blocks) {
  std::int64_t total = 0;
  for (const auto& b : blocks)
    total += b.second;
  Tensor t = Tensor::zeros({total, m.cols}, DType::f64);
  std::int64_t at = 0;
  for (const auto& [start, len] : blocks)
    for (std::int64_t i = 0; i < len; ++i, ++at)
      for (std::int64_t j = 0; j < m.cols; ++j)
        t.data<double>()[at * m.cols + j] = m(start + i, j);
  return t;
}

Tensor cols_of(const Mat& m, std::int64_t c0, std::int64_t width) {
  Tensor t = Tensor::zeros({m.rows, width}, DType::f64);
  for (std::int64_t i = 0; i < m.rows; ++i)
    for (std::int64_t j = 0; j < width; ++j)
      t.data<double>()[i * width + j] = m(i, c0 + j);
  return t;
}

}  // namespace

Result train_reference(const TrainOptions& o) {
  const auto& md = o.model;
  const auto& l = o.layout;
  const std::int64_t vocab = padded_vocab(md.vocab, l.tp);
  const Shape sh{md.seq, md.hidden, md.heads, md.kv(), md.hidden / md.heads, md.ffn};
  TransformerConfig lc{.seq = md.seq,
                       .batch = 1,
                       .hidden = md.hidden,
                       .heads = md.heads,
                       .ffn = md.ffn,
                       .kv_heads = md.kv_heads,
                       .activation = Activation::swiglu,
                       .sequence_parallel = false,
                       .dtype = DType::f64};
  Weights w, m1, m2;
  w.emb = from(initial_embedding(o, vocab));
  w.head = from(initial_head(o, vocab));
  for (std::int64_t i = 0; i < md.num_layers; ++i) {
    const auto t = TransformerWeights::random(lc, layer_seed(o, i));
    w.qkv.push_back(from(t.qkv));
    w.out.push_back(from(t.out));
    w.up.push_back(from(t.up));
    w.down.push_back(from(t.down));
  }
  auto zeros_like = [](const Weights& x) {
    Weights z;
    z.emb = Mat(x.emb.rows, x.emb.cols);
    z.head = Mat(x.head.rows, x.head.cols);
    for (std::size_t i = 0; i < x.qkv.size(); ++i) {
      z.qkv.emplace_back(x.qkv[i].rows, x.qkv[i].cols);
      z.out.emplace_back(x.out[i].rows, x.out[i].cols);
      z.up.emplace_back(x.up[i].rows, x.up[i].cols);
      z.down.emplace_back(x.down[i].rows, x.down[i].cols);
    }
    return z;
  };
  m1 = zeros_like(w);
  m2 = zeros_like(w);
  Result out;
  const double tokens = double(l.global_batch_size * md.seq);
  // The gradient of the mean loss; with micro_batch_interleave_num copies, MindSpore's
  // MicroBatchInterleaved sums the copies' losses: the gradient is that many means.
  const double grad_scale = double(l.micro_batch_interleave) / tokens;
  for (int it = 0; it < o.iterations; ++it) {
    Weights g = zeros_like(w);
    double loss = 0;
    for (std::int64_t sample = 0; sample < l.global_batch_size; ++sample) {
      const TokenBatch b =
          synthetic_batch(o.seed, md.vocab, md.seq, 1, it * l.global_batch_size + sample);
      Mat x(sh.s, sh.h);
      for (std::int64_t i = 0; i < sh.s; ++i)
        for (std::int64_t j = 0; j < sh.h; ++j)
          x(i, j) = w.emb(b.tokens[std::size_t(i)], j);
      std::vector<LayerCache> caches(std::size_t(md.num_layers));
      for (int li = 0; li < int(md.num_layers); ++li)
        x = layer_forward(sh, w, li, x, caches[std::size_t(li)]);
      const Norm nf = rmsnorm(x);
      const Mat logits = mul_t(nf.y, w.head);
      Mat dlogits(sh.s, vocab);
      for (std::int64_t i = 0; i < sh.s; ++i) {
        double mx = -INFINITY;
        for (std::int64_t j = 0; j < vocab; ++j)
          mx = std::max(mx, logits(i, j));
        double z = 0;
        for (std::int64_t j = 0; j < vocab; ++j)
          z += std::exp(logits(i, j) - mx);
        const std::int64_t label = b.labels[std::size_t(i)];
        loss += std::log(z) + mx - logits(i, label);
        for (std::int64_t j = 0; j < vocab; ++j)
          dlogits(i, j) = (std::exp(logits(i, j) - mx) / z - (j == label ? 1.0 : 0.0)) * grad_scale;
      }
      Mat dnf(sh.s, sh.h);
      mul_t_backward(nf.y, w.head, dlogits, &dnf, g.head);
      Mat dy(sh.s, sh.h);
      rmsnorm_backward(x, nf.rms, dnf, dy);
      for (int li = int(md.num_layers) - 1; li >= 0; --li)
        dy = layer_backward(sh, w, g, li, caches[std::size_t(li)], dy);
      for (std::int64_t i = 0; i < sh.s; ++i)
        for (std::int64_t j = 0; j < sh.h; ++j)
          g.emb(b.tokens[std::size_t(i)], j) += dy(i, j);
    }
    out.loss.push_back(loss / tokens);
    double norm2 = 0;
    auto add_norm = [&](const Mat& gt) {
      for (const double v : gt.v)
        norm2 += v * v;
    };
    add_norm(g.emb);
    add_norm(g.head);
    for (std::size_t i = 0; i < g.qkv.size(); ++i)
      for (const Mat* gt : {&g.qkv[i], &g.out[i], &g.up[i], &g.down[i]})
        add_norm(*gt);
    out.grad_norm.push_back(std::sqrt(norm2));
    const auto& a = o.adam;
    const double c1 = 1 - std::pow(a.beta1, it + 1), c2 = 1 - std::pow(a.beta2, it + 1);
    auto adam = [&](Mat& wt, Mat& gt, Mat& mt, Mat& vt) {
      for (std::size_t i = 0; i < wt.v.size(); ++i) {
        mt.v[i] = a.beta1 * mt.v[i] + (1 - a.beta1) * gt.v[i];
        vt.v[i] = a.beta2 * vt.v[i] + (1 - a.beta2) * gt.v[i] * gt.v[i];
        wt.v[i] -= a.lr * (mt.v[i] / c1) / (std::sqrt(vt.v[i] / c2) + a.eps);
      }
    };
    adam(w.emb, g.emb, m1.emb, m2.emb);
    adam(w.head, g.head, m1.head, m2.head);
    for (std::size_t i = 0; i < w.qkv.size(); ++i) {
      adam(w.qkv[i], g.qkv[i], m1.qkv[i], m2.qkv[i]);
      adam(w.out[i], g.out[i], m1.out[i], m2.out[i]);
      adam(w.up[i], g.up[i], m1.up[i], m2.up[i]);
      adam(w.down[i], g.down[i], m1.down[i], m2.down[i]);
    }
  }
  const int tp = l.tp;
  const std::int64_t hl = sh.h / tp, kvl = sh.g * sh.d / tp, fl = sh.f / tp, vl = vocab / tp;
  for (int r = 0; r < tp; ++r) {
    const std::string t = fmt::format(" tp{}", r);
    out.shards["embedding" + t] = rows_of(w.emb, {{r * vl, vl}});
    out.shards["lm_head" + t] = rows_of(w.head, {{r * vl, vl}});
    for (std::size_t i = 0; i < w.qkv.size(); ++i) {
      const std::string p = fmt::format("layer{}.", i);
      out.shards[p + "attn.qkv" + t] = rows_of(
          w.qkv[i], {{r * hl, hl}, {sh.h + r * kvl, kvl}, {sh.h + sh.g * sh.d + r * kvl, kvl}});
      out.shards[p + "attn.out" + t] = cols_of(w.out[i], r * hl, hl);
      out.shards[p + "mlp.up" + t] = rows_of(w.up[i], {{r * fl, fl}, {sh.f + r * fl, fl}});
      out.shards[p + "mlp.down" + t] = cols_of(w.down[i], r * fl, fl);
    }
  }
  return out;
}

}  // namespace cocemu::layers::train::reference

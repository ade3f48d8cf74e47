// The SwiGLU expert's two backward halves, data gradient (dgrad) and weight gradient (wgrad), each
// against a direct loop reference in long double, on fresh random data with poisoned outputs,
// including the empty group a dropless router can produce.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/engine/layer_test_util.h"
#include "worker/engine/cpu/swiglu_expert.h"

namespace dropless::cpu {
namespace {

using testing::RandomVector;
using Real = long double;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Reference {
  std::vector<Real> h_grad;   // n x 2F
  std::vector<Real> x_grad;   // n x H, before x_grad_beta * x_grad is added
  std::vector<Real> w1_grad;  // H x 2F
  std::vector<Real> w2_grad;  // F x H
};

// dL/d(every input) of y = (silu(x w1_gate) * (x w1_up)) w2 given dL/dy, by explicit loops.
Reference ReferenceBackward(const SwiGluShape& s, const std::vector<double>& x,
                            const std::vector<double>& w1, const std::vector<double>& w2,
                            const std::vector<double>& y_grad) {
  const int64_t n = s.rows, hid = s.hidden, f = s.ffn;
  Reference r{std::vector<Real>(n * 2 * f, 0), std::vector<Real>(n * hid, 0),
              std::vector<Real>(hid * 2 * f, 0), std::vector<Real>(f * hid, 0)};
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < f; ++i) {
      Real gate = 0, up = 0, a_grad = 0;
      for (int64_t d = 0; d < hid; ++d) {
        gate += Real(x[t * hid + d]) * w1[d * 2 * f + i];
        up += Real(x[t * hid + d]) * w1[d * 2 * f + f + i];
        a_grad += Real(y_grad[t * hid + d]) * w2[i * hid + d];
      }
      const Real sig = 1 / (1 + std::exp(-gate));
      const Real a = gate * sig * up;
      for (int64_t d = 0; d < hid; ++d) r.w2_grad[i * hid + d] += a * y_grad[t * hid + d];
      r.h_grad[t * 2 * f + i] = a_grad * up * (sig + gate * sig * (1 - sig));
      r.h_grad[t * 2 * f + f + i] = a_grad * gate * sig;
    }
    for (int64_t d = 0; d < hid; ++d) {
      for (int64_t j = 0; j < 2 * f; ++j) {
        r.x_grad[t * hid + d] += r.h_grad[t * 2 * f + j] * w1[d * 2 * f + j];
        r.w1_grad[d * 2 * f + j] += Real(x[t * hid + d]) * r.h_grad[t * 2 * f + j];
      }
    }
  }
  return r;
}

template <typename T>
std::vector<T> Cast(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

// |got - want| <= tol * (1 + max |want|): relative to the array's scale, so sums that cancel
// are not held to a tighter bound than their terms allow.
template <typename T>
void ExpectNear(const std::vector<T>& got, const std::vector<Real>& want, double tol,
                const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 1;
  for (Real w : want) scale = std::max(scale, 1 + static_cast<double>(std::fabs(w)));
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(static_cast<double>(got[i]), static_cast<double>(want[i]), tol * scale)
        << what << " " << i;
  }
}

template <typename T>
void CheckBackward(int64_t rows, T x_grad_beta, double tol, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "rows " << rows << " beta " << x_grad_beta);
  const SwiGluShape s{rows, 8, 5};
  const int64_t hid = s.hidden, f = s.ffn;
  const std::vector<double> x = RandomVector(rows * hid, seed);
  const std::vector<double> w1 = RandomVector(hid * 2 * f, seed + 1);
  const std::vector<double> w2 = RandomVector(f * hid, seed + 2);
  const std::vector<double> y_grad = RandomVector(rows * hid, seed + 3);
  const std::vector<double> x_grad_in = RandomVector(rows * hid, seed + 4);
  const Reference want = ReferenceBackward(s, x, w1, w2, y_grad);

  const std::vector<T> xt = Cast<T>(x), w1t = Cast<T>(w1), w2t = Cast<T>(w2),
                       y_gradt = Cast<T>(y_grad);
  std::vector<T> h(rows * 2 * f), a(rows * f), y(rows * hid);
  EXPECT_TRUE(
      SwiGluForward<T>(s, w1t.data(), w2t.data(), xt.data(), h.data(), a.data(), y.data(), T(0))
          .ok());

  const T poison = std::numeric_limits<T>::quiet_NaN();
  std::vector<T> h_grad(rows * 2 * f, poison), scratch(3, poison);
  std::vector<T> x_grad =
      x_grad_beta == T(0) ? std::vector<T>(rows * hid, poison) : Cast<T>(x_grad_in);
  EXPECT_TRUE(SwiGluBackwardData<T>(s, w1t.data(), w2t.data(), h.data(), y_gradt.data(),
                                    h_grad.data(), x_grad.data(), x_grad_beta, &scratch)
                  .ok());
  std::vector<Real> want_x_grad = want.x_grad;
  for (size_t i = 0; i < want_x_grad.size(); ++i) {
    want_x_grad[i] += Real(x_grad_beta) * x_grad_in[i];
  }
  ExpectNear(h_grad, want.h_grad, tol, "h_grad");
  ExpectNear(x_grad, want_x_grad, tol, "x_grad");

  std::vector<T> w1_grad(hid * 2 * f, poison), w2_grad(f * hid, poison);
  SwiGluBackwardWeights<T>(s, xt.data(), a.data(), y_gradt.data(), h_grad.data(), w1_grad.data(),
                           w2_grad.data());
  ExpectNear(w1_grad, want.w1_grad, tol, "w1_grad");  // an empty group: all zeros
  ExpectNear(w2_grad, want.w2_grad, tol, "w2_grad");
}

TEST(SwiGluBackwardTest, DataAndWeightGradientsMatchTheLoopReference) {
  uint32_t seed = 11;
  for (int64_t rows : {0, 1, 7, 33}) {
    for (double beta : {0.0, 1.0}) {
      CheckBackward<double>(rows, beta, 1e-12, seed += 10);
      CheckBackward<float>(rows, static_cast<float>(beta), 1e-4, seed += 10);
    }
  }
}

// wgrad reads only what the forward pass kept and dgrad's h_grad: it may run after other dgrads
// overwrote the scratch, and dgrad's outputs do not depend on wgrad having run.
TEST(SwiGluBackwardTest, WeightGradientNeedsOnlyTheDataGradientsOutput) {
  const SwiGluShape s{9, 6, 4};
  const int64_t hid = s.hidden, f = s.ffn;
  const std::vector<double> x = RandomVector(s.rows * hid, 3), w1 = RandomVector(hid * 2 * f, 4),
                            w2 = RandomVector(f * hid, 5), y_grad = RandomVector(s.rows * hid, 6);
  std::vector<double> h(s.rows * 2 * f), a(s.rows * f), y(s.rows * hid);
  EXPECT_TRUE(
      SwiGluForward<double>(s, w1.data(), w2.data(), x.data(), h.data(), a.data(), y.data(), 0.0)
          .ok());
  std::vector<double> h_grad(s.rows * 2 * f, kNaN), x_grad(s.rows * hid, kNaN), scratch;
  EXPECT_TRUE(SwiGluBackwardData<double>(s, w1.data(), w2.data(), h.data(), y_grad.data(),
                                         h_grad.data(), x_grad.data(), 0.0, &scratch)
                  .ok());
  std::fill(scratch.begin(), scratch.end(), kNaN);  // as if another group's dgrad reused it
  std::vector<double> w1_grad(hid * 2 * f, kNaN), w2_grad(f * hid, kNaN);
  SwiGluBackwardWeights<double>(s, x.data(), a.data(), y_grad.data(), h_grad.data(), w1_grad.data(),
                                w2_grad.data());
  const Reference want = ReferenceBackward(s, x, w1, w2, y_grad);
  ExpectNear(w1_grad, want.w1_grad, 1e-12, "w1_grad");
  ExpectNear(w2_grad, want.w2_grad, 1e-12, "w2_grad");
}

}  // namespace
}  // namespace dropless::cpu

// The tests' one attention oracle, written straight from the definition: one query attending
// over n keys, out = sum_j softmax(scale * q.k)_j v_j, in T arithmetic (double: the reference the
// model tests and the kernel tests compare with; float: what a plain fp32 scalar kernel rounds
// like). The layout is the caller's: q(i), key(j, i) and value(j, i) return element i of the
// query, of key j and of value j.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace megadecode::test::naive {

template <class T, class Q, class K, class V>
std::vector<T> attention(int n, int d, T scale, Q q, K key, V value) {
  std::vector<T> s(n), out(d);
  T mx = -INFINITY;
  for (int j = 0; j < n; ++j) {
    T dot = 0;
    for (int i = 0; i < d; ++i) dot = std::fma(static_cast<T>(q(i)), static_cast<T>(key(j, i)), dot);
    s[j] = dot * scale;
    mx = std::max(mx, s[j]);
  }
  T den = 0;
  for (T& x : s) den += (x = std::exp(x - mx));
  for (int i = 0; i < d; ++i) {
    T acc = 0;
    for (int j = 0; j < n; ++j) acc = std::fma(s[j], static_cast<T>(value(j, i)), acc);
    out[i] = acc / den;
  }
  return out;
}

}  // namespace megadecode::test::naive

#pragma once
// Eight-wide float exp for the element-wise layers (GELU, softmax): the libm calls they
// would otherwise make cost as much as all the matrix products of this model together.

#if defined(__AVX2__) && defined(__FMA__)
#define TROUPE_HAVE_AVX2 1
#include <immintrin.h>

namespace troupe::simd {

/// e^x for 8 floats with relative error below 2e-7 where the result is a normal float:
/// x < -87 gives 0 (no denormals), x > 88 gives +inf and NaN stays NaN, as the softmax
/// and GELU need to saturate cleanly and a diverging run must still show its NaN.
/// Method: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two for an exact product), e^r
/// by its degree-6 Taylor polynomial (remainder < 2e-8 there), 2^n built in the exponent.
inline __m256 exp(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f), hi = _mm256_set1_ps(88.0f);
  const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  const __m256 overflow = _mm256_cmp_ps(x, hi, _CMP_GT_OQ);
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);  // keeps 2^n a normal float
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i biased = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
  __m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(biased, 23)));
  e = _mm256_andnot_ps(underflow, e);
  e = _mm256_blendv_ps(e, _mm256_set1_ps(__builtin_inff()), overflow);
  return _mm256_blendv_ps(e, x, nan);
}

}  // namespace troupe::simd
#endif

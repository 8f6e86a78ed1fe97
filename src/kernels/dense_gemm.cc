#include "kernels/dense_gemm.h"

#include <oneapi/dnnl/dnnl.h>

#include "base/check.h"

namespace nibble {

void SgemmXWt(int64_t m, int64_t n, int64_t k, const float* x, int64_t ldx, const float* w,
              int64_t ldw, float beta, float* y, int64_t ldy) {
  NIBBLE_CHECK(m > 0 && n > 0 && k > 0 && ldx >= k && ldw >= k && ldy >= n);
  dnnl_status_t st = dnnl_sgemm('N', 'T', m, n, k, 1.0f, x, ldx, w, ldw, beta, y, ldy);
  NIBBLE_CHECK_MSG(st == dnnl_success, "dnnl_sgemm status %d", static_cast<int>(st));
}

void SgemmXW(int64_t m, int64_t n, int64_t k, const float* x, int64_t ldx, const float* w,
             int64_t ldw, float beta, float* y, int64_t ldy) {
  NIBBLE_CHECK(m > 0 && n > 0 && k > 0 && ldx >= k && ldw >= n && ldy >= n);
  dnnl_status_t st = dnnl_sgemm('N', 'N', m, n, k, 1.0f, x, ldx, w, ldw, beta, y, ldy);
  NIBBLE_CHECK_MSG(st == dnnl_success, "dnnl_sgemm status %d", static_cast<int>(st));
}

void SgemmAtB(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
              int64_t ldb, float beta, float* y, int64_t ldy) {
  NIBBLE_CHECK(m > 0 && n > 0 && k > 0 && lda >= m && ldb >= n && ldy >= n);
  dnnl_status_t st = dnnl_sgemm('T', 'N', m, n, k, 1.0f, a, lda, b, ldb, beta, y, ldy);
  NIBBLE_CHECK_MSG(st == dnnl_success, "dnnl_sgemm status %d", static_cast<int>(st));
}

}  // namespace nibble

/* The looped model's memory-bound CPU passes in one sweep over memory each (fp32).
 *
 * Compiled on first use by loopscale/model/cpu_kernels.py (the system C compiler, cached per source);
 * loopscale/model/fused.py calls them from its autograd functions and falls back to its torch ops when no
 * compiler is there. Eager torch runs each formula below as five to fifteen separate passes over a
 * [rows, d] activation, several over strided views; here each row is read once, in cache, and written
 * once. The formulas are arXiv 2604.21106 section 2's (RMSNorm; RoPE, then a parameter-free QK RMSNorm),
 * in the pair order of fused.interleaved_qkv; tests/test_model_cpu_kernels.py checks them against the
 * torch path.
 *
 * Work is split into `parts` contiguous row ranges (parallel()); the split depends only on `parts`, so
 * results are bitwise reproducible for a given thread count.
 */
#include <math.h>
#include <string.h>

#define MAX_HEAD_DIM 1024 /* cpu_kernels.py routes wider heads to the torch ops */
#define MAX_NORM_WIDTH 4096
#define MAX_HEADS 1024

typedef void (*range_fn)(const void *ctx, long lo, long hi, int part);

/* Part p runs rows [n p / parts, n (p + 1) / parts). With -fopenmp the parts run on the OpenMP threads torch
 * itself uses (the torch wheel's libgomp is already loaded, so this library binds to the same runtime and
 * its spinning workers pick the parts up); compiled without OpenMP, on the caller's thread. Either way the
 * ranges, and so the bits, are the same. */
static void parallel(range_fn fn, const void *ctx, long n, int parts) {
    if (parts < 1) parts = 1;
#pragma omp parallel for num_threads(parts) schedule(static, 1)
    for (int p = 0; p < parts; p++) fn(ctx, n * p / parts, n * (p + 1) / parts, p);
}

/* sum of a[i] * b[i] in eight running lanes (vectorised without reassociating the compiler's way) */
static inline float dot(const float *a, const float *b, long n) {
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const long full = n - n % 8;
    for (long i = 0; i < full; i += 8)
        for (int l = 0; l < 8; l++) lane[l] += a[i + l] * b[i + l];
    float s = 0;
    for (long i = full; i < n; i++) s += a[i] * b[i];
    for (int l = 0; l < 8; l++) s += lane[l];
    return s;
}

/* ---- RMSNorm with a weight: y = x rstd w, rstd = 1 / sqrt(mean(x^2) + eps) ---- */

typedef struct {
    const float *x, *w, *g;
    float *y, *rstd, *gx, *dw_parts;
    long n;
    float eps;
} rms_t;

static void rms_fwd_range(const void *c, long lo, long hi, int part) {
    (void)part;
    const rms_t *a = c;
    const long n = a->n;
    for (long r = lo; r < hi; r++) {
        const float *x = a->x + r * n;
        float *y = a->y + r * n;
        const float rs = 1.0f / sqrtf(dot(x, x, n) / (float)n + a->eps);
        a->rstd[r] = rs;
        for (long i = 0; i < n; i++) y[i] = x[i] * rs * a->w[i];
    }
}

void rms_norm_fwd(const float *x, const float *w, float *y, float *rstd, long rows, long n, float eps,
                  int parts) {
    rms_t a = {x, w, NULL, y, rstd, NULL, NULL, n, eps};
    parallel(rms_fwd_range, &a, rows, parts);
}

/* gx = rstd (g w - x_hat <g w, x_hat> / n), x_hat = x rstd; dw += g x_hat into this part's row */
static void rms_bwd_range(const void *c, long lo, long hi, int part) {
    const rms_t *a = c;
    const long n = a->n;
    float *dw = a->dw_parts ? a->dw_parts + part * n : NULL;
    float gw[MAX_NORM_WIDTH], xh[MAX_NORM_WIDTH];
    for (long r = lo; r < hi; r++) {
        const float *x = a->x + r * n, *g = a->g + r * n;
        float *gx = a->gx + r * n;
        const float rs = a->rstd[r];
        for (long i = 0; i < n; i++) {
            xh[i] = x[i] * rs;
            gw[i] = g[i] * a->w[i];
        }
        const float mean = dot(gw, xh, n) / (float)n;
        for (long i = 0; i < n; i++) gx[i] = (gw[i] - xh[i] * mean) * rs;
        if (dw)
            for (long i = 0; i < n; i++) dw[i] += g[i] * xh[i];
    }
}

void rms_norm_bwd(const float *g, const float *x, const float *w, const float *rstd, float *gx, float *dw_parts,
                  long rows, long n, int parts) {
    rms_t a = {x, w, g, NULL, (float *)rstd, gx, dw_parts, n, 0.0f};
    parallel(rms_bwd_range, &a, rows, parts);
}

/* ---- RoPE, then QK RMSNorm, on qkv [B, T, 3, H, hd] with q/k rotary pairs adjacent ----
 * turn [T, hd/2, 2] holds (cos, -sin) per position and pair: (x1 + i x2)(cos - i sin). */

typedef struct {
    const float *qkv, *turn, *out;
    float *y, *rstd, *grad;
    const float *g[3];
    long gstride[3][4]; /* gq, gk, gv as [B, T, H, hd] with element strides */
    long T, H, hd;
    float eps;
} rope_t;

/* the rotation as two products per element: y[i] = x[i] c[i] + x[i ^ 1] s[i], with c = (cos, cos) and
 * s = (sin, -sin) per pair ((x1 + i x2)(cos - i sin)), so that the loops vectorise */
static void expand_turn(const float *turn, long hd, float *c, float *s) {
    for (long p = 0; p < hd; p += 2) {
        c[p] = c[p + 1] = turn[p];
        s[p] = -turn[p + 1];
        s[p + 1] = turn[p + 1];
    }
}

/* Inlined with hd a constant for the usual head sizes (rope_fwd_range): the per-head loops then have no
 * trip-count, remainder or aliasing checks, which cost more than the arithmetic at hd = 16..128. */
static inline __attribute__((always_inline)) void rope_fwd_rows(const rope_t *a, long lo, long hi, const long hd) {
    if (hd > MAX_HEAD_DIM || hd % 2 || a->H > MAX_HEADS) return; /* cpu_kernels.py never asks */
    const long H = a->H, row = 3 * H * hd;
    float co[MAX_HEAD_DIM], si[MAX_HEAD_DIM], sw[MAX_HEAD_DIM], ss[2 * MAX_HEADS];
    for (long bt = lo; bt < hi; bt++) {
        expand_turn(a->turn + (bt % a->T) * hd, hd, co, si);
        const float *x = a->qkv + bt * row;
        float *y = a->y + bt * row;
        /* rotate every q/k head of this token, then all their norms at once: each head's sum of squares,
         * square root and division are a dependent chain that would otherwise stall each head */
        for (long jh = 0; jh < 2 * H; jh++) {
            const float *xs = x + jh * hd;
            float *ys = y + jh * hd;
            for (long i = 0; i < hd; i += 2) {
                sw[i] = xs[i + 1];
                sw[i + 1] = xs[i];
            }
            for (long i = 0; i < hd; i++) ys[i] = xs[i] * co[i] + sw[i] * si[i];
            ss[jh] = dot(ys, ys, hd);
        }
        float *rs = a->rstd + bt * 2 * H;
        for (long jh = 0; jh < 2 * H; jh++) rs[jh] = 1.0f / sqrtf(ss[jh] / (float)hd + a->eps);
        for (long jh = 0; jh < 2 * H; jh++)
            for (long i = 0; i < hd; i++) y[jh * hd + i] *= rs[jh];
        memcpy(y + 2 * H * hd, x + 2 * H * hd, (size_t)(H * hd) * sizeof(float));
    }
}

/* rows(a, ..., hd) with hd a constant for the usual head sizes */
#define BY_HEAD_DIM(rows, a, ...)                   \
    switch ((a)->hd) {                              \
        case 16: rows(a, __VA_ARGS__, 16); break;   \
        case 32: rows(a, __VA_ARGS__, 32); break;   \
        case 64: rows(a, __VA_ARGS__, 64); break;   \
        case 128: rows(a, __VA_ARGS__, 128); break; \
        default: rows(a, __VA_ARGS__, (a)->hd);     \
    }

static void rope_fwd_range(const void *c, long lo, long hi, int part) {
    (void)part;
    BY_HEAD_DIM(rope_fwd_rows, (const rope_t *)c, lo, hi)
}

void rope_qk_norm_fwd(const float *qkv, const float *turn, float *y, float *rstd, long B, long T, long H, long hd,
                      float eps, int parts) {
    rope_t a = {qkv, turn, NULL, y, rstd, NULL, {NULL, NULL, NULL}, {{0}}, T, H, hd, eps};
    parallel(rope_fwd_range, &a, B * T, parts);
}

/* per q/k head row: gz = (gy - y <gy, y> / hd) rstd (the norm), then the rotation's transpose (cos + i sin):
 * gx[i] = gz[i] c[i] - gz[i ^ 1] s[i] */
static inline __attribute__((always_inline)) void rope_bwd_rows(const rope_t *a, long lo, long hi, const long hd) {
    if (hd > MAX_HEAD_DIM || hd % 2) return; /* cpu_kernels.py never asks */
    const long H = a->H, row = 3 * H * hd;
    float co[MAX_HEAD_DIM], si[MAX_HEAD_DIM], gy[MAX_HEAD_DIM], gz[MAX_HEAD_DIM];
    for (long bt = lo; bt < hi; bt++) {
        const long b = bt / a->T, t = bt % a->T;
        expand_turn(a->turn + t * hd, hd, co, si);
        for (long j = 0; j < 3; j++) {
            const long *s = a->gstride[j];
            for (long h = 0; h < H; h++) {
                const float *gs = a->g[j] + b * s[0] + t * s[1] + h * s[2];
                float *dst = a->grad + bt * row + (j * H + h) * hd;
                if (j == 2) {
                    if (s[3] == 1) memcpy(dst, gs, (size_t)hd * sizeof(float));
                    else for (long i = 0; i < hd; i++) dst[i] = gs[i * s[3]];
                    continue;
                }
                const float *g_row = gs;
                if (s[3] != 1) {
                    for (long i = 0; i < hd; i++) gy[i] = gs[i * s[3]];
                    g_row = gy;
                }
                const float *ys = a->out + bt * row + (j * H + h) * hd;
                const float mean = dot(g_row, ys, hd) / (float)hd, rs = a->rstd[bt * 2 * H + j * H + h];
                for (long i = 0; i < hd; i++) gz[i] = (g_row[i] - ys[i] * mean) * rs;
                for (long i = 0; i < hd; i += 2) {
                    gy[i] = gz[i + 1];
                    gy[i + 1] = gz[i];
                }
                for (long i = 0; i < hd; i++) dst[i] = gz[i] * co[i] - gy[i] * si[i];
            }
        }
    }
}

static void rope_bwd_range(const void *c, long lo, long hi, int part) {
    (void)part;
    BY_HEAD_DIM(rope_bwd_rows, (const rope_t *)c, lo, hi)
}

void rope_qk_norm_bwd(const float *gq, const float *gk, const float *gv, const long *strides, const float *out,
                      const float *rstd, const float *turn, float *grad, long B, long T, long H, long hd,
                      int parts) {
    rope_t a = {NULL, turn, out, NULL, (float *)rstd, grad, {gq, gk, gv}, {{0}}, T, H, hd, 0.0f};
    memcpy(a.gstride, strides, sizeof(a.gstride));
    parallel(rope_bwd_range, &a, B * T, parts);
}

/* ---- the squared-ReLU MLP's elementwise passes, per row chunk (fused._SquaredReLUMLP) ----
 * The same arithmetic as the torch ops, bit for bit: h = clamp(z, min = 0) (NaN stays NaN), h^2 = h * h,
 * and 2 g h, in which the doubling is exact. */

typedef struct {
    float *h, *sq, *g;
} mlp_t;

static void relu_square_range(const void *c, long lo, long hi, int part) {
    (void)part;
    const mlp_t *a = c;
    float *restrict hp = a->h, *restrict sq = a->sq;
    for (long i = lo; i < hi; i++) {
        const float z = hp[i], h = z < 0.0f ? 0.0f : z;
        hp[i] = h;
        sq[i] = h * h;
    }
}

/* z -> h = relu(z) in place, and h^2 into sq */
void relu_square_fwd(float *z, float *sq, long n, int parts) {
    mlp_t a = {z, sq, NULL};
    parallel(relu_square_range, &a, n, parts);
}

static void relu_square_grad_range(const void *c, long lo, long hi, int part) {
    (void)part;
    const mlp_t *a = c;
    const float *restrict hp = a->h;
    float *restrict sq = a->sq, *restrict g = a->g;
    for (long i = lo; i < hi; i++) {
        const float h = hp[i];
        sq[i] = h * h;
        g[i] = 2.0f * g[i] * h;
    }
}

/* g (the gradient at h^2) -> 2 g h in place (the gradient at z), and h^2 into sq again (for W_proj's) */
void relu_square_bwd(const float *h, float *g, float *sq, long n, int parts) {
    mlp_t a = {(float *)h, sq, g};
    parallel(relu_square_grad_range, &a, n, parts);
}

/* ---- causal self-attention on the rope_qk_norm output [B, T, 3, H, hd], one (batch, head) at a time ----
 * softmax(q k^T scale + causal mask) v, as SDPA computes it, with the log-sum-exp of each query row kept for
 * the backward pass (as the flash kernels do: no T x T matrix is stored). torch's CPU flash kernel multiplies
 * small blocks through a BLAS call each; here a head's q, k, v are gathered once into cache-sized buffers and
 * multiplied by register tiles of AR query rows x AC key columns, only up to the causal diagonal. The output
 * is written as [B, T, H, hd], the layout the out projection reads, and the gradient straight into
 * [B, T, 3, H, hd], the layout rope_qk_norm_bwd reads. Heads are independent, so the bits do not depend on
 * the thread count. hd must be a multiple of 16 (cpu_kernels.py routes other sizes to SDPA). */

typedef float v8 __attribute__((vector_size(32))); /* eight lanes: one AVX register, two SSE ones */
static inline v8 ld8(const float *p) { v8 v; memcpy(&v, p, sizeof v); return v; }
static inline void st8(float *p, v8 v) { memcpy(p, &v, sizeof v); }
static inline v8 bc8(float x) { return (v8){x, x, x, x, x, x, x, x}; }

#define AR 6   /* query rows per register tile: 6 x 2 accumulators of 8 lanes, 15 of the 16 AVX registers */
#define AB 12  /* query rows per block of the backward pass (two tiles) */
#define AC 16  /* key columns per register tile */
#define ATP 48 /* buffers hold T rounded up to a multiple of AR, AB and AC: rows past T are zero */

/* exp(x) for x <= ~0 (scores minus their maximum or log-sum-exp), within 2e-7 relative: Cephes' expf
 * polynomial on x - n ln 2, with n rounded by adding 1.5 * 2^23 (not floorf) so that it vectorises anywhere */
static inline float exp_neg(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int e = ((int)n + 127) << 23;
    float s;
    memcpy(&s, &e, sizeof s);
    return p * s;
}

static inline float max_of(const float *x, long n) { /* n >= 1; eight running lanes, as dot() */
    float lane[8];
    for (int l = 0; l < 8; l++) lane[l] = x[0];
    const long full = n - n % 8;
    for (long i = 0; i < full; i += 8)
        for (int l = 0; l < 8; l++) lane[l] = x[i + l] > lane[l] ? x[i + l] : lane[l];
    float m = x[0];
    for (long i = full; i < n; i++) m = x[i] > m ? x[i] : m;
    for (int l = 0; l < 8; l++) m = lane[l] > m ? lane[l] : m;
    return m;
}

static inline float sum_of(const float *x, long n) {
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const long full = n - n % 8;
    for (long i = 0; i < full; i += 8)
        for (int l = 0; l < 8; l++) lane[l] += x[i + l];
    float s = 0.0f;
    for (long i = full; i < n; i++) s += x[i];
    for (int l = 0; l < 8; l++) s += lane[l];
    return s;
}

/* S[r][j] = A[r] . Bt[:, j] for AR rows of A [.][hd] and columns [0, ncols) of Bt [hd][tp] (q k^T, dO v^T) */
static inline __attribute__((always_inline)) void tile_dot(const float *A, const float *Bt, float *S, long tp,
                                                           long ncols, const long hd) {
    for (long j = 0; j < ncols; j += AC) {
        v8 acc[AR][2];
        for (int r = 0; r < AR; r++) acc[r][0] = acc[r][1] = bc8(0.0f);
        for (long d = 0; d < hd; d++) {
            const v8 b0 = ld8(Bt + d * tp + j), b1 = ld8(Bt + d * tp + j + 8);
            for (int r = 0; r < AR; r++) {
                const v8 a = bc8(A[r * hd + d]);
                acc[r][0] += a * b0;
                acc[r][1] += a * b1;
            }
        }
        for (int r = 0; r < AR; r++) {
            st8(S + r * tp + j, acc[r][0]);
            st8(S + r * tp + j + 8, acc[r][1]);
        }
    }
}

/* O[r] = sum_j P[r][j] M[j] for AR rows of P [.][tp] over columns [0, ncols) and M [tp][hd] (p v, dS k) */
static inline __attribute__((always_inline)) void tile_mix(const float *P, const float *M, float *O, long tp,
                                                           long ncols, const long hd) {
    for (long d0 = 0; d0 < hd; d0 += 16) {
        v8 acc[AR][2];
        for (int r = 0; r < AR; r++) acc[r][0] = acc[r][1] = bc8(0.0f);
        for (long j = 0; j < ncols; j++) {
            const v8 m0 = ld8(M + j * hd + d0), m1 = ld8(M + j * hd + d0 + 8);
            for (int r = 0; r < AR; r++) {
                const v8 p = bc8(P[r * tp + j]);
                acc[r][0] += p * m0;
                acc[r][1] += p * m1;
            }
        }
        for (int r = 0; r < AR; r++) {
            st8(O + r * hd + d0, acc[r][0]);
            st8(O + r * hd + d0 + 8, acc[r][1]);
        }
    }
}

typedef struct {
    const float *qkv, *y, *gy, *lse_in;
    float *out, *lse, *grad, *work;
    long B, T, H, hd, work_per_part;
    long gys[4]; /* gy as [B, T, H, hd], element strides */
    float scale;
} attn_t;

static inline long round_up(long n, long m) { return (n + m - 1) / m * m; }

static inline long min_l(long a, long b) { return a < b ? a : b; }

/* floats of workspace one part needs (cpu_kernels.py allocates parts x this) */
long attn_workspace(long T, long hd, int backward) {
    const long tp = round_up(T, ATP);
    return backward ? 8 * tp * hd + 4 * AB * tp + AB * hd + 2 * tp : 4 * tp * hd + AR * tp + AR * hd;
}

/* X [tp][hd] = s * part `which` (0 q, 1 k, 2 v) of head h of batch b; rows past T zero */
static void gather(const attn_t *a, long b, long h, int which, float s, float *X, long tp, long hd) {
    const long row = 3 * a->H * hd;
    const float *src = a->qkv + b * a->T * row + which * a->H * hd + h * hd;
    for (long t = 0; t < a->T; t++)
        for (long i = 0; i < hd; i++) X[t * hd + i] = src[t * row + i] * s;
    memset(X + a->T * hd, 0, (size_t)((tp - a->T) * hd) * sizeof(float));
}

/* Xt [hd][tp] from X [tp][hd] by 8 x 8 tiles */
static inline __attribute__((always_inline)) void transpose(const float *X, float *Xt, long tp, const long hd) {
    for (long t0 = 0; t0 < tp; t0 += 8)
        for (long i0 = 0; i0 < hd; i0 += 8)
            for (long i = 0; i < 8; i++)
                for (long t = 0; t < 8; t++) Xt[(i0 + i) * tp + t0 + t] = X[(t0 + t) * hd + i0 + i];
}

static inline __attribute__((always_inline)) void attn_fwd_heads(const attn_t *a, long lo, long hi, int part,
                                                                 const long hd) {
    if (hd % 16) return; /* cpu_kernels.py never asks */
    const long T = a->T, H = a->H, tp = round_up(T, ATP);
    float *Q = a->work + part * a->work_per_part, *K = Q + tp * hd, *Kt = K + tp * hd, *V = Kt + tp * hd;
    float *S = V + tp * hd, *O = S + AR * tp;
    for (long bh = lo; bh < hi; bh++) {
        const long b = bh / H, h = bh % H;
        gather(a, b, h, 0, a->scale, Q, tp, hd); /* the scale on q, once */
        gather(a, b, h, 1, 1.0f, K, tp, hd);
        gather(a, b, h, 2, 1.0f, V, tp, hd);
        transpose(K, Kt, tp, hd);
        for (long i0 = 0; i0 < T; i0 += AR) {
            const long ncols = min_l(round_up(i0 + AR, AC), tp); /* keys up to the last row's diagonal */
            tile_dot(Q + i0 * hd, Kt, S, tp, ncols, hd);
            for (int r = 0; r < AR; r++) {
                const long i = i0 + r;
                float *s = S + r * tp;
                if (i >= T) {
                    memset(s, 0, sizeof(float) * (size_t)ncols);
                    continue;
                }
                const float m = max_of(s, i + 1);
                for (long j = 0; j < ncols; j++) s[j] = j <= i ? exp_neg(s[j] - m) : 0.0f;
                const float l = sum_of(s, ncols);
                a->lse[bh * T + i] = m + logf(l);
                const float inv = 1.0f / l;
                for (long j = 0; j <= i; j++) s[j] *= inv;
            }
            tile_mix(S, V, O, tp, ncols, hd);
            for (int r = 0; r < AR && i0 + r < T; r++)
                memcpy(a->out + ((b * T + i0 + r) * H + h) * hd, O + r * hd, sizeof(float) * (size_t)hd);
        }
    }
}

static void attn_fwd_range(const void *c, long lo, long hi, int part) {
    BY_HEAD_DIM(attn_fwd_heads, (const attn_t *)c, lo, hi, part)
}

/* out [B, T, H, hd] and lse [B, H, T] from qkv [B, T, 3, H, hd]; work: parts x attn_workspace(T, hd, 0) */
void attn_fwd(const float *qkv, float *out, float *lse, float *work, long B, long T, long H, long hd, float scale,
              int parts) {
    attn_t a = {qkv, NULL, NULL, NULL, out, lse, NULL, work, B, T, H, hd, attn_workspace(T, hd, 0), {0}, scale};
    parallel(attn_fwd_range, &a, B * H, parts);
}

/* Per block of AB query rows: P = exp(S - lse) recomputed, dP = dO v^T, dS = P (dP - <dO, O>);
 * dQ = dS k scale, dK += dS^T (q scale), dV += P^T dO, summed over the blocks in the head's buffers. */
static inline __attribute__((always_inline)) void attn_bwd_heads(const attn_t *a, long lo, long hi, int part,
                                                                 const long hd) {
    if (hd % 16) return; /* cpu_kernels.py never asks */
    const long T = a->T, H = a->H, tp = round_up(T, ATP), row = 3 * H * hd;
    float *Q = a->work + part * a->work_per_part, *K = Q + tp * hd, *Kt = K + tp * hd, *V = Kt + tp * hd;
    float *Vt = V + tp * hd, *G = Vt + tp * hd, *dK = G + tp * hd, *dV = dK + tp * hd, *P = dV + tp * hd;
    float *dS = P + AB * tp, *Pt = dS + AB * tp, *dSt = Pt + AB * tp, *dQ = dSt + AB * tp, *Dv = dQ + AB * hd;
    float *L = Dv + tp;
    const long *gs = a->gys;
    for (long bh = lo; bh < hi; bh++) {
        const long b = bh / H, h = bh % H;
        gather(a, b, h, 0, a->scale, Q, tp, hd);
        gather(a, b, h, 1, 1.0f, K, tp, hd);
        gather(a, b, h, 2, 1.0f, V, tp, hd);
        transpose(K, Kt, tp, hd);
        transpose(V, Vt, tp, hd);
        for (long t = 0; t < T; t++) {
            const float *gr = a->gy + b * gs[0] + t * gs[1] + h * gs[2];
            float *g = G + t * hd;
            if (gs[3] == 1) memcpy(g, gr, sizeof(float) * (size_t)hd);
            else for (long i = 0; i < hd; i++) g[i] = gr[i * gs[3]];
            Dv[t] = dot(g, a->y + ((b * T + t) * H + h) * hd, hd);
            L[t] = a->lse_in[bh * T + t];
        }
        memset(G + T * hd, 0, sizeof(float) * (size_t)((tp - T) * hd));
        for (long t = T; t < tp; t++) Dv[t] = L[t] = 0.0f;
        memset(dK, 0, sizeof(float) * (size_t)(2 * tp * hd)); /* dK and dV */
        for (long i0 = 0; i0 < T; i0 += AB) {
            const long ncols = min_l(round_up(i0 + AB, AC), tp);
            for (int q = 0; q < AB; q += AR) {
                tile_dot(Q + (i0 + q) * hd, Kt, P + q * tp, tp, ncols, hd);
                tile_dot(G + (i0 + q) * hd, Vt, dS + q * tp, tp, ncols, hd);
            }
            for (int r = 0; r < AB; r++) {
                const long i = i0 + r;
                float *p = P + r * tp, *ds = dS + r * tp;
                const float l = L[i], dv = Dv[i];
                for (long j = 0; j < ncols; j++) {
                    const float pj = (j <= i && i < T) ? exp_neg(p[j] - l) : 0.0f;
                    p[j] = pj;
                    ds[j] = pj * (ds[j] - dv);
                }
            }
            for (int q = 0; q < AB; q += AR) tile_mix(dS + q * tp, K, dQ + q * hd, tp, ncols, hd);
            for (int r = 0; r < AB && i0 + r < T; r++) {
                float *dst = a->grad + (b * T + i0 + r) * row + h * hd;
                for (long i = 0; i < hd; i++) dst[i] = dQ[r * hd + i] * a->scale;
            }
            /* the block's P and dS transposed, so that each key column reads its AB weights from one place */
            for (long j = 0; j < ncols; j++)
                for (int r = 0; r < AB; r++) {
                    dSt[j * AB + r] = dS[r * tp + j];
                    Pt[j * AB + r] = P[r * tp + j];
                }
            const float *Qb = Q + i0 * hd, *Gb = G + i0 * hd;
            const long w = hd % 32 == 0 ? 32 : 16; /* columns of dK and dV at a time: 8 (or 4) running sums */
            for (long j = 0; j < ncols; j++) {
                const float *ws = dSt + j * AB, *wp = Pt + j * AB;
                for (long d0 = 0; d0 < hd; d0 += w) {
                    float *dk = dK + j * hd + d0, *dv = dV + j * hd + d0;
                    v8 k[4], v[4];
                    for (int u = 0; u < w / 8; u++) {
                        k[u] = ld8(dk + 8 * u);
                        v[u] = ld8(dv + 8 * u);
                    }
                    for (int r = 0; r < AB; r++) {
                        const v8 bs = bc8(ws[r]), bp = bc8(wp[r]);
                        for (int u = 0; u < w / 8; u++) {
                            k[u] += bs * ld8(Qb + r * hd + d0 + 8 * u);
                            v[u] += bp * ld8(Gb + r * hd + d0 + 8 * u);
                        }
                    }
                    for (int u = 0; u < w / 8; u++) {
                        st8(dk + 8 * u, k[u]);
                        st8(dv + 8 * u, v[u]);
                    }
                }
            }
        }
        for (long t = 0; t < T; t++) {
            float *dst = a->grad + (b * T + t) * row + h * hd;
            memcpy(dst + H * hd, dK + t * hd, sizeof(float) * (size_t)hd);
            memcpy(dst + 2 * H * hd, dV + t * hd, sizeof(float) * (size_t)hd);
        }
    }
}

static void attn_bwd_range(const void *c, long lo, long hi, int part) {
    BY_HEAD_DIM(attn_bwd_heads, (const attn_t *)c, lo, hi, part)
}

/* grad [B, T, 3, H, hd] (of q, k, v) from qkv, the forward's out and lse, and gy (out's gradient, any strides);
 * work: parts x attn_workspace(T, hd, 1) */
void attn_bwd(const float *qkv, const float *y, const float *lse, const float *gy, const long *gstrides,
              float *grad, float *work, long B, long T, long H, long hd, float scale, int parts) {
    attn_t a = {qkv, y, gy, lse, NULL, NULL, grad, work, B, T, H, hd, attn_workspace(T, hd, 1), {0}, scale};
    memcpy(a.gys, gstrides, sizeof(a.gys));
    parallel(attn_bwd_range, &a, B * H, parts);
}

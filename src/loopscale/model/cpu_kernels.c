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

#define BY_HEAD_DIM(rows, a, lo, hi)        \
    switch ((a)->hd) {                      \
        case 16: rows(a, lo, hi, 16); break;  \
        case 32: rows(a, lo, hi, 32); break;  \
        case 64: rows(a, lo, hi, 64); break;  \
        case 128: rows(a, lo, hi, 128); break; \
        default: rows(a, lo, hi, (a)->hd);    \
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

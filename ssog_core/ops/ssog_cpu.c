/* Fused CPU kernels for a steered factorized SSOG field: both filter passes of docs/DESIGN.md §1 for one
 * (image, head) pair at a time, the pair's per-query kernels built in per-thread scratch (keys outermost, so the
 * loops vectorise) and used at once; docs/KERNELS.md §6. ssog_core/ops/ssog_cpu.py compiles this file (once per
 * machine, cached) and calls it through ctypes; the pairs are spread over OpenMP threads. It is built twice, with
 * REAL = float and REAL = double.
 *
 * Layouts (all contiguous; N = gh·gw tokens in raster order t = i·gw + k):
 *   v, y, dy, dv   (B, N, H, D)        values in, output, their gradients
 *   mu, c, dmu, dc (B, N, H, R, 2)     per query and atom: the steered centre μ and c = log2(e)/(2σ²τ) on the row
 *                                      axis y (index 0, the column pass over key rows j) and the column axis x
 *                                      (index 1, the row pass over key columns k), and their gradients; the kernels
 *                                      use x = query − μ
 *   log_lam, dlog  (B, N, H, R)        unnormalised log atom weights (λ = softmax over the R atoms, as
 *                                      ssog_core.field.Field.lam) and their gradient
 *   y1             (B, H, N, R, D)     the column pass's output per token and atom (saved for the backward pass)
 *
 * A 1D kernel over n keys is w(key) = 2^(c·(x − j*)² − c·(x − key)²) / Z with the nearest key j* = clamp(round(x)),
 * so every term is ≤ 1 with peak exactly 1 and Z ≥ 1 (docs/DESIGN.md §1.6); the shift by j* cancels in the
 * normalisation, so its gradient is not needed.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef REAL
#define REAL float
#endif
typedef REAL real;
typedef int64_t idx;

static const real LN2 = (real)0.69314718055994530942, LOG2E = (real)1.44269504088896340736;

#if defined(REAL_IS_DOUBLE)
#define FLOOR floor
static inline real exp2_nonpositive(real a) { return exp2(a); }
#else
#define FLOOR floorf
/* 2^a for a ≤ 0 in float: 2^floor(a) by exponent arithmetic times a degree-6 polynomial for 2^f on [0, 1)
 * (relative error 8e-8, under one ulp). Plain arithmetic, so the compiler vectorises the loops that call it;
 * below 2^-126 it returns 2^-126 instead of a denormal or 0, which no normalised weight can tell apart. */
static inline float exp2_nonpositive(float a) {
    a = a < -126.0f ? -126.0f : a;
    const float whole = floorf(a);
    const float f = a - whole;
    float p = 0.00021702194f;
    p = p * f + 0.0012439693f;
    p = p * f + 0.0096788425f;
    p = p * f + 0.055483341f;
    p = p * f + 0.24022983f;
    p = p * f + 0.69314700f;
    p = p * f + 1.0f;
    const int32_t bits = ((int32_t)whole + 127) << 23; /* 2^whole, a normal float since whole ≥ −126 */
    float scale;
    memcpy(&scale, &bits, sizeof(scale));
    return p * scale;
}
#endif

/* The 1D kernels of m (query, atom) pairs over keys 0..n-1, keys outermost so that every loop runs along the m
 * pairs and vectorises: K[key·m + p] = scale_p · 2^(c_p·(x_p − j*_p)² − c_p·(x_p − key)²) / Z_p (scale = NULL: 1),
 * and the unscaled normalised weights in `a` when a != NULL. `work` is scratch for 2m values. */
static void kernels(idx m, idx n, const real *restrict x, const real *restrict c, const real *restrict scale,
                    real *restrict K, real *restrict a, real *restrict work) {
    real *shift = work, *inv = work + m;
    for (idx p = 0; p < m; p++) {
        real peak = FLOOR(x[p] + (real)0.5);
        peak = peak < 0 ? 0 : peak;
        peak = peak > (real)(n - 1) ? (real)(n - 1) : peak;
        shift[p] = c[p] * (x[p] - peak) * (x[p] - peak);
        inv[p] = 0;
    }
    for (idx key = 0; key < n; key++)
        for (idx p = 0; p < m; p++) {
            const real d = x[p] - (real)key;
            K[key * m + p] = exp2_nonpositive(shift[p] - c[p] * d * d);
            inv[p] += K[key * m + p];
        }
    for (idx p = 0; p < m; p++) inv[p] = 1 / inv[p];
    if (a)
        for (idx key = 0; key < n; key++)
            for (idx p = 0; p < m; p++) a[key * m + p] = K[key * m + p] * inv[p];
    if (scale)
        for (idx p = 0; p < m; p++) inv[p] *= scale[p];
    for (idx key = 0; key < n; key++)
        for (idx p = 0; p < m; p++) K[key * m + p] *= inv[p];
}

/* Gradients of m kernels K = scale·A (A normalised, both keys outermost as `kernels` makes them), given
 * S = K ⊙ ∂L/∂K: with P = Σ_key S, the softmax-of-a-quadratic gradient is ∂L/∂x = −2·ln2·c·Σ (S − A·P)(x − key) and
 * ∂L/∂c = −ln2·Σ (S − A·P)(x − key)², moments taken about the query's own x so that nothing cancels (the same as
 * ssog_core/ops/ssog_torch.py:_kernel_grad). `work` is scratch for m values. */
static void kernel_grads(idx m, idx n, const real *restrict x, const real *restrict c, const real *restrict S,
                         const real *restrict A, real *restrict dx, real *restrict dc, real *restrict work) {
    real *total = work;
    for (idx p = 0; p < m; p++) total[p] = dx[p] = dc[p] = 0;
    for (idx key = 0; key < n; key++)
        for (idx p = 0; p < m; p++) total[p] += S[key * m + p];
    for (idx key = 0; key < n; key++)
        for (idx p = 0; p < m; p++) {
            const real d = x[p] - (real)key, s = S[key * m + p] - A[key * m + p] * total[p];
            dx[p] += s * d;
            dc[p] += s * d * d;
        }
    for (idx p = 0; p < m; p++) {
        dx[p] *= -2 * LN2 * c[p];
        dc[p] *= -LN2;
    }
}

/* Copy one (image, head) pair's per-(token, atom) terms between the (B, N, H, R[, 2]) tensors and a dense
 * (N·R) array: `width` is 2 for x and c (then `axis` picks y or x), 1 for λ. */
static void gather(const real *restrict src, idx H, idx N, idx R, idx width, idx axis, real *restrict dst) {
    for (idx t = 0; t < N; t++)
        for (idx r = 0; r < R; r++) dst[t * R + r] = src[(t * H * R + r) * width + axis];
}

/* x = query − μ of one pair on one axis, dense: xs[t·R + r] = (axis ? w : i) − μ[t, r, axis] for t = (i, w). */
static void gather_offsets(const real *restrict mu, idx H, idx gh, idx gw, idx R, idx axis, real *restrict xs) {
    for (idx i = 0; i < gh; i++)
        for (idx w = 0; w < gw; w++) {
            const idx t = i * gw + w;
            const real query = (real)(axis ? w : i);
            for (idx r = 0; r < R; r++) xs[t * R + r] = query - mu[(t * H * R + r) * 2 + axis];
        }
}

static void scatter(const real *restrict src, idx H, idx N, idx R, idx width, idx axis, real *restrict dst) {
    for (idx t = 0; t < N; t++)
        for (idx r = 0; r < R; r++) dst[(t * H * R + r) * width + axis] = src[t * R + r];
}

/* λ of one pair: the softmax over the atoms of each token's log weights, gathered into a dense (N·R) array. */
static void gather_weights(const real *restrict log_lam, idx H, idx N, idx R, real *restrict lam) {
    gather(log_lam, H, N, R, 1, 0, lam);
    for (idx t = 0; t < N; t++) {
        real top = lam[t * R];
        for (idx r = 1; r < R; r++) top = lam[t * R + r] > top ? lam[t * R + r] : top;
        for (idx r = 0; r < R; r++) lam[t * R + r] = LOG2E * (lam[t * R + r] - top);
    }
    for (idx p = 0; p < N * R; p++) lam[p] = exp2_nonpositive(lam[p]);
    for (idx t = 0; t < N; t++) {
        real total = 0;
        for (idx r = 0; r < R; r++) total += lam[t * R + r];
        for (idx r = 0; r < R; r++) lam[t * R + r] /= total;
    }
}

/* ∂L/∂log λ from ∂L/∂λ (in place, dense (N·R)): the softmax's Jacobian, λ_r·(g_r − Σ_s λ_s g_s) per token. */
static void weights_grad(const real *restrict lam, idx N, idx R, real *restrict g) {
    for (idx t = 0; t < N; t++) {
        real mean = 0;
        for (idx r = 0; r < R; r++) mean += lam[t * R + r] * g[t * R + r];
        for (idx r = 0; r < R; r++) g[t * R + r] = lam[t * R + r] * (g[t * R + r] - mean);
    }
}

/* Scratch for one thread: dense terms and kernels of one pair, and its per-atom intermediate. */
typedef struct {
    real *xs, *cs, *ls, *gx, *gc, *work; /* N·R each (work: 2·N·R) */
    real *K, *A, *S;                     /* n_max·N·R each */
    real *mid;                           /* N·R·D */
} Scratch;

/* Each thread keeps its scratch block between calls (OpenMP's threads persist), so that a block above malloc's
 * mmap threshold is not mapped, faulted in and unmapped on every layer; blocks over KEEP_BYTES are not kept. */
#define KEEP_BYTES ((size_t)64 << 20)
static _Thread_local void *kept;
static _Thread_local size_t kept_bytes;

static void *scratch_block(size_t bytes) {
    if (bytes <= kept_bytes) return kept;
    free(kept);
    kept = malloc(bytes);
    kept_bytes = kept ? bytes : 0;
    return kept;
}

static void scratch_release(size_t bytes) {
    if (bytes > KEEP_BYTES) {
        free(kept);
        kept = NULL;
        kept_bytes = 0;
    }
}

static size_t scratch_bytes(idx N, idx R, idx D, idx n_max) {
    return sizeof(real) * (size_t)(N * R * (7 + 3 * n_max + D));
}

static int scratch_alloc(Scratch *sc, idx N, idx R, idx D, idx n_max) {
    const idx NR = N * R;
    real *m = scratch_block(scratch_bytes(N, R, D, n_max));
    if (!m) return 1;
    sc->xs = m, sc->cs = m + NR, sc->ls = m + 2 * NR, sc->gx = m + 3 * NR, sc->gc = m + 4 * NR, sc->work = m + 5 * NR;
    sc->K = m + 7 * NR, sc->A = sc->K + n_max * NR, sc->S = sc->A + n_max * NR, sc->mid = sc->S + n_max * NR;
    return 0;
}

/* Channels are processed as 256-bit vectors (GCC/Clang vector extensions: AVX where the CPU has it, pairs of
 * 128-bit registers elsewhere), at most BLOCK vectors at a time held in registers; D must be a multiple of VW
 * (ssog_cpu.py pads the values). The per-pair bodies are always inlined into a switch over the common block
 * counts, so that their channel loops are unrolled; other widths run the same code with a runtime count. */
#define VW ((idx)(32 / sizeof(real)))
#define BLOCK 8
typedef real vec __attribute__((vector_size(32), aligned(sizeof(real))));
#if defined(REAL_IS_DOUBLE)
typedef int64_t lane;
#else
typedef int32_t lane;
#endif
typedef lane lanes __attribute__((vector_size(32))); /* a shuffle's lane indices, one per element */
#if defined(__clang__)
#define SHUFFLE(v, ...) __builtin_shufflevector(v, v, __VA_ARGS__)
#else
#define SHUFFLE(v, ...) __builtin_shuffle(v, (lanes){__VA_ARGS__})
#endif
#define INLINE static inline __attribute__((always_inline))
#define DISPATCH_WIDTH(body, ...)                                                                                   \
    switch (D) {                                                                                                   \
    case VW: body(__VA_ARGS__, VW); break;                                                                         \
    case 2 * VW: body(__VA_ARGS__, 2 * VW); break;                                                                 \
    case 4 * VW: body(__VA_ARGS__, 4 * VW); break;                                                                 \
    case 8 * VW: body(__VA_ARGS__, 8 * VW); break;                                                                 \
    default: body(__VA_ARGS__, D);                                                                                 \
    }

/* acc[0..nv) += w · src[0..nv·VW) */
INLINE void madd(vec *acc, real w, const real *src, idx nv) {
    for (idx u = 0; u < nv; u++) acc[u] += w * *(const vec *)(src + u * VW);
}

INLINE void store(real *dst, const vec *acc, idx nv) {
    for (idx u = 0; u < nv; u++) *(vec *)(dst + u * VW) = acc[u];
}

/* Σ g·src over nv vectors, g held in registers; the lanes are summed by halving (log2 VW shuffles), not one by one */
INLINE real dotv(const vec *g, const real *src, idx nv) {
    vec s = {0};
    for (idx u = 0; u < nv; u++) s += g[u] * *(const vec *)(src + u * VW);
#if defined(REAL_IS_DOUBLE)
    s += SHUFFLE(s, 2, 3, 0, 1);
    s += SHUFFLE(s, 1, 0, 3, 2);
#else
    s += SHUFFLE(s, 4, 5, 6, 7, 0, 1, 2, 3);
    s += SHUFFLE(s, 2, 3, 0, 1, 6, 7, 4, 5);
    s += SHUFFLE(s, 1, 0, 3, 2, 5, 4, 7, 6);
#endif
    return s[0];
}

/* One (image, head) pair's forward pass; mid (N, R, D) receives the column pass's output. */
INLINE void forward_pair(const real *v, const real *mu, const real *c, const real *log_lam, real *y, real *mid,
                         Scratch *sc, idx b, idx h, idx gh, idx gw, idx H, idx R, const idx D) {
    const idx N = gh * gw, NR = N * R, first = (b * N * H + h) * R; /* the pair's (t = 0, r = 0) term */
    const real *vb = v + (b * N * H + h) * D;                       /* token t's values: vb + t·H·D */
    real *yb = y + (b * N * H + h) * D;
    const real *K = sc->K;
    /* column pass: mid[t, r] = Σ_j a_r(t)[j] · v[(j, k)] for every token t = (i, k) */
    gather_offsets(mu + 2 * first, H, gh, gw, R, 0, sc->xs);
    gather(c + 2 * first, H, N, R, 2, 0, sc->cs);
    kernels(NR, gh, sc->xs, sc->cs, NULL, sc->K, NULL, sc->work);
    for (idx d0 = 0; d0 < D; d0 += BLOCK * VW) {
        const idx nv = (D - d0 < BLOCK * VW ? D - d0 : BLOCK * VW) / VW;
        for (idx t = 0; t < N; t++) {
            const real *column = vb + (t % gw) * H * D + d0; /* v[(j, k)] = column[j·gw·H·D] */
            for (idx r = 0; r < R; r++) {
                vec acc[BLOCK] = {{0}};
                for (idx j = 0; j < gh; j++) madd(acc, K[j * NR + t * R + r], column + j * gw * H * D, nv);
                store(mid + (t * R + r) * D + d0, acc, nv);
            }
        }
    }
    /* row pass: y[t] = Σ_r λ_r(t) Σ_k u_r(t)[k] · mid[(i, k), r] for every query t = (i, w) */
    gather_offsets(mu + 2 * first, H, gh, gw, R, 1, sc->xs);
    gather(c + 2 * first, H, N, R, 2, 1, sc->cs);
    gather_weights(log_lam + first, H, N, R, sc->ls);
    kernels(NR, gw, sc->xs, sc->cs, sc->ls, sc->K, NULL, sc->work);
    for (idx d0 = 0; d0 < D; d0 += BLOCK * VW) {
        const idx nv = (D - d0 < BLOCK * VW ? D - d0 : BLOCK * VW) / VW;
        for (idx t = 0; t < N; t++) {
            const real *row = mid + (t / gw) * gw * R * D + d0; /* mid[(i, k), r] = row[(k·R + r)·D] */
            vec acc[BLOCK] = {{0}};
            for (idx k = 0; k < gw; k++)
                for (idx r = 0; r < R; r++) madd(acc, K[k * NR + t * R + r], row + (k * R + r) * D, nv);
            store(yb + t * H * D + d0, acc, nv);
        }
    }
}

/* One pair's backward pass: ∂L/∂v into its own head's rows of dv, and dmu, dc, dlog of its queries. */
INLINE void backward_pair(const real *v, const real *mu, const real *c, const real *log_lam, const real *mid,
                          const real *dy, real *dv, real *dmu, real *dc, real *dlog, Scratch *sc, idx b, idx h, idx gh,
                          idx gw, idx H, idx R, const idx D) {
    const idx N = gh * gw, NR = N * R, first = (b * N * H + h) * R;
    const real *vb = v + (b * N * H + h) * D, *dyb = dy + (b * N * H + h) * D;
    real *dvb = dv + (b * N * H + h) * D, *dmid = sc->mid, *K = sc->K, *A = sc->A, *S = sc->S;
    memset(dmid, 0, sizeof(real) * NR * D);
    for (idx t = 0; t < N; t++) memset(dvb + t * H * D, 0, sizeof(real) * D);
    /* row pass: ∂L/∂mid, ∂L/∂λ and the row kernels' gradients; S and gx accumulate over channel blocks */
    gather_offsets(mu + 2 * first, H, gh, gw, R, 1, sc->xs);
    gather(c + 2 * first, H, N, R, 2, 1, sc->cs);
    gather_weights(log_lam + first, H, N, R, sc->ls);
    kernels(NR, gw, sc->xs, sc->cs, sc->ls, K, A, sc->work);
    memset(S, 0, sizeof(real) * gw * NR);
    for (idx d0 = 0; d0 < D; d0 += BLOCK * VW) {
        const idx nv = (D - d0 < BLOCK * VW ? D - d0 : BLOCK * VW) / VW;
        for (idx t = 0; t < N; t++) {
            const idx i = t / gw;
            vec g[BLOCK];
            for (idx u = 0; u < nv; u++) g[u] = *(const vec *)(dyb + t * H * D + d0 + u * VW);
            for (idx k = 0; k < gw; k++)
                for (idx r = 0; r < R; r++) {
                    const idx p = k * NR + t * R + r, at = ((i * gw + k) * R + r) * D + d0;
                    S[p] += dotv(g, mid + at, nv); /* ∂L/∂K, times K below */
                    madd((vec *)(dmid + at), K[p], (const real *)g, nv);
                }
        }
    }
    for (idx p = 0; p < NR; p++) sc->gx[p] = 0;
    for (idx k = 0; k < gw; k++)
        for (idx p = 0; p < NR; p++) {
            sc->gx[p] += A[k * NR + p] * S[k * NR + p]; /* ∂L/∂λ = Σ_k a_k ∂L/∂u_k */
            S[k * NR + p] *= K[k * NR + p];
        }
    weights_grad(sc->ls, N, R, sc->gx);
    scatter(sc->gx, H, N, R, 1, 0, dlog + first);
    kernel_grads(NR, gw, sc->xs, sc->cs, S, A, sc->gx, sc->gc, sc->work);
    for (idx p = 0; p < NR; p++) sc->gx[p] = -sc->gx[p]; /* ∂L/∂μ = −∂L/∂x */
    scatter(sc->gx, H, N, R, 2, 1, dmu + 2 * first);
    scatter(sc->gc, H, N, R, 2, 1, dc + 2 * first);
    /* column pass: ∂L/∂v and the column kernels' gradients (scale 1, so A = K) */
    gather_offsets(mu + 2 * first, H, gh, gw, R, 0, sc->xs);
    gather(c + 2 * first, H, N, R, 2, 0, sc->cs);
    kernels(NR, gh, sc->xs, sc->cs, NULL, K, NULL, sc->work);
    memset(S, 0, sizeof(real) * gh * NR);
    for (idx d0 = 0; d0 < D; d0 += BLOCK * VW) {
        const idx nv = (D - d0 < BLOCK * VW ? D - d0 : BLOCK * VW) / VW;
        for (idx t = 0; t < N; t++)
            for (idx r = 0; r < R; r++) {
                const idx column = (t % gw) * H * D + d0; /* v[(j, k)] = vb[column + j·gw·H·D] */
                vec g[BLOCK];
                for (idx u = 0; u < nv; u++) g[u] = *(const vec *)(dmid + (t * R + r) * D + d0 + u * VW);
                for (idx j = 0; j < gh; j++) {
                    const idx p = j * NR + t * R + r, at = column + j * gw * H * D;
                    S[p] += dotv(g, vb + at, nv);
                    madd((vec *)(dvb + at), K[p], (const real *)g, nv);
                }
            }
    }
    for (idx p = 0; p < gh * NR; p++) S[p] *= K[p];
    kernel_grads(NR, gh, sc->xs, sc->cs, S, K, sc->gx, sc->gc, sc->work);
    for (idx p = 0; p < NR; p++) sc->gx[p] = -sc->gx[p];
    scatter(sc->gx, H, N, R, 2, 0, dmu + 2 * first);
    scatter(sc->gc, H, N, R, 2, 0, dc + 2 * first);
}

/* One call's arguments; the forward pass leaves the gradient fields NULL. */
typedef struct {
    const real *v, *mu, *c, *log_lam, *dy;
    real *y, *y1, *dv, *dmu, *dc, *dlog;
    idx B, gh, gw, H, R, D;
} Call;

/* Run every (image, head) pair of a call, spread over `threads` OpenMP threads (the OpenMP runtime PyTorch itself
 * uses: its pool, no second set of spinning threads), each with its own scratch. Returns 1 if scratch memory could
 * not be allocated. */
static int over_pairs(const Call *a, int backward, int threads) {
    const idx N = a->gh * a->gw, R = a->R, D = a->D, n_max = a->gh > a->gw ? a->gh : a->gw;
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        Scratch sc = {0};
        failed = scratch_alloc(&sc, N, R, D, n_max);
#pragma omp for schedule(static)
        for (idx task = 0; task < a->B * a->H; task++) {
            if (failed) continue;
            real *mid = a->y1 ? a->y1 + task * N * R * D : sc.mid; /* the pair's column-pass output */
            const idx b = task / a->H, h = task % a->H;
            if (backward) {
                DISPATCH_WIDTH(backward_pair, a->v, a->mu, a->c, a->log_lam, mid, a->dy, a->dv, a->dmu, a->dc,
                               a->dlog, &sc, b, h, a->gh, a->gw, a->H, R)
            } else {
                DISPATCH_WIDTH(forward_pair, a->v, a->mu, a->c, a->log_lam, a->y, mid, &sc, b, h, a->gh, a->gw, a->H, R)
            }
        }
        scratch_release(scratch_bytes(N, R, D, n_max));
    }
    return failed;
}

/* Forward pass over all B·H pairs; y1 may be NULL (nothing saved for a backward pass). */
int ssog_forward(const real *v, const real *mu, const real *c, const real *log_lam, real *y, real *y1, idx B, idx gh,
                 idx gw, idx H, idx R, idx D, int threads) {
    const Call call = {v, mu, c, log_lam, NULL, y, y1, NULL, NULL, NULL, NULL, B, gh, gw, H, R, D};
    return over_pairs(&call, 0, threads);
}

/* Backward pass over all pairs from the saved y1. Writes dv (each pair its own head's rows), and dmu, dc, dlog for
 * every query and atom. */
int ssog_backward(const real *v, const real *mu, const real *c, const real *log_lam, const real *y1, const real *dy,
                  real *dv, real *dmu, real *dc, real *dlog, idx B, idx gh, idx gw, idx H, idx R, idx D, int threads) {
    const Call call = {v, mu, c, log_lam, dy, NULL, (real *)y1, dv, dmu, dc, dlog, B, gh, gw, H, R, D};
    return over_pairs(&call, 1, threads);
}

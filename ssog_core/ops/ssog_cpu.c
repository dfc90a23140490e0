/* Fused CPU kernels for a steered factorized SSOG field: both filter passes of docs/DESIGN.md §1 for one
 * (image, head) pair at a time, the pair's per-query kernels built in per-thread scratch (keys outermost, so the
 * loops vectorise) and used at once, line by line as register-tiled matrix products; and the steering that makes
 * the per-token terms from the probes' raw outputs (ssog_terms_forward / _backward); docs/KERNELS.md §6. ssog_core/ops/ssog_cpu.py compiles this file (once per
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

/* Denormals flushed to zero in the float build's field kernels, on each thread for the call only (the caller's mode
 * is restored; not the process-wide -ffast-math). A trained field is sharp: most weights far from an atom's centre
 * are the polynomial's floor 2^-126, and their products with values and gradients are denormals, each an x86
 * microcode assist of ~100 cycles, which made a trained model's steered training step 4x slower than a fresh one's
 * (benchmarks/train_step.py --trained). The flushed terms are below 2^-126 beside sums of at least the peak's 1. */
#if !defined(REAL_IS_DOUBLE) && (defined(__x86_64__) || defined(__i386__))
#include <xmmintrin.h>
typedef unsigned int fp_mode;
static inline fp_mode flush_denormals(void) {
    const fp_mode old = _mm_getcsr();
    _mm_setcsr(old | 0x8040); /* FTZ (bit 15): results; DAZ (bit 6): operands */
    return old;
}
static inline void restore_fp_mode(fp_mode old) { _mm_setcsr(old); }
#elif !defined(REAL_IS_DOUBLE) && defined(__aarch64__)
typedef uint64_t fp_mode;
static inline fp_mode flush_denormals(void) {
    fp_mode old;
    __asm__ volatile("mrs %0, fpcr" : "=r"(old));
    __asm__ volatile("msr fpcr, %0" : : "r"(old | ((fp_mode)1 << 24))); /* FZ */
    return old;
}
static inline void restore_fp_mode(fp_mode old) { __asm__ volatile("msr fpcr, %0" : : "r"(old)); }
#else
typedef int fp_mode;
static inline fp_mode flush_denormals(void) { return 0; }
static inline void restore_fp_mode(fp_mode old) { (void)old; }
#endif

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

/* A line of queries: the n tokens t0 + q·step, q < n (a key column k: t0 = k, step = gw, the column pass's queries
 * (i, k); a query row i: t0 = i·gw, step = 1, the row pass's queries (i, w)); q is also the query's coordinate on
 * the pass's axis. The helpers below copy one (image, head) pair's per-(token, atom) terms of a line between the
 * (B, N, H, R[, 2]) tensors (pointers at the pair's first term) and dense (n·R) arrays in line order q·R + r:
 * `width` is 2 for μ and c (then `axis` picks y or x), 1 for λ. */
static void gather(const real *restrict src, idx H, idx R, idx t0, idx step, idx n, idx width, idx axis,
                   real *restrict dst) {
    for (idx q = 0; q < n; q++)
        for (idx r = 0; r < R; r++) dst[q * R + r] = src[((t0 + q * step) * H * R + r) * width + axis];
}

/* x = query − μ of a line on its axis: xs[q·R + r] = q − μ[t0 + q·step, r, axis]. */
static void gather_offsets(const real *restrict mu, idx H, idx R, idx t0, idx step, idx n, idx axis,
                           real *restrict xs) {
    gather(mu, H, R, t0, step, n, 2, axis, xs);
    for (idx q = 0; q < n; q++)
        for (idx r = 0; r < R; r++) xs[q * R + r] = (real)q - xs[q * R + r];
}

static void scatter(const real *restrict src, idx H, idx R, idx t0, idx step, idx n, idx width, idx axis,
                    real *restrict dst) {
    for (idx q = 0; q < n; q++)
        for (idx r = 0; r < R; r++) dst[((t0 + q * step) * H * R + r) * width + axis] = src[q * R + r];
}

/* λ of a line: the softmax over the atoms of each token's log weights, dense (n·R). */
static void gather_weights(const real *restrict log_lam, idx H, idx R, idx t0, idx step, idx n, real *restrict lam) {
    gather(log_lam, H, R, t0, step, n, 1, 0, lam);
    for (idx q = 0; q < n; q++) {
        real top = lam[q * R];
        for (idx r = 1; r < R; r++) top = lam[q * R + r] > top ? lam[q * R + r] : top;
        for (idx r = 0; r < R; r++) lam[q * R + r] = LOG2E * (lam[q * R + r] - top);
    }
    for (idx p = 0; p < n * R; p++) lam[p] = exp2_nonpositive(lam[p]);
    for (idx q = 0; q < n; q++) {
        real total = 0;
        for (idx r = 0; r < R; r++) total += lam[q * R + r];
        for (idx r = 0; r < R; r++) lam[q * R + r] /= total;
    }
}

/* ∂L/∂log λ from ∂L/∂λ (in place, dense (n·R)): the softmax's Jacobian, λ_r·(g_r − Σ_s λ_s g_s) per token. */
static void weights_grad(const real *restrict lam, idx n, idx R, real *restrict g) {
    for (idx q = 0; q < n; q++) {
        real mean = 0;
        for (idx r = 0; r < R; r++) mean += lam[q * R + r] * g[q * R + r];
        for (idx r = 0; r < R; r++) g[q * R + r] = lam[q * R + r] * (g[q * R + r] - mean);
    }
}

/* Scratch for one thread: the dense terms and kernels of one pair, and its per-atom intermediate (evaluation;
 * ∂L/∂y1 in the backward pass). */
typedef struct {
    real *xs, *cs, *ls, *gx, *gc, *work; /* N·R each (work: 2·N·R) */
    real *K, *A, *S;                     /* n_max·N·R each */
    real *mid;                           /* N·R·D */
    idx *ao, *oo;                        /* n_max·R each: a product's row offsets (tile) */
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

#define VW ((idx)(32 / sizeof(real))) /* reals per 256-bit vector */

static size_t scratch_bytes(idx N, idx R, idx D, idx n_max) {
    return sizeof(idx) * (size_t)(2 * n_max * R) + sizeof(real) * (size_t)(N * R * (7 + 3 * n_max + D));
}

static int scratch_alloc(Scratch *sc, idx N, idx R, idx D, idx n_max) {
    const idx NR = N * R, line = n_max * R;
    idx *offsets = scratch_block(scratch_bytes(N, R, D, n_max)); /* the offsets first: malloc aligns them */
    if (!offsets) return 1;
    sc->ao = offsets, sc->oo = offsets + line;
    real *m = (real *)(offsets + 2 * line);
    sc->xs = m, sc->cs = m + NR, sc->ls = m + 2 * NR, sc->gx = m + 3 * NR, sc->gc = m + 4 * NR, sc->work = m + 5 * NR;
    sc->K = m + 7 * NR, sc->A = sc->K + n_max * NR, sc->S = sc->A + n_max * NR, sc->mid = sc->S + n_max * NR;
    return 0;
}

/* Channels are processed as 256-bit vectors (GCC/Clang vector extensions: AVX where the CPU has it, pairs of
 * 128-bit registers elsewhere), at most BLOCK vectors at a time held in registers; D must be a multiple of VW
 * (ssog_cpu.py pads the values). The per-pair bodies are always inlined into a switch over the common block
 * counts, so that their channel loops are unrolled; other widths run the same code with a runtime count. */
#define BLOCK 8
typedef real vec __attribute__((vector_size(32), aligned(sizeof(real))));
#if defined(REAL_IS_DOUBLE)
typedef int64_t lane;
#else
typedef int32_t lane;
#endif
typedef lane lanes __attribute__((vector_size(32))); /* a shuffle's lane indices, one per element */
#define INLINE static inline __attribute__((always_inline))
#define DISPATCH_WIDTH(body, ...)                                                                                   \
    switch (D) {                                                                                                   \
    case VW: body(__VA_ARGS__, VW); break;                                                                         \
    case 2 * VW: body(__VA_ARGS__, 2 * VW); break;                                                                 \
    case 4 * VW: body(__VA_ARGS__, 4 * VW); break;                                                                 \
    case 8 * VW: body(__VA_ARGS__, 8 * VW); break;                                                                 \
    default: body(__VA_ARGS__, D);                                                                                 \
    }

INLINE void store(real *dst, const vec *acc, idx nv) {
    for (idx u = 0; u < nv; u++) *(vec *)(dst + u * VW) = acc[u];
}

/* Rows of a register tile of nv vectors each: at most 8 accumulators (beside the B vectors and a broadcast weight in
 * the 16 vector registers), and for a one- or two-vector head at least 4 rows, so that the fused multiply-adds of
 * independent accumulators hide each other's latency. */
#define TILE_ROWS 8
#define TILE(nv) ((nv) == 1 ? 8 : (nv) == 2 ? 4 : (nv) <= 4 ? 2 : 1)

/* One register tile of a small matrix product, for ra < rows:
 *   O[oo[ra] + (0..nv·VW)] = Σ_{q<nq} Σ_{s<ns} A[ao[ra] + q·aq + s·as] · B[q·bq + s·bs + (0..nv·VW)];
 * each B vector is loaded once per term for all rows, the sums stay in registers until the end. */
INLINE void tile(const idx rows, const idx nv, const real *A, const idx *ao, idx nq, idx aq, idx ns, idx as,
                 const real *B, idx bq, idx bs, real *O, const idx *oo) {
    vec acc[TILE_ROWS][BLOCK];
    for (idx ra = 0; ra < rows; ra++)
        for (idx u = 0; u < nv; u++) acc[ra][u] = (vec){0};
    for (idx q = 0; q < nq; q++)
        for (idx s = 0; s < ns; s++) {
            const real *a = A + q * aq + s * as, *b = B + q * bq + s * bs;
            vec bv[BLOCK];
            for (idx u = 0; u < nv; u++) bv[u] = *(const vec *)(b + u * VW);
            for (idx ra = 0; ra < rows; ra++) {
                const real w = a[ao[ra]];
                for (idx u = 0; u < nv; u++) acc[ra][u] += w * bv[u];
            }
        }
    for (idx ra = 0; ra < rows; ra++) store(O + oo[ra], acc[ra], nv);
}

/* `tile` over m rows (offsets ao[0..m), oo[0..m)): whole tiles of TILE(nv) rows, then the rest one row at a time. */
INLINE void tiles(idx m, const idx nv, const real *A, const idx *ao, idx nq, idx aq, idx ns, idx as, const real *B,
                  idx bq, idx bs, real *O, const idx *oo) {
    const idx mr = TILE(nv);
    idx m0 = 0;
    for (; m0 + mr <= m; m0 += mr) tile(mr, nv, A, ao + m0, nq, aq, ns, as, B, bq, bs, O, oo + m0);
    for (; m0 < m; m0++) tile(1, nv, A, ao + m0, nq, aq, ns, as, B, bq, bs, O, oo + m0);
}

/* Four dot products of D reals at once, out[q] = a_q · b_q: four vector sums whose lanes are then reduced together
 * (pairs of lanes, then halves: three shuffle-and-add steps for all four instead of three for each). */
#if defined(__clang__)
#define SHUFFLE2(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define SHUFFLE2(a, b, ...) __builtin_shuffle(a, b, (lanes){__VA_ARGS__})
#endif
INLINE void dot4(const real *a0, const real *b0, const real *a1, const real *b1, const real *a2, const real *b2,
                 const real *a3, const real *b3, idx D, real *out) {
    vec s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    for (idx d = 0; d < D; d += VW) {
        s0 += *(const vec *)(a0 + d) * *(const vec *)(b0 + d);
        s1 += *(const vec *)(a1 + d) * *(const vec *)(b1 + d);
        s2 += *(const vec *)(a2 + d) * *(const vec *)(b2 + d);
        s3 += *(const vec *)(a3 + d) * *(const vec *)(b3 + d);
    }
#if defined(REAL_IS_DOUBLE)
    const vec u0 = SHUFFLE2(s0, s1, 0, 4, 2, 6) + SHUFFLE2(s0, s1, 1, 5, 3, 7); /* s0 01, s1 01, s0 23, s1 23 */
    const vec u1 = SHUFFLE2(s2, s3, 0, 4, 2, 6) + SHUFFLE2(s2, s3, 1, 5, 3, 7);
    const vec w = SHUFFLE2(u0, u1, 0, 1, 4, 5) + SHUFFLE2(u0, u1, 2, 3, 6, 7);
    *(vec *)out = w;
#else
    const vec u0 = SHUFFLE2(s0, s1, 0, 8, 2, 10, 4, 12, 6, 14) + SHUFFLE2(s0, s1, 1, 9, 3, 11, 5, 13, 7, 15);
    const vec u1 = SHUFFLE2(s2, s3, 0, 8, 2, 10, 4, 12, 6, 14) + SHUFFLE2(s2, s3, 1, 9, 3, 11, 5, 13, 7, 15);
    const vec w = SHUFFLE2(u0, u1, 0, 1, 8, 9, 4, 5, 12, 13) + SHUFFLE2(u0, u1, 2, 3, 10, 11, 6, 7, 14, 15);
    typedef real half __attribute__((vector_size(16), aligned(sizeof(real))));
    *(half *)out = (half){w[0], w[1], w[2], w[3]} + (half){w[4], w[5], w[6], w[7]};
#endif
}

/* One (image, head) pair's forward pass; mid (N, R, D) receives the column pass's output. Each pass builds the
 * kernels of all the pair's N·R (query, atom) terms at once (keys outermost, K[key·N·R + p], so the loops run along
 * the terms and vectorise), in the order of the pass's lines of queries (key columns k for the column pass, query
 * rows i for the row pass) so that each line's terms are contiguous; then each line's product runs with its output
 * rows register-tiled (`tiles`). */
INLINE void forward_pair(const real *v, const real *mu, const real *c, const real *log_lam, real *y, real *mid,
                         Scratch *sc, idx b, idx h, idx gh, idx gw, idx H, idx R, const idx D) {
    const idx N = gh * gw, NR = N * R, first = (b * N * H + h) * R; /* the pair's (t = 0, r = 0) term */
    const real *vb = v + (b * N * H + h) * D, *mub = mu + 2 * first, *cb = c + 2 * first; /* token t: vb + t·H·D */
    real *yb = y + (b * N * H + h) * D, *K = sc->K;
    idx *ao = sc->ao, *oo = sc->oo;
    /* column pass, per key column k: mid[(i, k), r] = Σ_j a_r(i, k)[j] · v[(j, k)], rows (i, r) */
    const idx mc = gh * R;
    for (idx k = 0; k < gw; k++) {
        gather_offsets(mub, H, R, k, gw, gh, 0, sc->xs + k * mc);
        gather(cb, H, R, k, gw, gh, 2, 0, sc->cs + k * mc);
    }
    kernels(NR, gh, sc->xs, sc->cs, NULL, K, NULL, sc->work);
    for (idx k = 0; k < gw; k++) {
        for (idx i = 0, p = 0; i < gh; i++)
            for (idx r = 0; r < R; r++, p++) ao[p] = p, oo[p] = ((i * gw + k) * R + r) * D;
        for (idx d0 = 0; d0 < D; d0 += BLOCK * VW) {
            const idx nv = (D - d0 < BLOCK * VW ? D - d0 : BLOCK * VW) / VW;
            tiles(mc, nv, K + k * mc, ao, gh, NR, 1, 0, vb + k * H * D + d0, gw * H * D, 0, mid + d0, oo);
        }
    }
    /* row pass, per query row i: y[(i, w)] = Σ_{k, r} λ_r(i, w) · u_r(i, w)[k] · mid[(i, k), r], rows w */
    const idx mr = gw * R;
    for (idx i = 0; i < gh; i++) gather_offsets(mub, H, R, i * gw, 1, gw, 1, sc->xs + i * mr);
    gather(cb, H, R, 0, 1, N, 2, 1, sc->cs);
    gather_weights(log_lam + first, H, R, 0, 1, N, sc->ls);
    kernels(NR, gw, sc->xs, sc->cs, sc->ls, K, NULL, sc->work);
    for (idx i = 0; i < gh; i++) {
        for (idx w = 0; w < gw; w++) ao[w] = w * R, oo[w] = (i * gw + w) * H * D;
        for (idx d0 = 0; d0 < D; d0 += BLOCK * VW) {
            const idx nv = (D - d0 < BLOCK * VW ? D - d0 : BLOCK * VW) / VW;
            tiles(gw, nv, K + i * mr, ao, gw, NR, R, 1, mid + i * gw * R * D + d0, R * D, D, yb + d0, oo);
        }
    }
}

/* One pair's backward pass, in the forward pass's orders: ∂L/∂v into its own head's rows of dv, and dmu, dc, dlog of
 * its queries. */
INLINE void backward_pair(const real *v, const real *mu, const real *c, const real *log_lam, const real *mid,
                          const real *dy, real *dv, real *dmu, real *dc, real *dlog, Scratch *sc, idx b, idx h, idx gh,
                          idx gw, idx H, idx R, const idx D) {
    const idx N = gh * gw, NR = N * R, first = (b * N * H + h) * R;
    const real *vb = v + (b * N * H + h) * D, *dyb = dy + (b * N * H + h) * D, *mub = mu + 2 * first;
    const real *cb = c + 2 * first;
    real *dvb = dv + (b * N * H + h) * D, *dmid = sc->mid, *K = sc->K, *A = sc->A, *S = sc->S;
    idx *ao = sc->ao, *oo = sc->oo;
    /* row pass, per query row i: ∂L/∂mid[(i, k), r] = Σ_w u_r(i, w)[k] · ∂L/∂y[(i, w)] (rows (k, r)) and the dot
     * products ∂L/∂u_r(i, w)[k] = ∂L/∂y[(i, w)] · mid[(i, k), r] (against mid's row transposed); then ∂L/∂λ and
     * the row kernels' gradients */
    const idx mr = gw * R;
    for (idx i = 0; i < gh; i++) gather_offsets(mub, H, R, i * gw, 1, gw, 1, sc->xs + i * mr);
    gather(cb, H, R, 0, 1, N, 2, 1, sc->cs);
    gather_weights(log_lam + first, H, R, 0, 1, N, sc->ls);
    kernels(NR, gw, sc->xs, sc->cs, sc->ls, K, A, sc->work);
    for (idx i = 0; i < gh; i++) {
        for (idx k = 0, p = 0; k < gw; k++)
            for (idx r = 0; r < R; r++, p++) ao[p] = k * NR + r, oo[p] = (i * gw * R + p) * D;
        for (idx d0 = 0; d0 < D; d0 += BLOCK * VW) {
            const idx nv = (D - d0 < BLOCK * VW ? D - d0 : BLOCK * VW) / VW;
            tiles(mr, nv, K + i * mr, ao, gw, R, 1, 0, dyb + i * gw * H * D + d0, H * D, 0, dmid + d0, oo);
        }
        for (idx w = 0; w < gw; w++) {
            const real *g = dyb + (i * gw + w) * H * D, *row = mid + i * gw * R * D; /* mid[(i, k), r]: row + (k·R + r)·D */
            for (idx k = 0; k < gw; k++) {
                real *s_k = S + k * NR + (i * gw + w) * R;
                idx r = 0;
                for (; r + 4 <= R; r += 4) {
                    const real *m0 = row + (k * R + r) * D;
                    dot4(g, m0, g, m0 + D, g, m0 + 2 * D, g, m0 + 3 * D, D, s_k + r);
                }
                for (; r < R; r++) {
                    const real *m0 = row + (k * R + r) * D;
                    real out[4];
                    dot4(g, m0, g, m0, g, m0, g, m0, D, out);
                    s_k[r] = out[0];
                }
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
    scatter(sc->gx, H, R, 0, 1, N, 1, 0, dlog + first);
    kernel_grads(NR, gw, sc->xs, sc->cs, S, A, sc->gx, sc->gc, sc->work);
    for (idx p = 0; p < NR; p++) sc->gx[p] = -sc->gx[p]; /* ∂L/∂μ = −∂L/∂x */
    scatter(sc->gx, H, R, 0, 1, N, 2, 1, dmu + 2 * first);
    scatter(sc->gc, H, R, 0, 1, N, 2, 1, dc + 2 * first);
    /* column pass, per key column k: ∂L/∂v[(j, k)] = Σ_{i, r} a_r(i, k)[j] · ∂L/∂mid[(i, k), r] (rows j) and the dot
     * products ∂L/∂a_r(i, k)[j] = ∂L/∂mid[(i, k), r] · v[(j, k)] (against the column transposed); then the column
     * kernels' gradients (scale 1, so A = K) */
    const idx mc = gh * R;
    for (idx k = 0; k < gw; k++) {
        gather_offsets(mub, H, R, k, gw, gh, 0, sc->xs + k * mc);
        gather(cb, H, R, k, gw, gh, 2, 0, sc->cs + k * mc);
    }
    kernels(NR, gh, sc->xs, sc->cs, NULL, K, NULL, sc->work);
    for (idx k = 0; k < gw; k++) {
        for (idx j = 0; j < gh; j++) ao[j] = j * NR, oo[j] = (j * gw + k) * H * D;
        for (idx d0 = 0; d0 < D; d0 += BLOCK * VW) {
            const idx nv = (D - d0 < BLOCK * VW ? D - d0 : BLOCK * VW) / VW;
            tiles(gh, nv, K + k * mc, ao, gh, R, R, 1, dmid + k * R * D + d0, gw * R * D, D, dvb + d0, oo);
        }
        for (idx i = 0; i < gh; i++) /* ∂L/∂mid[(i, k), r] (rows g) against v[(j, k)], j < gh, four atoms at a time */
            for (idx j = 0; j < gh; j++) {
                const real *g = dmid + (i * gw + k) * R * D, *vj = vb + (j * gw + k) * H * D;
                const idx at = j * NR + k * mc + i * R; /* S[at + r] */
                idx r = 0;
                for (; r + 4 <= R; r += 4) {
                    const real *g0 = g + r * D;
                    dot4(g0, vj, g0 + D, vj, g0 + 2 * D, vj, g0 + 3 * D, vj, D, S + at + r);
                }
                for (; r < R; r++) {
                    real out[4];
                    dot4(g + r * D, vj, g + r * D, vj, g + r * D, vj, g + r * D, vj, D, out);
                    S[at + r] = out[0];
                }
            }
    }
    for (idx p = 0; p < gh * NR; p++) S[p] *= K[p];
    kernel_grads(NR, gh, sc->xs, sc->cs, S, K, sc->gx, sc->gc, sc->work);
    for (idx p = 0; p < NR; p++) sc->gx[p] = -sc->gx[p];
    for (idx k = 0; k < gw; k++) {
        scatter(sc->gx + k * mc, H, R, k, gw, gh, 2, 0, dmu + 2 * first);
        scatter(sc->gc + k * mc, H, R, k, gw, gh, 2, 0, dc + 2 * first);
    }
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
        const fp_mode mode = flush_denormals();
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
        restore_fp_mode(mode);
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

/* The steering (ssog_core.field.bound and steer, then c = log2(e)/(2σ²τ)) as two passes over the tokens: the per-token
 * kernel terms from the probes' raw outputs, and back. raw (T, P): token t's probe outputs, each enabled tap's block
 * at its offset (o_mu, o_sigma: H·R·2 values, o_lambda: H·R; −1 for a tap that is off); mu0, c0 (H, R, 2) and ll0
 * (H, R): the fixed field's μ, c and log λ; gates: a = s_μ·M, s_σ, s_λ. Per token, with b = tanh(raw):
 *   μ = μ0 + a·b_μ,   c = c0·e^(−2 s_σ b_σ)   (σ = σ0·e^(s_σ b_σ)),   log λ = log λ0 + s_λ·b_λ.
 * tanh is (1 − e^(−2|x|))/(1 + e^(−2|x|)) with the sign of x (absolute error under 1e-7 in float), e^a as
 * 2^(a·log2 e) by exp2_nonpositive's polynomial, valid for exponents in [−126, 127] (clamped). */
static inline real bounded(real x) {
    const real t = exp2_nonpositive(-2 * LOG2E * (x < 0 ? -x : x)), y = (1 - t) / (1 + t);
    return x < 0 ? -y : y;
}

static inline real exp_clamped(real a) {
    a *= LOG2E;
    return exp2_nonpositive(a > 127 ? 127 : a);
}

/* One tap's block of a token's terms: out[q] = base[q] + scale·b_q (`exponential`: base[q]·e^(scale·b_q)). */
static void steer_block(const real *restrict p, const real *restrict base, real scale, int exponential, idx n,
                        real *restrict out) {
    if (exponential)
        for (idx q = 0; q < n; q++) out[q] = base[q] * exp_clamped(scale * bounded(p[q]));
    else
        for (idx q = 0; q < n; q++) out[q] = base[q] + scale * bounded(p[q]);
}

int ssog_terms_forward(const real *raw, const real *mu0, const real *c0, const real *ll0, const real *gates, real *mu,
                       real *c, real *ll, idx T, idx P, idx o_mu, idx o_sigma, idx o_lambda, idx H, idx R, int threads) {
    const idx HR = H * R;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (idx t = 0; t < T; t++) {
        const real *p = raw + t * P;
        real *mu_t = mu + t * HR * 2, *c_t = c + t * HR * 2, *ll_t = ll + t * HR;
        if (o_mu < 0) memcpy(mu_t, mu0, sizeof(real) * HR * 2);
        else steer_block(p + o_mu, mu0, gates[0], 0, HR * 2, mu_t);
        if (o_sigma < 0) memcpy(c_t, c0, sizeof(real) * HR * 2);
        else steer_block(p + o_sigma, c0, -2 * gates[1], 1, HR * 2, c_t);
        if (o_lambda < 0) memcpy(ll_t, ll0, sizeof(real) * HR);
        else steer_block(p + o_lambda, ll0, gates[2], 0, HR, ll_t);
    }
    return 0;
}

/* The gradient of one tap's block from a token's ∂L/∂out (times `weight` when given: c for the exponential block,
 * whose ∂c/∂(scale·b) = c): ∂L/∂raw into g, the gate's per-element sums Σ dout·b into gate_sum, the base's Σ dout
 * into base_sum (the exponential block's is divided by the base at the end: ∂c/∂c0 = c/c0). */
INLINE void steer_block_grad(const real *restrict p, const real *restrict dout, const real *restrict weight, real scale,
                             idx n, real *restrict g, real *restrict gate_sum, real *restrict base_sum) {
    for (idx q = 0; q < n; q++) {
        const real b = bounded(p[q]), d = weight ? dout[q] * weight[q] : dout[q];
        base_sum[q] += d;
        gate_sum[q] += d * b;
        g[q] = scale * d * (1 - b * b);
    }
}

static void add_to(const real *restrict src, const real *restrict weight, idx n, real *restrict sum) {
    for (idx q = 0; q < n; q++) sum[q] += weight ? src[q] * weight[q] : src[q];
}

/* The gradients of ssog_terms_forward from ∂L/∂μ, ∂L/∂c, ∂L/∂log λ per token (T = B·N tokens, N per image): ∂L/∂raw
 * (T, P; zero outside the taps' blocks) and, per image, the sums over its tokens (so that no two threads write the
 * same element): partial (B, 5·H·R + 3) = [∂L/∂μ0 (H·R·2), ∂L/∂c0 (H·R·2), ∂L/∂log λ0 (H·R), ∂L/∂a, ∂L/∂s_σ,
 * ∂L/∂s_λ]; `work` (B, 5·H·R) holds the gates' per-element sums. */
int ssog_terms_backward(const real *raw, const real *c0, const real *gates, const real *c, const real *dmu,
                        const real *dc, const real *dll, real *draw, real *partial, real *work, idx B, idx N, idx P,
                        idx o_mu, idx o_sigma, idx o_lambda, idx H, idx R, int threads) {
    const idx HR = H * R, width = 5 * HR + 3;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (idx img = 0; img < B; img++) {
        real *sum = partial + img * width, *gate_mu = work + img * 5 * HR, *gate_sigma = gate_mu + 2 * HR;
        real *gate_ll = gate_mu + 4 * HR;
        memset(sum, 0, sizeof(real) * width);
        memset(gate_mu, 0, sizeof(real) * 5 * HR);
        for (idx t = img * N; t < (img + 1) * N; t++) {
            const real *p = raw + t * P, *c_t = c + t * HR * 2, *dmu_t = dmu + t * HR * 2, *dc_t = dc + t * HR * 2;
            const real *dll_t = dll + t * HR;
            real *g = draw + t * P;
            memset(g, 0, sizeof(real) * P);
            if (o_mu >= 0) steer_block_grad(p + o_mu, dmu_t, NULL, gates[0], HR * 2, g + o_mu, gate_mu, sum);
            else add_to(dmu_t, NULL, HR * 2, sum);
            if (o_sigma >= 0)
                steer_block_grad(p + o_sigma, dc_t, c_t, -2 * gates[1], HR * 2, g + o_sigma, gate_sigma, sum + 2 * HR);
            else add_to(dc_t, c_t, HR * 2, sum + 2 * HR);
            if (o_lambda >= 0) steer_block_grad(p + o_lambda, dll_t, NULL, gates[2], HR, g + o_lambda, gate_ll, sum + 4 * HR);
            else add_to(dll_t, NULL, HR, sum + 4 * HR);
        }
        double d_a = 0, d_sigma = 0, d_lambda = 0; /* each gate's sum over every element: in double */
        for (idx q = 0; q < HR * 2; q++) d_a += gate_mu[q], d_sigma += gate_sigma[q];
        for (idx q = 0; q < HR; q++) d_lambda += gate_ll[q];
        for (idx q = 0; q < HR * 2; q++) sum[2 * HR + q] /= c0[q];
        sum[5 * HR] = (real)d_a, sum[5 * HR + 1] = (real)(-2 * d_sigma), sum[5 * HR + 2] = (real)d_lambda;
    }
    return 0;
}

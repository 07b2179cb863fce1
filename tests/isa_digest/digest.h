/* xte_isa_digest (tests/isa_digest/): what its parts share. main.c says what the program does.
 *   harness.c        options, hashing, the case lines, allocation, the deterministic inputs
 *   quantize_gemm.c  quantize, dequantize, cast; the dense and grouped exact GEMM
 *   attention.c      attention forward / backward
 *   moe.c            MoE router, aux loss, token movement, SwiGLU, one-rank EP; the test hooks
 *   main.c           the groups in order, the TOTAL line
 * The cases and their order are those of the one file this was, so the digest's lines are
 * unchanged (tests/data/isa_digest_small.txt). */
#ifndef XTE_TESTS_ISA_DIGEST_H
#define XTE_TESTS_ISA_DIGEST_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xte/xte.h"

/* ================================================================== harness.c */

/* Value profiles of the generated inputs. */
enum {
  P_WILD, /* block magnitudes 2^-24..2^24, extreme / zero / constant blocks, NaN, inf, subnormals */
  P_FINITE, /* as WILD without NaN and inf */
  P_GEMM,   /* block magnitudes 2^-6..2^6, a few zero blocks and subnormal elements */
  P_UNIT,   /* [-1, 1) times the scale, an occasional zero / subnormal */
  P_TIES,   /* small integers / 8: many equal values */
  P_CLEAN   /* block magnitudes 2^-20..2^12 (fp16-safe), zero blocks, no NaN / inf / huge */
};

void case_begin(const char *fmt, ...);
void case_end(xte_status st, int reject_ok);
const char *dtn(xte_dtype dt);
uint16_t f2bf(float f);
uint16_t f2h(float f);
float from_bits(uint32_t u);
extern const char *g_dump;
extern int g_failed;
extern const char *g_filter;
extern int g_small;
extern int g_time;
extern uint64_t g_total;
extern int g_lines, g_unsupported;
void gen(void *p, xte_dtype dt, int64_t n, int prof, float scale);
void gen_e4m3_codes(uint8_t *p, int64_t n);
void gen_f32(float *p, int64_t n, int prof, float scale);
void *gen_new(xte_dtype dt, int64_t n, int prof, float scale);
int mem_mark(void);
void mem_release(int mark);
double now_s(void);
xte_tensor out2(const char *name, xte_dtype dt, int64_t r, int64_t c);
void out_buf(const char *name, void *p, size_t bytes, xte_dtype dt, int fill);
uint32_t rnd(void);
uint32_t rndn(uint32_t n);
int setup_ok(xte_status st, const char *what);
const void *shared_input(xte_dtype dt, int64_t n, int prof, float scale);
xte_tensor t1(void *p, xte_dtype dt, int64_t n);
xte_tensor t2(void *p, xte_dtype dt, int64_t r, int64_t c);
void *xalloc(size_t bytes);

/* ================================================================== quantize_gemm.c */

enum { C_ROW = 1, C_COL = 2, C_BOTH = 3 };

void cast_cases(void);
const char *copies_name(int c);
void gemm_cases(void);
void grouped_cases(void);
const char *layout_name(xte_scale_layout l);
xte_status make_q(xte_qtensor *q, int64_t M, int64_t K, xte_scaling_mode mode, xte_recipe rec,
                  xte_scale_layout lay, xte_dtype qdt, int copies, xte_dtype sdt, int as_out);
const char *mode_name(xte_scaling_mode m);
void quantize_cases(void);
const char *recipe_name(xte_recipe r);

/* ================================================================== attention.c */

typedef struct aspec {
  xte_attn_layout layout;
  xte_dtype dt;     /* Q, K, V */
  xte_dtype out_dt; /* O (e4m3: bf16 / fp16 / fp32), else dt */
  int64_t b, sq, skv, hq, hkv, dqk, dv;
  xte_attn_mask mask;
  int64_t wl, wr;
  float softcap, scale;
  int alibi, pad, descale;
  int nlen;             /* THD sequences */
  int32_t lq[8], lk[8]; /* THD lengths; BSHD padding lengths */
  int specials;
  const char *tag;
} aspec;

aspec aspec_make(xte_dtype dt, int64_t b, int64_t s, int64_t hq, int64_t hkv, int64_t d,
                 xte_attn_mask mask);
void attention_cases(void);
void attn_both(const aspec *a);
void attn_case(const aspec *a, int bwd);

/* ================================================================== moe.c */
void ep_cases(void);
void internal_cases(void);
void permute_cases(void);
void router_cases(void);
void swiglu_cases(void);

#endif /* XTE_TESTS_ISA_DIGEST_H */

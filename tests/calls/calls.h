/* One table of valid calls to every public entry point (CPU backend, NULL stream), shared by the
 * plain-C runners of tests/calls (no Criterion, so they also run under ThreadSanitizer):
 * alloc_faults.c (every allocation made to fail in turn) and thread_races.c (the same bytes for
 * every pool thread count; concurrent application threads).
 *
 * A case's setup allocates its inputs (deterministic pseudo-random data, with NaN / inf /
 * subnormals where the call takes them) and its outputs, and lists the output buffers; run makes
 * exactly one library call (or, for streams and memory, one short sequence) and returns its
 * status. run never writes anything but the listed outputs, so a case can be run again and again
 * on the same context (inputs are never overwritten). */
#ifndef XTE_TESTS_CALLS_H
#define XTE_TESTS_CALLS_H

#include <stddef.h>
#include <stdint.h>
#include <xte/xte.h>

#define CALLS_MAX_BUFS 48
#define CALLS_MAX_OUT 16

typedef struct calls_out {
  void *p;
  size_t bytes;
  const char *name;
} calls_out;

typedef struct calls_ctx {
  void *bufs[CALLS_MAX_BUFS]; /* everything calls_alloc gave, freed by calls_free */
  int nbufs;
  calls_out out[CALLS_MAX_OUT]; /* the bytes a run may write */
  int nout;
  uint64_t rng;
  void *state;                          /* the case's own struct (calls_alloc'd) */
  void (*cleanup)(struct calls_ctx *c); /* releases what is not a buffer (an EP group), or NULL */
  char err[160];                        /* why a setup failed */
} calls_ctx;

typedef struct calls_case {
  const char *name;
  int (*setup)(calls_ctx *c); /* 0: ready; else c->err says why */
  xte_status (*run)(calls_ctx *c);
} calls_case;

extern const calls_case calls_table[];
extern const int calls_count;

/* 64-byte aligned, zeroed, at least one byte; freed by calls_free. NULL when out of slots. */
void *calls_alloc(calls_ctx *c, size_t bytes);
/* Lists [p, p + bytes) as an output of the case. */
void calls_output(calls_ctx *c, void *p, size_t bytes, const char *name);
/* Frees everything of the context (and zeroes it). */
void calls_free(calls_ctx *c);

/* setup of case i into a fresh context; 0 on success (else prints why and frees). */
int calls_setup(int i, calls_ctx *c);

/* The sentinel pattern: byte i of output o. */
static inline uint8_t calls_sentinel(int o, size_t i) {
  return (uint8_t)(0xA5u ^ (uint8_t)(i * 37u + (size_t)o * 101u + (i >> 8) * 11u));
}
void calls_fill_sentinel(calls_ctx *c);
/* Total output bytes; calls_snapshot copies them all, in order, into dst. */
size_t calls_out_bytes(const calls_ctx *c);
void calls_snapshot(const calls_ctx *c, uint8_t *dst);
/* The first byte where the outputs differ from snap (-1: none); *o / *off name it. */
int64_t calls_compare(const calls_ctx *c, const uint8_t *snap, int *o, size_t *off);
/* The first output byte that is not the sentinel (-1: none). */
int64_t calls_check_sentinel(const calls_ctx *c, int *o, size_t *off);

/* Does name contain the filter (NULL or "" matches everything)? */
int calls_match(const char *name, const char *filter);
/* The first argument that is not an option (options such as ctest's "--jobs 1" are ignored,
 * with their values), or NULL. */
const char *calls_filter(int argc, char **argv);

#endif

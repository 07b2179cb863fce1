/* The EP transport of the GPU plugins over the vendor's collective library (NCCL for CUDA, MCCL
 * for MUSA), loaded with dlopen (no link-time dependency): the library's few types are declared
 * here by their ABI (an int result, an opaque communicator pointer, a stream pointer, the uint8
 * datatype 1), their functions found with dlsym. Written against a runtime policy RT (device
 * memory, copies, the block move of src/cuda/ep_kernels.cuh, the native stream) so that
 * src/cuda/ep_nccl.cu instantiates it with the CUDA runtime and the host SIMT runner
 * (tests/simt/simt_plugin.cpp) with host memory and a fake library (tests/simt/fake_nccl.c).
 *
 *  allgather / alltoallv (host memory: the agreement record, prepare's counts and routing): staged
 *    through the device buffers, one grouped send / receive per peer (allgather: the library's
 *    all-gather), read back and synchronized.
 *  alltoallw (device memory, the rows): the blocks for each peer packed back to back into the send
 *    staging buffer by one block-move launch, one grouped send / receive per peer, the received
 *    streams unpacked into their blocks by a second launch; a rank's blocks to itself are unpacked
 *    straight from its send staging.
 *
 * RT (static members; h is a backend stream handle):
 *   xte_status dalloc(void *h, size_t bytes, void **p)      device memory of h's device
 *   void dfree(void *h, void *p)
 *   xte_status copy(void *h, void *dst, const void *src, size_t n, int kind)  enqueued (0: host
 *                                                           to device, 1: device to host)
 *   xte_status sync(void *h)
 *   xte_status blocks(void *h, const xte_ep_block *b, int64_t n)
 *   void *native(void *h)                                   the stream the library takes
 *   int device(void *h)                                     h's device
 *   const xte_core_services *svc() */
#ifndef XTE_EP_CCL_H
#define XTE_EP_CCL_H

#include <dlfcn.h>
#include <new>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xte_backend.h"
#include "xte_ep_ops.h"

/* The library of this build (src/musa/xte_musa_compat.h names MCCL's). */
#if defined(__MUSACC__) || defined(XTE_MUSA)
#include "musa/xte_musa_compat.h"
#endif
#ifndef XTE_CCL_NAME
#define XTE_CCL_NAME "nccl"            /* transport name, symbol prefix */
#define XTE_CCL_LIB "libnccl.so.2"     /* dlopen'ed */
#define XTE_CCL_ENV "XTE_NCCL_LIBRARY" /* overrides XTE_CCL_LIB */
#endif
#ifndef XTE_CCL_MIN_VERSION
#define XTE_CCL_MIN_VERSION 2700 /* NCCL 2.7: grouped send / receive */
#endif

typedef int xte_ccl_result; /* ncclResult_t: 0 success */
#define XTE_CCL_UINT8 1     /* ncclUint8 */

/* The library's functions (the communicator and the stream as opaque pointers). */
struct xte_ccl_lib {
  void *dl = nullptr;
  xte_ccl_result (*get_version)(int *) = nullptr;
  xte_ccl_result (*group_start)(void) = nullptr;
  xte_ccl_result (*group_end)(void) = nullptr;
  xte_ccl_result (*send)(const void *, size_t, int, int, void *, void *) = nullptr;
  xte_ccl_result (*recv)(void *, size_t, int, int, void *, void *) = nullptr;
  xte_ccl_result (*all_gather)(const void *, void *, size_t, int, void *, void *) = nullptr;
  xte_ccl_result (*count)(void *, int *) = nullptr;
  xte_ccl_result (*user_rank)(void *, int *) = nullptr;
  const char *(*error_string)(xte_ccl_result) = nullptr;
  xte_ccl_result (*async_error)(void *, xte_ccl_result *) = nullptr;
  xte_ccl_result (*cu_device)(void *, int *) = nullptr; /* optional */
};

template <class F>
static inline int xte_ccl_sym(void *dl, const char *name, F *f) {
  void *p = dlsym(dl, name);
  memcpy(f, &p, sizeof p);
  return p != nullptr;
}

/* Loads the library (the XTE_CCL_ENV path, else XTE_CCL_LIB). XTE_ERROR_UNSUPPORTED with the
 * reason recorded when it is missing, incomplete or older than XTE_CCL_MIN_VERSION. */
static inline xte_status xte_ccl_open(const xte_core_services *svc, xte_ccl_lib *L) {
  const char *env = getenv(XTE_CCL_ENV);
  const char *path = env && env[0] ? env : XTE_CCL_LIB;
  const char *miss = nullptr;
  int v = 0;
  L->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!L->dl) {
    const char *e = dlerror();
    return svc->set_error(
        XTE_ERROR_UNSUPPORTED,
        "the " XTE_CCL_NAME " transport needs %s (%s; set " XTE_CCL_ENV " to its path): %s", path,
        env && env[0] ? "from " XTE_CCL_ENV : "not found by the loader", e ? e : "dlopen failed");
  }
#define XTE_CCL_NEED(field, sym) \
  if (!miss && !xte_ccl_sym(L->dl, XTE_CCL_NAME sym, &L->field)) miss = XTE_CCL_NAME sym
  XTE_CCL_NEED(get_version, "GetVersion");
  XTE_CCL_NEED(group_start, "GroupStart");
  XTE_CCL_NEED(group_end, "GroupEnd");
  XTE_CCL_NEED(send, "Send");
  XTE_CCL_NEED(recv, "Recv");
  XTE_CCL_NEED(all_gather, "AllGather");
  XTE_CCL_NEED(count, "CommCount");
  XTE_CCL_NEED(user_rank, "CommUserRank");
  XTE_CCL_NEED(error_string, "GetErrorString");
  XTE_CCL_NEED(async_error, "CommGetAsyncError");
#undef XTE_CCL_NEED
  (void)xte_ccl_sym(L->dl, XTE_CCL_NAME "CommCuDevice", &L->cu_device);
  if (!miss && (L->get_version(&v) != 0 || v < XTE_CCL_MIN_VERSION)) {
    dlclose(L->dl);
    L->dl = nullptr;
    return svc->set_error(XTE_ERROR_UNSUPPORTED,
                          "%s is version code %d: the " XTE_CCL_NAME
                          " transport needs %d or later (grouped send / receive)",
                          path, v, XTE_CCL_MIN_VERSION);
  }
  if (miss) {
    dlclose(L->dl);
    L->dl = nullptr;
    return svc->set_error(XTE_ERROR_UNSUPPORTED, "%s has no %s: not a usable " XTE_CCL_NAME, path,
                          miss);
  }
  return XTE_SUCCESS;
}

template <class RT>
struct xte_ep_ccl {
  xte_ccl_lib lib;
  void *comm = nullptr;   /* the caller's communicator (borrowed) */
  void *stream = nullptr; /* bound stream handle */
  int rank = 0, size = 0;
  void *dbuf[2] = {nullptr, nullptr}; /* send / receive staging (device) */
  size_t dbytes[2] = {0, 0};
  xte_ep_block *list = nullptr; /* host move list */
  int64_t list_cap = 0;
  int64_t *tot = nullptr; /* [4 * size]: send / receive bytes and offsets per peer */

  xte_status check(xte_ccl_result r, const char *what) {
    if (r == 0) return XTE_SUCCESS;
    return RT::svc()->set_error(XTE_ERROR_DEVICE, XTE_CCL_NAME ": %s: %s (%d)", what,
                                lib.error_string ? lib.error_string(r) : "error", r);
  }
  /* after the stream finished: an error the library met while running */
  xte_status async_check() {
    xte_ccl_result a = 0;
    xte_status st = check(lib.async_error(comm, &a), "CommGetAsyncError");
    if (st == XTE_SUCCESS && a != 0) st = check(a, "asynchronous error");
    return st;
  }
  xte_status grow(int i, size_t bytes) {
    void *p = nullptr;
    if (bytes <= dbytes[i]) return XTE_SUCCESS;
    if (dbuf[i]) {
      xte_status st = RT::sync(stream); /* enqueued work may still use the old buffer */
      if (st != XTE_SUCCESS) return st;
    }
    if (RT::dalloc(stream, bytes, &p) != XTE_SUCCESS) return XTE_ERROR_OUT_OF_MEMORY;
    RT::dfree(stream, dbuf[i]);
    dbuf[i] = p;
    dbytes[i] = bytes;
    return XTE_SUCCESS;
  }
  xte_status grow_list(int64_t n) {
    xte_ep_block *p;
    if (n <= list_cap) return XTE_SUCCESS;
    p = (xte_ep_block *)realloc(list, (size_t)n * sizeof *list);
    if (!p) return RT::svc()->set_error(XTE_ERROR_OUT_OF_MEMORY, XTE_CCL_NAME ": out of memory");
    list = p;
    list_cap = n;
    return XTE_SUCCESS;
  }
  /* one grouped send / receive per peer (not to itself): stot / rtot bytes at soff / roff */
  xte_status exchange(const char *sbase, const int64_t *stot, const int64_t *soff, char *rbase,
                      const int64_t *rtot, const int64_t *roff) {
    xte_status st = check(lib.group_start(), "GroupStart");
    xte_status st2;
    int p;
    if (st != XTE_SUCCESS) return st;
    for (p = 0; p < size && st == XTE_SUCCESS; p++) {
      if (p == rank) continue;
      if (stot[p])
        st = check(
            lib.send(sbase + soff[p], (size_t)stot[p], XTE_CCL_UINT8, p, comm, RT::native(stream)),
            "Send");
      if (st == XTE_SUCCESS && rtot[p])
        st = check(
            lib.recv(rbase + roff[p], (size_t)rtot[p], XTE_CCL_UINT8, p, comm, RT::native(stream)),
            "Recv");
    }
    st2 = check(lib.group_end(), "GroupEnd"); /* always closed */
    return st != XTE_SUCCESS ? st : st2;
  }

  xte_status reserve(int64_t nblocks, int64_t sbytes, int64_t rbytes) {
    xte_status st = XTE_SUCCESS;
    if (nblocks < 0 || sbytes < 0 || rbytes < 0)
      return RT::svc()->set_error(XTE_ERROR_INTERNAL, XTE_CCL_NAME ": negative reservation");
    if (grow(0, (size_t)sbytes) != XTE_SUCCESS || grow(1, (size_t)rbytes) != XTE_SUCCESS)
      st = RT::svc()->set_error(XTE_ERROR_OUT_OF_MEMORY,
                                XTE_CCL_NAME
                                ": out of device memory for %lld + %lld bytes of "
                                "staging",
                                (long long)sbytes, (long long)rbytes);
    if (st == XTE_SUCCESS) st = grow_list(nblocks + 1);
    return st;
  }

  xte_status allgather(const void *send, void *recv, size_t bytes) {
    xte_status st;
    size_t all = bytes * (size_t)size;
    if ((st = reserve(0, (int64_t)bytes, (int64_t)all)) != XTE_SUCCESS) return st;
    if (!bytes) return XTE_SUCCESS;
    if ((st = RT::copy(stream, dbuf[0], send, bytes, 0)) != XTE_SUCCESS) return st;
    st = check(lib.all_gather(dbuf[0], dbuf[1], bytes, XTE_CCL_UINT8, comm, RT::native(stream)),
               "AllGather");
    if (st == XTE_SUCCESS) st = RT::copy(stream, recv, dbuf[1], all, 1);
    if (st == XTE_SUCCESS) st = RT::sync(stream);
    if (st == XTE_SUCCESS) st = async_check();
    return st;
  }

  xte_status alltoallv(const void *send, const int64_t *scount, const int64_t *sdispl, void *recv,
                       const int64_t *rcount, const int64_t *rdispl, size_t unit) {
    int64_t *st_ = tot, *so = tot + size, *rt = tot + 2 * size, *ro = tot + 3 * size, s = 0, r = 0;
    xte_status st;
    int p;
    for (p = 0; p < size; p++) {
      st_[p] = scount[p] * (int64_t)unit;
      so[p] = s;
      s += st_[p];
      rt[p] = rcount[p] * (int64_t)unit;
      ro[p] = r;
      r += rt[p];
    }
    if (st_[rank] != rt[rank])
      return RT::svc()->set_error(XTE_ERROR_INTERNAL,
                                  XTE_CCL_NAME ": alltoallv sends itself %lld bytes, expects %lld",
                                  (long long)st_[rank], (long long)rt[rank]);
    if ((st = reserve(0, s, r)) != XTE_SUCCESS) return st;
    for (p = 0; p < size; p++)
      if (p != rank && st_[p]) {
        st = RT::copy(stream, (char *)dbuf[0] + so[p],
                      (const char *)send + sdispl[p] * (int64_t)unit, (size_t)st_[p], 0);
        if (st != XTE_SUCCESS) return st;
      }
    st = exchange((const char *)dbuf[0], st_, so, (char *)dbuf[1], rt, ro);
    for (p = 0; p < size && st == XTE_SUCCESS; p++)
      if (p != rank && rt[p])
        st = RT::copy(stream, (char *)recv + rdispl[p] * (int64_t)unit, (char *)dbuf[1] + ro[p],
                      (size_t)rt[p], 1);
    if (st == XTE_SUCCESS) st = RT::sync(stream);
    if (st == XTE_SUCCESS) st = async_check();
    if (st == XTE_SUCCESS && st_[rank])
      memmove((char *)recv + rdispl[rank] * (int64_t)unit,
              (const char *)send + sdispl[rank] * (int64_t)unit, (size_t)st_[rank]);
    return st;
  }

  xte_status alltoallw(const intptr_t *saddr, const int64_t *slen, const int64_t *soff,
                       const intptr_t *raddr, const int64_t *rlen, const int64_t *roff) {
    int64_t *st_ = tot, *so = tot + size, *rt = tot + 2 * size, *ro = tot + 3 * size, s = 0, r = 0,
            b, n = 0, pos;
    xte_status st;
    int p;
    for (p = 0; p < size; p++) {
      st_[p] = rt[p] = 0;
      for (b = soff[p]; b < soff[p + 1]; b++) st_[p] += slen[b];
      for (b = roff[p]; b < roff[p + 1]; b++) rt[p] += rlen[b];
      so[p] = s;
      s += st_[p];
      ro[p] = r;
      r += rt[p];
    }
    if (st_[rank] != rt[rank])
      return RT::svc()->set_error(XTE_ERROR_INTERNAL,
                                  XTE_CCL_NAME ": alltoallw sends itself %lld bytes, expects %lld",
                                  (long long)st_[rank], (long long)rt[rank]);
    b = soff[size] > roff[size] ? soff[size] : roff[size];
    if ((st = reserve(b, s, r)) != XTE_SUCCESS) return st;
    /* pack every peer's blocks (its own too) back to back */
    for (b = 0; b < soff[size]; b++)
      if (slen[b] > 0) {
        list[n].src = (const void *)saddr[b];
        list[n].dst = nullptr;
        list[n].len = slen[b];
        n++;
      }
    for (pos = 0, b = 0; b < n; b++) {
      list[b].dst = (char *)dbuf[0] + pos;
      pos += list[b].len;
    }
    if (n && (st = RT::blocks(stream, list, n)) != XTE_SUCCESS) return st;
    st = exchange((const char *)dbuf[0], st_, so, (char *)dbuf[1], rt, ro);
    if (st != XTE_SUCCESS) return st;
    /* unpack each peer's stream in order; its own from the send staging */
    n = 0;
    for (p = 0; p < size; p++) {
      const char *src = p == rank ? (const char *)dbuf[0] + so[p] : (const char *)dbuf[1] + ro[p];
      for (b = roff[p]; b < roff[p + 1]; b++)
        if (rlen[b] > 0) {
          list[n].src = src;
          list[n].dst = (void *)raddr[b];
          list[n].len = rlen[b];
          src += rlen[b];
          n++;
        }
    }
    if (n) st = RT::blocks(stream, list, n);
    return st;
  }

  void destroy() {
    if (stream && (dbuf[0] || dbuf[1])) (void)RT::sync(stream);
    RT::dfree(stream, dbuf[0]);
    RT::dfree(stream, dbuf[1]);
    free(list);
    free(tot);
    if (lib.dl) dlclose(lib.dl);
  }

  /* the table's functions */
  static xte_status t_allgather(void *c, const void *s, void *r, size_t bytes) {
    return ((xte_ep_ccl *)c)->allgather(s, r, bytes);
  }
  static xte_status t_alltoallv(void *c, const void *s, const int64_t *sc, const int64_t *sd,
                                void *r, const int64_t *rc, const int64_t *rd, size_t unit) {
    return ((xte_ep_ccl *)c)->alltoallv(s, sc, sd, r, rc, rd, unit);
  }
  static xte_status t_alltoallw(void *c, const intptr_t *sa, const int64_t *sl, const int64_t *so,
                                const intptr_t *ra, const int64_t *rl, const int64_t *ro) {
    return ((xte_ep_ccl *)c)->alltoallw(sa, sl, so, ra, rl, ro);
  }
  static xte_status t_reserve(void *c, int64_t nb, int64_t sb, int64_t rb) {
    return ((xte_ep_ccl *)c)->reserve(nb, sb, rb);
  }
  static void t_bind(void *c, void *stream) { ((xte_ep_ccl *)c)->stream = stream; }
  static void t_destroy(void *c) {
    xte_ep_ccl *x = (xte_ep_ccl *)c;
    x->destroy();
    delete x;
  }

  /* ops->ep->transport_create: comm points to the library's communicator */
  static xte_status create(const void *comm, void *stream, xte_ep_transport *t) {
    const xte_core_services *svc = RT::svc();
    xte_ep_ccl *c;
    xte_status st;
    int dev = -1;
    if (!comm) return svc->set_error(XTE_ERROR_NULL_POINTER, "comm is NULL");
    c = new (std::nothrow) xte_ep_ccl;
    if (!c) return svc->set_error(XTE_ERROR_OUT_OF_MEMORY, XTE_CCL_NAME ": out of memory");
    st = xte_ccl_open(svc, &c->lib);
    if (st != XTE_SUCCESS) {
      delete c;
      return st;
    }
    c->comm = *(void *const *)comm;
    c->stream = stream;
    if (!c->comm) st = svc->set_error(XTE_ERROR_NULL_POINTER, "*comm is NULL (no communicator)");
    if (st == XTE_SUCCESS) st = c->check(c->lib.count(c->comm, &c->size), "CommCount");
    if (st == XTE_SUCCESS) st = c->check(c->lib.user_rank(c->comm, &c->rank), "CommUserRank");
    if (st == XTE_SUCCESS && (c->size < 1 || c->rank < 0 || c->rank >= c->size))
      st = svc->set_error(XTE_ERROR_INVALID_ARGUMENT, XTE_CCL_NAME ": rank %d of %d ranks", c->rank,
                          c->size);
    if (st == XTE_SUCCESS && c->lib.cu_device &&
        c->check(c->lib.cu_device(c->comm, &dev), "CommCuDevice") == XTE_SUCCESS &&
        dev != RT::device(stream))
      st = svc->set_error(XTE_ERROR_INVALID_ARGUMENT,
                          "stream is on device %d, the communicator on device %d",
                          RT::device(stream), dev);
    if (st == XTE_SUCCESS &&
        !(c->tot = (int64_t *)calloc((size_t)c->size * 4 + 1, sizeof(int64_t))))
      st = svc->set_error(XTE_ERROR_OUT_OF_MEMORY, XTE_CCL_NAME ": out of memory");
    if (st != XTE_SUCCESS) {
      c->destroy();
      delete c;
      return st;
    }
    memset(t, 0, sizeof *t);
    t->name = XTE_CCL_NAME;
    t->rank = c->rank;
    t->size = c->size;
    t->ctx = c;
    t->allgather = t_allgather;
    t->alltoallv = t_alltoallv;
    t->alltoallw = t_alltoallw;
    t->reserve = t_reserve;
    t->bind = t_bind;
    t->destroy = t_destroy;
    return XTE_SUCCESS;
  }
};

#endif /* XTE_EP_CCL_H */

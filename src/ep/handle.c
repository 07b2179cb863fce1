/* The routing handle of expert parallelism: its layout (a header, then the arrays at offsets fixed
 * by the group) and the check that a handle was prepared by a group. */
#include "ep/ep_core.h"

static int add_sz(size_t *acc, size_t n, size_t elem) {
  size_t b;
  if (__builtin_mul_overflow(n, elem, &b)) return 0;
  b = (b + 63) & ~(size_t)63;
  if (b < n * elem || __builtin_add_overflow(*acc, b, acc)) return 0;
  return 1;
}

/* Lays out the handle at base (NULL: only computes the size into *bytes). */
int xte_ep_handle_layout(const struct xte_ep_group_s *g, char *base, xte_ep_handle *eh,
                         size_t *bytes) {
  size_t off = 0, R = (size_t)g->R, R1 = R + 1, K = (size_t)g->K, T = (size_t)g->Tmax;
  size_t kr = K < R ? K : R, RT;
  size_t o[20];
  int n = 0;
  if (__builtin_mul_overflow(R, T, &RT)) return 0;
#define EP_ARR(cnt, elem)                       \
  do {                                          \
    o[n++] = off;                               \
    if (!add_sz(&off, (cnt), (elem))) return 0; \
  } while (0)
  EP_ARR(1, sizeof(xte_ep_hdr));
  EP_ARR(R, 8);
  EP_ARR(R1, 8);
  EP_ARR(R, 8);
  EP_ARR(R1, 8);
  EP_ARR(R, 8);
  EP_ARR(R1, 8);
  EP_ARR(R, 8);
  EP_ARR(R1, 8);
  EP_ARR((size_t)g->El, 8);
  EP_ARR((size_t)g->El + 1, 8);
  EP_ARR((size_t)g->E, 8);
  EP_ARR((size_t)g->E, 8);
  EP_ARR((size_t)g->E, 8);
  if (T && kr > SIZE_MAX / T) return 0;
  EP_ARR(T * kr, 4);
  if (T && K > SIZE_MAX / T) return 0;
  EP_ARR(T * K, 4);
  EP_ARR(T * K, 4);
  if (RT && K > SIZE_MAX / RT) return 0;
  EP_ARR(RT * K, 4);
  EP_ARR(RT * K, 4);
  EP_ARR(RT, 4);
#undef EP_ARR
  *bytes = off;
  if (base && eh) {
    eh->h = (xte_ep_hdr *)(base + o[0]);
    eh->send_cnt = (int64_t *)(base + o[1]);
    eh->send_off = (int64_t *)(base + o[2]);
    eh->slot_cnt = (int64_t *)(base + o[3]);
    eh->slot_off = (int64_t *)(base + o[4]);
    eh->recv_cnt = (int64_t *)(base + o[5]);
    eh->recv_off = (int64_t *)(base + o[6]);
    eh->ret_cnt = (int64_t *)(base + o[7]);
    eh->ret_off = (int64_t *)(base + o[8]);
    eh->tpe = (int64_t *)(base + o[9]);
    eh->poff = (int64_t *)(base + o[10]);
    eh->ecnt_out = (int64_t *)(base + o[11]);
    eh->ein_cnt = (int64_t *)(base + o[12]);
    eh->ein_row = (int64_t *)(base + o[13]);
    eh->send_tok = (int32_t *)(base + o[14]);
    eh->topk = (int32_t *)(base + o[15]);
    eh->src_row_map = (int32_t *)(base + o[16]);
    eh->recv_topk = (int32_t *)(base + o[17]);
    eh->row_map = (int32_t *)(base + o[18]);
    eh->recv_tok = (int32_t *)(base + o[19]);
  }
  return 1;
}

/* A handle prepared by group (and dispatched when need_dispatch). */
xte_status xte_ep_get_handle(struct xte_ep_group_s *g, void *handle, int need_dispatch,
                             xte_ep_handle *eh) {
  size_t bytes;
  XTE_CHECK_PTR(handle, "handle");
  if ((uintptr_t)handle % 8)
    return xte_set_error(XTE_ERROR_ALIGNMENT, "handle is not 8-byte aligned");
  xte_ep_handle_layout(g, (char *)handle, eh, &bytes);
  if (eh->h->magic != XTE_EP_MAGIC || eh->h->group != g || !eh->h->prepared)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                         "handle was not prepared by xte_ep_prepare on this group");
  if (need_dispatch && !eh->h->dispatched)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                         "handle: xte_ep_dispatch has not run on it (combine and the backwards "
                         "use its rows)");
  return XTE_SUCCESS;
}

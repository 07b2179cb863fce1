/* The ranks' agreement: each collective first runs its local checks, then every rank's status and
 * signature are gathered, so that one failing rank fails all of them before any data moves. */
#include <stdio.h>

#include "ep/ep_core.h"

xte_status xte_ep_agree(struct xte_ep_group_s *g, xte_status st, const int64_t *sig,
                        const char *const *sig_names) {
  xte_ep_agree_msg me;
  xte_status ts;
  int r, i;
  memset(&me, 0, sizeof me);
  me.status = (int32_t)st;
  if (sig)
    for (i = 0; i < XTE_EP_NSIG; i++) me.sig[i] = sig[i];
  if (st != XTE_SUCCESS) snprintf(me.msg, sizeof me.msg, "%s", xte_last_error());
  ts = g->tr.allgather(g->tr.ctx, &me, g->agree, sizeof me);
  if (ts != XTE_SUCCESS) return ts;
  for (r = 0; r < g->R; r++) {
    if (g->agree[r].status == XTE_SUCCESS) continue;
    if (r == g->tr.rank) return st; /* our own message stands */
    return xte_set_error((xte_status)g->agree[r].status, "rank %d failed its checks: %s", r,
                         g->agree[r].msg);
  }
  if (st != XTE_SUCCESS) return st; /* cannot happen: our status was gathered */
  if (sig_names)
    for (i = 0; i < XTE_EP_NSIG; i++) {
      if (!sig_names[i]) continue;
      for (r = 1; r < g->R; r++)
        if (g->agree[r].sig[i] != g->agree[0].sig[i])
          return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                               "%s differs between ranks: %lld on rank 0, %lld on rank %d",
                               sig_names[i], (long long)g->agree[0].sig[i],
                               (long long)g->agree[r].sig[i], r);
    }
  return XTE_SUCCESS;
}

/* xte_ep_agree() that also releases the call's two workspaces when the ranks do not go ahead. */
xte_status xte_ep_agree_or_free(struct xte_ep_group_s *g, xte_status st, const int64_t *sig,
                                const char *const *names, void *ws_a, void *ws_b) {
  st = xte_ep_agree(g, st, sig, names);
  if (st != XTE_SUCCESS) {
    xte_ep_ws_free(g, ws_a);
    xte_ep_ws_free(g, ws_b);
  }
  return st;
}

#define _GNU_SOURCE /* cpu_set_t, sched_getaffinity, pthread_setaffinity_np (sysfs fallback) */
/* CPU thread pool sized and pinned from the machine's topology (XTE_NUM_THREADS overrides):
 * hwloc when the build found it (XTE_HAVE_HWLOC), else a sysconf / sysfs fallback that computes
 * the same numbers (see topology_sysfs). Static partition: the work split depends only on n and
 * the thread count, never on timing. Waiting, a worker (for the next job) and the caller (for the
 * workers) spin a while before they sleep (cpu/xte_spin.h).
 */
#ifdef XTE_HAVE_HWLOC
#include <hwloc.h>
#endif
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/xte_cpu.h"
#include "cpu/xte_spin.h"
#include "xte_internal.h"

#define XTE_POOL_MAX 256

typedef struct pool {
  pthread_mutex_t mu;
  pthread_cond_t wake, done;
  pthread_t tid[XTE_POOL_MAX];
  int created;          /* workers started (tid 1..created) */
  _Atomic int nthreads; /* threads a job uses, caller included */
  _Atomic unsigned long gen;
  _Atomic unsigned long pending;
  xte_range_fn fn;
  void *ctx;
  int64_t n;
  int job_threads;
  int per_thread; /* 1: fn(ctx, t, t+1, t) for each thread */
} pool;

static pool P;

static pthread_once_t topo_once = PTHREAD_ONCE_INIT;
static int topo_ok, phys_cores = 1;
static size_t cache_l1d = 32768, cache_l2 = 524288, cache_l3 = 0;
static char cpu_name[128] = "unknown";
static _Thread_local int in_worker;

#ifdef XTE_HAVE_HWLOC
static hwloc_topology_t topo;

static void topology_hwloc(void) {
  hwloc_obj_t o;
  int n;
  if (hwloc_topology_init(&topo) == 0 && hwloc_topology_load(topo) == 0) {
    topo_ok = 1;
    n = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
    phys_cores = n > 0 ? n : 1;
    o = hwloc_get_obj_by_type(topo, HWLOC_OBJ_L1CACHE, 0);
    if (o && o->attr) cache_l1d = (size_t)o->attr->cache.size;
    o = hwloc_get_obj_by_type(topo, HWLOC_OBJ_L2CACHE, 0);
    if (o && o->attr) cache_l2 = (size_t)o->attr->cache.size;
    o = hwloc_get_obj_by_type(topo, HWLOC_OBJ_L3CACHE, 0);
    if (o && o->attr) cache_l3 = (size_t)o->attr->cache.size;
    o = hwloc_get_obj_by_type(topo, HWLOC_OBJ_PACKAGE, 0);
    if (o) {
      const char *m = hwloc_obj_get_info_by_name(o, "CPUModel");
      if (m) snprintf(cpu_name, sizeof cpu_name, "%s", m);
    }
  }
}

/* Worker me runs on the PUs of core me % cores (hwloc's logical order). */
static void bind_worker(int me) {
  int ncores;
  if (!topo_ok) return;
  ncores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  if (ncores > 0) {
    hwloc_obj_t core = hwloc_get_obj_by_type(topo, HWLOC_OBJ_CORE, me % ncores);
    if (core) hwloc_set_cpubind(topo, core->cpuset, HWLOC_CPUBIND_THREAD);
  }
}
#else
/* Without hwloc: the same numbers from sysconf and sysfs. The CPUs are the online ones this
 * process may run on (sched_getaffinity; hwloc drops the ones its cgroup disallows, which in a
 * container is the same set), else sysconf(_SC_NPROCESSORS_ONLN) CPUs 0..n-1. A physical core is
 * a distinct (topology/physical_package_id, topology/core_id) pair; cores are numbered by their
 * lowest CPU, as hwloc's logical order does. Caches: cpu0/cache/index<i>/ with level 1 and type
 * Data or Unified (hwloc's L1CACHE), level 2, level 3. The name: /proc/cpuinfo "model name" (what
 * hwloc's CPUModel holds on x86 Linux). */
#define XTE_MAX_CPUS CPU_SETSIZE
static int cpu_core[XTE_MAX_CPUS]; /* core index of each usable CPU, -1 if not usable */

static int read_sysfs(const char *path, char *buf, size_t n) {
  FILE *f = fopen(path, "r");
  size_t len;
  if (!f) return 0;
  len = fread(buf, 1, n - 1, f);
  fclose(f);
  buf[len] = '\0';
  while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == ' ')) buf[--len] = '\0';
  return len > 0;
}

static long read_sysfs_long(const char *path) {
  char buf[64], *end;
  long v;
  if (!read_sysfs(path, buf, sizeof buf)) return -1;
  v = strtol(buf, &end, 10);
  return end == buf ? -1 : v;
}

/* "48K", "2048K", "32M", "123": bytes, 0 when unreadable. */
static size_t parse_size(const char *s) {
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (end == s) return 0;
  if (*end == 'K' || *end == 'k') v <<= 10;
  if (*end == 'M' || *end == 'm') v <<= 20;
  if (*end == 'G' || *end == 'g') v <<= 30;
  return (size_t)v;
}

static void topology_sysfs(void) {
  static long pkg[XTE_MAX_CPUS], core[XTE_MAX_CPUS];
  cpu_set_t allowed;
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  int have_mask = sched_getaffinity(0, sizeof allowed, &allowed) == 0;
  int c, i, ncores = 0, any_topology = 0;
  char path[128], buf[256];

  if (online < 1) online = 1;
  for (c = 0; c < XTE_MAX_CPUS; c++) {
    int usable = have_mask ? CPU_ISSET(c, &allowed) : c < online;
    cpu_core[c] = -1;
    if (!usable) continue;
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/online", c);
    if (read_sysfs_long(path) == 0) continue; /* offline (cpu0 has no such file) */
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", c);
    pkg[c] = read_sysfs_long(path);
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/core_id", c);
    core[c] = read_sysfs_long(path);
    if (pkg[c] >= 0 && core[c] >= 0) any_topology = 1;
    /* CPUs are visited in increasing order: a core's index is its rank by lowest CPU */
    for (i = 0; i < c; i++)
      if (cpu_core[i] >= 0 && pkg[i] == pkg[c] && core[i] == core[c] && core[c] >= 0) break;
    cpu_core[c] = i < c ? cpu_core[i] : ncores++;
  }
  if (ncores == 0) { /* no usable CPU seen: count the online ones, unpinned */
    ncores = (int)online;
    for (c = 0; c < XTE_MAX_CPUS; c++) cpu_core[c] = -1;
  } else {
    topo_ok = any_topology;
  }
  phys_cores = ncores > 0 ? ncores : 1;

  for (i = 0; i < 16; i++) {
    long level;
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
    level = read_sysfs_long(path);
    if (level < 0) break;
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
    if (!read_sysfs(path, buf, sizeof buf) || strcmp(buf, "Instruction") == 0) continue;
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
    if (!read_sysfs(path, buf, sizeof buf) || parse_size(buf) == 0) continue;
    if (level == 1) cache_l1d = parse_size(buf);
    if (level == 2) cache_l2 = parse_size(buf);
    if (level == 3) cache_l3 = parse_size(buf);
  }

  {
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
      if (strncmp(line, "model name", 10) == 0) {
        char *v = strchr(line, ':'), *e;
        if (!v) break;
        for (v++; *v == ' ' || *v == '\t'; v++) continue;
        e = v + strlen(v);
        while (e > v && (e[-1] == '\n' || e[-1] == ' ')) *--e = '\0';
        if (*v) snprintf(cpu_name, sizeof cpu_name, "%s", v);
        break;
      }
    }
    if (f) fclose(f);
  }
}

/* Worker me runs on the CPUs of core me % cores. */
static void bind_worker(int me) {
  cpu_set_t set;
  int c, any = 0, target;
  if (!topo_ok) return;
  target = me % phys_cores;
  CPU_ZERO(&set);
  for (c = 0; c < XTE_MAX_CPUS; c++)
    if (cpu_core[c] == target) CPU_SET(c, &set), any = 1;
  if (any) pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}
#endif

static void init_topology(void) {
  int n;
  pthread_mutex_init(&P.mu, NULL);
  pthread_cond_init(&P.wake, NULL);
  pthread_cond_init(&P.done, NULL);
#ifdef XTE_HAVE_HWLOC
  topology_hwloc();
#else
  topology_sysfs();
#endif
  {
    const char *e = getenv("XTE_NUM_THREADS");
    n = e && *e ? atoi(e) : 0;
    if (n < 1) n = phys_cores;
    if (n > XTE_POOL_MAX) n = XTE_POOL_MAX;
    atomic_store(&P.nthreads, n);
  }
}

static void run_share(int t, int nt, xte_range_fn fn, void *ctx, int64_t n, int per_thread) {
  if (per_thread) {
    fn(ctx, t, t + 1, t);
    return;
  }
  {
    int64_t q = n / nt, r = n % nt;
    int64_t b = t * q + (t < r ? t : r);
    int64_t e = b + q + (t < r ? 1 : 0);
    if (b < e) fn(ctx, b, e, t);
  }
}

static void *worker(void *arg) {
  int me = (int)(intptr_t)arg;
  unsigned long seen = 0;
  in_worker = 1;
  bind_worker(me);
  for (;;) {
    xte_range_fn fn;
    void *ctx;
    int64_t n;
    int nt, pt;
    (void)xte_spin_wait(&P.gen, seen, 1);
    pthread_mutex_lock(&P.mu);
    while (atomic_load(&P.gen) == seen) pthread_cond_wait(&P.wake, &P.mu);
    seen = atomic_load(&P.gen);
    fn = P.fn;
    ctx = P.ctx;
    n = P.n;
    nt = P.job_threads;
    pt = P.per_thread;
    pthread_mutex_unlock(&P.mu);
    if (me < nt) {
      run_share(me, nt, fn, ctx, n, pt);
      if (atomic_fetch_sub(&P.pending, 1) == 1) { /* the last one: wake a sleeping caller */
        pthread_mutex_lock(&P.mu);
        pthread_cond_signal(&P.done);
        pthread_mutex_unlock(&P.mu);
      }
    }
  }
  return NULL;
}

static pthread_mutex_t job_mu = PTHREAD_MUTEX_INITIALIZER;

static int run_job(int64_t n, xte_range_fn fn, void *ctx, int per_thread, int max_threads) {
  int nt, t;
  pthread_once(&topo_once, init_topology);
  nt = atomic_load(&P.nthreads);
  if (max_threads > 0 && nt > max_threads) nt = max_threads;
  if (!per_thread && n < nt) nt = n > 0 ? (int)n : 1;
  if (in_worker || nt <= 1) {
    if (per_thread) {
      fn(ctx, 0, 1, 0);
      return 1;
    }
    if (n > 0) fn(ctx, 0, n, 0);
    return 1;
  }
  pthread_mutex_lock(&job_mu); /* one job at a time from any caller */
  pthread_mutex_lock(&P.mu);
  while (P.created < nt - 1) {
    int id = P.created + 1;
    if (pthread_create(&P.tid[id], NULL, worker, (void *)(intptr_t)id) != 0) break;
    P.created++;
  }
  if (P.created < nt - 1) nt = P.created + 1;
  P.fn = fn;
  P.ctx = ctx;
  P.n = n;
  P.per_thread = per_thread;
  P.job_threads = nt;
  atomic_store(&P.pending, (unsigned long)(nt - 1));
  atomic_fetch_add_explicit(&P.gen, 1, memory_order_release);
  pthread_cond_broadcast(&P.wake);
  pthread_mutex_unlock(&P.mu);
  in_worker = 1;
  run_share(0, nt, fn, ctx, n, per_thread);
  in_worker = 0;
  if (!xte_spin_wait(&P.pending, 0, 0)) {
    pthread_mutex_lock(&P.mu);
    while (atomic_load(&P.pending) > 0) pthread_cond_wait(&P.done, &P.mu);
    pthread_mutex_unlock(&P.mu);
  }
  pthread_mutex_unlock(&job_mu);
  (void)t;
  return nt;
}

void xte_parallel_for(int64_t n, xte_range_fn fn, void *ctx) {
  run_job(n, fn, ctx, 0, 0);
}

void xte_parallel_for_max(int64_t n, int max_threads, xte_range_fn fn, void *ctx) {
  run_job(n, fn, ctx, 0, max_threads);
}

int xte_parallel_threads(xte_range_fn fn, void *ctx) {
  return run_job(0, fn, ctx, 1, 0);
}

int xte_cpu_threads(void) {
  pthread_once(&topo_once, init_topology);
  return atomic_load(&P.nthreads);
}

xte_status xte_cpu_set_num_threads(int n) {
  pthread_once(&topo_once, init_topology);
  if (n < 0 || n > XTE_POOL_MAX)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "n = %d is outside [0, %d]", n, XTE_POOL_MAX);
  if (n == 0) {
    const char *e = getenv("XTE_NUM_THREADS");
    n = e && *e ? atoi(e) : 0;
    if (n < 1) n = phys_cores;
    if (n > XTE_POOL_MAX) n = XTE_POOL_MAX;
  }
  pthread_mutex_lock(&job_mu);
  atomic_store(&P.nthreads, n);
  pthread_mutex_unlock(&job_mu);
  xte_clear_error();
  return XTE_SUCCESS;
}

int xte_cpu_get_num_threads(void) {
  return xte_cpu_threads();
}

size_t xte_cpu_l1d(void) {
  pthread_once(&topo_once, init_topology);
  return cache_l1d;
}
size_t xte_cpu_l2(void) {
  pthread_once(&topo_once, init_topology);
  return cache_l2;
}
size_t xte_cpu_l3(void) {
  pthread_once(&topo_once, init_topology);
  return cache_l3;
}

void xte_cpu_fill_info(xte_backend_info *info) {
  pthread_once(&topo_once, init_topology);
  xte_cpu_isa_info(info);
  info->cpu_cores = phys_cores;
  info->cpu_threads = atomic_load(&P.nthreads);
  info->l1d_bytes = cache_l1d;
  info->l2_bytes = cache_l2;
  info->l3_bytes = cache_l3;
  snprintf(info->cpu_name, sizeof info->cpu_name, "%s", cpu_name);
}

/* A host SIMT runner for CUDA kernel text (a test harness, not a CUDA emulator).
 *
 * Included before a kernel header (e.g. src/cuda/quantize_kernels.cuh), it lets that text compile
 * as C++20 for the host and run there:
 *  - __global__ / __device__ / __host__ / __forceinline__ / __launch_bounds__ / __restrict__ map
 *    to host C++ (or to nothing);
 *  - __shared__ is `static`: one copy per kernel, which is per block because blocks run one at a
 *    time (launches from several host threads are serialized by a lock). Dynamic shared memory:
 *    XTE_DYNAMIC_SHARED(T, name) (CUDA: extern __shared__ T name[]), filled with 0xA5 before
 *    every block so that a kernel reading it before writing it sees garbage, as on a GPU;
 *  - threadIdx / blockIdx / blockDim / gridDim are thread_local dim3, warpSize a global;
 *  - a block's CUDA threads run either as fibers on the launching OS thread (the default: fast,
 *    deterministic, exact deadlock reports) or as the OS threads of a persistent pool (created
 *    once, grown to the largest block seen, reused by every block and launch; the engine of
 *    sanitized builds and of SIMT_ENGINE=threads, where ThreadSanitizer sees every CUDA thread
 *    and reports a shared-memory access that lacks its __syncthreads as a race). See
 *    simt::engine. __syncthreads is a barrier over the block's threads. A thread that leaves the
 *    kernel while others wait at a barrier (a divergent __syncthreads, which hangs or misbehaves
 *    on a GPU) aborts the run with a message, as does a barrier that some thread never reaches;
 *  - atomics (atomicAdd / Sub / Max / Min / Exch / CAS / And / Or / Xor) go through
 *    std::atomic_ref;
 *  - warp intrinsics (__shfl_sync, __shfl_up_sync, __shfl_down_sync, __shfl_xor_sync,
 *    __ballot_sync, __any_sync, __all_sync, __syncwarp, __activemask) exchange values between the
 *    lanes of a warp of simt::set_warp_size() lanes (32 by default; 64 or 128 model MUSA's
 *    mp_21 / mp_22 128-lane warps). Masks must name every live lane of the warp (partial masks
 *    abort); __ballot_sync needs a warp of at most 64 lanes (its mask is 64 bits here);
 *  - simt::launch(grid, block, smem_bytes, kernel, args...) runs the blocks one after the other
 *    (x fastest, then y, then z), each with blockDim threads, and returns simt::ok or
 *    simt::invalid_configuration (what a GPU launch would refuse: an empty grid or block, more
 *    than 1024 threads per block, grid.y / grid.z past 65535, dynamic shared memory past 48 KiB).
 *
 * Out of reach: the GPU memory model (every access here is sequentially consistent enough),
 * hardware NaN bits (this is the host's arithmetic), tensor-core / TMA code, launch limits other
 * than the ones above, independent thread scheduling within a warp.
 * Build with -ffp-contract=off and without fast-math: the arithmetic is then the host's IEEE
 * fp32, which is what the CUDA build (-fmad=false -ftz=false -prec-div=true) promises too. */
#ifndef XTE_SIMT_H
#define XTE_SIMT_H

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <semaphore>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#if defined(__CUDACC__) || defined(__MUSACC__)
#error "simt.h is for host compilers only"
#endif

/* ---------------------------------------------------------------- keywords */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __shared__ static
#define XTE_DYNAMIC_SHARED(T, name) T *name = reinterpret_cast<T *>(simt::dynamic_smem())

namespace simt {

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

enum status { ok = 0, invalid_configuration = 1 };

[[noreturn]] inline void fatal(const char *what) {
  std::fprintf(stderr, "simt: %s\n", what);
  std::fflush(stderr);
  std::abort();
}

}  // namespace simt

using dim3 = simt::dim3;
inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
inline int warpSize = 32;

namespace simt {

/* How a block's CUDA threads run:
 *  fibers   (default) one OS thread (the launching one) runs them as fibers, switching at every
 *           barrier / warp exchange: fast (a barrier costs ~2 context switches per thread in user
 *           space), deterministic, and a barrier that some thread never reaches is a deadlock
 *           that is reported exactly;
 *  threads  each CUDA thread is an OS thread of a persistent pool (created once, grown to the
 *           largest block, reused by every block and launch): the engine ThreadSanitizer sees
 *           (the barriers are atomics, so a shared-memory access that lacks a __syncthreads is
 *           a race report). Default in -fsanitize=thread builds, or with SIMT_ENGINE=threads.
 * x86-64 fibers switch with a few instructions; elsewhere through ucontext (slower). */
enum engine { fibers = 0, threads = 1 };

namespace detail {

struct barrier;

/* ---------------------------------------------------------------- fibers */
#if defined(__x86_64__)
extern "C" void simt_ctx_switch(void **save_sp, void *load_sp);
extern "C" void simt_ctx_start();
/* callee-saved registers on the stack, then a return into the new stack */
asm(R"(
  .text
  .p2align 4
  .weak simt_ctx_switch
  .hidden simt_ctx_switch
  .type simt_ctx_switch,@function
simt_ctx_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size simt_ctx_switch, .-simt_ctx_switch
  .weak simt_ctx_start
  .hidden simt_ctx_start
  .type simt_ctx_start,@function
simt_ctx_start:
  movq %rbx, %rdi
  call simt_fiber_main@PLT
  ud2
  .size simt_ctx_start, .-simt_ctx_start
)");
#endif

struct fiber {
  std::unique_ptr<unsigned char[]> stack;
  size_t stack_size = 0;
#if defined(__x86_64__)
  void *sp = nullptr;
#else
  ucontext_t uc;
#endif
  unsigned id = 0;
  bool done = false;
  barrier *wait_bar = nullptr; /* waiting for this barrier's generation to move past wait_gen */
  unsigned wait_gen = 0;
};

/* A reusable barrier over n threads. A thread that leaves the kernel (depart) while others wait,
 * or arrives after one left, is a divergent barrier: fatal. */
struct barrier {
  std::atomic<unsigned> arrived{0}, gen{0}, departed{0};
  unsigned n = 0;
  void reset(unsigned count) {
    arrived.store(0);
    departed.store(0);
    n = count;
  }
  void arrive_and_wait();
  void depart() {
    departed.fetch_add(1);
    if (arrived.load() != 0)
      fatal("a thread exited while others wait at __syncthreads / a warp sync (divergent)");
  }
};

/* One warp of the running block: its live lanes, a value slot per lane, its barrier. */
struct warp {
  unsigned live = 0;
  std::vector<uint64_t> slot;
  barrier bar;
};

struct thread_ctx {
  warp *w = nullptr;
  unsigned lane = 0;
  fiber *f = nullptr; /* fibers engine: the running fiber */
};
inline thread_local thread_ctx tctx;

class pool {
 public:
  static pool &get() {
    static pool p;
    return p;
  }
  std::mutex launch_lock; /* one launch at a time, process-wide (static __shared__ storage) */
  engine eng = default_engine();

  /* Runs fn on nthreads CUDA threads as one block (blockIdx / gridDim / blockDim given). */
  void run_block(const std::function<void()> &fn, dim3 grid, dim3 block, dim3 bidx,
                 unsigned nthreads, unsigned char *smem, size_t smem_bytes) {
    job_ = &fn;
    grid_ = grid;
    block_ = block;
    bidx_ = bidx;
    nthreads_ = nthreads;
    if (smem_bytes) std::memset(smem, 0xA5, smem_bytes);
    smem_ = smem;
    bar_.reset(nthreads);
    const unsigned ws = (unsigned)warpSize, nw = (nthreads + ws - 1) / ws;
    while (warps_.size() < nw) warps_.push_back(std::make_unique<warp>());
    for (unsigned i = 0; i < nw; i++) {
      warp &w = *warps_[i];
      w.live = nthreads - i * ws < ws ? nthreads - i * ws : ws;
      w.slot.assign(ws, 0);
      w.bar.reset(w.live);
    }
    if (eng == fibers)
      run_fibers(nthreads);
    else
      run_threads(nthreads);
    job_ = nullptr;
  }

  unsigned char *smem() const { return smem_; }
  barrier &block_barrier() { return bar_; }

  /* fibers: back to the scheduler (the running fiber waits for b to pass generation g, or has
   * finished when b is null and done is set) */
  void yield_fiber() {
    fiber *f = tctx.f;
#if defined(__x86_64__)
    simt_ctx_switch(&f->sp, sched_sp_);
#else
    swapcontext(&f->uc, &sched_uc_);
#endif
  }

  /* fibers: the body of fiber id (entered once per block) */
  void fiber_body(fiber *f) {
    (*job_)();
    finish_thread();
    f->done = true;
    yield_fiber();
    fatal("a finished fiber was resumed");
  }

  ~pool() {
    quit_.store(true);
    for (auto &w : workers_) w->go.release();
    for (auto &w : workers_) w->th.join();
  }

 private:
  struct worker {
    std::binary_semaphore go{0};
    std::thread th;
  };
  std::vector<std::unique_ptr<worker>> workers_;
  std::vector<std::unique_ptr<fiber>> fibers_;
#if defined(__x86_64__)
  void *sched_sp_ = nullptr;
#else
  ucontext_t sched_uc_;
#endif
  const std::function<void()> *job_ = nullptr;
  dim3 grid_, block_, bidx_;
  unsigned nthreads_ = 0;
  unsigned char *smem_ = nullptr;
  barrier bar_;
  std::vector<std::unique_ptr<warp>> warps_;
  std::atomic<unsigned> done_{0};
  std::atomic<bool> quit_{false};
  static constexpr size_t fiber_stack = 256 * 1024;
  static constexpr uint64_t canary = 0x51A7C0DE5EEDF00Dull;

  /* sanitizers that track stacks or threads (TSan, ASan) get OS threads: the fibers' stack
   * switches are not annotated for them */
  static engine default_engine() {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
    return threads;
#else
    const char *env = std::getenv("SIMT_ENGINE");
    return env && !std::strcmp(env, "threads") ? threads : fibers;
#endif
  }

  /* the thread-locals of CUDA thread id of the current block */
  void enter_thread(unsigned id) {
    const unsigned ws = (unsigned)warpSize;
    blockDim = block_;
    gridDim = grid_;
    blockIdx = bidx_;
    threadIdx = dim3(id % block_.x, (id / block_.x) % block_.y, id / (block_.x * block_.y));
    tctx.w = warps_[id / ws].get();
    tctx.lane = id % ws;
  }
  void finish_thread() {
    tctx.w->bar.depart();
    bar_.depart();
  }

  void run_fibers(unsigned n) {
    while (fibers_.size() < n) {
      auto f = std::make_unique<fiber>();
      f->id = (unsigned)fibers_.size();
      f->stack_size = fiber_stack;
      f->stack.reset(new unsigned char[fiber_stack]);
      std::memcpy(f->stack.get(), &canary, sizeof canary);
      fibers_.push_back(std::move(f));
    }
    for (unsigned i = 0; i < n; i++) {
      fiber &f = *fibers_[i];
      f.done = false;
      f.wait_bar = nullptr;
#if defined(__x86_64__)
      /* [r15 r14 r13 r12 rbx rbp ret]; after the ret rsp = top - 16, 16-byte aligned, so
       * simt_ctx_start's call enters simt_fiber_main as the ABI wants */
      uintptr_t top = ((uintptr_t)f.stack.get() + f.stack_size) & ~(uintptr_t)15;
      void **sp = (void **)(top - 16 - 7 * sizeof(void *));
      for (int k = 0; k < 7; k++) sp[k] = nullptr;
      sp[4] = &f;                      /* rbx: the fiber, simt_ctx_start's argument */
      sp[6] = (void *)&simt_ctx_start; /* the ret of the first switch */
      f.sp = sp;
#else
      getcontext(&f.uc);
      f.uc.uc_stack.ss_sp = f.stack.get();
      f.uc.uc_stack.ss_size = f.stack_size;
      f.uc.uc_link = nullptr;
      makecontext(&f.uc, (void (*)())ucontext_entry, 2, (unsigned)((uintptr_t)&f >> 32),
                  (unsigned)((uintptr_t)&f & 0xFFFFFFFFu));
#endif
    }
    fiber *const saved = tctx.f;
    for (;;) {
      unsigned alive = 0, ran = 0;
      for (unsigned i = 0; i < n; i++) {
        fiber &f = *fibers_[i];
        if (f.done) continue;
        alive++;
        if (f.wait_bar && f.wait_bar->gen.load(std::memory_order_relaxed) == f.wait_gen) continue;
        f.wait_bar = nullptr;
        enter_thread(i);
        tctx.f = &f;
        ran++;
#if defined(__x86_64__)
        simt_ctx_switch(&sched_sp_, f.sp);
#else
        swapcontext(&sched_uc_, &f.uc);
#endif
      }
      if (!alive) break;
      if (!ran) fatal("deadlock: a __syncthreads or warp sync that not every thread reaches");
    }
    tctx.f = saved;
    tctx.w = nullptr;
    for (unsigned i = 0; i < n; i++)
      if (std::memcmp(fibers_[i]->stack.get(), &canary, sizeof canary) != 0)
        fatal("a fiber overflowed its stack");
  }

#if !defined(__x86_64__)
  static void ucontext_entry(unsigned hi, unsigned lo) {
    fiber *f = (fiber *)(((uintptr_t)hi << 32) | (uintptr_t)lo);
    get().fiber_body(f);
  }
#endif

  void run_threads(unsigned n) {
    grow(n);
    done_.store(0);
    for (unsigned i = 0; i < n; i++) workers_[i]->go.release();
    for (;;) {
      unsigned d = done_.load(std::memory_order_acquire);
      if (d == n) break;
      done_.wait(d, std::memory_order_acquire);
    }
  }

  void grow(unsigned n) {
    while (workers_.size() < n) {
      const unsigned id = (unsigned)workers_.size();
      workers_.push_back(std::make_unique<worker>());
      worker *w = workers_.back().get(); /* not through workers_: grow() may move it */
      w->th = std::thread([this, w, id] { loop(*w, id); });
    }
  }

  void loop(worker &me, unsigned id) {
    for (;;) {
      me.go.acquire();
      if (quit_.load()) return;
      const unsigned n = nthreads_; /* read before done_ lets the launcher move on */
      enter_thread(id);
      (*job_)();
      finish_thread();
      tctx.w = nullptr;
      if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == n) done_.notify_all();
    }
  }
};

inline void barrier::arrive_and_wait() {
  const unsigned g = gen.load(std::memory_order_acquire);
  const unsigned a = arrived.fetch_add(1) + 1;
  /* After the arrival (seq_cst): a departing thread sees it, or it sees the departure. A
   * departure counts only while this barrier has not completed: a thread that passed it and
   * exited before this one got here is no divergence. */
  if (departed.load() != 0 && gen.load() == g)
    fatal("__syncthreads / warp sync after a thread of the group exited");
  if (a == n) {
    arrived.store(0);
    gen.fetch_add(1, std::memory_order_release);
    if (!tctx.f) gen.notify_all();
    return;
  }
  if (fiber *f = tctx.f) { /* fibers: wait in the scheduler */
    f->wait_bar = this;
    f->wait_gen = g;
    pool::get().yield_fiber();
    return;
  }
  for (;;) {
    gen.wait(g, std::memory_order_acquire);
    if (gen.load(std::memory_order_acquire) != g) return;
  }
}

}  // namespace detail

/* Engine for later launches (not while a launch runs); sanitized builds keep threads. */
inline void set_engine(engine e) {
  std::lock_guard<std::mutex> g(detail::pool::get().launch_lock);
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  e = threads;
#endif
  detail::pool::get().eng = e;
}
inline engine get_engine() {
  return detail::pool::get().eng;
}

}  // namespace simt

#if defined(__x86_64__)
extern "C" inline __attribute__((used)) void simt_fiber_main(simt::detail::fiber *f) {
  simt::detail::pool::get().fiber_body(f);
}
#endif

namespace simt {
namespace detail {

/* ---------------------------------------------------------------- warp exchange */

template <class T>
inline uint64_t to_slot(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "warp value of at most 8 bytes");
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof v);
  return u;
}
template <class T>
inline T from_slot(uint64_t u) {
  T v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

inline warp &cur_warp(unsigned long long mask) {
  warp *w = tctx.w;
  if (!w) fatal("warp intrinsic outside a kernel");
  if (warpSize <= 32) {
    const unsigned long long need = w->live >= 32 ? 0xFFFFFFFFull : ((1ull << w->live) - 1);
    if ((mask & need) != need) fatal("warp intrinsic with a mask that leaves out live lanes");
  }
  return *w;
}

/* Every live lane publishes v; returns the value of lane src(lane) (its own when src is out of
 * range or names a lane that does not exist). */
template <class T, class F>
inline T exchange(unsigned long long mask, T v, F src_of) {
  warp &w = cur_warp(mask);
  const unsigned lane = tctx.lane;
  w.slot[lane] = to_slot(v);
  w.bar.arrive_and_wait();
  const int s = src_of((int)lane);
  const T r = s >= 0 && (unsigned)s < w.live ? from_slot<T>(w.slot[(unsigned)s]) : v;
  w.bar.arrive_and_wait();
  return r;
}

inline int seg_base(int lane, int width) {
  return lane - lane % width;
}

}  // namespace detail

/* The dynamic shared memory of the running block. */
inline unsigned char *dynamic_smem() {
  return detail::pool::get().smem();
}

/* Warp size for later launches: 32, 64 or 128 (not while a launch runs). */
inline void set_warp_size(int ws) {
  if (ws != 32 && ws != 64 && ws != 128) fatal("warp size must be 32, 64 or 128");
  std::lock_guard<std::mutex> g(detail::pool::get().launch_lock);
  warpSize = ws;
}

template <class... P, class... A>
status launch(dim3 grid, dim3 block, size_t smem_bytes, void (*kernel)(P...), A &&...args) {
  static_assert(sizeof...(P) == sizeof...(A), "kernel argument count");
  const unsigned long long nt = (unsigned long long)block.x * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || nt == 0 || nt > 1024 || block.z > 64 ||
      grid.x > 0x7FFFFFFFu || grid.y > 65535 || grid.z > 65535 || smem_bytes > 48 * 1024)
    return invalid_configuration;
  /* the arguments are copied once, as a launch does; every thread gets its own copy */
  std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
  const std::function<void()> fn = [&params, kernel] { std::apply(kernel, params); };
  detail::pool &p = detail::pool::get();
  std::lock_guard<std::mutex> g(p.launch_lock);
  std::unique_ptr<unsigned char[]> smem(smem_bytes ? new unsigned char[smem_bytes + 16] : nullptr);
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++)
        p.run_block(fn, grid, block, dim3(x, y, z), (unsigned)nt, smem.get(), smem_bytes);
  return ok;
}

}  // namespace simt

/* ---------------------------------------------------------------- synchronization */
inline void __syncthreads() {
  simt::detail::pool::get().block_barrier().arrive_and_wait();
}
inline void __syncwarp(unsigned long long mask = ~0ull) {
  simt::detail::cur_warp(mask).bar.arrive_and_wait();
}
inline void __threadfence() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
}
inline void __threadfence_block() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

/* ---------------------------------------------------------------- warp intrinsics */
template <class T>
inline T __shfl_sync(unsigned long long mask, T v, int src, int width = warpSize) {
  return simt::detail::exchange(mask, v, [&](int lane) {
    return simt::detail::seg_base(lane, width) + ((src % width) + width) % width;
  });
}
template <class T>
inline T __shfl_xor_sync(unsigned long long mask, T v, int lane_mask, int width = warpSize) {
  return simt::detail::exchange(mask, v, [&](int lane) {
    const int s = lane ^ lane_mask, b = simt::detail::seg_base(lane, width);
    return s >= b + width ? lane : s;
  });
}
template <class T>
inline T __shfl_down_sync(unsigned long long mask, T v, unsigned delta, int width = warpSize) {
  return simt::detail::exchange(mask, v, [&](int lane) {
    const int s = lane + (int)delta, b = simt::detail::seg_base(lane, width);
    return s >= b + width ? lane : s;
  });
}
template <class T>
inline T __shfl_up_sync(unsigned long long mask, T v, unsigned delta, int width = warpSize) {
  return simt::detail::exchange(mask, v, [&](int lane) {
    const int s = lane - (int)delta, b = simt::detail::seg_base(lane, width);
    return s < b ? lane : s;
  });
}
inline unsigned long long __ballot_sync(unsigned long long mask, int pred) {
  simt::detail::warp &w = simt::detail::cur_warp(mask);
  unsigned long long r = 0;
  if (warpSize > 64) simt::fatal("__ballot_sync on a warp of more than 64 lanes");
  w.slot[simt::detail::tctx.lane] = pred != 0;
  w.bar.arrive_and_wait();
  for (unsigned i = 0; i < w.live; i++) r |= (unsigned long long)(w.slot[i] != 0) << i;
  w.bar.arrive_and_wait();
  return r;
}
inline int __any_sync(unsigned long long mask, int pred) {
  simt::detail::warp &w = simt::detail::cur_warp(mask);
  int r = 0;
  w.slot[simt::detail::tctx.lane] = pred != 0;
  w.bar.arrive_and_wait();
  for (unsigned i = 0; i < w.live; i++) r |= w.slot[i] != 0;
  w.bar.arrive_and_wait();
  return r;
}
inline int __all_sync(unsigned long long mask, int pred) {
  simt::detail::warp &w = simt::detail::cur_warp(mask);
  int r = 1;
  w.slot[simt::detail::tctx.lane] = pred != 0;
  w.bar.arrive_and_wait();
  for (unsigned i = 0; i < w.live; i++) r &= w.slot[i] != 0;
  w.bar.arrive_and_wait();
  return r;
}
inline unsigned long long __activemask() {
  const unsigned live = simt::detail::tctx.w ? simt::detail::tctx.w->live : 0;
  return live >= 64 ? ~0ull : (1ull << live) - 1;
}

/* ---------------------------------------------------------------- atomics */
template <class T>
inline T atomicAdd(T *p, T v) {
  return std::atomic_ref<T>(*p).fetch_add(v);
}
template <class T>
inline T atomicSub(T *p, T v) {
  return std::atomic_ref<T>(*p).fetch_sub(v);
}
template <class T>
inline T atomicExch(T *p, T v) {
  return std::atomic_ref<T>(*p).exchange(v);
}
template <class T>
inline T atomicCAS(T *p, T cmp, T v) {
  std::atomic_ref<T>(*p).compare_exchange_strong(cmp, v);
  return cmp; /* the old value either way */
}
template <class T>
inline T atomicMax(T *p, T v) {
  std::atomic_ref<T> r(*p);
  T old = r.load();
  while (old < v && !r.compare_exchange_weak(old, v)) continue;
  return old;
}
template <class T>
inline T atomicMin(T *p, T v) {
  std::atomic_ref<T> r(*p);
  T old = r.load();
  while (v < old && !r.compare_exchange_weak(old, v)) continue;
  return old;
}
template <class T>
inline T atomicAnd(T *p, T v) {
  return std::atomic_ref<T>(*p).fetch_and(v);
}
template <class T>
inline T atomicOr(T *p, T v) {
  return std::atomic_ref<T>(*p).fetch_or(v);
}
template <class T>
inline T atomicXor(T *p, T v) {
  return std::atomic_ref<T>(*p).fetch_xor(v);
}

/* ---------------------------------------------------------------- vector types */
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
  return uint4{x, y, z, w};
}

/* ---------------------------------------------------------------- a few float built-ins */
inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline float __fadd_rn(float a, float b) {
  return a + b;
}
inline float __fsub_rn(float a, float b) {
  return a - b;
}
inline float __fdiv_rn(float a, float b) {
  return a / b;
}
inline float __fmaf_rn(float a, float b, float c) {
  return std::fma(a, b, c);
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

#endif /* XTE_SIMT_H */

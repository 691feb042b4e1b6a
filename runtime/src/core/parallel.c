/* parallel.c: the thread pool. One job at a time: [0, n) is cut into one contiguous range per
   thread; the caller runs the first range itself. Workers spin briefly, then sleep. */
#define _GNU_SOURCE
#include "internal.h"
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <unistd.h>

enum { SPIN_ROUNDS = 4000 };

static struct {
  pthread_mutex_t lock;        /* held by the thread that submits a job */
  pthread_mutex_t sleep_lock;
  pthread_cond_t wake;
  pthread_cond_t done_cond;
  pthread_t threads[256];
  int nthreads;                /* workers + the caller */
  int started;                 /* workers running */
  /* the current job */
  kiln_range_fn fn;
  void *ctx;
  int64_t n, chunk;
  int njobs;                   /* threads taking part in the job */
  uint64_t generation;         /* bumped for each job; workers wait for a change */
  int remaining;               /* workers that have not finished the job */
  int sleeping_caller;
  int stop;
} pool = {
  .lock = PTHREAD_MUTEX_INITIALIZER,
  .sleep_lock = PTHREAD_MUTEX_INITIALIZER,
  .wake = PTHREAD_COND_INITIALIZER,
  .done_cond = PTHREAD_COND_INITIALIZER,
};

static _Thread_local int in_region;

int kiln_in_parallel_region(void) { return in_region; }

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static void run_part(int id) {
  int64_t begin = id * pool.chunk;
  int64_t end = begin + pool.chunk < pool.n ? begin + pool.chunk : pool.n;
  if (begin < end) pool.fn(pool.ctx, begin, end);
}

static void *worker_main(void *arg) {
  int id = (int)(intptr_t)arg;
  uint64_t seen = 0;
  in_region = 1;
  for (;;) {
    uint64_t gen;
    int spins = 0;
    while ((gen = __atomic_load_n(&pool.generation, __ATOMIC_ACQUIRE)) == seen) {
      if (__atomic_load_n(&pool.stop, __ATOMIC_ACQUIRE)) return NULL;
      if (++spins < SPIN_ROUNDS) { cpu_relax(); continue; }
      pthread_mutex_lock(&pool.sleep_lock);
      while (__atomic_load_n(&pool.generation, __ATOMIC_ACQUIRE) == seen && !pool.stop)
        pthread_cond_wait(&pool.wake, &pool.sleep_lock);
      pthread_mutex_unlock(&pool.sleep_lock);
    }
    seen = gen;
    if (__atomic_load_n(&pool.stop, __ATOMIC_ACQUIRE)) return NULL;
    if (id < pool.njobs) run_part(id);
    if (__atomic_sub_fetch(&pool.remaining, 1, __ATOMIC_ACQ_REL) == 0) {
      pthread_mutex_lock(&pool.sleep_lock);
      pthread_cond_broadcast(&pool.done_cond);
      pthread_mutex_unlock(&pool.sleep_lock);
    }
  }
}

static void stop_workers(void) {
  if (pool.started == 0) return;
  pthread_mutex_lock(&pool.sleep_lock);
  __atomic_store_n(&pool.stop, 1, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&pool.wake);
  pthread_mutex_unlock(&pool.sleep_lock);
  for (int i = 1; i <= pool.started; i++) pthread_join(pool.threads[i], NULL);
  pool.started = 0;
  pool.stop = 0;
}

static int default_threads(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set) > 0 ? CPU_COUNT(&set) : 1;
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

static void ensure_init(void) {
  if (pool.nthreads == 0) {
    pool.nthreads = default_threads();
    if (pool.nthreads > 256) pool.nthreads = 256;
  }
}

KILN_API int kiln_set_num_threads(int n) {
  if (n < 1 || n > 256) return kiln_fail(KILN_ERR_ARGUMENT, "set_num_threads: %d threads (expected 1 to 256)", n);
  pthread_mutex_lock(&pool.lock);
  ensure_init();
  stop_workers();
  pool.nthreads = n;
  pthread_mutex_unlock(&pool.lock);
  return KILN_OK;
}

KILN_API int kiln_get_num_threads(void) {
  ensure_init();
  return pool.nthreads;
}

static void start_workers(void) {
  pool.generation = 0;
  for (int i = 1; i < pool.nthreads; i++) {
    if (pthread_create(&pool.threads[i], NULL, worker_main, (void *)(intptr_t)i) != 0) break;
    pool.started = i;
    char name[16];
    snprintf(name, sizeof name, "kiln-pool-%d", i < 999 ? i : 999);
    pthread_setname_np(pool.threads[i], name);
  }
}

/* Run fn over [0, n) on the pool (pool.lock held by the caller; released here). */
static void launch(int64_t n, int64_t grain, kiln_range_fn fn, void *ctx) {
  if (pool.started != pool.nthreads - 1) { stop_workers(); start_workers(); }
  int nt = pool.started + 1;
  int64_t parts = (n + grain - 1) / grain;
  if (parts > nt) parts = nt;
  int64_t chunk = (n + parts - 1) / parts;
  pool.fn = fn;
  pool.ctx = ctx;
  pool.n = n;
  pool.chunk = chunk;
  pool.njobs = (int)((n + chunk - 1) / chunk);
  __atomic_store_n(&pool.remaining, pool.started, __ATOMIC_RELEASE);
  pthread_mutex_lock(&pool.sleep_lock);
  __atomic_add_fetch(&pool.generation, 1, __ATOMIC_ACQ_REL);
  pthread_cond_broadcast(&pool.wake);
  pthread_mutex_unlock(&pool.sleep_lock);
  in_region = 1;
  run_part(0);
  in_region = 0;
  int spins = 0;
  while (__atomic_load_n(&pool.remaining, __ATOMIC_ACQUIRE) != 0) {
    if (++spins < SPIN_ROUNDS * 4) { cpu_relax(); continue; }
    pthread_mutex_lock(&pool.sleep_lock);
    while (__atomic_load_n(&pool.remaining, __ATOMIC_ACQUIRE) != 0) pthread_cond_wait(&pool.done_cond, &pool.sleep_lock);
    pthread_mutex_unlock(&pool.sleep_lock);
  }
  pthread_mutex_unlock(&pool.lock);
}

void kiln_parallel_for(int64_t n, int64_t grain, kiln_range_fn fn, void *ctx) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  ensure_init();
  if (n <= grain || pool.nthreads == 1 || in_region || pthread_mutex_trylock(&pool.lock) != 0) {
    fn(ctx, 0, n);
    return;
  }
  launch(n, grain, fn, ctx);
}

/* The team: part k of [0, nteam) runs on its own thread, all at the same time. */
struct team { kiln_team_fn fn; void *ctx; int nteam; };
static void team_part(void *ctx, int64_t begin, int64_t end) {
  const struct team *t = ctx;
  for (int64_t k = begin; k < end; k++) t->fn(t->ctx, (int)k, t->nteam);
}

int kiln_parallel_team_size(void) {
  ensure_init();
  return in_region ? 1 : pool.nthreads;
}

void kiln_parallel_team(kiln_team_fn fn, void *ctx) {
  ensure_init();
  if (pool.nthreads == 1 || in_region || pthread_mutex_trylock(&pool.lock) != 0) {
    fn(ctx, 0, 1);
    return;
  }
  if (pool.started != pool.nthreads - 1) { stop_workers(); start_workers(); }
  struct team t = {fn, ctx, pool.started + 1};
  if (t.nteam == 1) { pthread_mutex_unlock(&pool.lock); fn(ctx, 0, 1); return; }
  launch(t.nteam, 1, team_part, &t);
}

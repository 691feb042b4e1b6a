/* dist/group.c: process groups and their collectives (kiln/dist.h).
   One communication thread makes every engine call, one at a time, in the order the program
   queued them; the caller waits on the result (or not, with a work handle). Before a collective's
   transfer, each rank tells every other what it is entering (the arrival check, over a duplicate of
   the group's communicator): so a rank that never comes, or one that enters another collective,
   gives an error that names them, within the deadline, rather than a hang. */
#define _GNU_SOURCE
#include "../internal.h"
#include "engine.h"
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum work_kind { W_INIT, W_ALL_REDUCE, W_BROADCAST, W_ALL_GATHER, W_REDUCE_SCATTER, W_BARRIER, W_SEND, W_RECV,
                 W_NEW_GROUP, W_RAW_ALL_REDUCE, W_STOP };
static const char *const kind_names[] = {"init", "all_reduce", "broadcast", "all_gather", "reduce_scatter",
                                         "barrier", "send", "recv", "new_group", "all_reduce (engine)", "finalize"};
static const char *const op_names[] = {"sum", "max", "min", "prod", "mean"};

struct kiln_group {
  void *comm, *ctl;       /* the engine's communicator, and its duplicate for the arrival check */
  void *nccl;             /* the NCCL communicator, made on the first collective of a CUDA tensor */
  int nccl_device;
  int rank, size;         /* this process's rank in the group (-1: not a member) */
  int *world_ranks;       /* [size] */
  int64_t seq;            /* collectives entered so far (comm thread only) */
  char name[128];
};

struct kiln_work {
  int kind, op, root, peer, tag;
  struct kiln_group *group;
  struct kiln_tensor *t, *in;      /* retained while queued */
  int refs;                        /* the caller's and the thread's */
  int state;                       /* 0 queued, 1 running, 2 done */
  int rc;
  double started;
  char what[256];                  /* "all_reduce (sum) of f32 [3,4] on group world (2 ranks)" */
  char err[1024];
  struct kiln_work *next;
  /* new_group */
  int *ranks, nranks;
  struct kiln_group *made;
};

struct header {   /* what a rank enters, sent to every other rank of the group */
  int64_t seq;
  int32_t kind, dtype, op, root, ndim, device;   /* device: its type, CPU or CUDA */
  int64_t numel;
  int64_t sizes[KILN_MAX_DIMS];
};

static const struct kiln_engine *engine, *nccl;
static int world_rank, world_size = 1, initialized, launched_checked, launched;
static double timeout_s = 300;
static struct kiln_group *world;
static pthread_t thread;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t queued = PTHREAD_COND_INITIALIZER, finished = PTHREAD_COND_INITIALIZER;
static struct kiln_work *head, *tail;
static char broken[1024];   /* set once a collective timed out: the group's state is unknown after it */

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the engine library ---- */

/* Open an engine library: $env, else file next to libkiln, else file on the library path. */
static const struct kiln_engine *open_library(const char *env_name, const char *file, const char *what, const char *why) {
  const char *env = getenv(env_name);
  char path[600];
  snprintf(path, sizeof path, "%s", file);
  if (env && *env) snprintf(path, sizeof path, "%s", env);
  else {
    Dl_info info;
    if (dladdr((void *)kiln_dist_init, &info) && info.dli_fname && strchr(info.dli_fname, '/')) {
      snprintf(path, sizeof path, "%s", info.dli_fname);
      snprintf(strrchr(path, '/') + 1, sizeof path - (size_t)(strrchr(path, '/') + 1 - path), "%s", file);
      if (access(path, F_OK) != 0) snprintf(path, sizeof path, "%s", file);
    }
  }
  /* RTLD_GLOBAL: Open MPI opens its own plugins, which look for libmpi's symbols globally. */
  void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    kiln_fail(KILN_ERR_UNSUPPORTED, "%s: cannot load %s: %s; %s", what, path, dlerror(), why);
    return NULL;
  }
  kiln_engine_open_fn open_fn;
  void *sym = dlsym(h, "kiln_engine_open");
  memcpy(&open_fn, &sym, sizeof open_fn);
  const struct kiln_engine *e = open_fn ? open_fn(KILN_ENGINE_VERSION) : NULL;
  if (!e) kiln_fail(KILN_ERR_UNSUPPORTED, "%s: %s is not an engine of this kiln (version %d)", what, path, KILN_ENGINE_VERSION);
  return e;
}

/* ---- the engine of a world of one rank (kiln_dist_init_single): no peer, no MPI ---- */

static int self_init(int *rank, int *size, char *err, size_t n) { (void)err; (void)n; *rank = 0; *size = 1; return 0; }
static void self_finalize(void) {}
static void self_abort(int code) { _exit(code); }
static void *self_world(void) { return (void *)&self_world; }
static int self_comm_create(void *parent, const int *ranks, int n, void **out, char *err, size_t nerr) {
  (void)ranks; (void)n; (void)err; (void)nerr;
  *out = parent;
  return 0;
}
static int self_comm_dup(void *comm, void **out, char *err, size_t n) { (void)err; (void)n; *out = comm; return 0; }
static void self_comm_free(void *comm) { (void)comm; }
static int self_all_reduce(void *comm, const void *in, void *out, int64_t count, int dtype, int op, char *err, size_t n) {
  (void)comm; (void)op; (void)err; (void)n;
  if (in != out) memcpy(out, in, (size_t)count * (size_t)kiln_dtype_size(dtype));
  return 0;
}
static int self_broadcast(void *comm, void *buf, int64_t count, int dtype, int root, char *err, size_t n) {
  (void)comm; (void)buf; (void)count; (void)dtype; (void)root; (void)err; (void)n;
  return 0;
}
static int self_all_gather(void *comm, const void *in, void *out, int64_t count, int dtype, char *err, size_t n) {
  return self_all_reduce(comm, in, out, count, dtype, 0, err, n);
}
static int self_reduce_scatter(void *comm, const void *in, void *out, int64_t count, int dtype, int op, char *err, size_t n) {
  return self_all_reduce(comm, in, out, count, dtype, op, err, n);
}
static int self_barrier(void *comm, char *err, size_t n) { (void)comm; (void)err; (void)n; return 0; }
static int self_no_peer(char *err, size_t n) { snprintf(err, n, "a world of one rank has no other rank"); return 1; }
static int self_send(void *comm, const void *buf, int64_t count, int dtype, int dst, int tag, char *err, size_t n) {
  (void)comm; (void)buf; (void)count; (void)dtype; (void)dst; (void)tag;
  return self_no_peer(err, n);
}
static int self_recv(void *comm, void *buf, int64_t count, int dtype, int src, int tag, char *err, size_t n) {
  (void)comm; (void)buf; (void)count; (void)dtype; (void)src; (void)tag;
  return self_no_peer(err, n);
}
static int self_raw(void *comm, void *buf, int64_t count, int dtype, char *err, size_t n) {
  return self_all_reduce(comm, buf, buf, count, dtype, 0, err, n);
}
static const struct kiln_engine self_engine = {
  .version = KILN_ENGINE_VERSION, .name = "one rank (no engine)", .init = self_init, .finalize = self_finalize,
  .abort = self_abort, .world = self_world, .comm_create = self_comm_create, .comm_dup = self_comm_dup,
  .comm_free = self_comm_free, .all_reduce = self_all_reduce, .broadcast = self_broadcast, .all_gather = self_all_gather,
  .reduce_scatter = self_reduce_scatter, .barrier = self_barrier, .send = self_send, .recv = self_recv,
  .raw_all_reduce = self_raw,
};

static int open_engine(void) {
  engine = open_library("KILN_MPI_LIB", "libkiln_mpi.so", "dist.init",
                        "kiln was built without Open MPI, or libopenmpi3 is not installed");
  return engine ? KILN_OK : kiln_error_code();
}

/* ---- describing a collective ---- */

static void describe(struct kiln_work *w) {
  char shape[200] = "";
  const struct kiln_tensor *t = w->kind == W_ALL_GATHER ? w->in : w->t;
  if (t) snprintf(shape, sizeof shape, " of %s %s", kiln_dtype_name(t->dtype), kiln_shape_string(t));
  const char *gname = w->group ? w->group->name : "world";
  switch (w->kind) {
  case W_ALL_REDUCE: case W_REDUCE_SCATTER:
    snprintf(w->what, sizeof w->what, "%s (%s)%s on group %s", kind_names[w->kind], op_names[w->op], shape, gname);
    break;
  case W_BROADCAST:
    snprintf(w->what, sizeof w->what, "broadcast from rank %d%s on group %s", w->root, shape, gname);
    break;
  case W_SEND: snprintf(w->what, sizeof w->what, "send to rank %d (tag %d)%s on group %s", w->peer, w->tag, shape, gname); break;
  case W_RECV: snprintf(w->what, sizeof w->what, "recv from rank %d (tag %d)%s on group %s", w->peer, w->tag, shape, gname); break;
  default: snprintf(w->what, sizeof w->what, "%s%s on group %s", kind_names[w->kind], shape, gname);
  }
}

static void describe_header(const struct header *h, char *out, size_t n) {
  int k = h->kind >= 0 && h->kind <= W_STOP ? h->kind : W_STOP;
  int at = snprintf(out, n, "%s", kind_names[k]);
  if (k == W_ALL_REDUCE || k == W_REDUCE_SCATTER) at += snprintf(out + at, n - (size_t)at, " (%s)", op_names[h->op % 5]);
  if (k == W_BROADCAST) at += snprintf(out + at, n - (size_t)at, " from rank %d", h->root);
  if (k != W_BARRIER && k != W_NEW_GROUP)
    snprintf(out + at, n - (size_t)at, " of %s %s%s", kiln_dtype_name(h->dtype), kiln_sizes_string(h->ndim, h->sizes),
             h->device == KILN_CUDA ? " on cuda" : "");
}

/* ---- the arrival check (comm thread) ---- */

static int arrival_check(struct kiln_work *w) {
  struct kiln_group *g = w->group;
  int n = g->size;
  if (n == 1) return 0;
  const struct kiln_tensor *t = w->kind == W_ALL_GATHER ? w->in : w->t;
  struct header mine = {.seq = ++g->seq, .kind = w->kind, .op = w->op, .root = w->root};
  if (t) {
    mine.dtype = t->dtype;
    mine.device = t->device.type;
    mine.ndim = t->ndim;
    mine.numel = t->numel;
    memcpy(mine.sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim);
  }
  struct header *theirs = calloc((size_t)n, sizeof *theirs);
  void **reqs = calloc((size_t)(2 * n), sizeof *reqs);
  char *arrived = calloc((size_t)n, 1);
  if (!theirs || !reqs || !arrived) {
    free(theirs); free(reqs); free(arrived);
    snprintf(w->err, sizeof w->err, "%s: out of memory for the arrival check", w->what);
    return KILN_ERR_MEMORY;
  }
  int rc = 0;
  for (int r = 0; r < n && !rc; r++) {
    if (r == g->rank) { arrived[r] = 1; continue; }
    char e[256];
    if (engine->irecv_bytes(g->ctl, &theirs[r], (int)sizeof(struct header), r, 1, &reqs[2 * r], e, sizeof e) ||
        engine->isend_bytes(g->ctl, &mine, (int)sizeof mine, r, 1, &reqs[2 * r + 1], e, sizeof e)) {
      snprintf(w->err, sizeof w->err, "%s: %s", w->what, e);
      rc = KILN_ERR_STATE;
    }
  }
  double deadline = w->started + timeout_s;
  long spins = 0;
  while (!rc) {
    int pending = 0;
    for (int k = 0; k < 2 * n && !rc; k++) {
      if (!reqs[k]) continue;
      int done = 0;
      char e[256];
      if (engine->test(reqs[k], &done, e, sizeof e)) {
        snprintf(w->err, sizeof w->err, "%s: %s", w->what, e);
        rc = KILN_ERR_STATE;
        break;
      }
      if (done) { reqs[k] = NULL; if (k % 2 == 0) arrived[k / 2] = 1; }
      else pending++;
    }
    if (!pending || rc) break;
    if (++spins > 2000) {   /* past the first moments, wait without taking a core from the others */
      if (now() > deadline) {
        char list[512] = "";
        int at = 0, missing = 0;
        for (int r = 0; r < n; r++)
          if (!arrived[r] && at < (int)sizeof list - 16)
            at += snprintf(list + at, sizeof list - (size_t)at, "%s%d", missing++ ? ", " : "", g->world_ranks[r]);
        snprintf(w->err, sizeof w->err, "%s: %s %s had not arrived after %g s (a rank stopped, died, or is in a "
                 "different code path)", w->what, missing > 1 ? "ranks" : "rank", list, timeout_s);
        rc = KILN_ERR_STATE;
        break;
      }
      struct timespec ts = {0, spins > 20000 ? 200000 : 20000};
      nanosleep(&ts, NULL);
    }
  }
  if (rc) {
    for (int k = 0; k < 2 * n; k++) if (reqs[k]) engine->cancel(reqs[k]);
  } else {
    for (int r = 0; r < n && !rc; r++) {
      struct header *h = &theirs[r];
      if (r == g->rank) continue;
      int same = h->seq == mine.seq && h->kind == mine.kind && h->dtype == mine.dtype && h->op == mine.op &&
                 h->root == mine.root && h->numel == mine.numel && h->device == mine.device;
      if (!same) {
        char other[256];
        describe_header(h, other, sizeof other);
        snprintf(w->err, sizeof w->err, "%s: rank %d entered %s instead (collective %lld on both)", w->what,
                 g->world_ranks[r], other, (long long)mine.seq);
        rc = KILN_ERR_STATE;
      }
    }
  }
  free(theirs);
  free(reqs);
  free(arrived);
  return rc;
}

/* ---- running one work (comm thread) ---- */

static void divide(struct kiln_tensor *t, double n) {
  void *p = kiln_tensor_data(t);
  for (int64_t i = 0; i < t->numel; i++) {
    switch (t->dtype) {
    case KILN_F32: ((float *)p)[i] = (float)(((float *)p)[i] / n); break;
    case KILN_F64: ((double *)p)[i] /= n; break;
    case KILN_F16: ((uint16_t *)p)[i] = kiln_f32_to_f16(kiln_f16_to_f32(((uint16_t *)p)[i]) / (float)n); break;
    case KILN_BF16: ((uint16_t *)p)[i] = kiln_f32_to_bf16(kiln_bf16_to_f32(((uint16_t *)p)[i]) / (float)n); break;
    }
  }
}

static int run(struct kiln_work *w) {
  char e[512] = "";
  int bad = 0;
  struct kiln_group *g = w->group;
  if (w->kind == W_INIT) {
    if (engine->init(&world_rank, &world_size, e, sizeof e)) { snprintf(w->err, sizeof w->err, "dist.init: %s", e); return KILN_ERR_STATE; }
    return 0;
  }
  if (w->kind == W_STOP) { engine->finalize(); return 0; }
  if (broken[0]) { snprintf(w->err, sizeof w->err, "%.300s: the process group is broken since %.600s", w->what, broken); return KILN_ERR_STATE; }
  if (w->kind != W_SEND && w->kind != W_RECV && w->kind != W_RAW_ALL_REDUCE && !(w->kind == W_NEW_GROUP && !w->nranks)) {
    int rc = arrival_check(w);
    if (rc) return rc;
  }
  void *data = w->t ? kiln_tensor_data(w->t) : NULL;
  /* CUDA tensors travel by NCCL, over the group's NCCL communicator (made now, the first time:
     rank 0's unique id carried to the others by MPI) */
  const struct kiln_engine *en = engine;
  void *comm = g ? g->comm : NULL;
  if (w->t && w->t->device.type == KILN_CUDA) {
    if (!g->nccl) {
      unsigned char id[128] = {0};
      if (g->rank == 0) bad = nccl->unique_id(id, (int)sizeof id, e, sizeof e);
      if (!bad) bad = engine->broadcast(g->comm, id, (int64_t)sizeof id, KILN_U8, 0, e, sizeof e);
      if (!bad) bad = nccl->comm_from_id(id, g->size, g->rank, w->t->device.index, &g->nccl, e, sizeof e);
      if (!bad) g->nccl_device = w->t->device.index;
      if (bad) { snprintf(w->err, sizeof w->err, "%s: making the NCCL communicator: %s", w->what, e); return KILN_ERR_STATE; }
    }
    if (g->nccl_device != w->t->device.index) {
      snprintf(w->err, sizeof w->err, "%s: the group's NCCL communicator is on cuda:%d, the tensor on cuda:%d (one device per "
               "rank)", w->what, g->nccl_device, w->t->device.index);
      return KILN_ERR_DEVICE;
    }
    en = nccl;
    comm = g->nccl;
  }
  int mean_here = w->op == KILN_REDUCE_MEAN && !en->native_mean;
  int op = mean_here ? KILN_REDUCE_SUM : w->op;
  switch (w->kind) {
  case W_ALL_REDUCE:
    bad = en->all_reduce(comm, data, data, w->t->numel, w->t->dtype, op, e, sizeof e);
    if (!bad && mean_here) divide(w->t, g->size);
    break;
  case W_RAW_ALL_REDUCE: bad = en->raw_all_reduce(comm, data, w->t->numel, w->t->dtype, e, sizeof e); break;
  case W_BROADCAST: bad = en->broadcast(comm, data, w->t->numel, w->t->dtype, w->root, e, sizeof e); break;
  case W_ALL_GATHER: bad = en->all_gather(comm, kiln_tensor_data(w->in), data, w->in->numel, w->in->dtype, e, sizeof e); break;
  case W_REDUCE_SCATTER:
    bad = en->reduce_scatter(comm, kiln_tensor_data(w->in), data, w->t->numel, w->t->dtype, op, e, sizeof e);
    if (!bad && mean_here) divide(w->t, g->size);
    break;
  case W_BARRIER: bad = engine->barrier(g->comm, e, sizeof e); break;
  case W_SEND: bad = en->send(comm, data, w->t->numel, w->t->dtype, w->peer, w->tag, e, sizeof e); break;
  case W_RECV: bad = en->recv(comm, data, w->t->numel, w->t->dtype, w->peer, w->tag, e, sizeof e); break;
  case W_NEW_GROUP: {   /* nranks 0: the world's own control channel */
    void *comm = w->nranks ? NULL : world->comm, *ctl = NULL;
    if (w->nranks) bad = engine->comm_create(world->comm, w->ranks, w->nranks, &comm, e, sizeof e);
    if (!bad && comm) bad = engine->comm_dup(comm, &ctl, e, sizeof e);
    if (!bad) { w->made->comm = comm; w->made->ctl = ctl; }
    break;
  }
  }
  if (bad) { snprintf(w->err, sizeof w->err, "%s: %s", w->what, e); return KILN_ERR_STATE; }
  return 0;
}

static void release_locked(struct kiln_work *w) {
  if (--w->refs > 0) return;
  kiln_tensor_release(w->t);
  kiln_tensor_release(w->in);
  free(w->ranks);
  free(w);
}

static void *comm_thread(void *arg) {
  (void)arg;
  for (;;) {
    pthread_mutex_lock(&mu);
    while (!head) pthread_cond_wait(&queued, &mu);
    struct kiln_work *w = head;
    head = w->next;
    if (!head) tail = NULL;
    w->state = 1;
    w->started = now();
    pthread_mutex_unlock(&mu);
    int rc = run(w);
    pthread_mutex_lock(&mu);
    w->rc = rc;
    w->state = 2;
    int stop = w->kind == W_STOP;
    if (rc && strstr(w->err, "had not arrived") && !broken[0]) snprintf(broken, sizeof broken, "%s", w->err);
    pthread_cond_broadcast(&finished);
    release_locked(w);
    pthread_mutex_unlock(&mu);
    if (stop) return NULL;
  }
}

static struct kiln_work *work_new(int kind, struct kiln_group *g) {
  struct kiln_work *w = calloc(1, sizeof *w);
  if (!w) { kiln_fail(KILN_ERR_MEMORY, "dist: out of memory"); return NULL; }
  w->kind = kind;
  w->group = g;
  w->refs = 2;
  return w;
}

static void enqueue(struct kiln_work *w) {
  if (w->t) kiln_tensor_retain(w->t);
  if (w->in) kiln_tensor_retain(w->in);
  pthread_mutex_lock(&mu);
  if (tail) tail->next = w; else head = w;
  tail = w;
  pthread_cond_signal(&queued);
  pthread_mutex_unlock(&mu);
}

/* Wait for w. A transfer that has not finished 5 s after its deadline has stalled (every rank
   arrived, then one stopped answering): the group is broken. */
static int wait_locked(struct kiln_work *w) {
  while (w->state != 2) {
    double t = now();
    if (w->state == 1 && t > w->started + timeout_s + 5) {
      if (!broken[0]) snprintf(broken, sizeof broken, "%.400s did not finish within %g s: every rank arrived, then the transfer stalled "
                               "(a rank died or stopped answering)", w->what, timeout_s);
      return kiln_fail(KILN_ERR_STATE, "%.400s did not finish within %g s: every rank arrived, then the transfer stalled "
                       "(a rank died or stopped answering); the process group is broken", w->what, timeout_s);
    }
    if (w->state == 0 && broken[0])
      return kiln_fail(KILN_ERR_STATE, "%s: the process group is broken since %s", w->what, broken);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 250000000;
    if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
    pthread_cond_timedwait(&finished, &mu, &ts);
  }
  if (w->rc) return kiln_fail(w->rc, "%s", w->err);
  return KILN_OK;
}

static int submit(struct kiln_work *w, struct kiln_work **out) {
  describe(w);
  /* the device's queued work that makes (or still reads) the buffers ends before the transfer */
  for (int k = 0; k < 2; k++) {
    const struct kiln_tensor *t = k ? w->in : w->t;
    if (t && t->device.type == KILN_CUDA && kiln_cuda_synchronize(t->device.index)) { free(w); return kiln_error_code(); }
  }
  enqueue(w);
  if (out) { *out = w; return KILN_OK; }
  pthread_mutex_lock(&mu);
  int rc = wait_locked(w);
  release_locked(w);
  pthread_mutex_unlock(&mu);
  return rc;
}

KILN_API int kiln_work_wait(struct kiln_work *w) {
  if (!w) return kiln_fail(KILN_ERR_ARGUMENT, "wait: no work handle");
  pthread_mutex_lock(&mu);
  int rc = wait_locked(w);
  pthread_mutex_unlock(&mu);
  return rc;
}

KILN_API int kiln_work_is_done(const struct kiln_work *w) {
  pthread_mutex_lock(&mu);
  int done = w && w->state == 2;
  pthread_mutex_unlock(&mu);
  return done;
}

KILN_API void kiln_work_release(struct kiln_work *w) {
  if (!w) return;
  pthread_mutex_lock(&mu);
  release_locked(w);
  pthread_mutex_unlock(&mu);
}

/* ---- set-up ---- */

KILN_API int kiln_dist_launched(void) {
  if (!launched_checked) {
    launched = getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
    launched_checked = 1;
  }
  return launched;
}

static struct kiln_group *group_new(int size, const int *world_ranks, const char *name) {
  struct kiln_group *g = calloc(1, sizeof *g);
  int *wr = calloc((size_t)size, sizeof *wr);
  if (!g || !wr) { free(g); free(wr); kiln_fail(KILN_ERR_MEMORY, "dist: out of memory"); return NULL; }
  g->size = size;
  g->rank = -1;
  g->world_ranks = wr;
  for (int r = 0; r < size; r++) {
    wr[r] = world_ranks ? world_ranks[r] : r;
    if (wr[r] == world_rank) g->rank = r;
  }
  snprintf(g->name, sizeof g->name, "%s", name);
  return g;
}

static int init_with(const struct kiln_engine *chosen);

KILN_API int kiln_dist_init(void) { return init_with(NULL); }

/* A world of one rank, with no launcher and no MPI: distributed code run alone, and the NCCL
   engine's checks on one GPU. */
KILN_API int kiln_dist_init_single(void) {
  if (initialized && engine != &self_engine)
    return kiln_fail(KILN_ERR_STATE, "dist.init: already initialised with %s", engine->name);
  return init_with(&self_engine);
}

static int init_with(const struct kiln_engine *chosen) {
  if (initialized) return KILN_OK;
  const char *t = getenv("KILN_DIST_TIMEOUT");
  if (t && *t) {
    char *end;
    double v = strtod(t, &end);
    if (*end || !(v > 0)) return kiln_fail(KILN_ERR_ARGUMENT, "dist.init: KILN_DIST_TIMEOUT=%s is not a number of seconds > 0", t);
    timeout_s = v;
  }
  if (chosen) engine = chosen;
  if (!engine && open_engine()) return kiln_error_code();
  if (!thread && pthread_create(&thread, NULL, comm_thread, NULL) != 0)
    return kiln_fail(KILN_ERR_STATE, "dist.init: cannot start the communication thread");
  struct kiln_work *w = work_new(W_INIT, NULL);
  if (!w) return kiln_error_code();
  snprintf(w->what, sizeof w->what, "dist.init");
  enqueue(w);
  pthread_mutex_lock(&mu);
  double deadline = now() + timeout_s;
  while (w->state != 2 && now() < deadline) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 1;
    pthread_cond_timedwait(&finished, &mu, &ts);
  }
  int state = w->state, rc = w->rc;
  char err[1024];
  snprintf(err, sizeof err, "%s", w->err);
  release_locked(w);
  pthread_mutex_unlock(&mu);
  if (state != 2)
    return kiln_fail(KILN_ERR_STATE, "dist.init: the job's ranks did not all start within %g s (a rank never joined)", timeout_s);
  if (rc) return kiln_fail(rc, "%s", err);
  world = group_new(world_size, NULL, "world");
  if (!world) return kiln_error_code();
  world->comm = engine->world();
  struct kiln_work *d = work_new(W_NEW_GROUP, world);   /* the world's control channel */
  if (!d) return kiln_error_code();
  d->made = world;
  snprintf(d->what, sizeof d->what, "dist.init (its control channel)");
  enqueue(d);
  pthread_mutex_lock(&mu);
  rc = wait_locked(d);
  release_locked(d);
  pthread_mutex_unlock(&mu);
  if (rc) return rc;
  initialized = 1;
  return KILN_OK;
}

KILN_API int kiln_dist_is_initialized(void) { return initialized; }

KILN_API int kiln_dist_finalize(void) {
  if (!initialized) return KILN_OK;
  struct kiln_work *w = work_new(W_STOP, NULL);
  if (!w) return kiln_error_code();
  snprintf(w->what, sizeof w->what, "dist.finalize");
  enqueue(w);
  pthread_mutex_lock(&mu);
  int rc = wait_locked(w);
  release_locked(w);
  pthread_mutex_unlock(&mu);
  if (rc) return rc;
  pthread_join(thread, NULL);
  thread = 0;
  initialized = 0;
  return KILN_OK;
}

KILN_API void kiln_dist_abort(int code) {
  if (engine && initialized) engine->abort(code);
  _exit(code);
}

KILN_API const char *kiln_dist_engine_name(void) { return engine && initialized ? engine->name : ""; }

KILN_API int kiln_dist_set_timeout(double seconds) {
  if (!(seconds > 0)) return kiln_fail(KILN_ERR_ARGUMENT, "dist.set_timeout: %g is not a number of seconds > 0", seconds);
  timeout_s = seconds;
  return KILN_OK;
}

KILN_API double kiln_dist_timeout(void) { return timeout_s; }

KILN_API struct kiln_group *kiln_dist_world(void) {
  if (!initialized) { kiln_fail(KILN_ERR_STATE, "dist: not initialised (call kiln.dist.init() first)"); return NULL; }
  return world;
}

KILN_API struct kiln_group *kiln_dist_new_group(const int *ranks, int n) {
  if (!initialized) { kiln_fail(KILN_ERR_STATE, "dist.new_group: not initialised (call kiln.dist.init() first)"); return NULL; }
  if (n < 1) { kiln_fail(KILN_ERR_ARGUMENT, "dist.new_group: no ranks given"); return NULL; }
  for (int i = 0; i < n; i++) {
    if (ranks[i] < 0 || ranks[i] >= world_size) {
      kiln_fail(KILN_ERR_ARGUMENT, "dist.new_group: rank %d is not in the world (ranks 0 to %d)", ranks[i], world_size - 1);
      return NULL;
    }
    if (i && ranks[i] <= ranks[i - 1]) {
      kiln_fail(KILN_ERR_ARGUMENT, "dist.new_group: ranks must be given in ascending order without repeats (%d after %d)",
                ranks[i], ranks[i - 1]);
      return NULL;
    }
  }
  static int groups_made;
  char name[128];
  int at = snprintf(name, sizeof name, "%d (ranks", ++groups_made);
  for (int i = 0; i < n && at < 110; i++) at += snprintf(name + at, sizeof name - (size_t)at, "%s %d", i ? "," : "", ranks[i]);
  snprintf(name + at, sizeof name - (size_t)at, "%s)", at >= 110 ? " ..." : "");
  struct kiln_group *g = group_new(n, ranks, name);
  if (!g) return NULL;
  struct kiln_work *w = work_new(W_NEW_GROUP, world);
  if (!w) return NULL;
  w->ranks = malloc(sizeof(int) * (size_t)n);
  if (!w->ranks) { kiln_fail(KILN_ERR_MEMORY, "dist: out of memory"); return NULL; }
  memcpy(w->ranks, ranks, sizeof(int) * (size_t)n);
  w->nranks = n;
  w->made = g;
  if (submit(w, NULL)) return NULL;
  return g;
}

KILN_API int kiln_group_rank(const struct kiln_group *g) { return g ? g->rank : -1; }
KILN_API int kiln_group_size(const struct kiln_group *g) { return g ? g->size : 0; }
KILN_API const char *kiln_group_name(const struct kiln_group *g) { return g ? g->name : ""; }
KILN_API int kiln_group_world_rank(const struct kiln_group *g, int r) { return g && r >= 0 && r < g->size ? g->world_ranks[r] : -1; }

/* ---- collectives ---- */

static int check_group(const char *op, struct kiln_group *g) {
  if (!initialized) return kiln_fail(KILN_ERR_STATE, "%s: kiln.dist is not initialised (call kiln.dist.init() first)", op);
  if (!g) return kiln_fail(KILN_ERR_ARGUMENT, "%s: no group given", op);
  if (g->rank < 0) return kiln_fail(KILN_ERR_ARGUMENT, "%s: rank %d is not a member of group %s", op, world_rank, g->name);
  if (broken[0]) return kiln_fail(KILN_ERR_STATE, "%s: the process group is broken since %s", op, broken);
  return KILN_OK;
}

static int check_tensor(const char *op, const char *role, const struct kiln_tensor *t) {
  if (kiln_check_live(op, t)) return kiln_error_code();
  if (t->device.type == KILN_CUDA && !nccl) {
    nccl = open_library("KILN_NCCL_LIB", "libkiln_nccl.so", op, "the NCCL engine carries CUDA tensors; kiln was built without it "
                        "(no CUDA toolkit or NCCL), or NCCL is not on the library path");
    if (!nccl) return kiln_error_code();
  }
  if (t->device.type != KILN_CPU && t->device.type != KILN_CUDA)
    return kiln_fail(KILN_ERR_DEVICE, "%s: %s %s %s is on %s, which no engine carries", op, role, kiln_shape_string(t),
                     kiln_dtype_name(t->dtype), kiln_device_name(t->device));
  if (!kiln_is_contiguous(t))
    return kiln_fail(KILN_ERR_ARGUMENT, "%s: %s %s is not contiguous (call :contiguous() first)", op, role, kiln_shape_string(t));
  return KILN_OK;
}

static int check_op(const char *name, int op, int dtype) {
  if (op < 0 || op > KILN_REDUCE_MEAN) return kiln_fail(KILN_ERR_ARGUMENT, "%s: reduce op %d is not sum, max, min, prod or mean", name, op);
  if (op == KILN_REDUCE_MEAN && !kiln_dtype_is_float(dtype))
    return kiln_fail(KILN_ERR_DTYPE, "%s: mean needs a float dtype, not %s (use sum)", name, kiln_dtype_name(dtype));
  return KILN_OK;
}

KILN_API int kiln_all_reduce(struct kiln_group *g, struct kiln_tensor *t, int op, struct kiln_work **out) {
  if (check_group("all_reduce", g) || check_tensor("all_reduce", "tensor", t) || check_op("all_reduce", op, t->dtype)) return kiln_error_code();
  struct kiln_work *w = work_new(W_ALL_REDUCE, g);
  if (!w) return kiln_error_code();
  w->t = t;
  w->op = op;
  return submit(w, out);
}

KILN_API int kiln_dist_raw_all_reduce(struct kiln_group *g, struct kiln_tensor *t) {
  if (check_group("all_reduce", g) || check_tensor("all_reduce", "tensor", t)) return kiln_error_code();
  struct kiln_work *w = work_new(W_RAW_ALL_REDUCE, g);
  if (!w) return kiln_error_code();
  w->t = t;
  return submit(w, NULL);
}

KILN_API int kiln_broadcast(struct kiln_group *g, struct kiln_tensor *t, int root, struct kiln_work **out) {
  if (check_group("broadcast", g) || check_tensor("broadcast", "tensor", t)) return kiln_error_code();
  if (root < 0 || root >= g->size)
    return kiln_fail(KILN_ERR_ARGUMENT, "broadcast: root %d is not a rank of group %s (0 to %d)", root, g->name, g->size - 1);
  struct kiln_work *w = work_new(W_BROADCAST, g);
  if (!w) return kiln_error_code();
  w->t = t;
  w->root = root;
  return submit(w, out);
}

KILN_API int kiln_all_gather(struct kiln_group *g, struct kiln_tensor *out, const struct kiln_tensor *in, struct kiln_work **wo) {
  if (check_group("all_gather", g) || check_tensor("all_gather", "output", out) || check_tensor("all_gather", "input", in))
    return kiln_error_code();
  if (out->dtype != in->dtype)
    return kiln_fail(KILN_ERR_DTYPE, "all_gather: output is %s, input %s", kiln_dtype_name(out->dtype), kiln_dtype_name(in->dtype));
  if (kiln_check_same_device("all_gather", out, in)) return kiln_error_code();
  if (out->numel != in->numel * g->size)
    return kiln_fail(KILN_ERR_SHAPE, "all_gather: output %s must hold %d x %lld elements (the input %s from each rank of group %s)",
                     kiln_shape_string(out), g->size, (long long)in->numel, kiln_shape_string(in), g->name);
  struct kiln_work *w = work_new(W_ALL_GATHER, g);
  if (!w) return kiln_error_code();
  w->t = out;
  w->in = (struct kiln_tensor *)in;
  return submit(w, wo);
}

KILN_API int kiln_reduce_scatter(struct kiln_group *g, struct kiln_tensor *out, const struct kiln_tensor *in, int op,
                                 struct kiln_work **wo) {
  if (check_group("reduce_scatter", g) || check_tensor("reduce_scatter", "output", out) ||
      check_tensor("reduce_scatter", "input", in) || check_op("reduce_scatter", op, in->dtype))
    return kiln_error_code();
  if (out->dtype != in->dtype)
    return kiln_fail(KILN_ERR_DTYPE, "reduce_scatter: output is %s, input %s", kiln_dtype_name(out->dtype), kiln_dtype_name(in->dtype));
  if (kiln_check_same_device("reduce_scatter", out, in)) return kiln_error_code();
  if (in->numel != out->numel * g->size)
    return kiln_fail(KILN_ERR_SHAPE, "reduce_scatter: input %s must hold %d x %lld elements (one output %s per rank of group %s)",
                     kiln_shape_string(in), g->size, (long long)out->numel, kiln_shape_string(out), g->name);
  struct kiln_work *w = work_new(W_REDUCE_SCATTER, g);
  if (!w) return kiln_error_code();
  w->t = out;
  w->in = (struct kiln_tensor *)in;
  w->op = op;
  return submit(w, wo);
}

KILN_API int kiln_barrier(struct kiln_group *g, struct kiln_work **out) {
  if (check_group("barrier", g)) return kiln_error_code();
  struct kiln_work *w = work_new(W_BARRIER, g);
  if (!w) return kiln_error_code();
  return submit(w, out);
}

static int point_to_point(int kind, struct kiln_group *g, const struct kiln_tensor *t, int peer, int tag, struct kiln_work **out) {
  const char *name = kind == W_SEND ? "send" : "recv";
  if (check_group(name, g) || check_tensor(name, "tensor", t)) return kiln_error_code();
  if (peer < 0 || peer >= g->size || peer == g->rank)
    return kiln_fail(KILN_ERR_ARGUMENT, "%s: rank %d is not another rank of group %s (0 to %d, this is %d)", name, peer, g->name,
                     g->size - 1, g->rank);
  if (tag < 0 || tag > 32767) return kiln_fail(KILN_ERR_ARGUMENT, "%s: tag %d is not in 0 to 32767", name, tag);
  struct kiln_work *w = work_new(kind, g);
  if (!w) return kiln_error_code();
  w->t = (struct kiln_tensor *)t;
  w->peer = peer;
  w->tag = tag;
  return submit(w, out);
}

KILN_API int kiln_send(struct kiln_group *g, const struct kiln_tensor *t, int dst, int tag, struct kiln_work **out) {
  return point_to_point(W_SEND, g, t, dst, tag, out);
}

KILN_API int kiln_recv(struct kiln_group *g, struct kiln_tensor *t, int src, int tag, struct kiln_work **out) {
  return point_to_point(W_RECV, g, t, src, tag, out);
}

/* kiln/dist.h: process groups and collectives over a message engine (Open MPI, through
   libkiln_mpi.so, loaded on kiln_dist_init), and the gradient reducer of data parallelism.
   Ranks are the engine's: 0 .. size-1. Every collective has a deadline (kiln_dist_set_timeout);
   when it passes, the error names the collective, the group, the shape, and the ranks that had not
   arrived, and the group is broken from then on: the job should end. Tensors are CPU tensors,
   contiguous. */
#ifndef KILN_DIST_H
#define KILN_DIST_H
#include <kiln/tensor.h>

enum kiln_reduce_op { KILN_REDUCE_SUM = 0, KILN_REDUCE_MAX = 1, KILN_REDUCE_MIN = 2, KILN_REDUCE_PROD = 3, KILN_REDUCE_MEAN = 4 };

struct kiln_group;
struct kiln_work;

/* Start the engine (once; later calls return KILN_OK). Outside a launcher the process is a world
   of one rank. */
int kiln_dist_init(void);
/* A world of one rank without a launcher or MPI (distributed code run alone; one GPU's checks). */
int kiln_dist_init_single(void);
int kiln_dist_is_initialized(void);
/* Let every queued collective finish, then stop the engine. */
int kiln_dist_finalize(void);
/* End every rank of the job now, with code. */
void kiln_dist_abort(int code);
/* 1 when the process was started by mpirun (or kiln launch), before kiln_dist_init. */
int kiln_dist_launched(void);
const char *kiln_dist_engine_name(void);
int kiln_dist_set_timeout(double seconds);
double kiln_dist_timeout(void);

struct kiln_group *kiln_dist_world(void);
/* A group of the world ranks listed (ascending, no repeats), called by every rank of the world. A
   rank not listed gets a group it is not a member of: its collectives on it are errors. */
struct kiln_group *kiln_dist_new_group(const int *ranks, int n);
int kiln_group_rank(const struct kiln_group *g);    /* -1 when not a member */
int kiln_group_size(const struct kiln_group *g);
int kiln_group_world_rank(const struct kiln_group *g, int group_rank);
const char *kiln_group_name(const struct kiln_group *g);

/* Collectives. With work NULL a call waits for its result; otherwise it returns once queued and
   *work is the handle to wait on (kiln_work_wait), then to release. Collectives run one at a time
   in the order they were called. t is changed in place (all_reduce, broadcast, recv). */
int kiln_all_reduce(struct kiln_group *g, struct kiln_tensor *t, int op, struct kiln_work **work);
int kiln_broadcast(struct kiln_group *g, struct kiln_tensor *t, int root, struct kiln_work **work);
/* out holds size * in->numel elements: rank r's in at r * in->numel. */
int kiln_all_gather(struct kiln_group *g, struct kiln_tensor *out, const struct kiln_tensor *in, struct kiln_work **work);
/* in holds size * out->numel elements; rank r gets the reduction of block r. */
int kiln_reduce_scatter(struct kiln_group *g, struct kiln_tensor *out, const struct kiln_tensor *in, int op,
                        struct kiln_work **work);
int kiln_barrier(struct kiln_group *g, struct kiln_work **work);
int kiln_send(struct kiln_group *g, const struct kiln_tensor *t, int dst, int tag, struct kiln_work **work);
int kiln_recv(struct kiln_group *g, struct kiln_tensor *t, int src, int tag, struct kiln_work **work);
/* The engine's own all-reduce (sum, in place), with no arrival check: the peer bench/dist.lua
   times kiln's all_reduce against. */
int kiln_dist_raw_all_reduce(struct kiln_group *g, struct kiln_tensor *t);

int kiln_work_wait(struct kiln_work *w);
int kiln_work_is_done(const struct kiln_work *w);
void kiln_work_release(struct kiln_work *w);

/* The gradient reducer of data parallelism. Registered on params, it hears from autograd when
   each one's grad is final during backward, packs grads into buckets of about bucket_bytes (the
   first of first_bucket_bytes, so that communication starts early), in the reverse order of
   params, and starts each bucket's all-reduce as soon as it is full, in bucket order, while backward
   goes on. At the end of backward it waits for them and writes the mean back into every grad.
   A param that got no grad in a backward counts as a zero grad (and gets one). */
struct kiln_reducer;
struct kiln_reducer *kiln_reducer_new(struct kiln_group *g, struct kiln_tensor **params, int n, int64_t bucket_bytes,
                                      int64_t first_bucket_bytes);
/* Off: backward leaves grads as they are (gradient accumulation); the next backward while on
   reduces what has accumulated. */
int kiln_reducer_set_enabled(struct kiln_reducer *r, int enabled);
int kiln_reducer_bucket_count(const struct kiln_reducer *r);
/* Elements in bucket k (from 0), -1 when there is none. */
int64_t kiln_reducer_bucket_numel(const struct kiln_reducer *r, int k);
/* Of the last backward: buckets started before its last node had run. */
int kiln_reducer_started_early(const struct kiln_reducer *r);
void kiln_reducer_free(struct kiln_reducer *r);

#endif

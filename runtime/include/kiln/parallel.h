/* kiln/parallel.h: the one thread pool that runs kiln's CPU loops (and its GEMMs).
   OpenBLAS is kept single-threaded and called from this pool, so two pools never compete. */
#ifndef KILN_PARALLEL_H
#define KILN_PARALLEL_H

/* n >= 1; the default is the number of cores the process may run on. */
int kiln_set_num_threads(int n);
int kiln_get_num_threads(void);

#endif

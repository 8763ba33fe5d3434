/*
 * A native host of a fastvideo3 model runtime, written against include/fastvideo3/runtime.h
 * only. Built as a shared library and loaded into the producer's process (graph execs and
 * buffers are process-local); every entry point takes the fv3_model_runtime_v1 pointer.
 *
 * On a GPU it reaches the CUDA runtime through dlopen (fv3c_load_cuda), so it links against
 * nothing but libc and libdl. Errors are written into `err` (NUL-terminated, cap bytes).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fastvideo3/runtime.h"

typedef int (*memcpy_fn)(void *, const void *, size_t, int);
typedef int (*graph_launch_fn)(void *, void *);
typedef int (*stream_sync_fn)(void *);
typedef int (*device_sync_fn)(void);
static memcpy_fn cuda_memcpy;
static device_sync_fn cuda_device_sync;
static graph_launch_fn cuda_graph_launch;
static stream_sync_fn cuda_stream_sync;
#define CUDA_MEMCPY_DEFAULT 4

#define FAIL(code, ...) do { snprintf(err, cap, __VA_ARGS__); return (code); } while (0)

static int check_runtime(const fv3_model_runtime_v1 *rt, char *err, size_t cap) {
  if (!rt) FAIL(-1, "null runtime");
  if (rt->abi_version != FV3_MODEL_RUNTIME_ABI_VERSION) FAIL(-1, "abi_version %u", rt->abi_version);
  if (rt->struct_size < FV3_MODEL_RUNTIME_V1_BASE_SIZE) FAIL(-1, "struct_size %u < base", rt->struct_size);
  if (!rt->exp || rt->exp->abi_version != FV3_RUNTIME_ABI_VERSION) FAIL(-1, "bad export");
  if (rt->exp->struct_size < sizeof(fv3_runtime_export_v1)) FAIL(-1, "export struct_size %u", rt->exp->struct_size);
  return 0;
}

static int verb_status(const fv3_model_runtime_v1 *rt, int32_t st, const char *what, char *err, size_t cap) {
  if (st != FV3_OK) FAIL(st, "%s: status %d: %s", what, st, rt->last_error(rt->ctx));
  return 0;
}

int fv3c_load_cuda(const char *path, char *err, size_t cap) {
  void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (!h) FAIL(-1, "dlopen %s: %s", path, dlerror());
  cuda_memcpy = (memcpy_fn)dlsym(h, "cudaMemcpy");
  cuda_graph_launch = (graph_launch_fn)dlsym(h, "cudaGraphLaunch");
  cuda_stream_sync = (stream_sync_fn)dlsym(h, "cudaStreamSynchronize");
  cuda_device_sync = (device_sync_fn)dlsym(h, "cudaDeviceSynchronize");
  if (!cuda_memcpy || !cuda_graph_launch || !cuda_stream_sync || !cuda_device_sync) FAIL(-1, "missing CUDA symbols");
  return 0;
}

static int copy_bytes(void *dst, const void *src, uint64_t n, int32_t device_type, char *err, size_t cap) {
  if (device_type == FV3_DEVICE_CPU) {
    memcpy(dst, src, n);
    return 0;
  }
  if (!cuda_memcpy) FAIL(-1, "device buffer but the CUDA runtime is not loaded");
  int rc = cuda_memcpy(dst, src, n, CUDA_MEMCPY_DEFAULT);
  if (rc) FAIL(-1, "cudaMemcpy: %d", rc);
  /* A pageable-memory copy may return before its DMA lands, and the producer's stream does not
   * order with the legacy stream: wait, so the next launch on that stream sees the bytes. */
  rc = cuda_device_sync();
  if (rc) FAIL(-1, "cudaDeviceSynchronize: %d", rc);
  return 0;
}

/* FNV-1a 64 of the identity string: a host may check the producer's fingerprint rule. */
uint64_t fv3c_fnv1a64(const char *s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (; *s; ++s) { h ^= (unsigned char)*s; h *= 0x100000001b3ULL; }
  return h;
}

/* Adopt: validate, retain, report identity and fingerprint (and FNV-1a over the identity). */
int fv3c_adopt(const fv3_model_runtime_v1 *rt, uint64_t *fingerprint, uint64_t *identity_fnv,
               char *err, size_t cap) {
  int rc = check_runtime(rt, err, cap);
  if (rc) return rc;
  if ((rc = verb_status(rt, rt->retain(rt->ctx), "retain", err, cap))) return rc;
  *fingerprint = rt->exp->fingerprint;
  *identity_fnv = fv3c_fnv1a64(rt->exp->identity);
  return 0;
}

int fv3c_release(const fv3_model_runtime_v1 *rt, char *err, size_t cap) {
  return verb_status(rt, rt->release(rt->ctx), "release", err, cap);
}

typedef struct { const fv3_model_runtime_v1 *rt; int32_t status; } release_job;
static void *release_thread(void *arg) {
  release_job *job = (release_job *)arg;
  job->status = job->rt->release(job->rt->ctx);
  return NULL;
}

/* Release from a thread the producer never saw (its callback must take the GIL itself). */
int fv3c_release_on_thread(const fv3_model_runtime_v1 *rt, char *err, size_t cap) {
  pthread_t t;
  release_job job = {rt, -1};
  if (pthread_create(&t, NULL, release_thread, &job)) FAIL(-1, "pthread_create");
  pthread_join(t, NULL);
  return verb_status(rt, job.status, "release (other thread)", err, cap);
}

static const fv3_port_v1 *find_port(const fv3_model_runtime_v1 *rt, const char *name, const char *bucket) {
  for (uint32_t i = 0; i < rt->num_ports; ++i) {
    const fv3_port_v1 *p = &rt->ports[i];
    if (!strcmp(p->name, name) && (!p->bucket[0] || !strcmp(p->bucket, bucket))) return p;
  }
  return NULL;
}

/* The buffer window of a SWAP port of `direction` that moves exactly `nbytes` (into `*out`). */
static int swap_buffer(const fv3_model_runtime_v1 *rt, const char *port, const char *bucket, uint32_t direction,
                       uint64_t nbytes, const fv3_buffer_v1 **out, char *err, size_t cap) {
  const int in = direction == FV3_PORT_IN;
  const fv3_port_v1 *p = find_port(rt, port, bucket);
  if (!p) FAIL(FV3_ERR_UNKNOWN_PORT, "no port %s in bucket %s", port, bucket);
  if (p->update != FV3_PORT_SWAP || p->direction != direction || p->buffer_index < 0)
    FAIL(FV3_ERR_INVALID_ARGUMENT, "port %s is not a SWAP %s", port, in ? "input" : "output");
  if (nbytes != p->nbytes) FAIL(FV3_ERR_INVALID_ARGUMENT, "port %s %s %llu bytes", port, in ? "takes" : "gives",
                                (unsigned long long)p->nbytes);
  *out = &rt->exp->buffers[p->buffer_index];
  return 0;
}

/* Write a SWAP input straight into its buffer window: no verb, no producer code runs. */
int fv3c_write_swap(const fv3_model_runtime_v1 *rt, const char *port, const char *bucket,
                    const void *data, uint64_t nbytes, char *err, size_t cap) {
  const fv3_buffer_v1 *b;
  int rc = swap_buffer(rt, port, bucket, FV3_PORT_IN, nbytes, &b, err, cap);
  if (rc) return rc;
  if (b->nbytes < nbytes) FAIL(FV3_ERR_INVALID_ARGUMENT, "buffer %s too small", b->name);
  return copy_bytes(b->data, data, nbytes, b->device_type, err, cap);
}

/* Read a SWAP output straight from its buffer window (after the stream was synchronized). */
int fv3c_read_swap(const fv3_model_runtime_v1 *rt, const char *port, const char *bucket,
                   void *dst, uint64_t nbytes, char *err, size_t cap) {
  const fv3_buffer_v1 *b;
  int rc = swap_buffer(rt, port, bucket, FV3_PORT_OUT, nbytes, &b, err, cap);
  if (rc) return rc;
  return copy_bytes(dst, b->data, nbytes, b->device_type, err, cap);
}

int fv3c_prepare(const fv3_model_runtime_v1 *rt, const char *bucket, char *err, size_t cap) {
  return verb_status(rt, rt->verbs.prepare(rt->ctx, bucket), "prepare", err, cap);
}

int fv3c_step(const fv3_model_runtime_v1 *rt, char *err, size_t cap) {
  return verb_status(rt, rt->verbs.step(rt->ctx), "step", err, cap);
}

int fv3c_get_output(const fv3_model_runtime_v1 *rt, const char *port, void *dst, uint64_t nbytes,
                    char *err, size_t cap) {
  return verb_status(rt, rt->verbs.get_output(rt->ctx, port, dst, nbytes), "get_output", err, cap);
}

/* Bytes of all state regions, in region order. */
uint64_t fv3c_state_bytes(const fv3_model_runtime_v1 *rt) {
  uint64_t n = 0;
  for (uint32_t i = 0; i < rt->exp->num_regions; ++i) n += rt->exp->regions[i].nbytes;
  return n;
}

int fv3c_snapshot(const fv3_model_runtime_v1 *rt, void *dst, uint64_t cap_bytes, char *err, size_t cap) {
  const fv3_runtime_export_v1 *e = rt->exp;
  if (cap_bytes < fv3c_state_bytes(rt)) FAIL(-1, "snapshot buffer too small");
  unsigned char *out = (unsigned char *)dst;
  for (uint32_t i = 0; i < e->num_regions; ++i) {
    const fv3_state_region_v1 *r = &e->regions[i];
    const fv3_buffer_v1 *b = &e->buffers[r->buffer_index];
    if (r->offset + r->nbytes > b->nbytes) FAIL(-1, "region %s outside its buffer", r->name);
    int rc = copy_bytes(out, (unsigned char *)b->data + r->offset, r->nbytes, b->device_type, err, cap);
    if (rc) return rc;
    out += r->nbytes;
  }
  return 0;
}

int fv3c_restore(const fv3_model_runtime_v1 *rt, const void *src, uint64_t nbytes, char *err, size_t cap) {
  const fv3_runtime_export_v1 *e = rt->exp;
  if (nbytes != fv3c_state_bytes(rt)) FAIL(-1, "snapshot has %llu bytes, regions need %llu",
                                          (unsigned long long)nbytes, (unsigned long long)fv3c_state_bytes(rt));
  const unsigned char *in = (const unsigned char *)src;
  for (uint32_t i = 0; i < e->num_regions; ++i) {
    const fv3_state_region_v1 *r = &e->regions[i];
    const fv3_buffer_v1 *b = &e->buffers[r->buffer_index];
    int rc = copy_bytes((unsigned char *)b->data + r->offset, in, r->nbytes, b->device_type, err, cap);
    if (rc) return rc;
    in += r->nbytes;
  }
  return 0;
}

/* Size-probed tail: query_extension is read only when struct_size covers it.
 * Returns the bucket count, -2 when the producer has no such tail, <0 on error. */
int fv3c_bucket_count(const fv3_model_runtime_v1 *rt, char *err, size_t cap) {
  if (!FV3_HAS_FIELD(fv3_model_runtime_v1, rt->struct_size, query_extension)) return -2;
  const void *table = NULL;
  uint64_t size = 0;
  int32_t st = rt->query_extension(rt->ctx, FV3_EXTENSION_BUCKETS, &table, &size);
  if (st) { verb_status(rt, st, "query_extension", err, cap); return -1; }
  if (size < sizeof(fv3_bucket_table_v1)) FAIL(-1, "bucket table of %llu bytes", (unsigned long long)size);
  return (int)((const fv3_bucket_table_v1 *)table)->num_buckets;
}

/* Launch one graph (name, bucket) through its exported exec handle on its stream, then wait. */
int fv3c_launch_graph(const fv3_model_runtime_v1 *rt, const char *name, const char *bucket,
                      char *err, size_t cap) {
  const fv3_runtime_export_v1 *e = rt->exp;
  for (uint32_t i = 0; i < e->num_graphs; ++i) {
    const fv3_graph_v1 *g = &e->graphs[i];
    if (strcmp(g->name, name) || strcmp(g->bucket, bucket)) continue;
    if (!g->exec_handle) FAIL(FV3_ERR_NOT_PREPARED, "graph %s/%s has no exec handle", name, bucket);
    if (!cuda_graph_launch) FAIL(-1, "the CUDA runtime is not loaded");
    void *stream = g->stream_index < e->num_streams ? e->streams[g->stream_index].native_handle : NULL;
    int rc = cuda_graph_launch(g->exec_handle, stream);
    if (rc) FAIL(-1, "cudaGraphLaunch: %d", rc);
    rc = cuda_stream_sync(stream);
    if (rc) FAIL(-1, "cudaStreamSynchronize: %d", rc);
    return 0;
  }
  FAIL(FV3_ERR_UNKNOWN_PORT, "no graph %s in bucket %s", name, bucket);
}

/* One step the way a scheduling host does it: launch each stage's graph in declared order. */
int fv3c_fire_stages(const fv3_model_runtime_v1 *rt, const char *bucket, char *err, size_t cap) {
  for (uint32_t i = 0; i < rt->num_stages; ++i) {
    int rc = fv3c_launch_graph(rt, rt->stages[i].graph, bucket, err, cap);
    if (rc) return rc;
  }
  return 0;
}

/*
 * The round trip of a simple host: adopt, check the fingerprint rule, prepare, write a SWAP
 * input into its buffer, step, read an output (out1), snapshot the state regions, step (out2),
 * restore, step again (out3, which must equal out2), release.
 */
int fv3c_round_trip(const fv3_model_runtime_v1 *rt, const char *bucket, const char *in_port,
                    const void *input, uint64_t in_nbytes, const char *out_port,
                    void *out1, void *out2, void *out3, uint64_t out_nbytes,
                    uint64_t *fingerprint, char *err, size_t cap) {
  uint64_t fnv = 0;
  int rc = fv3c_adopt(rt, fingerprint, &fnv, err, cap);
  if (rc) return rc;
  if (fnv != *fingerprint) { rt->release(rt->ctx); FAIL(-1, "fingerprint is not FNV-1a of identity"); }
  uint64_t n = fv3c_state_bytes(rt);
  void *snap = malloc(n ? n : 1);
  if (!snap) { rt->release(rt->ctx); FAIL(-1, "out of memory"); }
  if (!(rc = fv3c_prepare(rt, bucket, err, cap)) &&
      !(rc = fv3c_write_swap(rt, in_port, bucket, input, in_nbytes, err, cap)) &&
      !(rc = fv3c_step(rt, err, cap)) &&
      !(rc = fv3c_get_output(rt, out_port, out1, out_nbytes, err, cap)) &&
      !(rc = fv3c_snapshot(rt, snap, n, err, cap)) &&
      !(rc = fv3c_step(rt, err, cap)) &&
      !(rc = fv3c_get_output(rt, out_port, out2, out_nbytes, err, cap)) &&
      !(rc = fv3c_restore(rt, snap, n, err, cap)) &&
      !(rc = fv3c_step(rt, err, cap)) &&
      !(rc = fv3c_get_output(rt, out_port, out3, out_nbytes, err, cap))) {
    rc = 0;
  }
  free(snap);
  int32_t st = rt->release(rt->ctx);
  if (!rc && st) FAIL(st, "release: %d", st);
  return rc;
}

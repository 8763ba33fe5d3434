/*
 * fastvideo3 runtime export: the C ABI of one deployed model.
 *
 * A producer (today the Python process that loaded the weights and captured the CUDA graphs)
 * fills two plain-data structs and hands a native host a pointer to the second:
 *
 *   fv3_runtime_export_v1  what the model IS: identity string and its fingerprint, a discovery
 *                          manifest, streams, graph exec handles, buffers, ordered state
 *                          regions, and the owner's retain/release.
 *   fv3_model_runtime_v1   how a host DRIVES it: ports (SWAP / STAGED / SETUP), the stage DAG,
 *                          the verbs set_input / get_output / prepare / step, retain/release,
 *                          and size-probed tails (query_extension).
 *
 * Only POD fields, opaque handles and NUL-terminated strings owned by the export cross this
 * boundary: no Python, no torch, no model code. Everything a struct points at stays valid
 * while the host holds a reference (retain on adopt, release when done, from any thread).
 *
 * Versioning (append-only). Fields are never reordered or removed.
 *   - fv3_runtime_export_v1 grows by appending fields; struct_size says how many bytes the
 *     producer filled. A host reads an appended field only if struct_size covers it
 *     (FV3_HAS_FIELD).
 *   - fv3_model_runtime_v1: the prefix that ends at `release` is the base, measured by
 *     FV3_MODEL_RUNTIME_V1_BASE_SIZE; a host requires only the base. Each later field is a tail
 *     that the host size-probes before reading it: `query_extension` is read only when
 *     struct_size >= FV3_MODEL_RUNTIME_V1_QUERY_EXTENSION_SIZE. abi_version stays 1 for tails.
 *     The embedded verbs table is frozen (fields follow it, so it cannot grow).
 *
 * Handles: on a CUDA device, fv3_stream_v1.native_handle is a cudaStream_t and
 * fv3_graph_v1.exec_handle a cudaGraphExec_t of the producer's process (graph execs are
 * process-local, so the host runs in that process); buffer data pointers are device pointers.
 * On a CPU those handles are NULL and buffer data pointers are host memory.
 */
#ifndef FASTVIDEO3_RUNTIME_H
#define FASTVIDEO3_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FV3_RUNTIME_ABI_VERSION 1u
#define FV3_MODEL_RUNTIME_ABI_VERSION 1u
#define FV3_MAX_DIMS 8

/* Status codes returned by every callback (0 = success). */
enum {
  FV3_OK = 0,
  FV3_ERR_INVALID_ARGUMENT = 1,   /* bad port, size, dtype or bucket */
  FV3_ERR_RELEASED = 2,           /* used after the final release */
  FV3_ERR_UNKNOWN_PORT = 3,
  FV3_ERR_UNAVAILABLE = 4,        /* verb not implemented, or not legal now (e.g. inside step) */
  FV3_ERR_NOT_PREPARED = 5,       /* bucket not prepared */
  FV3_ERR_NO_EXTENSION = 6,       /* query_extension: unknown id */
  FV3_ERR_INTERNAL = 7
};

/* Element types (values are frozen). */
enum {
  FV3_DTYPE_UNKNOWN = 0,
  FV3_DTYPE_F32 = 1,
  FV3_DTYPE_F16 = 2,
  FV3_DTYPE_BF16 = 3,
  FV3_DTYPE_F64 = 4,
  FV3_DTYPE_I64 = 5,
  FV3_DTYPE_I32 = 6,
  FV3_DTYPE_U8 = 7,
  FV3_DTYPE_BOOL = 8
};

enum { FV3_DEVICE_CPU = 1, FV3_DEVICE_CUDA = 2 };

/* Port update classes: the two-speed hot path plus setup. */
enum {
  FV3_PORT_SWAP = 1,   /* a window onto buffers[buffer_index]: the host writes/reads raw bytes */
  FV3_PORT_STAGED = 2, /* the runtime's set_input/get_output verb transforms the value */
  FV3_PORT_SETUP = 3   /* legal only outside step */
};

enum { FV3_PORT_IN = 1, FV3_PORT_OUT = 2 };

typedef struct fv3_stream_v1 {
  const char *name;
  void *native_handle;  /* cudaStream_t on CUDA; NULL on a CPU */
  int32_t device_type;  /* FV3_DEVICE_* */
  int32_t device_index;
} fv3_stream_v1;

/* One captured graph of one shape bucket. A stage names a graph; a host that fires stages
 * itself launches the entry whose (name, bucket) matches the prepared bucket. */
typedef struct fv3_graph_v1 {
  const char *name;
  const char *bucket;    /* "" when the graph has no buckets */
  void *exec_handle;     /* cudaGraphExec_t on CUDA; NULL on a CPU (replay via the step verb) */
  uint32_t stream_index; /* index into streams[], the stream the producer replays it on */
  uint32_t reserved;
} fv3_graph_v1;

typedef struct fv3_buffer_v1 {
  const char *name;
  void *data;            /* device pointer on CUDA, host pointer on a CPU */
  uint64_t nbytes;
  uint32_t dtype;        /* FV3_DTYPE_* */
  int32_t device_type;   /* FV3_DEVICE_* */
  int32_t device_index;
  uint32_t ndim;
  int64_t shape[FV3_MAX_DIMS];
} fv3_buffer_v1;

/* A restorable span of state. Regions are matched by position on restore, so their order,
 * names, dtypes, shapes, offsets and sizes are all part of the identity (and fingerprint). */
typedef struct fv3_state_region_v1 {
  const char *name;
  uint32_t buffer_index; /* index into buffers[]: the state arena */
  uint32_t dtype;
  uint64_t offset;       /* byte offset into that buffer */
  uint64_t nbytes;
  uint32_t ndim;
  uint32_t reserved;
  int64_t shape[FV3_MAX_DIMS];
} fv3_state_region_v1;

typedef struct fv3_runtime_export_v1 {
  uint32_t abi_version;  /* FV3_RUNTIME_ABI_VERSION */
  uint32_t struct_size;  /* bytes filled by the producer (append-only growth) */
  const char *identity;  /* canonical identity string */
  uint64_t fingerprint;  /* FNV-1a 64 of identity's bytes, computed by the producer only */
  const char *manifest_json; /* discovery data; never part of the identity */
  uint32_t num_streams;
  uint32_t num_graphs;
  uint32_t num_buffers;
  uint32_t num_regions;
  const fv3_stream_v1 *streams;
  const fv3_graph_v1 *graphs;
  const fv3_buffer_v1 *buffers;
  const fv3_state_region_v1 *regions;
  void *owner;                          /* opaque; pass to retain/release */
  int32_t (*retain)(void *owner);
  int32_t (*release)(void *owner);
} fv3_runtime_export_v1;

typedef struct fv3_port_v1 {
  const char *name;
  const char *bucket;   /* "" for a fixed-shape port; else one entry per (port, bucket) */
  uint32_t direction;   /* FV3_PORT_IN / FV3_PORT_OUT */
  uint32_t update;      /* FV3_PORT_SWAP / STAGED / SETUP */
  uint32_t dtype;
  int32_t buffer_index; /* SWAP (and buffer-backed SETUP): index into exp->buffers; else -1 */
  uint64_t nbytes;      /* bytes of the window (the leading nbytes of the buffer) */
  uint32_t ndim;
  uint32_t reserved;
  int64_t shape[FV3_MAX_DIMS];
} fv3_port_v1;

typedef struct fv3_stage_v1 {
  const char *graph;          /* fires graphs[] entries with this name */
  uint32_t num_after;
  uint32_t reserved;
  const char *const *after;   /* names of stages that must fire first (declared earlier) */
} fv3_stage_v1;

/* Frozen verbs table. `ctx` is fv3_model_runtime_v1.ctx. Byte-level verbs copy between host
 * memory and the port's bytes; a SWAP port may also be written directly through its buffer. */
typedef struct fv3_model_verbs_v1 {
  int32_t (*set_input)(void *ctx, const char *port, const void *data, uint64_t nbytes);
  int32_t (*get_output)(void *ctx, const char *port, void *dst, uint64_t nbytes);
  int32_t (*prepare)(void *ctx, const char *bucket); /* warm phase; "" = no bucket */
  int32_t (*step)(void *ctx);                        /* fire the stages in declared order */
} fv3_model_verbs_v1;

/* The v1 base of the model-runtime struct, in order; frozen (later fields are tails). */
#define FV3_MODEL_RUNTIME_V1_BASE_FIELDS                                                      \
  uint32_t abi_version;  /* FV3_MODEL_RUNTIME_ABI_VERSION */                                   \
  uint32_t struct_size;  /* >= FV3_MODEL_RUNTIME_V1_BASE_SIZE */                               \
  const fv3_runtime_export_v1 *exp; /* held by the model runtime; do not retain separately */  \
  uint32_t num_ports;                                                                          \
  uint32_t num_stages;                                                                         \
  const fv3_port_v1 *ports;                                                                    \
  const fv3_stage_v1 *stages;                                                                  \
  void *ctx;                                                                                   \
  fv3_model_verbs_v1 verbs;                                                                    \
  const char *(*last_error)(void *ctx); /* message of this thread's last failed call, or "" */ \
  int32_t (*retain)(void *ctx);                                                                \
  int32_t (*release)(void *ctx);

typedef struct fv3_model_runtime_v1 {
  FV3_MODEL_RUNTIME_V1_BASE_FIELDS
  /* ---- end of the v1 base; tails below are size-probed one by one ---- */
  int32_t (*query_extension)(void *ctx, uint32_t extension_id, const void **table,
                             uint64_t *table_size);
} fv3_model_runtime_v1;

/* The struct as a host that knows no tail declares it: the base alone. Such a host requires
 * struct_size >= sizeof(fv3_model_runtime_v1_base) and never reads past it. */
typedef struct fv3_model_runtime_v1_base {
  FV3_MODEL_RUNTIME_V1_BASE_FIELDS
} fv3_model_runtime_v1_base;

#define FV3_FIELD_END(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))
/* True when a struct filled with `size` bytes covers `field`. */
#define FV3_HAS_FIELD(type, size, field) ((uint64_t)(size) >= FV3_FIELD_END(type, field))

#define FV3_MODEL_RUNTIME_V1_BASE_SIZE FV3_FIELD_END(fv3_model_runtime_v1, release)
#define FV3_MODEL_RUNTIME_V1_QUERY_EXTENSION_SIZE FV3_FIELD_END(fv3_model_runtime_v1, query_extension)

/* Extension ids (assigned here only). */
enum {
  /* table: fv3_bucket_table_v1, the shape buckets the ports are keyed by */
  FV3_EXTENSION_BUCKETS = 1
};

typedef struct fv3_bucket_table_v1 {
  uint32_t num_buckets;
  uint32_t reserved;
  const char *const *buckets;
} fv3_bucket_table_v1;

#ifdef __cplusplus
}
#endif
#endif /* FASTVIDEO3_RUNTIME_H */

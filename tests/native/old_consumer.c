/*
 * A host built before the model-runtime struct had any tail: its copy of the struct ends at
 * `release` (the v1 base). It must keep working against a producer that appends tails, because
 * it requires only struct_size >= its own sizeof and never looks past it.
 */
#include <stdio.h>
#include <string.h>

#include "fastvideo3/runtime.h"

typedef fv3_model_runtime_v1_base old_model_runtime_v1; /* the v1 base, as a host that predates tails has it */

_Static_assert(sizeof(old_model_runtime_v1) == FV3_MODEL_RUNTIME_V1_BASE_SIZE, "base prefix drifted");

/* adopt, write a SWAP input into its buffer (CPU), step, read an output, release */
int fv3old_step(const void *ptr, const char *bucket, const char *in_port, const void *input,
                uint64_t in_nbytes, const char *out_port, void *out, uint64_t out_nbytes,
                char *err, size_t cap) {
  const old_model_runtime_v1 *rt = (const old_model_runtime_v1 *)ptr;
  if (rt->abi_version != 1 || rt->struct_size < sizeof(old_model_runtime_v1)) {
    snprintf(err, cap, "incompatible runtime (struct_size %u)", rt->struct_size);
    return -1;
  }
  if (rt->retain(rt->ctx)) { snprintf(err, cap, "retain failed"); return -1; }
  int rc = rt->verbs.prepare(rt->ctx, bucket);
  const fv3_port_v1 *port = NULL;
  for (uint32_t i = 0; !rc && i < rt->num_ports; ++i)
    if (!strcmp(rt->ports[i].name, in_port) && (!rt->ports[i].bucket[0] || !strcmp(rt->ports[i].bucket, bucket)))
      port = &rt->ports[i];
  if (!rc && (!port || port->buffer_index < 0 || port->nbytes != in_nbytes)) rc = -1;
  if (!rc) memcpy(rt->exp->buffers[port->buffer_index].data, input, in_nbytes);
  if (!rc) rc = rt->verbs.step(rt->ctx);
  if (!rc) rc = rt->verbs.get_output(rt->ctx, out_port, out, out_nbytes);
  if (rc) snprintf(err, cap, "status %d: %s", rc, rt->last_error(rt->ctx));
  int32_t st = rt->release(rt->ctx);
  return rc ? rc : st;
}

/* moerun/routing.h — routing methods as data, top-k selection, the
 * permutation used by runners, and the packed interchange form.
 * Reference semantics: shared/spec/routing.md. */
#ifndef MOERUN_ROUTING_H
#define MOERUN_ROUTING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moerun/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* moerun's own stable ids: never renumber; retired values keep their slot.
 * 0 is "unspecified" and is never a valid method (there is no default). */
typedef enum {
    MR_ROUTING_UNSPECIFIED = 0,
    MR_ROUTING_SOFTMAX_TOPK = 1,
    MR_ROUTING_RENORMALIZE = 2,
    MR_ROUTING_TOPK_SOFTMAX = 3,
    MR_ROUTING_MINIMAX2 = 4,
    MR_ROUTING_DEEPSEEK_V3 = 5,
    MR_ROUTING_SIGMOID_RENORM = 6,
    MR_ROUTING_SIGMOID = 7,
    MR_ROUTING_LLAMA4 = 8,
    MR_ROUTING_TOPK = 9,
    MR_ROUTING_COUNT
} mr_routing_id;

/* Most expert groups a grouped method accepts (n_group); DeepSeek-V3 uses 8. */
#define MR_ROUTING_MAX_GROUPS 1024

/* One routing problem instance. */
typedef struct {
    mr_routing_id method;
    int n_experts;      /* E */
    int top_k;          /* k */
    int n_group;        /* grouped selection (deepseek_v3); <= 1 means no groups */
    int topk_group;     /* groups kept */
    float scale;        /* routed scaling factor applied to the weights (1.0 when unused) */
    const float *bias;  /* [E] e_score_correction_bias (fp32), required by methods that use it */
} mr_routing;

const char *mr_routing_name(mr_routing_id id); /* "minimax2"...; "unspecified" for 0 */
mr_status mr_routing_from_name(const char *name, mr_routing_id *out);
bool mr_routing_uses_bias(mr_routing_id id);
bool mr_routing_is_grouped(mr_routing_id id);
/* llama4: the weight multiplies the expert input, not its output. */
bool mr_routing_weight_on_input(mr_routing_id id);
/* Checks E, k, groups and bias against the method; clear error otherwise. */
mr_status mr_routing_validate(const mr_routing *r);

/* Routes T tokens: logits [T][E] fp32 -> ids [T][k] (selection order) and
 * weights [T][k] fp32. An all-NaN token is MR_EINPUT naming the token. */
mr_status mr_route(const mr_routing *r, const float *logits, int64_t T, int32_t *ids, float *weights);

/* The permutation of T*k (token, choice) slots sorted by expert, tokens
 * ascending within an expert. Caller-provided arrays:
 * counts [E], offsets [E+1], slot_of [T*k], token_of [T*k] (token_of[s] =
 * t*k + j, i.e. the flat (token, choice) index). ids out of [0,E) -> MR_EINPUT. */
typedef struct {
    int32_t *counts;
    int32_t *offsets;
    int32_t *slot_of;
    int32_t *token_of;
} mr_permutation;
mr_status mr_permutation_build(const int32_t *ids, int64_t T, int k, int E, mr_permutation *p);

/* Packed interchange: expert id in the high 16 bits, bf16 bits of the weight
 * in the low 16 bits. Unpacking masks with 0xFFFF (no sign extension). */
uint32_t mr_routing_pack(int32_t expert, float weight);
void mr_routing_unpack(uint32_t packed, int32_t *expert, float *weight);

#ifdef __cplusplus
}
#endif
#endif

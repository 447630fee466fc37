/* permutation.c — the expert-sorted permutation of routed (token, choice)
 * slots that runners use to group rows by expert, and the packed int32
 * interchange form of one choice.
 *
 * Permutation of T tokens x k choices (n = T*k slots, flat index f = t*k + j):
 *   counts[e]      number of slots routed to expert e
 *   offsets[e]     first slot of expert e's segment; offsets[E] = n
 *   slot_of[f]     the slot of (t, j) in expert-sorted order
 *   token_of[s]    its inverse: the flat index f stored at slot s
 * Within one expert's segment the flat indices ascend (so tokens ascend),
 * which keeps every reduction order deterministic.
 *
 * Packed form (one uint32 per choice):
 *   bits 31..16  expert id (0..65535)
 *   bits 15..0   bf16 bits of the weight (RNE)
 * Unpacking masks with 0xFFFF on an unsigned value, so a negative weight's
 * sign bit never leaks into the expert id and vice versa. */
#include "moerun/formats.h"
#include "moerun/routing.h"

mr_status mr_permutation_build(const int32_t *ids, int64_t T, int k, int E, mr_permutation *p) {
    if (!p || !p->counts || !p->offsets) return mr_error_set(MR_EINVAL, "mr_permutation_build: NULL output");
    if (T < 0 || k < 1 || E < 1)
        return mr_error_set(MR_EINVAL, "mr_permutation_build: bad shape T = %lld, k = %d, E = %d", (long long)T, k, E);
    uint64_t n64;
    if (!mr_u64_mul((uint64_t)T, (uint64_t)k, &n64) || n64 > (uint64_t)INT32_MAX)
        return mr_error_set(MR_EOVERFLOW, "mr_permutation_build: %lld tokens x %d choices exceed the int32 slot range",
                            (long long)T, k);
    const int64_t n = (int64_t)n64;
    if (n > 0 && (!ids || !p->slot_of || !p->token_of))
        return mr_error_set(MR_EINVAL, "mr_permutation_build: NULL ids, slot_of or token_of");

    /* Check every id before writing anything. */
    for (int64_t f = 0; f < n; f++)
        if (ids[f] < 0 || ids[f] >= E)
            return mr_error_set(MR_EINPUT, "expert id %d of token %lld (choice %d) is outside [0, %d)", (int)ids[f],
                                (long long)(f / k), (int)(f % k), E);

    for (int e = 0; e < E; e++) p->counts[e] = 0;
    for (int64_t f = 0; f < n; f++) p->counts[ids[f]]++;
    p->offsets[0] = 0;
    for (int e = 0; e < E; e++) p->offsets[e + 1] = p->offsets[e] + p->counts[e];

    /* Counting sort, stable in f: counts are reused as per-expert cursors
     * and end equal to the counts again. */
    for (int e = 0; e < E; e++) p->counts[e] = 0;
    for (int64_t f = 0; f < n; f++) {
        const int32_t e = ids[f];
        const int32_t s = p->offsets[e] + p->counts[e]++;
        p->slot_of[f] = s;
        p->token_of[s] = (int32_t)f;
    }
    return MR_OK;
}

uint32_t mr_routing_pack(int32_t expert, float weight) {
    MR_ASSERT(expert >= 0 && expert <= 0xFFFF); /* the packed form holds 16-bit ids */
    return ((uint32_t)expert << 16) | (uint32_t)mr_f32_to_bf16(weight);
}

void mr_routing_unpack(uint32_t packed, int32_t *expert, float *weight) {
    if (expert) *expert = (int32_t)(packed >> 16);
    if (weight) *weight = mr_bf16_to_f32((uint16_t)(packed & 0xFFFFu));
}

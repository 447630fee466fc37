/* steal.h — a chunk list split into per-thread ranges with stealing, for
 * parallel regions whose threads stream memory (the routed experts, the dense
 * matmul). Each thread owns one contiguous range [front, back) of chunk
 * indices, packed in 64 bits in its own 64-byte slot, and walks it forward; a
 * thread that runs dry moves the back half of another thread's remaining
 * range into its own slot and walks that. So each thread still streams long
 * runs of memory, and a thread the OS takes away for a moment (an HTTP loop
 * beside the engine) delays the region by little: the others take its work.
 * Which thread computes a chunk never changes its result. */
#ifndef MOERUN_BASE_STEAL_H
#define MOERUN_BASE_STEAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MR__STEAL_STRIDE 8 /* uint64 per range slot: one 64-byte line */

static inline uint64_t mr__rng_pack(uint32_t f, uint32_t b) { return (uint64_t)f << 32 | b; }

/* Thread me's first range of n chunks shared by nt threads (before the region's first take). */
static inline void mr__rng_init(_Atomic uint64_t *rs, int64_t n, int nt, int me) {
    atomic_store_explicit(&rs[(size_t)me * MR__STEAL_STRIDE],
                          mr__rng_pack((uint32_t)(n * me / nt), (uint32_t)(n * (me + 1) / nt)), memory_order_relaxed);
}

static inline int64_t mr__rng_take_front(_Atomic uint64_t *r) {
    uint64_t v = atomic_load_explicit(r, memory_order_relaxed);
    for (;;) {
        const uint32_t f = (uint32_t)(v >> 32), b = (uint32_t)v;
        if (f >= b) return -1;
        if (atomic_compare_exchange_weak_explicit(r, &v, mr__rng_pack(f + 1, b), memory_order_acq_rel,
                                                  memory_order_relaxed))
            return f;
    }
}

/* Moves the back half of another thread's range into mine; false if all are empty. Only its
 * owner stores into a slot other than by CAS, and only while the slot is empty, so no thief's
 * CAS is lost. */
static inline bool mr__rng_steal(_Atomic uint64_t *rs, int nt, int me) {
    for (int i = 1; i < nt; i++) {
        _Atomic uint64_t *v = &rs[(size_t)((me + i) % nt) * MR__STEAL_STRIDE];
        uint64_t x = atomic_load_explicit(v, memory_order_relaxed);
        for (;;) {
            const uint32_t f = (uint32_t)(x >> 32), b = (uint32_t)x;
            if (f >= b) break;
            const uint32_t m = f + (b - f) / 2;
            if (atomic_compare_exchange_weak_explicit(v, &x, mr__rng_pack(f, m), memory_order_acq_rel,
                                                      memory_order_relaxed)) {
                atomic_store_explicit(&rs[(size_t)me * MR__STEAL_STRIDE], mr__rng_pack(m, b), memory_order_release);
                return true;
            }
        }
    }
    return false;
}

/* The next chunk for thread me, or -1 when every range is empty. */
static inline int64_t mr__rng_next(_Atomic uint64_t *rs, int nt, int me) {
    for (;;) {
        const int64_t t = mr__rng_take_front(&rs[(size_t)me * MR__STEAL_STRIDE]);
        if (t >= 0) return t;
        if (!mr__rng_steal(rs, nt, me)) return -1;
    }
}

#endif

/* a2a_pairs.c — the registry of supported (a2a transport, MoE runner) pairs.
 * It is data: one row per supported pair; anything not listed is refused.
 * A runner that routes inside its kernel cannot sit behind a transport that
 * must dispatch tokens by expert first, so mpi is declared with routed and
 * reference, the runners that take precomputed (ids, weights).
 * (The runners' own predicates check the same thing from their side; a test
 * checks that the two agree.) */
#include <stdio.h>
#include <string.h>

#include "config/config_internal.h"

typedef struct {
    mr_a2a a2a;
    bool any;               /* every runner */
    mr_moe_runner_id runner;
    const char *why;
} pair_row;

static const pair_row pairs[] = {
    {MR_A2A_NONE, true, MR_RUNNER_REFERENCE, "without a transport every runner works, in one process"},
    {MR_A2A_MPI, false, MR_RUNNER_ROUTED,
     "routed takes precomputed (ids, weights), so mpi can dispatch tokens by expert first"},
    {MR_A2A_MPI, false, MR_RUNNER_REFERENCE,
     "reference takes precomputed (ids, weights) and computes each row on its own, so mpi can dispatch tokens by "
     "expert first"},
};

bool mr_a2a_pair_supported(mr_a2a a, const mr_moe_runner *r, char *why, size_t n) {
    if (why && n) why[0] = 0;
    if (r == NULL) {
        if (why && n) snprintf(why, n, "no runner given.");
        return false;
    }
    char listed[128] = "";
    size_t used = 0;
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        if (pairs[i].a2a != a) continue;
        if (pairs[i].any || pairs[i].runner == r->id) {
            if (why && n) snprintf(why, n, "%s.", pairs[i].why);
            return true;
        }
        const mr_moe_runner *listed_r = mr_moe_runner_get(pairs[i].runner);
        int w = snprintf(listed + used, sizeof listed - used, "%s%s", used ? ", " : "",
                         listed_r ? listed_r->name : "(not built)");
        if (w > 0 && (size_t)w < sizeof listed - used) used += (size_t)w;
    }
    if (why && n) {
        if (r->routes_itself && mr_a2a_needs_routing_first(a))
            snprintf(why, n, "%s routes inside its kernel, but %s must dispatch tokens by expert first (the pair registry lists %s with: %s).",
                     r->name, mr_a2a_name(a), mr_a2a_name(a), used ? listed : "no runner");
        else
            snprintf(why, n, "the pair registry does not list (%s, %s); %s is declared with: %s.", mr_a2a_name(a),
                     r->name, mr_a2a_name(a), used ? listed : "no runner");
    }
    return false;
}

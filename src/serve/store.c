/* store.c — the Responses API's stored responses: what `store` (true unless
 * the request says false, as OpenAI's default is) keeps for GET and DELETE
 * /v1/responses/{id}, its input_items, and a later request's
 * previous_response_id; and the Conversations API's conversations (a second
 * store that never evicts).
 *
 * In memory, bounded in bytes (--response-store-mb, --conversation-store-mb):
 * past the bound the least recently used entries go first (a put or a get
 * uses an entry), or, in a store made without eviction, a put or an edit that
 * would pass it is refused (room reserved for edits to come counts); an entry
 * larger than the whole bound is not kept. Each entry is JSON text (the
 * Response, and the conversation items up to and including its output; a
 * conversation's object), so that no jansson value is shared between the HTTP
 * threads; every call takes the store's lock and copies what it returns. An
 * entry can be claimed by one owner at a time (a conversation's running
 * response), beside its text. */
#include <stdlib.h>
#include <string.h>

#include "serve/serve_internal.h"

#define N_BUCKETS 16384u /* a power of two; chains stay short at the bound's typical entry counts */
#define ENTRY_OVERHEAD 96u /* what an entry costs beside its texts, counted against the bound */

typedef struct entry {
    char *id, *response, *items;
    char owner[64]; /* who holds the entry's claim (sv_store_claim), "" none */
    int n_input;
    size_t bytes;
    struct entry *newer, *older; /* the use order */
    struct entry *chain;         /* the bucket's next */
} entry;

struct sv_store {
    pthread_mutex_t mu;
    size_t cap, bytes;
    size_t reserved; /* room promised to edits to come (sv_store_reserve), counted against the bound */
    bool evict; /* past the bound: the least recently used go (else the put is refused) */
    int64_t count;
    uint64_t evicted;
    entry *buckets[N_BUCKETS];
    entry *newest, *oldest;
};

static uint32_t id_hash(const char *s) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h & (N_BUCKETS - 1);
}

sv_store *sv_store_new(size_t cap_bytes, bool evict) {
    if (!cap_bytes) return NULL;
    sv_store *st = mr_calloc(1, sizeof *st);
    if (!st) return NULL;
    if (pthread_mutex_init(&st->mu, NULL)) {
        mr_free(st);
        return NULL;
    }
    st->cap = cap_bytes;
    st->evict = evict;
    return st;
}

static void entry_free(entry *e) {
    mr_free(e->id);
    mr_free(e->response);
    mr_free(e->items);
    mr_free(e);
}

void sv_store_free(sv_store *st) {
    if (!st) return;
    for (entry *e = st->newest, *next; e; e = next) {
        next = e->older;
        entry_free(e);
    }
    pthread_mutex_destroy(&st->mu);
    mr_free(st);
}

static void unlink_use(sv_store *st, entry *e) {
    if (e->newer) e->newer->older = e->older;
    else st->newest = e->older;
    if (e->older) e->older->newer = e->newer;
    else st->oldest = e->newer;
    e->newer = e->older = NULL;
}

static void link_newest(sv_store *st, entry *e) {
    e->older = st->newest;
    e->newer = NULL;
    if (st->newest) st->newest->newer = e;
    st->newest = e;
    if (!st->oldest) st->oldest = e;
}

/* The entry of id; NULL when absent. */
static entry *find(sv_store *st, const char *id) {
    for (entry *e = st->buckets[id_hash(id)]; e; e = e->chain)
        if (!strcmp(e->id, id)) return e;
    return NULL;
}

static void drop(sv_store *st, entry *e) {
    entry **l = &st->buckets[id_hash(e->id)];
    while (*l != e) l = &(*l)->chain;
    *l = e->chain;
    unlink_use(st, e);
    st->bytes -= e->bytes;
    st->count--;
    entry_free(e);
}

static char *dup_text(const char *s) {
    const size_t n = strlen(s) + 1;
    char *d = mr_malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

int sv_store_put(sv_store *st, const char *id, const char *response, const char *items, int n_input) {
    const size_t bytes = strlen(id) + strlen(response) + strlen(items) + ENTRY_OVERHEAD;
    if (bytes > st->cap) return 1;
    entry *e = mr_calloc(1, sizeof *e);
    if (!e || !(e->id = dup_text(id)) || !(e->response = dup_text(response)) || !(e->items = dup_text(items))) {
        if (e) entry_free(e);
        return -1;
    }
    e->n_input = n_input;
    e->bytes = bytes;
    pthread_mutex_lock(&st->mu);
    entry *old = find(st, id);
    if (!st->evict && st->bytes + st->reserved - (old ? old->bytes : 0) + bytes > st->cap) {
        pthread_mutex_unlock(&st->mu);
        entry_free(e);
        return 2;
    }
    if (old) drop(st, old); /* a put of the same id replaces it */
    while (st->oldest && st->bytes + bytes > st->cap) {
        drop(st, st->oldest);
        st->evicted++;
    }
    const uint32_t h = id_hash(id);
    e->chain = st->buckets[h];
    st->buckets[h] = e;
    link_newest(st, e);
    st->bytes += bytes;
    st->count++;
    pthread_mutex_unlock(&st->mu);
    return 0;
}

int sv_store_get(sv_store *st, const char *id, char **response, char **items, int *n_input) {
    if (response) *response = NULL;
    if (items) *items = NULL;
    pthread_mutex_lock(&st->mu);
    entry *e = find(st, id);
    int rc = e ? 0 : 1;
    if (e) {
        unlink_use(st, e);
        link_newest(st, e);
        if ((response && !(*response = dup_text(e->response))) || (items && !(*items = dup_text(e->items)))) rc = -1;
        if (n_input) *n_input = e->n_input;
    }
    pthread_mutex_unlock(&st->mu);
    if (rc < 0) {
        if (response) mr_free(*response), *response = NULL;
        if (items) mr_free(*items), *items = NULL;
    }
    return rc;
}

int sv_store_edit(sv_store *st, const char *id, bool grow, char *(*fn)(const char *response, void *arg, int *rc),
                  void *arg) {
    pthread_mutex_lock(&st->mu);
    entry *e = find(st, id);
    int rc = 1;
    char *t = e ? (rc = 0, fn(e->response, arg, &rc)) : NULL;
    if (t) {
        const size_t bytes = e->bytes - strlen(e->response) + strlen(t);
        if (bytes > e->bytes && st->bytes + st->reserved - e->bytes + bytes > st->cap && !grow) { /* (shrinking is taken) */
            rc = 2;
            mr_free(t);
        } else {
            mr_free(e->response);
            e->response = t;
            st->bytes = st->bytes - e->bytes + bytes;
            e->bytes = bytes;
            unlink_use(st, e);
            link_newest(st, e);
        }
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

bool sv_store_delete(sv_store *st, const char *id) {
    pthread_mutex_lock(&st->mu);
    entry *e = find(st, id);
    if (e) drop(st, e);
    pthread_mutex_unlock(&st->mu);
    return e != NULL;
}

int sv_store_claim(sv_store *st, const char *id, const char *owner) {
    pthread_mutex_lock(&st->mu);
    entry *e = find(st, id);
    const int rc = !e ? 1 : e->owner[0] ? 2 : 0;
    if (!rc) snprintf(e->owner, sizeof e->owner, "%s", owner);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

void sv_store_unclaim(sv_store *st, const char *id, const char *owner) {
    pthread_mutex_lock(&st->mu);
    entry *e = find(st, id);
    if (e && !strcmp(e->owner, owner)) e->owner[0] = 0;
    pthread_mutex_unlock(&st->mu);
}

bool sv_store_reserve(sv_store *st, size_t n) {
    pthread_mutex_lock(&st->mu);
    const bool ok = st->bytes + st->reserved + n <= st->cap;
    if (ok) st->reserved += n;
    pthread_mutex_unlock(&st->mu);
    return ok;
}

void sv_store_unreserve(sv_store *st, size_t n) {
    pthread_mutex_lock(&st->mu);
    st->reserved -= n < st->reserved ? n : st->reserved;
    pthread_mutex_unlock(&st->mu);
}

void sv_store_stats(sv_store *st, int64_t *count, size_t *bytes, uint64_t *evicted) {
    pthread_mutex_lock(&st->mu);
    *count = st->count;
    *bytes = st->bytes;
    *evicted = st->evicted;
    pthread_mutex_unlock(&st->mu);
}

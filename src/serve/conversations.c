/* conversations.c — OpenAI's Conversations API (/v1/conversations) and a
 * Responses request's `conversation`.
 *
 * A conversation is one entry of a store without eviction (store.c,
 * --conversation-store-mb), its text the object
 *   {"id": "conv_<48 hex>", "object": "conversation", "created_at",
 *    "metadata": {...}, "items": [item, ...]}
 * where every item has an id and is one the Responses API reads as input
 * (messages, function_call, function_call_output, reasoning), checked as such
 * when it is added. The routes:
 *   POST   /v1/conversations                  {items?, metadata?}  -> the conversation
 *   GET    /v1/conversations/{id}                                  -> the conversation
 *   POST   /v1/conversations/{id}             {metadata}           -> the conversation
 *   DELETE /v1/conversations/{id}                                  -> conversation.deleted
 *   GET    /v1/conversations/{id}/items       ?limit&order&after   -> a list (newest first)
 *   POST   /v1/conversations/{id}/items       {items}              -> a list of the added items
 *   GET    /v1/conversations/{id}/items/{item}                     -> the item
 *   DELETE /v1/conversations/{id}/items/{item}                     -> the conversation
 * A Responses request naming a conversation is given its items before its
 * input, and when it ends (completed or incomplete) its input's items and its
 * output are added (respond.c). A put or an edit that would pass the bound is
 * refused, never an older conversation dropped; a response's own items are
 * added even past it (the check is made when it is admitted), so that no
 * answered turn is missing from its conversation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve/serve_internal.h"

enum { MAX_ADD = 20 }; /* items per create (OpenAI's) */
#define STORE_FULL "the conversation store is full (--conversation-store-mb): delete conversations or items to make room"

/* An item's type / id, "" when it has none. */
static const char *str_of(const json_t *it, const char *key) {
    const char *v = json_string_value(json_object_get(it, key));
    return v ? v : "";
}

int sv_check_metadata(const json_t *x, const char *param, sv_error *e) {
    if (!json_is_object(x) || json_object_size(x) > 16)
        return sv_fail(e, 400, param, "%s must be an object of at most 16 keys", param);
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)x, k, v) {
        if (strlen(k) > 64) return sv_fail(e, 400, param, "%s: a key is longer than 64 characters ('%.40s...')", param, k);
        if (!json_is_string(v) || json_string_length(v) > 512)
            return sv_fail(e, 400, param, "%s.%.64s must be a string of at most 512 characters", param, k);
    }
    return 0;
}

/* The conversation object of an entry's text: without its items. NULL out of memory. */
static json_t *public_of(json_t *conv) {
    return json_pack("{s:O,s:s,s:O,s:O}", "id", json_object_get(conv, "id"), "object", "conversation", "created_at",
                     json_object_get(conv, "created_at"), "metadata", json_object_get(conv, "metadata"));
}

static char *dump_public(json_t *conv, sv_error *e) {
    json_t *o = public_of(conv);
    char *t = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!t) sv_fail(e, 500, NULL, "out of memory");
    return t;
}

/* A json_dumps text as the store's (mr_malloc'd). */
static char *store_text(json_t *v) {
    char *t = json_dumps(v, JSON_COMPACT), *m = t ? mr_strdup(t) : NULL;
    free(t);
    return m;
}

/* items (a list the client sent under `param`) checked as Responses input and given ids: a new list, or NULL
 * with *e filled. Empty is allowed where empty_ok. */
static json_t *new_items(const json_t *items, const char *param, bool empty_ok, sv_error *e) {
    if (!json_is_array(items) || (!empty_ok && !json_array_size(items)))
        return sv_fail(e, 400, param, "%s must be a %slist of items", param, empty_ok ? "" : "non-empty "), NULL;
    if (json_array_size(items) > MAX_ADD)
        return sv_fail(e, 400, param, "%s has %zu items; at most %d are added at a time", param, json_array_size(items),
                       MAX_ADD), NULL;
    char hex[49];
    sv_random_hex(hex, 24);
    json_t *msgs = json_array();
    if (!msgs) return sv_fail(e, 500, NULL, "out of memory"), NULL;
    const int bad = json_array_size(items) ? sv_resp_input_msgs(items, msgs, e) : 0;
    json_decref(msgs);
    if (bad) { /* its messages name "input[i]": the items of this request */
        for (char *p; (p = strstr(e->message, "input[")) || (p = strstr(e->message, "input "));) memcpy(p, "items", 5);
        if (!strncmp(e->param, "input", 5)) memcpy(e->param, "items", 5); /* param is "items" */
        return NULL;
    }
    json_t *out = sv_resp_ctx_items(items, hex);
    for (size_t i = 0; out && i < json_array_size(out); i++) { /* messages as the API lists them: with a status */
        json_t *it = json_array_get(out, i);
        if (!strcmp(str_of(it, "type"), "message") && !json_object_get(it, "status") &&
            json_object_set_new(it, "status", json_string("completed")))
            json_decref(out), out = NULL;
    }
    if (!out) sv_fail(e, 500, NULL, "out of memory");
    return out;
}

/* ---- edits under the store's lock ---- */

typedef struct {
    const json_t *add;  /* items to append */
    const json_t *meta; /* metadata to set */
    const char *item;   /* the item to delete */
    json_t *result;     /* the conversation after the edit (a copy) */
} edit_arg;

static char *apply(const char *text, void *arg, int *rc) {
    edit_arg *a = arg;
    json_t *conv = json_loads(text, 0, NULL), *items = json_object_get(conv, "items");
    *rc = -1;
    if (!json_is_array(items)) {
        json_decref(conv);
        return NULL;
    }
    if (a->add && json_array_extend(items, (json_t *)a->add)) goto oom;
    if (a->meta && json_object_set(conv, "metadata", (json_t *)a->meta)) goto oom;
    if (a->item) {
        size_t i = 0;
        while (i < json_array_size(items) && strcmp(a->item, str_of(json_array_get(items, i), "id")))
            i++;
        if (i == json_array_size(items)) {
            json_decref(conv);
            *rc = 4; /* no such item */
            return NULL;
        }
        json_array_remove(items, i);
    }
    char *t = store_text(conv);
    if (!t) goto oom;
    a->result = conv;
    *rc = 0;
    return t;
oom:
    json_decref(conv);
    return NULL;
}

static int edit(sv_store *cv, const char *id, bool grow, edit_arg *a, sv_error *e) {
    const int rc = sv_store_edit(cv, id, grow, apply, a);
    if (rc == 1) return sv_fail(e, 404, "conversation_id", "Conversation with id '%.100s' not found", id);
    if (rc == 2)
        return sv_fail(e, 400, "items", STORE_FULL);
    if (rc == 4) return sv_fail(e, 404, "item_id", "Item with id '%.100s' not found in conversation '%.100s'", a->item, id);
    if (rc) return sv_fail(e, 500, NULL, "out of memory");
    return 0;
}

/* The stored conversation of id (parsed); NULL with *e filled. */
static json_t *load(sv_store *cv, const char *id, sv_error *e) {
    char *text = NULL;
    const int rc = sv_store_get(cv, id, &text, NULL, NULL);
    if (rc > 0) return sv_fail(e, 404, "conversation_id", "Conversation with id '%.100s' not found", id), NULL;
    json_t *conv = rc ? NULL : json_loads(text, 0, NULL);
    mr_free(text);
    if (!conv) sv_fail(e, 500, NULL, "out of memory");
    return conv;
}

/* The request body as an object of only the fields named (NULL-ended); NULL with *e filled. */
static json_t *body_of(const char *body, size_t len, const char *const *fields, sv_error *e) {
    json_t *req = sv_body_object(body, len, e);
    const char *k;
    json_t *v;
    if (req) json_object_foreach(req, k, v) {
        int i = 0;
        while (fields[i] && strcmp(fields[i], k)) i++;
        if (!fields[i]) {
            sv_fail(e, 400, k, "unknown field '%.60s'", k);
            json_decref(req);
            return NULL;
        }
    }
    return req;
}

static char *create(sv_store *cv, const char *body, size_t len, sv_error *e) {
    static const char *const F[] = {"items", "metadata", "safety_identifier", NULL};
    json_t *req = body_of(body, len, F, e);
    if (!req) return NULL;
    const json_t *meta = json_object_get(req, "metadata"), *its = json_object_get(req, "items");
    const json_t *sid = json_object_get(req, "safety_identifier");
    json_t *items = NULL, *conv = NULL;
    char *text = NULL, *answer = NULL, hex[49], id[64];
    if (sid && !json_is_null(sid) && !json_is_string(sid)) {
        sv_fail(e, 400, "safety_identifier", "safety_identifier must be a string");
        goto out;
    }
    if (meta && !json_is_null(meta) && sv_check_metadata(meta, "metadata", e)) goto out;
    if (!(items = its && !json_is_null(its) ? new_items(its, "items", true, e) : json_array())) {
        if (!its || json_is_null(its)) sv_fail(e, 500, NULL, "out of memory");
        goto out;
    }
    sv_random_hex(hex, 24);
    snprintf(id, sizeof id, "conv_%s", hex);
    conv = json_pack("{s:s,s:s,s:I,s:o,s:O}", "id", id, "object", "conversation", "created_at", (json_int_t)time(NULL),
                     "metadata", meta && !json_is_null(meta) ? json_deep_copy(meta) : json_object(), "items", items);
    if (!conv || !(text = store_text(conv))) {
        sv_fail(e, 500, NULL, "out of memory");
        goto out;
    }
    const int rc = sv_store_put(cv, id, text, "", 0);
    if (rc == 1 || rc == 2) sv_fail(e, 400, "items", STORE_FULL);
    else if (rc) sv_fail(e, 500, NULL, "out of memory");
    else answer = dump_public(conv, e);
out:
    mr_free(text);
    json_decref(conv);
    json_decref(items);
    json_decref(req);
    return answer;
}

/* reasoning items with encrypted_content (include reasoning.encrypted_content): their text behind this
 * server's prefix, as the Responses API gives it */
static int with_encrypted(json_t *items) {
    for (size_t i = 0; i < json_array_size(items); i++) {
        json_t *it = json_array_get(items, i), *parts = json_object_get(it, "content");
        if (!json_array_size(parts)) parts = json_object_get(it, "summary"); /* as the Responses input reads it */
        if (strcmp(str_of(it, "type"), "reasoning") || json_object_get(it, "encrypted_content"))
            continue;
        sv_buf b = {0};
        int bad = sv_buf_lit(&b, SV_ENC_PREFIX);
        for (size_t k = 0; !bad && k < json_array_size(parts); k++) {
            const char *t = json_string_value(json_object_get(json_array_get(parts, k), "text"));
            bad = (k && sv_buf_lit(&b, "\n")) || (t && sv_buf_add(&b, t, strlen(t)));
        }
        bad = bad || json_object_set_new(it, "encrypted_content", json_stringn(b.p, b.len));
        sv_buf_free(&b);
        if (bad) return -1;
    }
    return 0;
}

/* The answer for items: OpenAI's list of them, whole (has_more false). */
static char *list_of(json_t *items, sv_error *e) {
    json_t *first = json_object_get(json_array_get(items, 0), "id");
    json_t *last = json_object_get(json_array_get(items, json_array_size(items) - 1), "id");
    json_t *o = json_pack("{s:s,s:O,s:O?,s:O?,s:b}", "object", "list", "data", items, "first_id", first, "last_id", last,
                          "has_more", 0);
    char *t = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!t) sv_fail(e, 500, NULL, "out of memory");
    return t;
}

static char *add_items(sv_store *cv, const char *id, const char *body, size_t len, bool enc, sv_error *e) {
    static const char *const F[] = {"items", NULL};
    json_t *req = body_of(body, len, F, e);
    if (!req) return NULL;
    json_t *items = new_items(json_object_get(req, "items"), "items", false, e);
    json_decref(req);
    if (!items) return NULL;
    edit_arg a = {.add = items};
    char *t = NULL;
    if (!edit(cv, id, false, &a, e)) {
        if (enc && with_encrypted(items)) sv_fail(e, 500, NULL, "out of memory");
        else t = list_of(items, e);
    }
    json_decref(a.result);
    json_decref(items);
    return t;
}

/* GET .../items/{item}; DELETE .../items/{item} (the conversation after it). */
static char *one_item(sv_store *cv, const char *id, const char *item, bool del, bool enc, sv_error *e) {
    if (del) {
        edit_arg a = {.item = item};
        char *t = edit(cv, id, false, &a, e) ? NULL : dump_public(a.result, e);
        json_decref(a.result);
        return t;
    }
    json_t *conv = load(cv, id, e), *items = json_object_get(conv, "items"), *hit = NULL;
    if (!conv) return NULL;
    for (size_t i = 0; !hit && i < json_array_size(items); i++)
        if (!strcmp(item, str_of(json_array_get(items, i), "id"))) hit = json_array_get(items, i);
    json_t *one = hit ? json_pack("[O]", hit) : NULL;
    char *t = NULL;
    if (!hit) sv_fail(e, 404, "item_id", "Item with id '%.100s' not found in conversation '%.100s'", item, id);
    else if (!one || (enc && with_encrypted(one)) || !(t = json_dumps(json_array_get(one, 0), JSON_COMPACT)))
        sv_fail(e, 500, NULL, "out of memory");
    json_decref(one);
    json_decref(conv);
    return t;
}

char *sv_conv_handle(sv_store *cv, const char *method, const char *path, const char *body, size_t len,
                     const sv_conv_query *q, sv_error *e) {
    const bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    const bool del = !strcmp(method, "DELETE");
    if (!cv)
        return sv_fail(e, 404, NULL, "the Conversations API is off on this server (--conversation-store-mb 0)"), NULL;
    if (q->bad_include)
        return sv_fail(e, 400, "include", "include \"%.60s\" is not supported (reasoning.encrypted_content and "
                       "message.output_text.logprobs are)", q->bad_include), NULL;
    if (!*path) {
        if (!post) return e->allow = "POST", sv_fail(e, 405, NULL, "/v1/conversations takes POST, not %.16s", method), NULL;
        return create(cv, body, len, e);
    }
    /* path: /{id}[/items[/{item}]] */
    char id[160], item[160];
    const char *p = path + 1, *tail = strchr(p, '/');
    const size_t n = tail ? (size_t)(tail - p) : strlen(p);
    if (!n || n >= sizeof id) return sv_fail(e, 404, "conversation_id", "Conversation with id '%.100s' not found", p), NULL;
    memcpy(id, p, n);
    id[n] = 0;
    if (!tail) {
        if (get) {
            json_t *conv = load(cv, id, e);
            char *t = conv ? dump_public(conv, e) : NULL;
            json_decref(conv);
            return t;
        }
        if (del) {
            if (!sv_store_delete(cv, id)) return sv_fail(e, 404, "conversation_id", "Conversation with id '%s' not found", id), NULL;
            json_t *o = json_pack("{s:s,s:s,s:b}", "id", id, "object", "conversation.deleted", "deleted", 1);
            char *t = o ? json_dumps(o, JSON_COMPACT) : NULL;
            json_decref(o);
            if (!t) sv_fail(e, 500, NULL, "out of memory");
            return t;
        }
        static const char *const F[] = {"metadata", NULL};
        json_t *req = body_of(body, len, F, e);
        if (!req) return NULL;
        const json_t *meta = json_object_get(req, "metadata");
        char *t = NULL;
        edit_arg a = {.meta = meta};
        if (!meta) sv_fail(e, 400, "metadata", "metadata is required");
        else if (!sv_check_metadata(meta, "metadata", e) && !edit(cv, id, false, &a, e)) t = dump_public(a.result, e);
        json_decref(a.result);
        json_decref(req);
        return t;
    }
    if (strncmp(tail, "/items", 6) || (tail[6] && tail[6] != '/') || (tail[6] == '/' && !tail[7]))
        return sv_fail(e, 404, NULL, "no route for %.16s /v1/conversations%.200s", method, path), NULL;
    if (tail[6] == '/') {
        if (strlen(tail + 7) >= sizeof item || strchr(tail + 7, '/'))
            return sv_fail(e, 404, "item_id", "Item with id '%.100s' not found", tail + 7), NULL;
        snprintf(item, sizeof item, "%s", tail + 7);
        if (!get && !del)
            return e->allow = "GET, HEAD, DELETE",
                   sv_fail(e, 405, NULL, "a conversation item takes GET or DELETE, not %.16s", method), NULL;
        return one_item(cv, id, item, del, q->encrypted, e);
    }
    if (post) return add_items(cv, id, body, len, q->encrypted, e);
    if (!get)
        return e->allow = "GET, HEAD, POST",
               sv_fail(e, 405, NULL, "a conversation's items take GET or POST, not %.16s", method), NULL;
    json_t *conv = load(cv, id, e), *items = json_object_get(conv, "items");
    if (!conv) return NULL;
    char *t = NULL;
    if (q->encrypted && with_encrypted(items)) sv_fail(e, 500, NULL, "out of memory");
    else t = sv_item_page(items, (long)json_array_size(items), q->limit, q->order, q->after, "item of this conversation", e);
    json_decref(conv);
    return t;
}

/* ---- a Responses request's conversation ---- */

int sv_conv_id(sv_store *cv, const json_t *x, char id[64], sv_error *e) {
    const json_t *v = json_is_object(x) ? json_object_get(x, "id") : x;
    if (!json_is_string(v) || (json_is_object(x) && json_object_size(x) != 1))
        return sv_fail(e, 400, "conversation", "conversation must be a conversation id or {\"id\": ...}");
    if (!cv)
        return sv_fail(e, 400, "conversation", "conversation needs the Conversations API, which is off on this server "
                       "(--conversation-store-mb 0)");
    if (json_string_length(v) >= 64)
        return sv_fail(e, 404, "conversation", "Conversation with id '%.60s...' not found", json_string_value(v));
    snprintf(id, 64, "%s", json_string_value(v));
    return 0;
}

json_t *sv_conv_claim(sv_store *cv, const char *id, const char *owner, size_t reserve, sv_error *e) {
    const int rc = sv_store_claim(cv, id, owner);
    if (rc == 1) return sv_fail(e, 404, "conversation", "Conversation with id '%s' not found", id), NULL;
    if (rc == 2)
        return sv_fail(e, 409, "conversation", "conversation '%s' is running another response; a conversation runs one "
                       "at a time: retry when it has ended", id), NULL;
    if (!sv_store_reserve(cv, reserve)) {
        sv_store_unclaim(cv, id, owner);
        return sv_fail(e, 400, "conversation", STORE_FULL " for this response's input"), NULL;
    }
    json_t *conv = load(cv, id, e), *items = json_incref(json_object_get(conv, "items"));
    if (!items) { /* out of memory, or deleted since the claim (load says which) */
        if (conv) sv_fail(e, 500, NULL, "out of memory");
        else if (e->http == 404) snprintf(e->param, sizeof e->param, "conversation");
        sv_conv_release(cv, id, owner, reserve);
    }
    json_decref(conv);
    return items;
}

void sv_conv_release(sv_store *cv, const char *id, const char *owner, size_t reserved) {
    if (!id[0]) return;
    sv_store_unclaim(cv, id, owner);
    sv_store_unreserve(cv, reserved);
}

void sv_conv_append(sv_store *cv, const char *id, const json_t *input, const json_t *output) {
    json_t *items = json_copy((json_t *)input);
    if (!items || json_array_extend(items, (json_t *)output)) {
        json_decref(items);
        MR_WARN("serve: out of memory adding a response's items to conversation %s", id);
        return;
    }
    edit_arg a = {.add = items};
    sv_error e;
    if (edit(cv, id, true, &a, &e) && e.http != 404) /* 404: deleted while the response ran */
        MR_WARN("serve: the items of a response were not added to conversation %s: %s", id, e.message);
    json_decref(a.result);
    json_decref(items);
}

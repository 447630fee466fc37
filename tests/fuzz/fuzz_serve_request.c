/* fuzz_serve_request.c — libFuzzer target for the server's request parser
 * (serve/request.c), the Responses and Messages APIs' translations to a
 * chat request (serve/responses.c, serve/anthropic.c) and the stop-string
 * scanner (serve/stop.c), and sglang's /generate translation (serve/sglang.c).
 * The first byte picks the endpoint (bit 0 chat, bit 2 responses, bit 3
 * Anthropic's messages, bit 5 sglang's generate, with bit 7 sglang's /v1/score); the rest is the HTTP body. Invariants: a parse
 * either succeeds, with fields inside their documented ranges, or fails
 * with a 4xx/5xx status, a message, and an error body that is JSON of the
 * section-3 shape. A Responses request may chain to "resp_kept" (a stored
 * conversation with a reasoning item, a message and a call) through
 * previous_response_id, or name "conv_kept" (a conversation) as its conversation; its translation's
 * conversation items each have an id. Bit 6 sends the body to the Conversations API instead (bits 0-2 the
 * route and method, 3-5 and 7 the list's query): an answer is a JSON object, or a clean refusal, and the
 * kept conversation stays readable, its items each with an id (DELETE of it is not among the routes).
 * On success the stop strings are run over the body's own
 * bytes in random pieces, checking that the scanner never releases bytes it
 * later retracts. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_internal.h"

#define CHECK(x) \
    do {         \
        if (!(x)) abort(); \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static sv_store *store, *convs;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!store) {
        store = sv_store_new(1 << 20, true);
        CHECK(store && !sv_store_put(store, "resp_kept", "{}",
                                     "[{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":"
                                     "\"input_text\",\"text\":\"hi\"}]},{\"id\":\"rs_1\",\"type\":\"reasoning\",\"summary\":[],"
                                     "\"content\":[{\"type\":\"reasoning_text\",\"text\":\"think\"}]},{\"id\":\"fc_1\",\"type\":"
                                     "\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{}\"}]", 1));
    }
    if (!convs) {
        convs = sv_store_new(1 << 16, false);
        CHECK(convs && !sv_store_put(convs, "conv_kept",
                                     "{\"id\":\"conv_kept\",\"object\":\"conversation\",\"created_at\":1,\"metadata\":{},"
                                     "\"items\":[{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"user\",\"status\":"
                                     "\"completed\",\"content\":[{\"type\":\"input_text\",\"text\":\"hi\"}]}]}", "", 0));
    }
    if (size < 1) return 0;
    if (data[0] & 64) { /* the Conversations API: an answer that is a JSON object, or a clean refusal */
        static const char *const M[] = {"POST", "POST", "POST", "GET", "GET", "DELETE", "DELETE", "GET"};
        static const char *const P[] = {"", "/conv_kept/items", "/conv_kept", "/conv_kept/items", "/conv_kept/items/msg_1",
                                        "/conv_kept/items/x", "/conv_x", "/conv_kept"};
        const int w = data[0] & 7;
        sv_conv_query q = {.limit = (data[0] & 8) ? "2" : NULL, .order = (data[0] & 16) ? "asc" : NULL,
                           .after = (data[0] & 32) ? "msg_1" : NULL, .encrypted = data[0] & 128};
        sv_error ce;
        memset(&ce, 0, sizeof ce);
        char *a = sv_conv_handle(convs, M[w], P[w], (const char *)data + 1, size - 1, &q, &ce);
        if (!a) {
            CHECK(ce.http >= 400 && ce.http < 600 && ce.message[0]);
        } else {
            json_t *o = json_loads(a, 0, NULL);
            CHECK(json_is_object(o));
            json_decref(o);
            mr_free(a);
        }
        char *kept = NULL;
        CHECK(sv_store_get(convs, "conv_kept", &kept, NULL, NULL) == 0);
        json_t *conv = json_loads(kept, 0, NULL), *items = json_object_get(conv, "items");
        CHECK(json_is_array(items) && json_array_size(items) >= 1);
        for (size_t i = 0; i < json_array_size(items); i++) CHECK(json_is_string(json_object_get(json_array_get(items, i), "id")));
        json_decref(conv);
        mr_free(kept);
        return 0;
    }
    sv_kind k = (data[0] & 1) ? SV_CHAT : SV_COMPLETIONS;
    const char *body = (const char *)data + 1;
    size_t n = size - 1;
    sv_limits lim = {.max_completion_tokens = 4096, .max_choices = 16, .vocab = 1000};
    sv_request r;
    sv_error e;
    memset(&e, 0, sizeof e);
    char *chat = NULL;
    json_t *echo = NULL;
    const bool score = (data[0] & 32) && (data[0] & 128);
    if (data[0] & 32) { /* sglang's /generate or /v1/score: a clean refusal, or a completions request the parser reads */
        if (score ? sv_score_to_completions(body, n, &chat, &echo, &e) : sv_sglang_to_completions(body, n, &chat, &echo, &e)) {
            CHECK(e.http >= 400 && e.http < 600 && e.message[0] && !chat && !echo);
            return 0;
        }
        CHECK(chat && json_is_object(echo));
        k = SV_COMPLETIONS;
        body = chat;
        n = strlen(chat);
    } else if (data[0] & 12) { /* the Responses / Messages APIs: a clean refusal, or a chat request the parser reads */
        const bool resp = data[0] & 4;
        sv_resp_in in;
        if (resp ? sv_responses_to_chat(body, n, store, convs, &in, &e) : sv_anthropic_to_chat(body, n, data[0] & 16, &chat, &e)) {
            CHECK(e.http >= 400 && e.http < 600 && e.message[0] && !chat && (!resp || (!in.chat_json && !in.echo && !in.ctx)));
            return 0;
        }
        if (resp) {
            chat = in.chat_json, echo = in.echo;
            CHECK(json_is_array(in.ctx) && json_array_size(in.ctx) >= 1 && !strncmp(in.id, "resp_", 5));
            for (size_t i = 0; i < json_array_size(in.ctx); i++) CHECK(json_is_string(json_object_get(json_array_get(in.ctx, i), "id")));
            CHECK(!in.conv[0] || json_is_array(in.conv_input));
            if (in.conv[0]) sv_conv_release(convs, in.conv, in.id, in.conv_reserved); /* what the request's free does */
            CHECK(sv_store_claim(convs, "conv_kept", "probe") == 0); /* no claim is left behind */
            sv_store_unclaim(convs, "conv_kept", "probe");
            json_decref(in.ctx);
            json_decref(in.conv_input);
        }
        CHECK(chat && (!resp || json_is_object(echo)));
        k = SV_CHAT;
        body = chat;
        n = strlen(chat);
    }
    if (sv_request_parse(k, body, n, &lim, &r, &e)) {
        free(chat);
        json_decref(echo);
        CHECK(e.http >= 400 && e.http < 600);
        CHECK(e.message[0]);
        char *b = sv_error_body(&e);
        CHECK(b);
        json_error_t je;
        json_t *o = json_loads(b, 0, &je);
        CHECK(o && json_is_string(json_object_get(json_object_get(o, "error"), "message")));
        json_decref(o);
        free(b);
        return 0;
    }
    CHECK(r.kind == k);
    CHECK(r.n >= 1 && r.n <= lim.max_choices);
    CHECK(r.max_tokens == -1 || (r.max_tokens >= (r.echo ? 0 : 1) && r.max_tokens <= lim.max_completion_tokens));
    if (data[0] & 32) { /* what /generate adds after the parse: the prompt alone, the prompt's logprobs */
        sv_sglang_apply(echo, &r);
        CHECK(r.max_tokens == -1 || (r.max_tokens >= 0 && r.max_tokens <= lim.max_completion_tokens));
        CHECK(r.plp_from >= 0 && r.prompt_logprobs >= -1 && r.prompt_logprobs <= SV_MAX_TOP_LOGPROBS);
        CHECK((r.prompt_logprobs >= 0) == (r.plp_from > 0));
        CHECK(r.routes == json_is_true(json_object_get(echo, "routes")));
        /* rid: a string, or a batch's list of strings, one per prompt */
        const json_t *rid = json_object_get(echo, "rid");
        CHECK(!rid || json_is_string(rid) ||
              (json_is_array(rid) && json_is_true(json_object_get(echo, "batch")) && json_array_size(rid) == (size_t)r.n_prompts));
        for (size_t i = 0; json_is_array(rid) && i < json_array_size(rid); i++) CHECK(json_is_string(json_array_get(rid, i)));
        /* token_ids_logprob: a list of integers, or (a batch only) a list of them or nulls, 1024 ids at most each */
        const json_t *ti = json_object_get(echo, "token_ids_logprob");
        const bool each = json_is_true(json_object_get(echo, "lp_ids_each"));
        CHECK(!ti || json_is_array(ti));
        CHECK(!each || (ti && json_is_true(json_object_get(echo, "batch"))));
        for (size_t i = 0; ti && i < (each ? json_array_size(ti) : 1); i++) {
            const json_t *l = each ? json_array_get(ti, i) : ti;
            CHECK(json_is_null(l) || (json_is_array(l) && json_array_size(l) <= MR_ENGINE_MAX_LOGPROB_IDS));
            for (size_t k2 = 0; k2 < json_array_size(l); k2++) CHECK(json_is_integer(json_array_get(l, k2)));
        }
        if (score) { /* the prompts alone, the labels after each; the answer's shape over log-probabilities of 0 */
            const size_t nl = json_array_size(ti);
            CHECK(r.max_tokens == 0 && r.n_prompts >= 1 && !each && nl >= 1);
            const float **lp = calloc((size_t)r.n_prompts, sizeof *lp);
            float *zero = calloc(nl, sizeof(float));
            CHECK(lp && zero);
            for (int i = 0; i < r.n_prompts; i++) lp[i] = zero;
            json_t *so = sv_score_object(echo, "m", r.n_prompts, lp, (int)nl, 1);
            const json_t *sc = json_object_get(so, "scores");
            CHECK(json_array_size(sc) == (size_t)r.n_prompts);
            const double want = json_is_true(json_object_get(echo, "apply_softmax")) ? 1.0 / (double)nl : 1.0;
            for (size_t i = 0; i < json_array_size(sc); i++) {
                CHECK(json_array_size(json_array_get(sc, i)) == nl);
                for (size_t t = 0; t < nl; t++) CHECK(fabs(json_real_value(json_array_get(json_array_get(sc, i), t)) - want) < 1e-12);
            }
            json_decref(so);
            free(lp);
            free(zero);
        }
    }
    CHECK(!r.has_temperature || (r.temperature >= 0 && r.temperature <= 2));
    CHECK(!r.has_top_p || (r.top_p > 0 && r.top_p <= 1));
    CHECK(r.n_stop >= 0 && r.n_stop <= SV_MAX_STOP);
    if (k == SV_COMPLETIONS) {
        CHECK(r.n_prompts >= 1);
        for (int i = 0; i < r.n_prompts; i++) {
            CHECK(r.prompts[i].text || r.prompts[i].n_ids > 0);
            for (int64_t j = 0; j < r.prompts[i].n_ids; j++) CHECK(r.prompts[i].ids[j] >= 0 && r.prompts[i].ids[j] < 1000);
        }
    } else {
        CHECK(json_is_array(r.messages) && json_array_size(r.messages) > 0);
    }
    for (int i = 0; i < r.n_stop_ids; i++) CHECK(r.stop_ids[i] >= 0 && r.stop_ids[i] < 1000);
    if (r.n_stop) {
        sv_stop st;
        sv_stop_init(&st, r.n_stop, r.stop);
        size_t have = 0, scanned = 0, sent = 0;
        unsigned seed = (unsigned)size;
        while (have < n) {
            seed = seed * 1103515245u + 12345u;
            have += 1 + (seed >> 16) % 7;
            if (have > n) have = n;
            size_t cut, end, safe;
            if (sv_stop_scan(&st, body, have, scanned, &cut, &end, &safe)) {
                CHECK(cut >= sent && cut < end && end <= have);
                CHECK(!memcmp(body + cut, r.stop[0], 0));
                break;
            }
            CHECK(safe >= sent && safe <= have && have - safe < st.max_len);
            sent = safe;
            scanned = have;
        }
    }
    sv_request_free(&r);
    free(chat);
    json_decref(echo);
    return 0;
}

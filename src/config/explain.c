/* explain.c — telling the story of a resolution: `moerun resolve`'s table,
 * `--explain` (the declaration log pass by pass, then each option with its
 * chain of sources), `--json` (schema: docs/resolve-json.md) and the
 * one-line summary other commands print at startup. Reads the resolution;
 * never changes it. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"

static const char *const pass_order[] = {"checkpoint", "platform", "model_overrides", "moe_runner",
                                         "a2a",        "layout",   "engine",          "validate", "publish"};
#define N_PASSES (sizeof pass_order / sizeof pass_order[0])

static char mark(mr_decl_kind k) {
    switch (k) {
    case MR_DECL_SET: return '=';
    case MR_DECL_REFUSE: return 'x';
    case MR_DECL_NOTE: return '-';
    case MR_DECL_ERROR: return '!';
    }
    return '?';
}

/* "default auto > model_overrides routed > moe_runner routed" */
static void chain(const mr_resolution *r, mr_opt_id id, char *buf, size_t n) {
    const mr_option_def *d = mr_option_at((int)id);
    size_t used = 0;
    int w;
    if (r->user_source[id] == MR_SRC_DEFAULT)
        w = snprintf(buf, n, "default %s", *d->def ? d->def : "(none)");
    else
        w = snprintf(buf, n, "%s %s", r->user_source[id] == MR_SRC_FLAG ? d->flag : d->env, r->user_value[id]);
    if (w < 0 || (size_t)w >= n) return;
    used = (size_t)w;
    for (int i = 0; i < r->n_decls; i++) {
        const mr_decl *x = &r->decls[i];
        if (x->kind != MR_DECL_SET || strcmp(x->field, d->name) != 0) continue;
        w = snprintf(buf + used, n - used, " > %s %s", x->source, x->value);
        if (w < 0 || (size_t)w >= n - used) return;
        used += (size_t)w;
    }
}

static void model_line(const mr_resolution *r, FILE *f) {
    const mr_model_desc *m = &r->model;
    fprintf(f, "model: %s%s%s%s, %lld layers, hidden %lld, %d experts x %lld, top-%d, routing %s\n", m->architecture,
            m->model_type[0] ? " (" : "", m->model_type, m->model_type[0] ? ")" : "", (long long)m->n_layers,
            (long long)m->hidden, m->n_experts, (long long)m->moe_inter, m->top_k, mr_routing_name(m->routing));
}

void mr_resolution_print(const mr_resolution *r, FILE *f) {
    if (r == NULL) return;
    fprintf(f, "%-20s %-16s %s\n", "option", "value", "from");
    for (int i = 0; i < MR_OPT_COUNT; i++) {
        const mr_option_def *d = mr_option_at(i);
        const char *v = mr_resolution_value(r, (mr_opt_id)i);
        const char *from = mr_opt_source_name(r->user_source[i]);
        for (int j = r->n_decls - 1; j >= 0; j--)
            if (r->decls[j].kind == MR_DECL_SET && !strcmp(r->decls[j].field, d->name)) {
                from = r->decls[j].source;
                break;
            }
        fprintf(f, "%-20s %-16s %s\n", d->name, *v ? v : "(none)", from);
    }
    if (r->status != MR_OK) fprintf(f, "FAILED: %s\n", r->error);
}

void mr_resolution_explain(const mr_resolution *r, FILE *f) {
    if (r == NULL) return;
    fprintf(f, "moerun resolve: %s\n", r->user_value[MR_OPT_MODEL][0] ? r->user_value[MR_OPT_MODEL] : "(no model)");
    if (r->have_model) model_line(r, f);
    fprintf(f, "(= decided, x refused, - noted, ! failed)\n");
    int step = 0;
    for (size_t p = 0; p < N_PASSES; p++) {
        bool header = false;
        for (int i = 0; i < r->n_decls; i++) {
            const mr_decl *x = &r->decls[i];
            if (strcmp(x->source, pass_order[p]) != 0) continue;
            if (!header) {
                if (p == 2 && r->have_model)
                    fprintf(f, "%d %s [%s]\n", (int)p + 1, pass_order[p], r->model.architecture);
                else
                    fprintf(f, "%d %s\n", (int)p + 1, pass_order[p]);
                header = true;
                step++;
            }
            if (strlen(x->value) > 14)
                fprintf(f, "    %-18s %c %s\n    %-18s   %-14s %s\n", x->field, mark(x->kind), x->value, "", "", x->reason);
            else
                fprintf(f, "    %-18s %c %-14s %s\n", x->field, mark(x->kind), x->value, x->reason);
        }
    }
    (void)step;
    fprintf(f, "result\n");
    for (int i = 0; i < MR_OPT_COUNT; i++) {
        const mr_option_def *d = mr_option_at(i);
        const char *v = mr_resolution_value(r, (mr_opt_id)i);
        char ch[512];
        chain(r, (mr_opt_id)i, ch, sizeof ch);
        if (strlen(v) > 14)
            fprintf(f, "    %-18s = %s\n    %-18s   %-14s %s\n", d->name, v, "", "", ch);
        else
            fprintf(f, "    %-18s = %-14s %s\n", d->name, *v ? v : "(none)", ch);
    }
    int nref = 0;
    for (int i = 0; i < r->n_decls; i++)
        if (r->decls[i].kind == MR_DECL_REFUSE) nref++;
    if (nref) {
        fprintf(f, "refusals\n");
        for (int i = 0; i < r->n_decls; i++)
            if (r->decls[i].kind == MR_DECL_REFUSE)
                fprintf(f, "    %s (asked by %s): %s\n", r->decls[i].value, r->decls[i].source, r->decls[i].reason);
    }
    if (r->status == MR_OK && r->exec)
        fprintf(f, "ok: published, checksum %016llx\n", (unsigned long long)r->exec->checksum);
    else
        fprintf(f, "FAILED: %s\n", r->error);
}

void mr_resolution_summary(const mr_resolution *r, char *buf, size_t n) {
    if (n == 0) return;
    if (r == NULL) {
        snprintf(buf, n, "resolution: none");
        return;
    }
    if (r->status != MR_OK || r->exec == NULL) {
        snprintf(buf, n, "resolution failed: %s", r->error);
        return;
    }
    const mr_exec *x = r->exec;
    char ref[400] = "";
    size_t used = 0;
    for (int i = 0; i < r->n_decls; i++) {
        const mr_decl *d = &r->decls[i];
        if (d->kind != MR_DECL_REFUSE || strcmp(d->field, "moe_runner_backend") != 0) continue;
        /* one clause per runner: its first sentence, without the parenthetical detail */
        bool seen = false;
        for (int j = 0; j < i; j++)
            if (r->decls[j].kind == MR_DECL_REFUSE && !strcmp(r->decls[j].value, d->value)) seen = true;
        if (seen) continue;
        size_t len = strcspn(d->reason, "(");
        while (len > 0 && (d->reason[len - 1] == ' ' || d->reason[len - 1] == '.')) len--;
        int w = snprintf(ref + used, sizeof ref - used, "%s%s refused: %.*s", used ? "; " : " (", d->value, (int)len,
                         d->reason);
        if (w < 0 || (size_t)w >= sizeof ref - used) break;
        used += (size_t)w;
    }
    if (used && used + 1 < sizeof ref) {
        ref[used] = ')';
        ref[used + 1] = 0;
    }
    snprintf(buf, n, "resolved: %s %s %s runner=%s a2a=%s isa=%s threads=%d%s%s%s", x->model->architecture,
             mr_quant_name(x->quant), mr_act_mode_name(x->act_mode), x->runner->name, mr_a2a_name(x->a2a),
             mr_kernel_isa_name(x->kernel_isa), x->threads, x->batch_invariant ? " deterministic" : "",
             x->dense_act_dtype == MR_FMT_BF16 ? " dense=bf16" : "", ref);
}

/* ---- JSON ---- */

static int add(json_t *obj, const char *k, json_t *v) { return v ? json_object_set_new(obj, k, v) : -1; }

char *mr_resolution_json(const mr_resolution *r) {
    if (r == NULL) return NULL;
    json_t *root = json_object();
    if (root == NULL) return NULL;
    int bad = 0;
    bad |= add(root, "schema", json_string("moerun.resolve/1"));
    bad |= add(root, "ok", json_boolean(r->status == MR_OK));
    bad |= add(root, "error", r->status == MR_OK ? json_null() : json_string(r->error));
    bad |= add(root, "model_dir", json_string(r->user_value[MR_OPT_MODEL]));
    if (r->have_model) {
        const mr_model_desc *m = &r->model;
        json_t *jm = json_object();
        bad |= add(jm, "architecture", json_string(m->architecture));
        bad |= add(jm, "model_type", json_string(m->model_type));
        bad |= add(jm, "hidden", json_integer(m->hidden));
        bad |= add(jm, "layers", json_integer(m->n_layers));
        bad |= add(jm, "experts", json_integer(m->n_experts));
        bad |= add(jm, "top_k", json_integer(m->top_k));
        bad |= add(jm, "expert_intermediate", json_integer(m->moe_inter));
        bad |= add(jm, "routing", json_string(mr_routing_name(m->routing)));
        bad |= add(jm, "routing_reason", json_string(m->routing_why));
        bad |= add(jm, "quantization", json_string(mr_quant_name(m->quant.kind)));
        bad |= add(jm, "quantization_source", json_string(m->quant.where));
        json_t *ex = json_array();
        for (int i = 0; ex && i < m->quant.n_exclude; i++) bad |= json_array_append_new(ex, json_string(m->quant.exclude[i]));
        bad |= add(jm, "excluded", ex);
        bad |= add(root, "model", jm);
    } else {
        bad |= add(root, "model", json_null());
    }
    json_t *opts = json_object();
    for (int i = 0; opts && i < MR_OPT_COUNT; i++) {
        const mr_option_def *d = mr_option_at(i);
        json_t *o = json_object();
        bad |= add(o, "value", json_string(mr_resolution_value(r, (mr_opt_id)i)));
        bad |= add(o, "user_value", json_string(r->user_value[i]));
        bad |= add(o, "user_source", json_string(mr_opt_source_name(r->user_source[i])));
        bad |= add(o, "explicit", json_boolean(mr__user_fixed(r, (mr_opt_id)i)));
        json_t *ch = json_array();
        for (int j = 0; ch && j < r->n_decls; j++) {
            const mr_decl *x = &r->decls[j];
            if (x->kind != MR_DECL_SET || strcmp(x->field, d->name) != 0) continue;
            json_t *e = json_object();
            bad |= add(e, "source", json_string(x->source));
            bad |= add(e, "value", json_string(x->value));
            bad |= add(e, "reason", json_string(x->reason));
            bad |= json_array_append_new(ch, e);
        }
        bad |= add(o, "chain", ch);
        bad |= add(opts, d->name, o);
    }
    bad |= add(root, "options", opts);
    json_t *decls = json_array();
    json_t *refs = json_array();
    for (int j = 0; decls && refs && j < r->n_decls; j++) {
        const mr_decl *x = &r->decls[j];
        json_t *e = json_object();
        bad |= add(e, "kind", json_string(mr_decl_kind_name(x->kind)));
        bad |= add(e, "source", json_string(x->source));
        bad |= add(e, "field", json_string(x->field));
        bad |= add(e, "value", json_string(x->value));
        bad |= add(e, "reason", json_string(x->reason));
        bad |= json_array_append_new(decls, e);
        if (x->kind == MR_DECL_REFUSE) {
            json_t *rf = json_object();
            bad |= add(rf, "field", json_string(x->field));
            bad |= add(rf, "candidate", json_string(x->value));
            bad |= add(rf, "source", json_string(x->source));
            bad |= add(rf, "reason", json_string(x->reason));
            bad |= json_array_append_new(refs, rf);
        }
    }
    bad |= add(root, "declarations", decls);
    bad |= add(root, "refusals", refs);
    if (r->status == MR_OK && r->exec) {
        const mr_exec *x = r->exec;
        json_t *je = json_object();
        char ck[32], fl[300];
        snprintf(ck, sizeof ck, "%016llx", (unsigned long long)x->checksum);
        mr__cpu_flags_str(x->cpu_flags, fl, sizeof fl);
        bad |= add(je, "runner", json_string(x->runner->name));
        bad |= add(je, "a2a", json_string(mr_a2a_name(x->a2a)));
        bad |= add(je, "ep_size", json_integer(x->ep_size));
        bad |= add(je, "ep_rank", json_integer(x->problem.ep_rank));
        bad |= add(je, "local_experts", json_pack("[i, i]", x->problem.local_first, x->problem.n_local));
        bad |= add(je, "ep_timeout", json_integer(x->ep_timeout_s));
        bad |= add(je, "quantization", json_string(mr_quant_name(x->quant)));
        bad |= add(je, "activation_mode", json_string(mr_act_mode_name(x->act_mode)));
        bad |= add(je, "router_dtype", json_string(x->router_dtype == MR_FMT_BF16 ? "bf16" : "fp32"));
        bad |= add(je, "device", json_string(mr_device_name(x->device)));
        bad |= add(je, "kernel_isa", json_string(mr_kernel_isa_name(x->kernel_isa)));
        bad |= add(je, "cpu_flags", json_string(fl));
        bad |= add(je, "threads", json_integer(x->threads));
        bad |= add(je, "step_threads", json_string(x->step_threads_fixed ? "fixed" : "adaptive"));
        bad |= add(je, "enable_deterministic_inference", json_boolean(x->batch_invariant));
        bad |= add(je, "dense_activation_dtype", json_string(x->dense_act_dtype == MR_FMT_BF16 ? "bf16" : "fp32"));
        json_t *jl = json_object();
        const char *g = x->layout.gateup == MR_GATEUP_CONCAT        ? "concat"
                        : x->layout.gateup == MR_GATEUP_INTERLEAVED ? "interleaved"
                                                                    : "separate";
        bad |= add(jl, "gateup", json_string(g));
        bad |= add(jl, "interleave_rows", json_integer(x->layout.interleave_rows));
        bad |= add(jl, "inter_padded", json_integer(x->layout.inter_padded));
        bad |= add(jl, "pack", json_integer(x->layout.pack));
        bad |= add(jl, "owner", json_string(x->layout.owner ? x->layout.owner : ""));
        bad |= add(je, "layout", jl);
        bad |= add(je, "checksum", json_string(ck));
        bad |= add(root, "exec", je);
    } else {
        bad |= add(root, "exec", json_null());
    }
    char *out = NULL;
    if (!bad) {
        char *s = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        if (s) {
            out = mr_strdup(s);
            free(s);
        }
    }
    json_decref(root);
    return out;
}

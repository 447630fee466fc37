/* hfnames.c — the Hugging Face tensor names of MiniMax-M2 (moerun/io.h):
 * one table of module patterns ("L" = layer, "E" = expert) with each
 * kind's default suffix, the name writer and the parser. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moerun/io.h"

static const struct {
    const char *pre, *mid, *post; /* module = pre [L mid [E post]] */
    int n_idx;                    /* indices in the module: 0, 1 (layer) or 2 (layer, expert) */
    const char *suffix;           /* the default suffix */
    bool linear;
} map[MR_HF_COUNT] = {
    [MR_HF_EMBED] = {"model.embed_tokens", "", "", 0, "weight", false},
    [MR_HF_FINAL_NORM] = {"model.norm", "", "", 0, "weight", false},
    [MR_HF_LM_HEAD] = {"lm_head", "", "", 0, "weight", true},
    [MR_HF_ATTN_NORM] = {"model.layers.", ".input_layernorm", "", 1, "weight", false},
    [MR_HF_FFN_NORM] = {"model.layers.", ".post_attention_layernorm", "", 1, "weight", false},
    [MR_HF_Q_PROJ] = {"model.layers.", ".self_attn.q_proj", "", 1, "weight", true},
    [MR_HF_K_PROJ] = {"model.layers.", ".self_attn.k_proj", "", 1, "weight", true},
    [MR_HF_V_PROJ] = {"model.layers.", ".self_attn.v_proj", "", 1, "weight", true},
    [MR_HF_O_PROJ] = {"model.layers.", ".self_attn.o_proj", "", 1, "weight", true},
    [MR_HF_Q_NORM] = {"model.layers.", ".self_attn.q_norm", "", 1, "weight", false},
    [MR_HF_K_NORM] = {"model.layers.", ".self_attn.k_norm", "", 1, "weight", false},
    [MR_HF_ROUTER] = {"model.layers.", ".block_sparse_moe.gate", "", 1, "weight", false},
    [MR_HF_ROUTER_BIAS] = {"model.layers.", ".block_sparse_moe", "", 1, "e_score_correction_bias", false},
    [MR_HF_EXPERT_W1] = {"model.layers.", ".block_sparse_moe.experts.", ".w1", 2, "weight", true},
    [MR_HF_EXPERT_W3] = {"model.layers.", ".block_sparse_moe.experts.", ".w3", 2, "weight", true},
    [MR_HF_EXPERT_W2] = {"model.layers.", ".block_sparse_moe.experts.", ".w2", 2, "weight", true},
};

bool mr_hf_is_linear(mr_hf_tensor t) { return (int)t >= 0 && t < MR_HF_COUNT && map[t].linear; }
bool mr_hf_is_expert(mr_hf_tensor t) { return (int)t >= 0 && t < MR_HF_COUNT && map[t].n_idx == 2; }

bool mr_hf_name(mr_hf_tensor t, int layer, int expert, const char *suffix, char *buf, size_t n) {
    if ((int)t < 0 || t >= MR_HF_COUNT || n == 0) return false;
    const char *suf = suffix ? suffix : map[t].suffix;
    const char *dot = *suf ? "." : "";
    int w;
    if (map[t].n_idx == 0) w = snprintf(buf, n, "%s%s%s", map[t].pre, dot, suf);
    else if (map[t].n_idx == 1) w = snprintf(buf, n, "%s%d%s%s%s", map[t].pre, layer, map[t].mid, dot, suf);
    else w = snprintf(buf, n, "%s%d%s%d%s%s%s", map[t].pre, layer, map[t].mid, expert, map[t].post, dot, suf);
    return w >= 0 && (size_t)w < n;
}

/* a decimal index without sign or leading zeros (as the names are written) */
static const char *index_at(const char *s, int *out) {
    if (*s < '0' || *s > '9' || (s[0] == '0' && s[1] >= '0' && s[1] <= '9')) return NULL;
    long v = 0;
    while (*s >= '0' && *s <= '9') {
        v = v * 10 + (*s++ - '0');
        if (v > 1000000000L) return NULL;
    }
    *out = (int)v;
    return s;
}

static const char *literal(const char *s, const char *lit) {
    size_t n = strlen(lit);
    return strncmp(s, lit, n) == 0 ? s + n : NULL;
}

bool mr_hf_parse(const char *name, mr_hf_tensor *t, int *layer, int *expert, const char **suffix) {
    for (int k = 0; name && k < MR_HF_COUNT; k++) {
        int l = -1, e = -1;
        const char *p = literal(name, map[k].pre);
        if (p && map[k].n_idx >= 1) p = index_at(p, &l);
        if (p) p = literal(p, map[k].mid);
        if (p && map[k].n_idx == 2) p = index_at(p, &e);
        if (p) p = literal(p, map[k].post);
        if (!p || *p != '.') continue; /* the module must end here */
        /* the suffix is what follows the module; a longer module of another kind does not match
           ("...block_sparse_moe.gate.weight" is not the bias module's "gate.weight") */
        const char *suf = p + 1;
        if (strchr(suf, '.') != NULL) continue;
        *t = (mr_hf_tensor)k;
        *layer = l;
        *expert = e;
        *suffix = suf;
        return true;
    }
    return false;
}

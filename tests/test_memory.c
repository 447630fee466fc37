/* test_memory.c — weights held once: a 2-layer model with 256 FP8 experts
 * (about 100 MB of experts, the bulk of the process) is loaded with the
 * packing runner (routed) and the in-place one (reference), and the
 * process's resident memory, less what it held before the open, must stay
 * within 1.1x of what the model says it keeps (without the KV allocation,
 * whose pages in use still count on the RSS side: a bound), at the peak of
 * the load, at its end and after a forward pass. Before after-load gave the
 * checkpoint's pages back, the packed copy and the mapped source were both
 * resident: 1.8x. RSS is read from /proc (Linux). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "moerun/model.h"
#include "testutil.h"

static char *g_dir;

#if defined(__has_feature)
#if __has_feature(address_sanitizer) && !defined(__SANITIZE_ADDRESS__)
#define __SANITIZE_ADDRESS__ 1 /* clang's spelling */
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
/* Under AddressSanitizer a freed block stays resident in its quarantine (256 MB
 * by default), so the load's freed scratch would count as held: 1.39x here.
 * This suite measures the engine's memory, not the sanitizer's, so it runs with
 * no quarantine (ASan still checks every access; ASAN_OPTIONS overrides). */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "quarantine_size_mb=0"; }
#endif

static int make_model(void **st) {
    (void)st;
    char *base = tu_tmpdir("memory");
    if (!base) return -1;
    g_dir = malloc(strlen(base) + 8);
    sprintf(g_dir, "%s/m", base);
    free(base);
    mr_tiny_params tp = {.hidden = 256, .layers = 2, .experts = 256, .top_k = 8, .inter = 256, .heads = 4,
                         .kv_heads = 2, .head_dim = 64, .rotary_dim = 32, .vocab = 512, .quant = MR_FMT_FP8_BLOCK,
                         .seed = 9};
    return mr_tiny_write(g_dir, &tp) == MR_OK ? 0 : -1;
}

static int drop_model(void **st) {
    (void)st;
    char *slash = strrchr(g_dir, '/');
    *slash = 0;
    tu_rmtree(g_dir);
    free(g_dir);
    return 0;
}

static void check_runner(const char *runner) {
    mr_mem_rss_peak_reset();
    const size_t rss0 = mr_mem_rss();
    assert_true(rss0 > 0); /* /proc is readable */
    mr_model_opts o = {.runner = runner, .quiet = true, .max_batch = 1, .max_ctx = 32, .max_tokens = 16};
    mr_model *m = NULL;
    if (mr_model_open(g_dir, &o, &m)) fail_msg("%s: %s", runner, mr_error_last());
    mr_model_memory mm;
    mr_model_memory_get(m, &mm);
    assert_true(mm.experts > 90u * 1000 * 1000);
    assert_int_equal(mm.kept, mm.weights_mapped + mm.weights_copied + mm.experts + mm.activations + mm.kv +
                                  mm.moe_workspace);
    const double held = (double)(mm.kept - mm.kv);
    int32_t toks[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    int slot = 0;
    int64_t n = 12;
    float *lg = malloc(512 * sizeof(float));
    mr_batch b = {.n_seq = 1, .seq = &slot, .n_tok = &n, .tokens = toks};
    assert_int_equal(mr_model_forward(m, &b, lg), MR_OK);
    /* in double: RSS may end below rss0 (the allocator, ASan's above all, gives back pages the
     * previous case freed), which as a size_t difference wrapped to ~1.8e19 bytes */
    const double r0 = (double)rss0;
    const double peak = ((double)mm.rss_peak_load - r0) / held, end = ((double)mm.rss_load - r0) / held,
                 steady = ((double)mr_mem_rss() - r0) / held, steady_peak = ((double)mr_mem_rss_peak() - r0) / held;
    print_message("%s: kept %.1f MB (without KV); RSS over it: load peak %.3fx, load end %.3fx, after a forward %.3fx "
                  "(peak %.3fx)\n",
                  runner, held / 1e6, peak, end, steady, steady_peak);
    assert_true(peak <= 1.1);
    assert_true(end <= 1.1);
    assert_true(steady <= 1.1);
    assert_true(steady_peak <= 1.1);
    free(lg);
    mr_model_close(m);
}

static void test_routed_held_once(void **st) {
    (void)st;
    check_runner("routed");
}

static void test_reference_held_once(void **st) {
    (void)st;
    check_runner("reference");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_routed_held_once),
        cmocka_unit_test(test_reference_held_once),
    };
    return cmocka_run_group_tests(tests, make_model, drop_model);
}

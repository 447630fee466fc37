/* main.c — `moerun <command> [args]`: git-style dispatch to the subcommands.
 * Commands not linked into this build (weak symbols left NULL) say so.
 * Under an MPI launcher with the mpi transport (cli_ep.h) the group is
 * started before the command and ended after it; commands that load a
 * model but do not run expert-parallel refuse to start there. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_ep.h"
#include "moerun/base.h"
#include "moerun/moe.h"

#pragma weak mr_cmd_inspect
#pragma weak mr_cmd_resolve
#pragma weak mr_cmd_bench
#pragma weak mr_cmd_gen_tiny
#pragma weak mr_cmd_quantize
#pragma weak mr_cmd_generate
#pragma weak mr_cmd_probe
#pragma weak mr_cmd_tokenize
#pragma weak mr_cmd_detokenize
#pragma weak mr_cmd_perplexity
#pragma weak mr_cmd_chat
#pragma weak mr_cmd_chat_template
#pragma weak mr_cmd_parse_output
#pragma weak mr_cmd_serve

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} command;

/* Expert parallel: the commands that run under mpirun with the mpi transport,
 * and those that load a model but refuse to (the others load none). */
static const char *const ep_runs[] = {"generate", "probe", "bench", "serve"};
static const char *const ep_refuses[] = {"chat", "perplexity"};

static int ep_kind(const char *name) {
    for (size_t i = 0; i < sizeof ep_runs / sizeof ep_runs[0]; i++)
        if (!strcmp(name, ep_runs[i])) return 1;
    for (size_t i = 0; i < sizeof ep_refuses / sizeof ep_refuses[0]; i++)
        if (!strcmp(name, ep_refuses[i])) return -1;
    return 0;
}

static const command commands[] = {
    {"version", mr_cmd_version, "print the version, build options and CPU features"},
    {"inspect", mr_cmd_inspect, "list the tensors of a safetensors file, folder or index"},
    {"resolve", mr_cmd_resolve, "decide the MoE backend for a model and explain why"},
    {"bench", mr_cmd_bench, "benchmarks: `bench moe` times one MoE layer against this machine's ceilings"},
    {"gen-tiny", mr_cmd_gen_tiny, "write a small random MiniMax-M2 checkpoint"},
    {"quantize", mr_cmd_quantize, "convert a bf16 checkpoint to FP8 block or NVFP4"},
    {"generate", mr_cmd_generate, "generate text (or token ids) from a prompt"},
    {"chat", mr_cmd_chat, "an interactive conversation in the terminal"},
    {"probe", mr_cmd_probe, "temperature-0 correctness probe of every runner against the reference"},
    {"tokenize", mr_cmd_tokenize, "text to token ids with a model's tokenizer.json"},
    {"detokenize", mr_cmd_detokenize, "token ids to text with a model's tokenizer.json"},
    {"perplexity", mr_cmd_perplexity, "perplexity of a model on a text file, and tokens/s"},
    {"chat-template", mr_cmd_chat_template, "render a conversation with a model's chat template (as transformers does)"},
    {"parse-output", mr_cmd_parse_output, "split model output into reasoning, content and tool calls (JSON)"},
    {"serve", mr_cmd_serve, "OpenAI-compatible HTTP server (completions, chat, metrics)"},
};

const char *mr_cli_who(const char *cmd) {
    static char who[96];
    if (mr_ep_size() > 1) /* every rank prints its own errors */
        snprintf(who, sizeof who, "%s [rank %d/%d]", cmd, mr_ep_rank(), mr_ep_size());
    else
        snprintf(who, sizeof who, "%s", cmd);
    return who;
}

void mr_cli_fail(const char *cmd, const char *what) {
    const char *d = mr_error_last();
    const char *who = mr_cli_who(cmd);
    const size_t wl = strlen(who); /* a library message that names the command already: once, not twice */
    if (d && !strncmp(d, who, wl) && !strncmp(d + wl, ": ", 2)) d += wl + 2;
    if (!what)
        fprintf(stderr, "moerun %s: %s\n", who, d && *d ? d : "failed");
    else if (d && *d)
        fprintf(stderr, "moerun %s: %s: %s\n", who, what, d);
    else
        fprintf(stderr, "moerun %s: %s\n", who, what);
}

static void usage(FILE *f) {
    fprintf(f, "usage: moerun <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s%s\n", commands[i].name, commands[i].help, commands[i].fn ? "" : " (not in this build)");
    fprintf(f, "\n`moerun <command> --help` describes a command.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) return mr_cmd_version(argc - 1, argv + 1);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(argv[1], commands[i].name) != 0) continue;
        if (!commands[i].fn) {
            fprintf(stderr, "moerun: command '%s' is not available in this build\n", argv[1]);
            return 2;
        }
        const int ep = ep_kind(argv[1]);
        if (ep == 0 || !mr_cli_ep_wanted(argc - 1, argv + 1)) return commands[i].fn(argc - 1, argv + 1);
        if (ep < 0) {
            fprintf(stderr,
                    "moerun %s: does not run expert-parallel (the mpi transport); generate, probe, bench moe and "
                    "serve do; give --moe-a2a-backend none to run each rank alone\n",
                    argv[1]);
            return 2;
        }
        if (mr_cli_ep_start(argv[1])) return 1;
        return mr_cli_ep_end(commands[i].fn(argc - 1, argv + 1));
    }
    fprintf(stderr, "moerun: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}

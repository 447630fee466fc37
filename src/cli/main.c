/* main.c — `moerun <command> [args]`: git-style dispatch to the subcommands.
 * Commands not linked into this build (weak symbols left NULL) say so. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "moerun/base.h"

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

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} command;

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
};

void mr_cli_fail(const char *cmd, const char *what) {
    const char *d = mr_error_last();
    if (!what)
        fprintf(stderr, "moerun %s: %s\n", cmd, d && *d ? d : "failed");
    else if (d && *d)
        fprintf(stderr, "moerun %s: %s: %s\n", cmd, what, d);
    else
        fprintf(stderr, "moerun %s: %s\n", cmd, what);
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
        return commands[i].fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "moerun: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}

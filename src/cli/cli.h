/* cli.h — the moerun subcommands. Each lives in src/cli/cmd_<name>.c and
 * returns the process exit status: 0 success, 1 runtime/file error,
 * 2 usage or resolution error (spec/resolution.md). */
#ifndef MR_CLI_H
#define MR_CLI_H

int mr_cmd_version(int argc, char **argv);
int mr_cmd_inspect(int argc, char **argv);
int mr_cmd_resolve(int argc, char **argv);
int mr_cmd_bench(int argc, char **argv);
int mr_cmd_gen_tiny(int argc, char **argv);
int mr_cmd_quantize(int argc, char **argv);
int mr_cmd_generate(int argc, char **argv);
int mr_cmd_probe(int argc, char **argv);
int mr_cmd_tokenize(int argc, char **argv);
int mr_cmd_detokenize(int argc, char **argv);
int mr_cmd_perplexity(int argc, char **argv);
int mr_cmd_chat(int argc, char **argv);
int mr_cmd_chat_template(int argc, char **argv);
int mr_cmd_parse_output(int argc, char **argv);
int mr_cmd_serve(int argc, char **argv);
int mr_cmd_bench_serve(int argc, char **argv); /* `bench serve` */

/* Prints "moerun <cmd>: <what>: <last error detail>" to stderr; with what ==
 * NULL, "moerun <cmd>: <detail>" (for details that already name the flag). */
void mr_cli_fail(const char *cmd, const char *what);
/* "cmd", or "cmd [rank r/R]" when several expert-parallel ranks run it
 * (each prints its own errors): for messages. A static buffer. */
const char *mr_cli_who(const char *cmd);

#endif

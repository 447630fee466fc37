/* moerun/chat.h — chat templates and model-output parsers (the text module's
 * chat half; the tokenizer is moerun/text.h).
 *
 * Templates. A model's chat template is Jinja text (tokenizer_config.json
 * `chat_template`, or chat_template.jinja in the model folder). moerun
 * interprets the Jinja subset that Hugging Face chat templates use, with the
 * environment transformers' apply_chat_template sets up: trim_blocks and
 * lstrip_blocks, an immutable sandbox (no list.append, no dict.update),
 * `tojson` as json.dumps(ensure_ascii=False), `raise_exception`,
 * `strftime_now`, `namespace`, `dict`, loop controls and `{% generation %}`.
 * A template is parsed once (mr_chat_template_parse) and rendered many times
 * from any thread. Errors name the template line; a hostile template is
 * stopped by the limits in mr_chat_limits, never by a crash.
 *
 * Chats. mr_chat_open reads a model folder's templates and special tokens;
 * mr_chat_apply renders a conversation (messages, tools, extra template
 * variables) exactly as transformers' apply_chat_template(tokenize=False)
 * does: null-valued message keys dropped, `reasoning_content` / `thinking` /
 * `reasoning` aliased, bos_token/eos_token/... from the config.
 *
 * Parsers. mr_chat_parser splits a model's streamed output into reasoning,
 * content and OpenAI-style tool calls, incrementally: text may be fed in any
 * pieces (token by token, or split inside a tag or a UTF-8 sequence) and the
 * concatenated deltas are the same as for one piece.
 *
 * All JSON is jansson; functions that return json_t give the caller a new
 * reference. */
#ifndef MOERUN_CHAT_H
#define MOERUN_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "moerun/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- limits on one render (a template from a stranger must not hang) ---- */
typedef struct {
    size_t max_output_bytes; /* rendered text (and any captured block); default 16 MiB */
    size_t max_memory_bytes; /* values the template builds; default 256 MiB */
    uint64_t max_steps;      /* evaluated nodes + loop iterations; default 20 million */
    int max_depth;           /* nested evaluation frames (macro recursion); default 500 */
    int64_t now_unix;        /* strftime_now's clock (local time); 0: the real clock */
} mr_chat_limits;

void mr_chat_limits_default(mr_chat_limits *l);

/* ---- one compiled template ---- */
typedef struct mr_chat_template mr_chat_template;

/* Parses Jinja source (UTF-8, len bytes; need not be NUL-terminated). name
 * appears in error messages ("template 'default' line 12: ..."); NULL for
 * "template". Syntax errors, unknown filters or tests and invalid UTF-8 fail
 * here with MR_EINPUT. */
mr_status mr_chat_template_parse(const char *src, size_t len, const char *name, mr_chat_template **out);
void mr_chat_template_free(mr_chat_template *t);
/* The source text as given (NUL-terminated). */
const char *mr_chat_template_source(const mr_chat_template *t);

/* Renders with the members of the JSON object vars as the template's
 * variables. *out is a NUL-terminated mr_malloc'd string (caller mr_free's),
 * *out_len its length (may be NULL). limits NULL: defaults. Errors:
 * MR_EINPUT for template errors (raise_exception, undefined calls, type
 * errors) with "line N: ..." detail, MR_ECAPACITY for a limit, MR_ENOMEM.
 * Thread-safe for one template rendered from many threads. */
mr_status mr_chat_template_render(const mr_chat_template *t, const json_t *vars, const mr_chat_limits *limits,
                                  char **out, size_t *out_len);

/* ---- a model's chat setup ---- */
typedef struct mr_chat mr_chat;

/* Output formats the parser knows; decided from the template text. */
typedef enum {
    MR_CHAT_FORMAT_PLAIN = 0,  /* everything is content */
    MR_CHAT_FORMAT_MINIMAX_M2, /* <think> reasoning, <minimax:tool_call> XML tool calls */
} mr_chat_format;

/* Reads model_dir: chat_template.jinja and additional_chat_templates/
 * *.jinja when present (they take priority, as in transformers), else
 * tokenizer_config.json `chat_template` (a string, or a list of {name,
 * template}); the special tokens bos_token, eos_token, unk_token, sep_token,
 * pad_token, cls_token, mask_token (strings or {"content": ...}) from
 * tokenizer_config.json. A folder without any template fails with
 * MR_ENOTFOUND. */
mr_status mr_chat_open(const char *model_dir, mr_chat **out);
/* The same from memory: config is a tokenizer_config.json object (may be
 * NULL), jinja a chat_template.jinja text (may be NULL; wins over config). */
mr_status mr_chat_new(const json_t *config, const char *jinja, mr_chat **out);
/* The folder's special tokens (tokenizer_config.json, when there) with another
 * template (vLLM's and sglang's --chat-template): tmpl is a Jinja file, or the
 * template itself when it holds "{{" or "{%". */
mr_status mr_chat_open_override(const char *model_dir, const char *tmpl, mr_chat **out);
void mr_chat_free(mr_chat *c);

/* Number of named templates, and the i-th name ("default", "tool_use", ...). */
size_t mr_chat_template_count(const mr_chat *c);
const char *mr_chat_template_name(const mr_chat *c, size_t i);
/* The template apply would pick for (name, has_tools), or NULL with
 * MR_ENOTFOUND detail. name NULL: transformers' rule ("tool_use" when tools
 * are given and it exists, else "default", else the only one). */
const mr_chat_template *mr_chat_pick(const mr_chat *c, const char *name, bool has_tools);
/* A special token from the config ("bos_token", ...) or NULL. */
const char *mr_chat_special_token(const mr_chat *c, const char *key);
/* The output format of the default template (what parser to run). */
mr_chat_format mr_chat_format_of(const mr_chat *c);
/* The format a template's text implies. */
mr_chat_format mr_chat_format_detect(const char *template_src);

typedef struct {
    const json_t *messages;  /* array of message objects; required, non-empty */
    const json_t *tools;     /* array of tool objects (OpenAI {type, function} or bare schemas); NULL: none */
    const json_t *kwargs;    /* object of extra template variables (chat_template_kwargs); NULL: none */
    bool add_generation_prompt;
    bool continue_final_message; /* render the last message open-ended (no end-of-turn after it) */
    bool parse_tool_arguments;   /* assistant tool_calls[].function.arguments given as JSON text are parsed
                                    into objects first (what vLLM does; templates iterate over them) */
    const char *template_name;   /* NULL: mr_chat_pick's rule */
    const mr_chat_limits *limits; /* NULL: defaults */
} mr_chat_request;

/* Renders a conversation as transformers' apply_chat_template(tokenize=False)
 * does. *out as in mr_chat_template_render. Bad messages (not an array of
 * objects, empty), bad tools or kwargs that collide with the template's own
 * variables fail with MR_EINVAL before rendering. */
mr_status mr_chat_apply(const mr_chat *c, const mr_chat_request *r, char **out, size_t *out_len);

/* ---- streaming output parser ---- */
typedef struct mr_chat_parser mr_chat_parser;

typedef struct {
    mr_chat_format format;
    bool reasoning;     /* split reasoning from content (else all text is content) */
    bool think_open;    /* the prompt already ends inside <think> (MiniMax-M2's generation prompt) */
    bool tool_calls;    /* parse tool-call blocks (else they stay content) */
    const json_t *tools; /* the request's tools: parameter types convert values; borrowed, may be NULL */
    uint64_t id_seed;   /* tool-call ids derive from it; 0: a process-unique seed */
} mr_chat_parser_opts;

/* Defaults for a format: MiniMax-M2 → reasoning, think_open, tool_calls on. */
void mr_chat_parser_opts_default(mr_chat_parser_opts *o, mr_chat_format f);

/* One tool call's piece of a delta, as OpenAI streams it: the first piece
 * of a call carries id and name (and arguments may be ""); later pieces
 * carry argument text only. */
typedef struct {
    int index;        /* the call's index in the message, from 0 */
    const char *id;   /* "call_<hex>" on the first piece, else NULL */
    const char *name; /* on the first piece, else NULL */
    const char *args; /* argument JSON text piece (NUL-terminated, may be "") */
    size_t args_len;
} mr_chat_tool_delta;

/* What one feed produced. Pointers stay valid until the next feed/finish/
 * free on the same parser. Text pieces are whole UTF-8 sequences. */
typedef struct {
    const char *reasoning; /* NUL-terminated; "" when none */
    size_t reasoning_len;
    const char *content;
    size_t content_len;
    const mr_chat_tool_delta *tools;
    size_t n_tools;
    const char *const *warnings; /* malformed tool-call markup that was returned as content, ... */
    size_t n_warnings;
} mr_chat_delta;

mr_status mr_chat_parser_new(const mr_chat_parser_opts *o, mr_chat_parser **out);
void mr_chat_parser_free(mr_chat_parser *p);
/* Feeds the next piece of model output. *out describes what it released. */
mr_status mr_chat_parser_feed(mr_chat_parser *p, const char *text, size_t len, const mr_chat_delta **out);
/* End of output: releases what was held back (a partial tag, an unfinished
 * tool call, closed as well as it can be, with a warning). Feeding after
 * finish fails with MR_ESTATE. */
mr_status mr_chat_parser_finish(mr_chat_parser *p, const mr_chat_delta **out);
/* An OpenAI chat.completion.chunk `delta` object for d ({"reasoning_content",
 * "content", "tool_calls": [{index, id, type, function: {name, arguments}}]}),
 * or NULL when d is empty. New reference. */
json_t *mr_chat_delta_json(const mr_chat_delta *d);
/* The whole message so far as an OpenAI assistant message: {"role":
 * "assistant", "content": str|null, "reasoning_content"?: str, "tool_calls"?:
 * [...]}. New reference, NULL on allocation failure. */
json_t *mr_chat_parser_message(const mr_chat_parser *p);
/* Tool calls seen so far (finish_reason "tool_calls" when > 0). */
size_t mr_chat_parser_tool_call_count(const mr_chat_parser *p);

#ifdef __cplusplus
}
#endif
#endif

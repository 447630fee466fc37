/* cli_text.h — text in and out for the model commands (generate, chat,
 * perplexity): the model folder's tokenizer and chat template, a prompt
 * rendered and encoded, and generated tokens streamed to stdout as text. */
#ifndef MR_CLI_TEXT_H
#define MR_CLI_TEXT_H

#include <jansson.h>

#include "cli_model.h"
#include "moerun/chat.h"
#include "moerun/text.h"

/* Loads dir's tokenizer.json and, when need_chat, its chat template. Prints
 * the reason and returns 2 (bad or missing files) or 1 (out of memory). */
int mr_cli_text_open(const char *cmd, const char *dir, bool need_chat, mr_tokenizer **t, mr_chat **c);
/* text -> ids (no BOS/EOS added; invalid UTF-8 refused with its offset). 0, or the exit status. */
int mr_cli_text_encode(const char *cmd, const mr_tokenizer *t, const char *text, mr_tok_ids *out);
/* A conversation (messages: array of {role, content}) rendered with the
 * generation prompt and encoded. 0, or the exit status. */
int mr_cli_messages_encode(const char *cmd, const mr_tokenizer *t, const mr_chat *c, const json_t *messages,
                           mr_tok_ids *out);
/* One user message (system NULL: the template's default) rendered and encoded. */
int mr_cli_chat_encode(const char *cmd, const mr_tokenizer *t, const mr_chat *c, const char *system, const char *user,
                       mr_tok_ids *out);
/* Moves ids into a one-prompt list (ids is emptied). Nonzero on out of memory. */
int mr_cli_prompts_from_ids(mr_tok_ids *ids, mr_cli_prompts *p);
/* Decodes one generated token and writes the text that is complete to stdout,
 * flushed (streaming). Nonzero (message printed) on a decode or write error. */
int mr_cli_stream_token(const char *cmd, mr_tokstream *s, int32_t tok);
/* Writes what the stream still holds back. */
int mr_cli_stream_end(const char *cmd, mr_tokstream *s);

#endif

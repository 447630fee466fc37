/* grammar.h — constrained decoding (structured outputs): a JSON schema, a
 * list of choices or the tool-call shape of a request compiled into a
 * grammar; per generation a matcher that says which tokens keep the output
 * a prefix of a text the grammar accepts, and advances with each token.
 *
 * The grammar works on bytes: a token is allowed when its bytes (as the
 * tokenizer decodes it alone) can follow the output so far. The tokens of a
 * vocabulary sit in a byte trie (mr_vocab_index), walked once per step with
 * the matcher's state; a token that shares a prefix with another is cheap.
 *
 * What a JSON schema may hold (the subset OpenAI's strict structured outputs
 * and xgrammar's strict mode serve; anything that would constrain the output
 * in a way the matcher does not enforce is refused with MR_EINVAL naming the
 * keyword and where it is, never ignored):
 *   type (a name or a list), enum, const, anyOf / oneOf (any alternatives,
 *   two objects too: those that can start alike are followed side by side,
 *   up to 8 at once, and the output follows at least one of them; oneOf's
 *   alternatives must exclude one another, by type, by literals, or as
 *   objects by a key one requires and the other never writes or by a
 *   required property whose values exclude one another (a discriminator):
 *   one that cannot be shown is refused), allOf of one schema, $ref to "#", "#/$defs/x"
 *   or "#/definitions/x" (recursion allowed; a schema that requires
 *   itself without end, through a required property or minItems, admits no
 *   value and is refused, and the ways into such a part that may be left out,
 *   an alternative, an optional property or more array items, are);
 *   object: properties (written in the schema's order; every one listed in
 *   required appears, the others may be left out), required; no other keys
 *   when properties are given (strict, also when empty: {} alone),
 *   additionalProperties (a schema, true or false) when they are not;
 *   array: items, minItems, maxItems, and tuples: prefixItems (or items as
 *   a list with additionalItems, drafts 4 to 2019), the items after them by
 *   items (false: none), uniqueItems where the items are one of at most
 *   64 values (enum, const, boolean: pydantic's set[Literal] / set[Enum]);
 *   string: minLength, maxLength
 *   (characters; beside a pattern a character is taken only where a match of
 *   an allowed length can still follow, and a pattern none of whose matches
 *   has an allowed length is refused), pattern (src/text/grammar_pattern.c says which regular
 *   expressions: classes, groups, alternation, repetition; at most 1024
 *   character positions once repetitions are written out, and 4096 states
 *   once deterministic) or format (date,
 *   time, date-time, duration, uuid, email, ipv4, ipv6, ipvanyaddress, uri,
 *   hostname, base64: as patterns; dates are not checked against the
 *   calendar; binary, password and pydantic's paths name no rule: any string); integer and number with minimum, maximum,
 *   exclusiveMinimum, exclusiveMaximum (a digit comes only when the number
 *   can still end in range; a bounded number is written without exponent,
 *   with at most 18 digits before and 18 after its point; a number's bound
 *   is the double the schema's number reads as, an exclusive one the next
 *   double inward, so that every output reads as a double in range), an
 *   integer's format int8 .. int64 / uint8 .. uint64 (as bounds), a
 *   number's float / double; an unbounded number stays below 10^308 (its
 *   integer digits plus its exponent at most 308), so that it reads as a
 *   finite double where 1e999 would read as infinity; boolean, null.
 * Annotations (title, description, default, examples, $schema, $id,
 * $comment, ...) are ignored. Whitespace between JSON tokens: at most
 * MR_GRAMMAR_MAX_WS bytes in a row, of which at most one newline (compact
 * and indented JSON both fit; a small model that loves newlines cannot pad
 * its answer with them, the failure xgrammar's any-whitespace default
 * shows); none after the top-level value. */
#ifndef MOERUN_GRAMMAR_H
#define MOERUN_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "moerun/base.h"
#include "moerun/text.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MR_GRAMMAR_MAX_WS 24        /* whitespace bytes in a row between JSON tokens (one newline at most) */
#define MR_GRAMMAR_MAX_NODES 4096   /* compiled schema nodes */
#define MR_GRAMMAR_MAX_PROPS 64     /* properties of one object */
#define MR_GRAMMAR_MAX_DEPTH 128    /* nesting of the output (objects and arrays); near it, an optional key, an item or a value that could not end within it is not offered */
#define MR_GRAMMAR_MAX_LITERALS 4096 /* enum values, choices and tool names, all together */

typedef struct mr_grammar mr_grammar; /* immutable once built: share it between matchers */

/* A JSON value that follows schema; NULL is any JSON object ({"type":
 * "json_object"}). MR_EINVAL names the offending keyword by JSON pointer
 * ("#/properties/a/pattern: ..."). */
mr_status mr_grammar_json_schema(const json_t *schema, mr_grammar **out);
/* Exactly one of the strings, as raw text (vLLM's guided_choice); n >= 1,
 * none empty. */
mr_status mr_grammar_choice(const char *const *choices, size_t n, mr_grammar **out);
/* Raw text that the regular expression matches whole (vLLM's guided_regex,
 * sglang's regex): the syntax of a schema's "pattern"
 * (src/text/grammar_pattern.c), anchored at both ends. */
mr_status mr_grammar_regex(const char *regex, mr_grammar **out);
/* Raw text that an EBNF grammar matches (vLLM's structured_outputs.grammar
 * / guided_grammar, sglang's ebnf): the GBNF notation of llama.cpp as
 * xgrammar reads it, whose rule root is the whole text. Rules name ::= ...;
 * string literals "..." and character classes [...] / [^...] with the
 * escapes \n \r \t \b \f \a \v \0 \e, \xH.., \uHHHH, \UHHHHHHHH; "." any
 * character; groups; alternation; repetition * + ? {m} {m,} {m,n} (counts
 * up to 1024); comments from #. Left recursion directly in a rule
 * (A ::= A x | y) is rewritten; other left recursion, xgrammar's macros
 * (TagDispatch, Token, ...), rule options and lookaheads are MR_EINVAL with
 * the line and column. */
mr_status mr_grammar_ebnf(const char *text, mr_grammar **out);
/* Free text in which tagged JSON values come (xgrammar's structural tags,
 * vLLM's and sglang's response_format {"type": "structural_tag", ...}): the
 * text is free until one of the triggers has just been written; from there
 * it is the rest of the begin of a tag that starts with that trigger, the
 * tag's JSON value (its schema as mr_grammar_json_schema takes it; the same
 * whitespace around it as between JSON tokens, none before an end that
 * starts with whitespace), and the tag's end; then free text again. Free
 * text may hold special tokens; begins and ends too, where their bytes
 * match. spec: {"structures": [{"begin", "schema", "end"}], "triggers":
 * [...]}, or {"format": {"type": "triggered_tags", "triggers", "tags":
 * [{"begin", "content": {"type": "json_schema", "json_schema"}, "end"}],
 * "at_least_one", "stop_after_first"}} (src/text/grammar_tags.c). At most
 * 256 tags and 64 triggers; every begin starts with a trigger, every
 * trigger starts a begin, and no begin is a prefix of another (MR_EINVAL
 * names the field otherwise). */
mr_status mr_grammar_structural_tag(const json_t *spec, mr_grammar **out);
/* MiniMax-M2's tool calls in free text, for tool_choice "auto" with strict
 * tools: the text is free until "<minimax:tool_call>"; from there one or
 * more (at most max_calls when > 0) <invoke name="NAME"> blocks of the
 * tools, each with its <parameter name="KEY">VALUE</parameter> lines and
 * </invoke>, then "</minimax:tool_call>" (whitespace between the tags, as
 * the chat template writes it); with max_calls > 0 that block is the
 * answer's only one and its end the output's. A strict tool ({"strict": true} with
 * parameters.properties) takes its declared parameters in their order, the
 * required ones always; a value the schema admits as a string is raw text
 * (not "</parameter>", not "null" unless null is allowed; an enum or const
 * one of its values), any other value JSON that follows the schema (what
 * MiniMax-M2's parser reads back by the schema's types). Other tools take
 * any parameters, raw text values. A string parameter's pattern, format,
 * minLength or maxLength cannot be enforced on raw text: MR_EINVAL names it. */
mr_status mr_grammar_minimax_tools(const json_t *tools, int max_calls, mr_grammar **out);
/* The same format for tool_choice "required" (name NULL) or a named tool:
 * the answer is one block (whitespace before it, nothing after it) of at
 * least one call (at most max_calls when > 0; a named tool's calls only),
 * every tool with parameters.properties held to them as a strict one. */
mr_status mr_grammar_minimax_forced(const json_t *tools, const char *name, int max_calls, mr_grammar **out);
/* Tool calls as JSON, for tool_choice "required" (name NULL): an array of at
 * least one {"name": <a tool's name>, "parameters": <that tool's
 * parameters>} (at most max_calls when > 0: 1 for parallel_tool_calls
 * false); for a named tool (name given): that tool's parameters
 * object alone. tools: OpenAI's list ({"type": "function", "function":
 * {"name", "parameters"}}); a tool without parameters takes any object. */
mr_status mr_grammar_tool_calls(const json_t *tools, const char *name, int max_calls, mr_grammar **out);
void mr_grammar_free(mr_grammar *g); /* NULL is fine */
/* One line: what was compiled ("json schema: 12 nodes, 3 literals"). */
const char *mr_grammar_describe(const mr_grammar *g);

/* The tokens of a vocabulary by their bytes. Built once per tokenizer;
 * immutable, shared by every matcher. Ids without bytes are never allowed
 * by the grammar (only as end ids). */
typedef struct mr_vocab_index mr_vocab_index;
mr_status mr_vocab_index_new(const mr_tokenizer *t, mr_vocab_index **out);
/* From explicit byte strings (tests): bytes[i] of len[i] for id i; special[i] may be NULL. */
mr_status mr_vocab_index_from_bytes(const char *const *bytes, const size_t *len, const bool *special, int32_t n,
                                    mr_vocab_index **out);
void mr_vocab_index_free(mr_vocab_index *v); /* NULL is fine */
int32_t mr_vocab_index_size(const mr_vocab_index *v); /* ids are in [0, size) */

typedef struct {
    const int32_t *end_ids; /* [n_end] tokens that end the output (EOS, stop ids): allowed only where the grammar
                               is complete (copied) */
    int n_end;
    /* When non-NULL, the output starts free (any token but the end ids) and the grammar begins after these
     * bytes ("</think>" of a reasoning model); copied. */
    const char *free_until;
    bool no_whitespace; /* no whitespace between JSON tokens at all (vLLM's disable_any_whitespace) */
} mr_matcher_opts;

typedef struct mr_matcher mr_matcher; /* one per generation; the grammar and the index must outlive it */
mr_status mr_matcher_new(const mr_grammar *g, const mr_vocab_index *v, const mr_matcher_opts *o, mr_matcher **out);
void mr_matcher_free(mr_matcher *m); /* NULL is fine */
/* allow: a bitset of (vocab + 31) / 32 words, written in full: bit id set
 * when the token may come next. Returns the number of allowed ids (0 when
 * none: the output cannot go on, which a complete grammar without end ids
 * also gives); -1 (and no id allowed) when an EBNF grammar's parse went past
 * the matcher's limits here (too ambiguous, or too costly to follow). */
int64_t mr_matcher_mask(mr_matcher *m, uint32_t *allow);
/* Advances by one token. MR_EINPUT (the matcher unchanged) when the grammar
 * does not allow it here. */
mr_status mr_matcher_accept(mr_matcher *m, int32_t token);
/* Byte-level (tests, the forced output): feeds bytes; false (and the matcher
 * unchanged) when they cannot continue the output. */
bool mr_matcher_feed(mr_matcher *m, const char *bytes, size_t n);
/* The output so far is a complete text of the grammar (an end id may come). */
bool mr_matcher_complete(const mr_matcher *m);
/* An end id was accepted: the output is over. */
bool mr_matcher_ended(const mr_matcher *m);

#ifdef __cplusplus
}
#endif
#endif

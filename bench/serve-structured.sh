#!/usr/bin/env bash
# bench/serve-structured.sh MODEL TAG [CONCURRENCIES] — what structured
# outputs cost a served run: one `moerun serve`, then ROUNDS rounds of
# `moerun bench serve` at the same concurrencies in three modes, interleaved:
#   none   no constraint;
#   json   response_format json_schema {"text": a string of >= 100000
#          characters}: the answer stays inside one JSON string, the state a
#          JSON answer spends most tokens in (the mask's plain-string path);
#   regex  structured_outputs.regex "[a-z ,.]+": raw text through the pattern
#          automaton (the walk of the whole vocabulary trie, or a mask the
#          matcher cached for the pattern's state);
#   tags   a structural tag (response_format {"type": "structural_tag"}, two
#          tags behind the trigger "<function="): free text through the
#          triggers' automaton, the state strict tools and tags spend most
#          tokens in (the tokens without '<' at once, the mask cached).
# Completions, token-id prompts of IN tokens, OUT output tokens, ignore_eos,
# temperature 0 (bench serve's defaults), so every mode writes the same number
# of tokens. The client's output tok/s counts tokens with text; a random-weights
# model with a large vocabulary writes tokens without text too (special ones,
# pieces of a UTF-8 character), so the table also prints the server's own mean
# generation rate (its generation_tokens counter over the run) and mean
# inter-token latency from /metrics, which count every token.
# Environment: MOERUN (build/moerun), SERVER (the moerun that serves, default
# MOERUN: an older build for an A/B), IN (32), OUT (64), ROUNDS (2), MODES (none json regex tags), VOCAB (the
# prompt ids' range, default min(vocab_size, 60000): a tokenizer may have holes
# above), EXTRA (serve options, e.g. "--threads 2").
# JSON to bench/results/structured_<TAG>_<mode>_r<round>.json.
set -u
MODEL=$1; TAG=$2; CONC=${3:-1,16,64}
M=${MOERUN:-build/moerun}
IN=${IN:-32}; OUT=${OUT:-64}; ROUNDS=${ROUNDS:-2}; EXTRA=${EXTRA:-}
R=bench/results
mkdir -p "$R"
vocab=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "$MODEL/config.json" | head -1)
VOCAB=${VOCAB:-$(( vocab < 60000 ? vocab : 60000 ))}
[ -f "$MODEL/tokenizer.json" ] || { echo "serve-structured: $MODEL has no tokenizer.json (structured outputs need one)"; exit 2; }
LOG=$(mktemp /tmp/serve-structured.XXXXXX)
# shellcheck disable=SC2086
"${SERVER:-$M}" serve --model "$MODEL" --port 0 $EXTRA >"$LOG" 2>&1 &
SP=$!
trap 'kill -TERM $SP 2>/dev/null; wait $SP 2>/dev/null; rm -f "$LOG"' EXIT
URL=
for _ in $(seq 1 600); do
    URL=$(sed -n 's/.*ready on \(http:\/\/[0-9.:]*\).*/\1/p' "$LOG" | head -1)
    [ -n "$URL" ] && break
    kill -0 $SP 2>/dev/null || { cat "$LOG"; exit 1; }
    sleep 0.2
done
[ -n "$URL" ] || { echo "serve-structured: the server did not get ready"; cat "$LOG"; exit 1; }
JSON='{"response_format":{"type":"json_schema","json_schema":{"name":"t","schema":{"type":"object","properties":{"text":{"type":"string","minLength":100000}},"required":["text"]}}}}'
REGEX='{"structured_outputs":{"regex":"[a-z ,.]+"}}'
TAGS='{"response_format":{"type":"structural_tag","triggers":["<function="],"structures":[{"begin":"<function=get_weather>","schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]},"end":"</function>"},{"begin":"<function=search>","schema":{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]},"end":"</function>"}]}}'
echo "serve-structured: ${SERVER:-$M} serving $MODEL at $URL, in $IN / out $OUT, prompt ids < $VOCAB, $(date -u +%H:%M:%S)"
printf '%-6s %-5s %s\n' round mode "per C: client output tok/s | server tok/s (all tokens) | server mean ITL ms | failed"
for r in $(seq 1 "$ROUNDS"); do
    for mode in ${MODES:-none json regex tags}; do
        case $mode in
        none) X=();;
        json) X=(--extra-request-body "$JSON");;
        regex) X=(--extra-request-body "$REGEX");;
        tags) X=(--extra-request-body "$TAGS");;
        *) echo "serve-structured: unknown mode $mode (none, json, regex, tags)"; exit 2;;
        esac
        out="$R/structured_${TAG}_${mode}_r$r"
        "$M" bench serve --base-url "$URL" --concurrency "$CONC" --input-len "$IN" --output-len "$OUT" \
            --vocab "$VOCAB" "${X[@]}" --json "$out.json" >"$out.txt" 2>&1
        line=$(jq -r '[.results[] | "C=\(.max_concurrency): \(.output_throughput | round) | \(.server_counters_delta.generation_tokens / .duration | round) | \(.server_counters_delta.mean_itl_ms * 100 | round / 100) | \(.failed)"] | join(";  ")' "$out.json" 2>/dev/null)
        printf '%-6s %-5s %s\n' "$r" "$mode" "${line:-bench serve failed: $(tail -1 "$out.txt")}"
    done
done

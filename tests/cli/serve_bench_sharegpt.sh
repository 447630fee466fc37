#!/usr/bin/env bash
# serve_bench_sharegpt.sh — `moerun bench serve --dataset-name sharegpt` (sglang's
# default dataset) against `moerun serve` on the trained default model, with a
# ShareGPT-shaped file written here: conversations of many lengths, the
# "conversation" spelling, one-turn entries, prompts too short and too long for
# the context, entries of the wrong shape (not an object, a number for a value, a
# NUL in the text), non-ASCII text. The oracle (lib/sharegpt_oracle.py) derives
# the rows from the definition, counting tokens with the server's /tokenize over
# its own HTTP, and checks the bench's --json: the rows in order, what was pruned
# and skipped, and per concurrency that every request completed with the rows'
# lengths (the server's counters). Then: sglang's /generate, chat with --tokenizer (counted here, not
# by the server), --sharegpt-output-len, --apply-chat-template and --tokenize-prompt (the ids a server's
# /tokenize answered are the ones sent), a file with fewer rows than asked, a
# seed that reorders, and bad input (exit 2 for options, 1 for files, no --json
# left behind).
# Args: <moerun> <tests/data> <scratch dir>
set -u
M=$1; DATA=$2; S=$3
. "$(dirname "$0")/lib/serve.sh"
serve_test_begin
command -v jq >/dev/null || { echo "SKIPPED: jq is not installed (scripts/install-deps.sh installs it)"; exit 77; }
MODEL="$DATA/../../models/tiny-kjv"
ORACLE="$(dirname "$0")/lib/sharegpt_oracle.py"
python3 - "$S/sg.json" <<'EOF'
import json, random, sys
rng = random.Random(11)
words = ("and the lord said unto moses in the beginning god created heaven earth light darkness "
         "Grüße naïve café 日本 🙂").split()
def txt(n): return " ".join(rng.choice(words) for _ in range(n))
d = []
for i in range(70):
    turns = [{"from": "human", "value": txt(rng.randint(2, 50))}, {"from": "gpt", "value": txt(rng.randint(1, 70))}]
    d.append({"id": f"c{i}", "conversations": turns + [{"from": "human", "value": "and then?"}] * (i % 3)})
d.insert(5, {"id": "one", "conversations": [{"from": "human", "value": "alone"}]})
d.insert(9, {"id": "alt", "conversation": [{"from": "human", "value": txt(12)}, {"from": "gpt", "value": txt(9)}]})
d.insert(13, {"id": "short", "conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": txt(8)}]})
d.insert(17, {"id": "long", "conversations": [{"from": "human", "value": txt(400)}, {"from": "gpt", "value": txt(9)}]})
d.insert(21, ["not", "an", "object"])
d.insert(25, {"id": "num", "conversations": [{"from": "human", "value": 5}, {"from": "gpt", "value": "x y"}]})
d.insert(29, {"id": "nul", "conversations": [{"from": "human", "value": "a\u0000b c d"}, {"from": "gpt", "value": "e f g"}]})
d.insert(33, {"id": "none", "conversations": []})
json.dump(d, open(sys.argv[1], "w", encoding="utf-8"), ensure_ascii=False)
EOF
start_server "$S/serve.log" --model "$MODEL" --context-length 160 || exit 1
SG="--dataset-name sharegpt --dataset-path $S/sg.json"
# completions, token counts from the server: 12 rows, the first 12 of them at C = 1 and at C = 3
"$M" bench serve --base-url "$SV_URL" --concurrency 1,3 --num-prompts 12 $SG --seed 5 --json "$S/a.json" \
    >"$S/a.out" 2>&1 || bad "sharegpt completions: exit $?: $(tail -3 "$S/a.out")"
grep -q "^dataset: 12 rows of 12 asked (seed 5)" "$S/a.out" || bad "no dataset line: $(grep dataset "$S/a.out")"
python3 "$ORACLE" "$S/sg.json" "$SV_URL" 5 12 0 0 "$S/a.json" || bad "sharegpt completions: the oracle disagrees"
jq -e '.dataset.long_pruned + .dataset.short_pruned >= 0 and .dataset.context_len == 160' "$S/a.json" >/dev/null ||
    bad "the server's context length was not applied"
# sglang's native /generate: the rows as "text"
"$M" bench serve --base-url "$SV_URL" --backend sglang --concurrency 2 --num-prompts 8 $SG --seed 3 --json "$S/g.json" \
    >"$S/g.out" 2>&1 || bad "sharegpt /generate: exit $?: $(tail -3 "$S/g.out")"
python3 "$ORACLE" "$S/sg.json" "$SV_URL" 3 8 0 0 "$S/g.json" || bad "sharegpt /generate: the oracle disagrees"
# chat (answers not streamed), counted here with the model's tokenizer, a fixed output length; a context
# length of our own
"$M" bench serve --base-url "$SV_URL" --concurrency 2 --num-prompts 20 $SG --seed 9 --chat --tokenizer "$MODEL" --disable-stream \
    --sharegpt-output-len 6 --sharegpt-context-len 60 --output-details --json "$S/b.json" >"$S/b.out" 2>&1 ||
    bad "sharegpt chat: exit $?: $(tail -3 "$S/b.out")"
python3 "$ORACLE" "$S/sg.json" "$SV_URL" 9 20 60 6 "$S/b.json" || bad "sharegpt chat: the oracle disagrees"
jq -e '.dataset.long_pruned >= 1 and .results[0].total_output_tokens == 120' "$S/b.json" >/dev/null ||
    bad "sharegpt chat: no long prompt pruned at context 60, or not 20 x 6 tokens"
jq -e '.results[0] | (.generated_texts | length) == 20 and ([.generated_texts[] | length] | add) > 0 and
       (.errors | all(. == ""))' "$S/b.json" >/dev/null || bad "--output-details, chat: no text kept from the answers"
# sglang's --apply-chat-template: each prompt the chat template's rendering of it as the user's message (BOS text
# out), counted with the model's tokenizer here, sent as text (completions) or, with --tokenize-prompt, as the
# ids counted (/generate's input_ids); and --tokenize-prompt with the server's counts (its /tokenize ids)
"$M" bench serve --base-url "$SV_URL" --concurrency 2 --num-prompts 10 $SG --seed 6 --apply-chat-template \
    --tokenizer "$MODEL" --json "$S/t.json" >"$S/t.out" 2>&1 || bad "--apply-chat-template: exit $?: $(tail -3 "$S/t.out")"
grep -q "dataset sharegpt .* (chat template applied)" "$S/t.out" || bad "--apply-chat-template: not said"
python3 "$ORACLE" "$S/sg.json" "$SV_URL" 6 10 0 0 "$S/t.json" "$MODEL" || bad "--apply-chat-template: the oracle disagrees"
"$M" bench serve --base-url "$SV_URL" --backend sglang --concurrency 2 --num-prompts 10 $SG --seed 6 \
    --apply-chat-template --tokenize-prompt --tokenizer "$MODEL" --json "$S/ti.json" >"$S/ti.out" 2>&1 ||
    bad "--apply-chat-template --tokenize-prompt: exit $?: $(tail -3 "$S/ti.out")"
python3 "$ORACLE" "$S/sg.json" "$SV_URL" 6 10 0 0 "$S/ti.json" "$MODEL" ||
    bad "--apply-chat-template --tokenize-prompt: the oracle disagrees"
"$M" bench serve --base-url "$SV_URL" --concurrency 3 --num-prompts 9 $SG --seed 7 --tokenize-prompt \
    --json "$S/tp.json" >"$S/tp.out" 2>&1 || bad "--tokenize-prompt: exit $?: $(tail -3 "$S/tp.out")"
grep -q "completions (token ids), dataset sharegpt" "$S/tp.out" || bad "--tokenize-prompt: not said"
python3 "$ORACLE" "$S/sg.json" "$SV_URL" 7 9 0 0 "$S/tp.json" || bad "--tokenize-prompt: the oracle disagrees"
jq -e '.dataset.tokenize_prompt and (.dataset.apply_chat_template | not)' "$S/tp.json" >/dev/null ||
    bad "--tokenize-prompt: not in --json's dataset"
# sglang's random dataset over the file: random lengths, each prompt a row's first-turn tokens (the server's
# /tokenize ids) repeated and cut; sent as ids, so the server counts exactly the drawn lengths, and the rows are
# the shuffled usable conversations, none pruned but an empty one
# (80 requests: all 73 usable rows, the one-token prompt too, then the first ones again)
"$M" bench serve --base-url "$SV_URL" --concurrency 4 --num-prompts 80 --dataset-name random --dataset-path "$S/sg.json" \
    --random-input-len 30 --random-output-len 2 --random-range-ratio 0.5 --seed 8 --json "$S/r.json" >"$S/r.out" 2>&1 ||
    bad "random over a file: exit $?: $(tail -3 "$S/r.out")"
jq -e '.dataset.name == "random" and (.dataset.rows | length) == 73 and .dataset.short_pruned == 0 and
       (.dataset.rows | all(.output_len == 0)) and .results[0].completed == 80 and
       .results[0].server_counters_delta.prompt_tokens == .results[0].total_input_tokens and
       .results[0].total_input_tokens >= 80 * 15 and .results[0].total_input_tokens <= 80 * 30' "$S/r.json" >/dev/null ||
    bad "random over a file: $(jq -c '[.dataset.name, (.dataset.rows | length), .results[0].total_input_tokens, .results[0].server_counters_delta.prompt_tokens]' "$S/r.json")"
python3 - "$(dirname "$ORACLE")" "$S/sg.json" "$S/r.json" "$SV_URL" <<'EOF2' ||
import json, sys
sys.path.insert(0, sys.argv[1])
import sharegpt_oracle as so
data, got = json.load(open(sys.argv[2], encoding="utf-8")), json.load(open(sys.argv[3]))
order = so.shuffled(data, 8)[0]
conv = lambda e: e.get("conversations", e.get("conversation"))
want = [{"source": i, "prompt_len": so.tokenize(sys.argv[4], conv(data[i])[0]["value"])[0], "output_len": 0}
        for i in order]
if got["dataset"]["rows"] != want:
    print(got["dataset"]["rows"], want)
    sys.exit(1)
EOF2
    bad "random over a file: the rows are not the first usable conversations in the shuffled order, counted"
# fewer rows than asked: all of them, in the shuffled order; another seed reorders the same rows
for seed in 1 2; do
    "$M" bench serve --base-url "$SV_URL" --concurrency 8 --num-prompts 500 $SG --seed $seed --sharegpt-output-len 2 \
        --json "$S/c$seed.json" >"$S/c.out" 2>&1 || bad "all rows: exit $?: $(tail -3 "$S/c.out")"
    grep -q "rows of 500 asked" "$S/c.out" || bad "all rows: $(grep '^dataset' "$S/c.out")"
    python3 "$ORACLE" "$S/sg.json" "$SV_URL" $seed 500 0 2 "$S/c$seed.json" || bad "all rows, seed $seed: the oracle disagrees"
done
jq -e --slurpfile b "$S/c2.json" '([.dataset.rows[].source] | sort) == ([$b[0].dataset.rows[].source] | sort) and
      [.dataset.rows[].source] != [$b[0].dataset.rows[].source]' "$S/c1.json" >/dev/null ||
    bad "seeds 1 and 2: not the same rows in another order"
# a server whose /tokenize takes only llama-server's request ({"content", "add_special"}): the bench counts
# with that form (lib/hostile_server.py record: a token a word, one more for the special token)
rm -f "$S/hport"
python3 "$(dirname "$0")/lib/hostile_server.py" record "$S/rec.jsonl" >"$S/hport" & hp=$!
for _ in $(seq 100); do grep -q '^[0-9]' "$S/hport" 2>/dev/null && break; sleep 0.1; done
"$M" bench serve --base-url "http://127.0.0.1:$(cat "$S/hport")" --concurrency 2 --num-prompts 10 $SG --seed 4 \
    --sharegpt-output-len 2 --json "$S/l.json" >"$S/l.out" 2>&1 || bad "llama-server's /tokenize: exit $?: $(tail -2 "$S/l.out")"
cp "$S/rec.jsonl" "$S/rec0.jsonl"
# --tokenize-prompt: the prompts sent are the ids that server's /tokenize answered (a word's index, from 0)
"$M" bench serve --base-url "http://127.0.0.1:$(cat "$S/hport")" --concurrency 2 --num-prompts 5 $SG --seed 4 \
    --sharegpt-output-len 2 --tokenize-prompt --no-warmup >"$S/l2.out" 2>&1 ||
    bad "llama-server's /tokenize, --tokenize-prompt: exit $?: $(tail -2 "$S/l2.out")"
kill $hp 2>/dev/null; wait $hp 2>/dev/null
python3 - "$S/sg.json" "$S/l.json" "$S/rec0.jsonl" "$S/rec.jsonl" <<'EOF2' || bad "llama-server's /tokenize: the rows are not counted in its form, or --tokenize-prompt did not send its ids"
import json, sys
data, got = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
rows = got["dataset"]["rows"]
conv = lambda e: e.get("conversations", e.get("conversation"))
ok = len(rows) == 10 and got["dataset"]["context_len"] == 0 and all(
    r["prompt_len"] == len(conv(data[r["source"]])[0]["value"].split()) + 1 and r["output_len"] == 2 for r in rows)
n0 = len(open(sys.argv[3]).readlines())
sent = [json.loads(l)["body"]["prompt"] for l in open(sys.argv[4]).readlines()[n0:]]
ok &= sorted(map(len, sent)) == sorted(r["prompt_len"] for r in rows[:5])
ok &= all(p == list(range(len(p))) for p in sent)
if not ok:
    print(rows[:5], sent)
sys.exit(0 if ok else 1)
EOF2
# bad options: exit 2
for args in "--dataset-name sharegpt" "--dataset-name shargpt $SG" "--dataset-path $S/sg.json --sharegpt-output-len 4" \
            "$SG --input-len 8" "$SG --output-len 8" "$SG --random-range-ratio 0.5" "$SG --text-prompts" \
            "$SG --sharegpt-output-len 1" "$SG --sharegpt-context-len x" "--sharegpt-output-len 4" \
            "$SG --apply-chat-template" "--apply-chat-template --tokenizer $MODEL" \
            "$SG --apply-chat-template --tokenizer $MODEL --chat" "$SG --tokenize-prompt --chat" \
            "--tokenize-prompt --text-prompts"; do
    "$M" bench serve --base-url "$SV_URL" --concurrency 1 $args >/dev/null 2>"$S/err"; rc=$?
    [ $rc = 2 ] && [ -s "$S/err" ] || bad "bench serve $args: exit $rc, want 2 ($(head -1 "$S/err"))"
done
# bad files: exit 1, the reason named once, no --json file
printf '{"conversations": []}' >"$S/obj.json"; printf '[{"conversations": [' >"$S/cut.json"
printf '[{"conversations": [{"value": "a"}, {"value": "b"}]}, 7]' >"$S/none.json"
for case in "$S/missing.json|No such file" "$S|not a file" "$S/cut.json|line 1" "$S/obj.json|not a JSON array" \
            "$S/none.json|no usable conversation (2 entries, 1 with two turns, 1 malformed, 1 too short" \
            "$S/sg.json --apply-chat-template --tokenizer $DATA/model/tiny|--tokenizer $DATA/model/tiny"; do
    f=${case%%|*} want=${case#*|}
    "$M" bench serve --base-url "$SV_URL" --concurrency 1 --dataset-name sharegpt --dataset-path $f \
        --json "$S/bad.json" >/dev/null 2>"$S/err"; rc=$?
    [ $rc = 1 ] && grep -qF -- "$want" "$S/err" || bad "dataset $f: exit $rc, want 1 and '$want': $(head -2 "$S/err")"
    grep -q "bench serve: bench serve" "$S/err" && bad "dataset $f: the command named twice: $(head -1 "$S/err")"
    [ -e "$S/bad.json" ] && bad "dataset $f: --json left a file"
done
serve_test_end

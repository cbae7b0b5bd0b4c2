#!/usr/bin/env bash
# Instructions per call under valgrind's callgrind, each case through this
# crate and through governor 0.10 (`check_key`) / tower_governor 0.8 in one
# run, and the ratios ours / theirs; then a client's call through the
# outbound BudgetLayer beside tower's RateLimit (0.5), in the same run. Instruction counts repeat from run to
# run (to within an instruction where random hash seeds change the probes),
# unlike times on a shared machine.
#
#   bash bench/callgrind.sh
#
# Needs valgrind (Debian: apt-get install valgrind). The program is
# bench/examples/callgrind.rs; only its `case_*` functions are counted.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind not found: apt-get install valgrind" >&2; exit 1; }

cargo build --release -p tower-pinned-window-bench --example callgrind --quiet
out=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$out"' EXIT
iters=$(valgrind --tool=callgrind --callgrind-out-file="$out/callgrind.out" \
  --collect-atstart=no --toggle-collect='*case_*' \
  "${CARGO_TARGET_DIR:-target}"/release/examples/callgrind 2>"$out/valgrind.log")
memory=$(sed -n 's/.*memory=\([0-9]*\).*/\1/p' <<<"$iters")
layer=$(sed -n 's/.*layer=\([0-9]*\).*/\1/p' <<<"$iters")
callgrind_annotate --inclusive=yes --threshold=100 "$out/callgrind.out" >"$out/annotate.txt"
[ -z "${KEEP:-}" ] || echo "callgrind's output: $out" >&2

# Inclusive instructions per iteration of one case function.
per() { # $1 = case name, $2 = iterations
  local ir
  ir=$(grep -E "callgrind::$1(\$| |\[)" "$out/annotate.txt" | head -n 1 | awk '{gsub(",", "", $1); print $1}')
  [ -n "$ir" ] || { echo "case $1 not found in callgrind's output" >&2; exit 1; }
  echo "$ir / $2" | bc -l
}

hot_ours=$(per case_hot_key_ours "$memory"); hot_gov=$(per case_hot_key_governor "$memory")
keys_ours=$(per case_100k_keys_ours "$memory"); keys_gov=$(per case_100k_keys_governor "$memory")
two_ours=$(per case_two_counters_ours "$memory")
slot_ours=$(per case_slot_taken_and_given_back_ours "$memory")
take_all_ours=$(per case_take_all_and_given_back_ours "$memory")
bare=$(per case_layer_bare "$layer")
ours_h=$(per case_layer_ours_headers "$layer"); ours_n=$(per case_layer_ours_no_headers "$layer")
ours_hr=$(per case_layer_ours_headers_response "$layer"); ours_nr=$(per case_layer_ours_no_headers_response "$layer")
ours_hq=$(per case_layer_ours_headers_request "$layer"); ours_nq=$(per case_layer_ours_no_headers_request "$layer")
ours_hu=$(per case_layer_ours_headers_unread "$layer"); ours_nu=$(per case_layer_ours_no_headers_unread "$layer")
tg_h=$(per case_layer_tower_governor_headers "$layer"); tg_n=$(per case_layer_tower_governor_no_headers "$layer")
bare_ax=$(per case_layer_bare_axum_request "$layer")
ours_hax=$(per case_layer_ours_headers_axum_request "$layer"); ours_nax=$(per case_layer_ours_no_headers_axum_request "$layer")
tg_hax=$(per case_layer_tower_governor_headers_axum_request "$layer"); tg_nax=$(per case_layer_tower_governor_no_headers_axum_request "$layer")
client_bare=$(per case_client_bare "$layer")
client_budget=$(per case_client_budget "$layer"); client_rate=$(per case_client_rate_limit "$layer")
client_none=$(per case_client_budget_reads_nothing "$layer")
client_bare_h=$(per case_client_bare_headers "$layer")
book_empty=$(per case_layer_ours_no_headers_book_empty "$layer"); book_stored=$(per case_layer_ours_no_headers_book_stored "$layer")
client_budget_h=$(per case_client_budget_headers "$layer"); client_none_h=$(per case_client_budget_headers_reads_nothing "$layer")

row() { printf '| %s | %.0f | %.0f | %.2f |\n' "$1" "$2" "$3" "$(echo "$2 / $3" | bc -l)"; }
over() { echo "$1 - $2" | bc -l; } # a layer case's overhead: $1 less its bare case $2
echo "| case (instructions per call) | pinned-window | governor | ratio |"
echo "|---|---|---|---|"
row "memory backend, one hot key" "$hot_ours" "$hot_gov"
row "memory backend, 100k distinct keys" "$keys_ours" "$keys_gov"
row "layer overhead over \`service_fn\`, with rate-limit headers (defaults)" "$(over "$ours_h" "$bare")" "$(over "$tg_h" "$bare")"
row "layer overhead over \`service_fn\`, no headers (defaults)" "$(over "$ours_n" "$bare")" "$(over "$tg_n" "$bare")"
row "layer overhead, with headers, \`DecisionIn::Response\`" "$(over "$ours_hr" "$bare")" "$(over "$tg_h" "$bare")"
row "layer overhead, no headers, \`DecisionIn::Response\`" "$(over "$ours_nr" "$bare")" "$(over "$tg_n" "$bare")"
row "layer overhead, with headers, \`DecisionIn::Request\`" "$(over "$ours_hq" "$bare")" "$(over "$tg_h" "$bare")"
row "layer overhead, no headers, \`DecisionIn::Request\`" "$(over "$ours_nq" "$bare")" "$(over "$tg_n" "$bare")"
row "layer overhead, with headers, \`Decision\` unread (\`DecisionIn::Asked\`)" "$(over "$ours_hu" "$bare")" "$(over "$tg_h" "$bare")"
row "layer overhead, no headers, \`Decision\` unread (\`DecisionIn::Asked\`)" "$(over "$ours_nu" "$bare")" "$(over "$tg_n" "$bare")"
row "layer overhead, with headers (defaults), the request with extensions (as under axum)" "$(over "$ours_hax" "$bare_ax")" "$(over "$tg_hax" "$bare_ax")"
row "layer overhead, no headers (defaults), the request with extensions (as under axum)" "$(over "$ours_nax" "$bare_ax")" "$(over "$tg_nax" "$bare_ax")"
printf '\nbare `service_fn` request: %.0f instructions; with extensions: %.0f\n' "$bare" "$bare_ax"
printf 'limits held in the store (a LimitBook), no headers: nothing stored %.0f, the layer'"'"'s limit stored %.0f instructions per request, %.2f and %.2f x the layer with its fixed quota (%.0f)\n' \
  "$book_empty" "$book_stored" "$(echo "$book_empty / $ours_n" | bc -l)" "$(echo "$book_stored / $ours_n" | bc -l)" "$ours_n"
printf 'memory backend, one hot key under two quotas (no governor counterpart): %.0f instructions\n' "$two_ours"
printf 'memory backend, a slot in flight taken and given back on one hot key: %.0f instructions, %.2f x the hot key'"'"'s hit\n' "$slot_ours" "$(echo "$slot_ours / $hot_ours" | bc -l)"
printf 'memory backend, a hit and a slot in one step (take_all) and the slot given back: %.0f instructions, %.2f x the hot key'"'"'s hit (the slot adds %.2f x)\n' "$take_all_ours" "$(echo "$take_all_ours / $hot_ours" | bc -l)" "$(echo "($take_all_ours - $hot_ours) / $hot_ours" | bc -l)"

echo
echo "| outbound case (instructions per call) | BudgetLayer | tower RateLimit | ratio |"
echo "|---|---|---|---|"
row "client layer overhead over \`service_fn\`, the budget has room (memory backend)" "$(over "$client_budget" "$client_bare")" "$(over "$client_rate" "$client_bare")"
printf '\nbare `service_fn` client call: %.0f instructions\n' "$client_bare"
# The provider's word (BudgetLayer::heed): what reading the answers costs,
# beside the same layer that reads nothing (Reader::none), as a share of
# the call through the layer.
read_silent=$(echo "$client_budget - $client_none" | bc -l)
read_talk=$(echo "$client_budget_h - $client_none_h" | bc -l)
printf 'reading a silent answer (no rate-limit header): %.0f instructions, %.1f%% of the call through the layer (%.0f)\n' \
  "$read_silent" "$(echo "100 * $read_silent / $client_budget" | bc -l)" "$client_budget"
printf 'reading OpenAI'"'"'s four headers that say nothing new: %.0f instructions, %.1f%% of the call through the layer (%.0f; the bare call with those answers: %.0f)\n' \
  "$read_talk" "$(echo "100 * $read_talk / $client_budget_h" | bc -l)" "$client_budget_h" "$client_bare_h"

#!/usr/bin/env bash
# Heap allocations per request through an axum router, counted by a
# counting global allocator (bench/examples/allocs.rs), and the budgets CI
# holds the layer to: the run fails when the layer adds more allocations a
# request than a budget allows. It is a count, not a time: it does not
# flake on a busy machine.
#
#   bash bench/allocs.sh
#
# "Added by the layer" is measured against the same route behind a
# route_layer that does nothing (axum boxes any route_layer's service and
# future: two allocations a request, whatever the layer).
#
# The budgets:
# - headers-off-unread=0: the issue's target (met). Headers off, the
#   Decision read by nobody (DecisionIn::Asked): nothing allocated.
# - headers-on-unread=0: the issue's target was at most 1 (met); the
#   budget is a ratchet at the measured figure. The IETF headers, the
#   Decision unread: the RateLimit field's value is cut from a per-thread
#   block of value bytes, reused once its values are dropped, so it costs
#   no allocation of its own.
# - headers-on=1, headers-off=1: a ratchet at the measured figures, for the
#   default DecisionIn::Request (the handler could read Extension<Decision>;
#   here it does not): the boxed Decision in the map axum already made for
#   the request.
# - headers-on-response=3, headers-off-response=3: a ratchet at the
#   measured figures, for DecisionIn::Response, which puts the Decision in
#   the response's extensions (the map's box, its table, the boxed value:
#   three).
# - headers-off-handler=1: a ratchet at the measured figure. DecisionIn::Request,
#   the handler reads Extension<Decision>: the boxed value, in the map axum
#   already made for the request.
# - headers-off-outer=3: a ratchet at the measured figure. DecisionIn::Asked,
#   an outer layer asks with WantDecision and reads the Decision from the
#   response's extensions, which it empties into three allocations.
# - headers-off-outer-default=4: a ratchet at the measured figure. The same
#   under the default DecisionIn::Request: the request's copy too.
#
# With REDIS_URL set (a Redis of your own, never a shared one: keys are
# written), the Redis route's rows are printed too, measured and not
# budgeted: REDIS_URL=redis://127.0.0.1:6397/ bash bench/allocs.sh
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release -p tower-pinned-window-bench --example allocs --quiet
"${CARGO_TARGET_DIR:-target}"/release/examples/allocs \
  --budget headers-off-unread=0 \
  --budget headers-on-unread=0 \
  --budget headers-on=1 \
  --budget headers-off=1 \
  --budget headers-on-response=3 \
  --budget headers-off-response=3 \
  --budget headers-off-handler=1 \
  --budget headers-off-outer=3 \
  --budget headers-off-outer-default=4

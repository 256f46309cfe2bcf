#!/usr/bin/env bash
# The redis-cli walk-through of README ("Clients and examples"), against a running Redis with
# the module (`make run` in another terminal, or REDIS_PORT=...). The waits in
# the replies depend on how fast the commands follow each other.
set -euo pipefail
cli() { echo "\$ redis-cli $*"; redis-cli -p "${REDIS_PORT:-6379}" "$@"; }
redis-cli -p "${REDIS_PORT:-6379}" DEL llm:api '{acme}:rpm' '{acme}:tpm' user:7:bw >/dev/null
cli TB.CONSUME llm:api 0.5 1                      # the API allows one call every 2 s
cli TB.CONSUME llm:api 0.5 1                      # too soon: denied, retry_after_ms
cli TB.CONSUME llm:api 0.5 1 1 RESERVE 10000      # take the next turn, wait retry_after_ms
cli TB.CONSUME llm:api 0.5 1 1 RESERVE 10000      # and the one after: 2 s later
cli TB.INFO llm:api                               # tokens negative: two turns reserved
cli TB.CONSUME llm:api 0.5 1 1 BLOCK 1000         # more than 1 s away: denied at once
cli TB.MCONSUME 2 '{acme}:rpm' '{acme}:tpm' 500/m 500 1 30000/m 30000 2000
cli TB.REFUND '{acme}:tpm' 800                    # the call used 1200 tokens, not 2000
cli TB.CONSUME user:7:bw 10000000 1000000 67108864 ATMOST   # send what may go now

# The Lua fallback: one source, lua/tb.lua, shipped by each client package as
# a byte-identical copy (packages cannot reach outside their own directory).
#
#   make lua-sync    copy lua/tb.lua into every client package
#   make lua-check   fail if a package's copy differs (part of `make test`)

LUA_SOURCE := lua/tb.lua
# Every packaged copy of LUA_SOURCE; a new client package adds its own here.
LUA_COPIES := clients/python/src/tb_limiter/tb.lua clients/node/src/tb.lua clients/ruby/lib/tb_limiter/tb.lua

.PHONY: lua-sync lua-check

EXTRA_TESTS += lua-check

lua-sync: ## copy lua/tb.lua into every client package
	@for f in $(LUA_COPIES); do cp $(LUA_SOURCE) $$f; echo "copied $(LUA_SOURCE) to $$f"; done

lua-check: ## fail if a client package's copy of lua/tb.lua differs (part of make test)
	@for f in $(LUA_COPIES); do \
	  cmp -s $(LUA_SOURCE) $$f || { \
	    echo "error: $$f differs from $(LUA_SOURCE); edit $(LUA_SOURCE), then run 'make lua-sync'" >&2; \
	    exit 1; }; \
	done; echo "lua-check: $(words $(LUA_COPIES)) copies of $(LUA_SOURCE) are identical"

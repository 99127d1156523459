# The two commands of the README:  `make demo`  and  `make test`.
# Both create .venv and install what they need (pinned by constraints.txt) on first use.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test image check lint bench clean

# keyturn (the daemon, with the test tools), keyturn-devkit (devkit/: the sandbox, the dev
# servers and the test harnesses; never in `pip install .`) and the client library, in one
# resolution. uv installs them (13 s here, where pip took 54 s before the first test could start),
# bytecode included. setuptools, pinned, first: the three editable projects are built with it,
# without build isolation (which would install setuptools again for each), as the packaging test
# builds keyturn's wheel.
UV := $(BIN)/uv pip install --quiet --python $(BIN)/python -c constraints.txt
$(STAMP): pyproject.toml devkit/pyproject.toml clients/python/pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt uv
	$(UV) --upgrade pip setuptools
	$(UV) --compile-bytecode --no-build-isolation -e '.[test]' -e ./devkit \
		-e 'clients/python[httpx,requests]'
	@# Selenium brings trio (its CDP and BiDi sessions only, which the browser test does not
	@# open) and PySocks. httpcore imports trio, and requests PySocks, whenever they are
	@# installed: about 0.1 s of CPU for every keyturn process the tests start that makes an
	@# HTTP client, several hundred a run.
	$(BIN)/uv pip uninstall --quiet --python $(BIN)/python trio trio-websocket pysocks
	touch $(STAMP)

# The release tools, twine (`twine check`) and cyclonedx-bom (the image's SBOM), in a venv of
# their own: they bring rich and chardet, which structlog, httpx and requests import whenever
# they are installed, costing each keyturn and sandbox process the tests start about 0.3 s of
# CPU (several hundred of them per run).
TOOLS := build/tools/.installed
$(TOOLS): $(STAMP) constraints.txt
	$(PYTHON) -m venv build/tools
	$(BIN)/uv pip install --quiet --python build/tools/bin/python -c constraints.txt \
		--compile-bytecode twine cyclonedx-bom
	@# The SBOM is validated against CycloneDX's schema, but not the syntax of its IRIs:
	@# rfc3987-syntax's parser (jsonschema's "iri-reference" check) took 10 of the build's 11 s
	@# of CPU for the SBOM (about 180 IRIs). Every other keyword and format is still checked.
	$(BIN)/uv pip uninstall --quiet --python build/tools/bin/python rfc3987-syntax lark
	touch $(TOOLS)

demo: $(STAMP)
	$(BIN)/keyturn demo

# The Debian and npm packages (scripts/system-deps.sh, mostly downloads) install while the venv
# is made and linted, and the tools' venv (with the venv's uv) while it is linted; their output is
# shown once all is done. Beside ruff and mypy, bytecode is written once for what the test
# processes import:
# - our own packages (editable installs get none, and every keyturn process the tests start
#   would compile them again where PYTHONDONTWRITEBYTECODE is set);
# - the test modules as pytest rewrites their asserts: a collection run with bytecode allowed
#   leaves the rewritten modules in tests/**/__pycache__, which every worker then reads, even
#   where PYTHONDONTWRITEBYTECODE is set (16 s of CPU per worker to collect without them, 6 s
#   with them).
test:
	@mkdir -p build
	@{ bash scripts/system-deps.sh > build/system-deps.log 2>&1; echo $$? > build/system-deps.rc; } & \
	$(MAKE) --no-print-directory $(STAMP) && { \
		{ $(MAKE) --no-print-directory $(TOOLS) > build/tools.log 2>&1; echo $$? > build/tools.rc; } & \
		{ $(BIN)/python -m compileall -q -j 0 src devkit/src clients/python/src; \
		  env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest --collect-only -q -p no:cacheprovider \
			> build/collect.log 2>&1; } & \
		$(BIN)/ruff check src devkit tests bench clients && $(BIN)/mypy; }; \
	status=$$?; wait; cat build/system-deps.log build/tools.log; \
	test $$status -eq 0 && test "$$(cat build/system-deps.rc)" = 0 && test "$$(cat build/tools.rc)" = 0
	$(BIN)/pytest -n 5 --dist loadfile --no-loadscope-reorder
	@cat build/image/report.txt

# keyturn's image: deploy/Dockerfile built by buildah from nothing (scripts/build-image.sh), then
# booted by podman against a dev OpenBao and the sandbox. `make test` runs the same test module,
# first of all, so that the build overlaps the other tests.
image: $(STAMP) $(TOOLS)
	bash scripts/system-deps.sh
	$(BIN)/pytest -q -p no:cacheprovider tests/integration/test_image.py
	@cat build/image/report.txt

# The quick loop while changing code: lint, types and the unit tests (fakes only, no servers).
check: $(STAMP)
	$(BIN)/ruff check src devkit tests bench clients
	$(BIN)/mypy
	$(BIN)/pytest -n 3 -q tests/unit

lint: $(STAMP)
	$(BIN)/ruff check src devkit tests bench clients
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/sandbox_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache build src/*.egg-info devkit/build devkit/src/*.egg-info \
		clients/python/src/*.egg-info

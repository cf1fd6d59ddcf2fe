# Two commands on a fresh Debian/Ubuntu machine:
#   make demo   installs into .venv, prepares Fashion-MNIST, runs `hotset compare`
#   make test   installs into .venv and runs the whole test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DATA ?= data/fashion-mnist
OUT ?= out
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
# no wheel cache: a fresh machine installs once, and torch's CUDA wheels would keep GBs
PIP := $(PY) -m pip install -q --disable-pip-version-check --no-cache-dir $(FIND_LINKS)

.PHONY: install system-deps s3rver data demo compare test docs bench chaos peers peers-venv lint lock clean

$(VENV)/.installed: pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -r requirements.lock
	$(PIP) --no-deps -e .
	$(PY) -m pip check
	touch $@

install: $(VENV)/.installed

# what the demo runs, alone (hotset and its [plot] extra: requirements-runtime.lock)
$(VENV)/.runtime: pyproject.toml requirements-runtime.lock
	$(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -r requirements-runtime.lock
	$(PIP) --no-deps -e .
	touch $@

system-deps:
	bash scripts/system-deps.sh

# s3rver (npm): the S3-compatible server the object-store tests and `--storage s3` use
# beside moto's; skipped (and those tests with it) where npm is missing
S3RVER := .tools/node_modules/.bin/s3rver
$(S3RVER):
	npm install -s --prefix .tools --no-audit --no-fund s3rver@3.7.1
s3rver: $(if $(shell command -v npm),$(S3RVER),)

$(DATA)/train/manifest.json: | install system-deps
	$(VENV)/bin/hotset prepare fashion-mnist $(DATA)

data: $(DATA)/train/manifest.json

# a few minutes on 2 cores: the first 12,000 training images (only those are prepared)
DEMO_DATA ?= $(DATA)-12k
demo: $(VENV)/.runtime
	bash scripts/system-deps.sh demo
	test -f $(DEMO_DATA)/train/manifest.json || \
	  $(VENV)/bin/hotset prepare fashion-mnist $(DEMO_DATA) --limit 12000 >/dev/null
	$(VENV)/bin/hotset compare --data $(DEMO_DATA) --systems lru,minio,shade \
	  --cache-fractions 0.2 --epochs 3 --num-workers 2 --out $(OUT)

# the full comparison (about an hour on 2 cores; minutes on a GPU with --device cuda)
compare: install system-deps data
	$(VENV)/bin/hotset compare --data $(DATA) --systems inmemory,lru,minio,belady,shade,icache,spider \
	  --cache-fractions 0.1,0.2 --epochs 5 --num-workers 8 --concurrency 8 --out $(OUT)

test: install system-deps s3rver peers-venv
	$(VENV)/bin/ruff check src tests benchmarks examples scripts
	$(PY) scripts/api_docs.py site
	PYTHON=$(PYTHON) bash scripts/wheel_smoke.sh
	$(PY) -m pytest -q -n 2 -m "not serial"  # two at once: many wait on servers and ranks
	$(PY) -m pytest -q -m serial

# the API reference from the docstrings (pdoc), in site/
docs: install
	$(PY) scripts/api_docs.py site

bench: install
	$(PY) benchmarks/control_plane.py
	$(PY) benchmarks/plan_scale.py
	$(PY) benchmarks/store_latency.py
	$(PY) benchmarks/loader_throughput.py
	$(PY) benchmarks/dsa_tree.py
	$(PY) benchmarks/io_bound_epoch.py
	$(PY) benchmarks/refcnt_eviction.py

# faults on a schedule for 10 minutes: every served sample checked (docs/benchmarks.md)
chaos: install system-deps
	$(PY) benchmarks/chaos.py --minutes 10

# the peer hotset is measured against (MosaicML Streaming), in a venv of its own, and the
# side-by-side run (benchmarks/peer_compare.py)
PEERS ?= .venv-peers
PEERS_PIP := $(PEERS)/bin/python -m pip install -q --disable-pip-version-check --no-cache-dir $(FIND_LINKS)
$(PEERS)/.installed: benchmarks/peers/requirements.txt benchmarks/peers/constraints.txt
	$(PYTHON) -m venv $(PEERS)
	$(PEERS_PIP) torch==2.13.0
	$(PEERS_PIP) -c benchmarks/peers/constraints.txt -r benchmarks/peers/requirements.txt
	# no torchvision build matches the CPU torch; the runner never uses Streaming's vision sets
	$(PEERS)/bin/python -m pip uninstall -q -y torchvision
	touch $@

# the peer's venv alone (`hotset compare --peers streaming` and its test use it)
peers-venv: $(PEERS)/.installed

peers: install system-deps peers-venv
	$(PY) benchmarks/peer_compare.py --peer-python $(PEERS)/bin/python
	$(PY) benchmarks/first_batch.py --peer-python $(PEERS)/bin/python

# the locked set from the current venv (torch and hotset itself excluded)
lock: install
	{ sed -n '1,3p' requirements.lock; $(PY) -m pip freeze --exclude-editable | grep -v '^torch=='; } > requirements.lock.new
	! grep -n ' @ file:' requirements.lock.new  # a local wheel would not install elsewhere
	mv requirements.lock.new requirements.lock
	$(PY) scripts/runtime_lock.py > requirements-runtime.lock

lint: install
	$(VENV)/bin/ruff check src tests benchmarks examples scripts

clean:
	rm -rf $(VENV) $(OUT) .tools build src/*.egg-info

# Two commands on a fresh Debian/Ubuntu machine:
#   make demo   installs into .venv, prepares Fashion-MNIST, runs `hotset compare`
#   make test   installs into .venv and runs the whole test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DATA ?= data/fashion-mnist
OUT ?= out
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
PIP := $(PY) -m pip install -q --disable-pip-version-check $(FIND_LINKS)

.PHONY: install system-deps data demo test bench lint clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -e '.[dev,redis]'
	touch $@

install: $(VENV)/.installed

system-deps:
	bash scripts/system-deps.sh

$(DATA)/train/manifest.json: | install system-deps
	$(VENV)/bin/hotset prepare fashion-mnist $(DATA)

data: $(DATA)/train/manifest.json

demo: install system-deps data
	$(VENV)/bin/hotset compare --data $(DATA) --policies lru,minio,belady,shade \
	  --cache-fractions 0.1,0.2 --epochs 3 --num-workers 2 --out $(OUT)

test: install system-deps
	$(VENV)/bin/ruff check src tests benchmarks
	$(PY) -m pytest -q

bench: install
	$(PY) benchmarks/control_plane.py
	$(PY) benchmarks/store_latency.py
	$(PY) benchmarks/loader_throughput.py
	$(PY) benchmarks/dsa_tree.py

lint: install
	$(VENV)/bin/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) $(OUT) build src/*.egg-info

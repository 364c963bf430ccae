# gangslice — the two entry points are `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo playground test lint typecheck unit image-test e2e bench reference crds venv clean image release

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/gangslice simulate --out out/simulate

# gangslice on a control plane on loopback with fake GPU nodes, until Ctrl-C (needs Go the first
# time, to build the binaries; no container engine). ARGS=--once stops after printing.
playground: $(STAMP)
	$(BIN)/gangslice playground $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check extender tests
	$(BIN)/ruff format --check extender tests
	$(BIN)/lint-imports

reference: $(STAMP)
	$(BIN)/python -m extender.docs --output docs/reference.md

crds: $(STAMP)
	$(BIN)/python -m extender.kube.crd_schema --output manifests/crds

typecheck: $(STAMP)
	$(BIN)/mypy extender

# Bytecode and pytest's rewritten test modules, kept outside the tree: where the environment
# turns writing them off (PYTHONDONTWRITEBYTECODE, as container images often do), every run
# compiled the whole package and rewrote every test module again (about 10 s of each run).
PYCACHE := $(abspath $(VENV))/pycache

# The quick tier: unit and conformance tests (under 3 minutes; no image, no control plane).
unit: $(STAMP)
	PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(PYCACHE) $(BIN)/pytest -q -m 'not e2e' tests/unit tests/conformance

# The image tier: builds the release once (`make release`: both images, the chart, the wheel;
# needs root, mmdebstrap and buildah) and checks every artifact.
image-test: $(STAMP)
	$(BIN)/pytest -q tests/image

e2e: $(STAMP)
	$(BIN)/pytest -q -m e2e tests/e2e

# Everything: lint, types, then every tier in one pytest run (unit, conformance, image, e2e).
test: lint typecheck
	$(BIN)/pytest -q tests

# The OCI image archive out/image/gangslice-<version>-amd64.oci.tar and its SBOM (needs root,
# mmdebstrap, buildah; no container daemon or registry). ARCH=arm64 for Grace trays.
image: $(STAMP)
	PYTHON=$(abspath $(BIN))/python hack/image/build.sh $(or $(ARCH),amd64)

# Every artifact of the version in pyproject.toml under out/release/ (hack/release/build.sh):
# the wheel and the sdist, the amd64 and arm64 image archives and the multi-arch index over
# both, their SBOMs, the Helm chart with the image by digest, SHA256SUMS. Needs what `make image`
# needs, and helm (hack/e2e/build.sh builds it). .github/workflows/release.yaml publishes them.
release: $(STAMP)
	PYTHON=$(abspath $(BIN))/python hack/release/build.sh

bench: $(STAMP)
	$(BIN)/gangslice bench placement

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

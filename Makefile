# paged-kv: every target installs what it needs into .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch 2.13 is what CI and this course's machines use (their pip finds its CPU build). Elsewhere
# choose the build: TORCH_PIP_ARGS="--index-url URL" with the URL of PyTorch's CPU wheels (from the
# install selector on PyTorch's site) for the CPU build; on a CUDA machine `make install TORCH_SPEC=torch`
# replaces a CPU-only torch already in .venv (scripts/ensure_torch.py says what it keeps or replaces).
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
# Given on make's command line, TORCH_SPEC is what the user asks for, not the default.
TORCH_EXPLICIT := $(if $(filter command line,$(origin TORCH_SPEC)),--explicit)
STAMP := $(VENV)/.installed
LAB_STAMP := $(VENV)/.installed-lab
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout=300
LAB_ARGS ?=
# Parallel test workers (pytest-xdist); each notebook stays on one worker.
JOBS ?= 2
XDIST := -n $(JOBS) --dist loadfile
# The course's tests are few and long (a grading run each): dealt one at a time, whatever file they sit in, the
# longest first (tests/conftest.py orders them), so no long one starts last (657 s -> 604 s on 2 cores). One
# worker more than JOBS: about a third of their time is waiting (the limits a test waits out, processes starting),
# so a spare worker keeps the cores busy (course tests back to back on 2 cores: 642 s with 2 workers, 617 s with 3).
COURSE_XDIST := -n $(shell expr $(JOBS) + 1) --dist load --maxschedchunk 1

.PHONY: install install-lab torch lab lint test test-library test-course test-fast test-notebooks test-browser exercises bench gpu-check clean

## Everything a course author needs: the learner's extras and the dev tools (tests, lint).
install: $(STAMP)

## What a learner needs: the course, JupyterLab and Triton (no test or lint tools).
install-lab: $(LAB_STAMP)

# Always run (cheap when torch matches): a torch that does not match TORCH_SPEC is replaced.
torch:
	@test -x $(PY) || { $(PYTHON) -m venv $(VENV) && $(PY) -m pip install --quiet --upgrade pip; }
	@$(PY) -c "import packaging" 2>/dev/null || $(PY) -m pip install --quiet packaging
	$(PY) scripts/ensure_torch.py $(TORCH_EXPLICIT) "$(TORCH_SPEC)" -- $(TORCH_PIP_ARGS)

$(STAMP): pyproject.toml course/pyproject.toml | torch
	$(PY) -m pip install --quiet $(TORCH_PIP_ARGS) -e ".[dev]" -e ./course
	touch $(STAMP) $(LAB_STAMP)

$(LAB_STAMP): pyproject.toml course/pyproject.toml | torch
	$(PY) -m pip install --quiet $(TORCH_PIP_ARGS) -e ".[lab,triton]" -e ./course
	touch $(LAB_STAMP)

## Open the course in JupyterLab (served from the repository root, so lessons/ and exercises/ both show).
## As root (Docker, cloud GPU boxes) it adds --allow-root; with no display it adds --no-browser.
lab: install-lab
	@extra=""; \
	if [ "$$(id -u)" = "0" ]; then extra="$$extra --allow-root"; \
	  echo "make lab: running as root, so JupyterLab gets --allow-root"; fi; \
	if [ "$$(uname)" != "Darwin" ] && [ -z "$${DISPLAY:-}$${WAYLAND_DISPLAY:-}" ]; then extra="$$extra --no-browser"; \
	  echo "make lab: no display here, so no browser opens: open the http://127.0.0.1:... link printed below"; fi; \
	set -x; $(VENV)/bin/jupyter lab --ServerApp.root_dir=. --LabApp.default_url=/lab/tree/lessons/00_setup.ipynb $$extra $(LAB_ARGS)

## Lint: ruff on the code, mypy on the library (settings in pyproject.toml).
lint: install
	$(PY) -m ruff check paged_kv_lib course tests benchmarks scripts
	$(PY) -m mypy

# The course's tests (its checks, planted solutions, the grader, the learner's install); the rest of tests/
# is the library's.
COURSE_TESTS := tests/course tests/conformance tests/exercises tests/grading tests/platforms
LIBRARY_TESTS := $(COURSE_TESTS:%=--ignore=%) --ignore=tests/browser tests

## Every test: lint, the library's tests, the course's tests and notebooks (lessons and exercise solutions).
## Lint runs beside the library's tests (mypy keeps one core busy for a minute); each prints when it ends.
test: install
	$(MAKE) --no-print-directory -j2 --output-sync=target lint test-library
	$(MAKE) --no-print-directory test-course
## The library's tests.
test-library: install
	$(PY) -m pytest $(XDIST) $(LIBRARY_TESTS)

## The course's checks, planted solutions, grader and platforms, then every notebook through nbval.
test-course: install
	$(PY) -m pytest $(COURSE_XDIST) $(COURSE_TESTS)
	$(PY) -m pytest $(XDIST) lessons exercises/solutions $(NBVAL)

## While working on the library: its tests without the slow ones (listed in tests/conftest.py), under a minute
## of CPU. One process: a second xdist worker would import torch and collect everything again (11 s of CPU).
test-fast: install
	$(PY) -m pytest -p no:nbval -m "not slow" $(LIBRARY_TESTS)

test-notebooks: install
	$(PY) -m pytest $(XDIST) lessons exercises/solutions $(NBVAL)

## JupyterLab in headless Chromium (needs the system's chromium; see README).
test-browser: install
	$(PY) -m pip install --quiet -e ".[browser]"
	$(PY) -m pytest tests/browser -m browser -p no:randomly

## Regenerate the learner versions of the exercises from exercises/solutions/.
exercises: install
	$(PY) -m paged_kv_course.grading.generate

## The learner's course without exercises/solutions/ or tests/, into $(RELEASE_DIR) (outside this folder).
RELEASE_DIR ?= ../paged-kv-release
.PHONY: release
release: install
	$(VENV)/bin/paged-kv release --out $(RELEASE_DIR)

## Benchmarks that print figures (docs/benchmarks.md holds the latest).
bench: install
	$(PY) benchmarks/allocator_ops.py
	$(PY) benchmarks/free_queue.py
	$(PY) benchmarks/attention.py
	$(PY) benchmarks/engine.py
	$(PY) benchmarks/engine_memory.py
	$(PY) benchmarks/simulate.py

## On a CUDA machine: GPU tests, kernel benchmark and the last lesson; results in $GPU_CHECK_OUT.
## gpu_check.py's status is kept: make reports "Error N" with N = 1 a step failed, 2 no CUDA GPU,
## 3 a target missed, after one line saying which.
gpu-check: install
	@$(PY) benchmarks/gpu_check.py; status=$$?; \
	case $$status in \
	  0) ;; \
	  1) echo "make gpu-check: exit 1: a step failed (tests, benchmark or lesson 09)" >&2 ;; \
	  2) echo "make gpu-check: exit 2: no CUDA GPU or Triton here; run it on a GPU machine" >&2 ;; \
	  3) echo "make gpu-check: exit 3: every step passed but a performance target was missed" >&2 ;; \
	  *) echo "make gpu-check: exit $$status" >&2 ;; \
	esac; \
	exit $$status

clean:
	rm -rf $(VENV) build dist *.egg-info gpu-check-out test-artifacts

## In a class repository: nbval over your exercises (quick feedback), then the official grader (the
## score), one line per task; exit 0 only when every task passed. EXERCISES="02 03" checks only those;
## CHECK_SUMMARY=FILE appends a Markdown score table to FILE (CI: the job summary). It installs the
## learner's dependencies only (install-lab), not the dev tools.
EXERCISES ?=
CHECK_SUMMARY ?=
.PHONY: check
check: install-lab
	$(VENV)/bin/paged-kv check $(EXERCISES) $(if $(CHECK_SUMMARY),--summary "$(CHECK_SUMMARY)")

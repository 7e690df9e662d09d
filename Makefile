# Early exit vs the KV cache: two commands for a fresh clone.
#   make book   set up .venv, fetch the model, execute every chapter (profile cpu), build _build/html
#   make test   set up .venv, run the unit tests, then build the whole book on a tiny model
#               (profile smoke) with Sphinx warnings as errors, then open every page in headless Chromium
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.earlyexit-installed
PIP_VERSION := 26.3
# torch==2.13.0 in requirements.lock is the CPU build. On the reference machines pip takes it from a
# local wheel. Elsewhere name the CPU index, or pip fetches a CUDA build of several GB:
#   make book TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
PIP_INSTALL = $(PY) -m pip install --quiet --disable-pip-version-check \
              $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))

.PHONY: help setup model book test clean llama-cpp

help:
	@echo "make book    set up .venv, fetch the model, run every chapter on the CPU, build _build/html"
	@echo "make test    set up .venv, run pytest, then build the book on a tiny model (warnings as errors)"
	@echo "make clean   remove _build/ and book/generated/ (executed notebooks)"
	@echo "make llama-cpp  build the optional llama.cpp peer of benchmarks/bench_engine.py (about 7 minutes)"

$(PY):
	$(PYTHON) -m venv $(VENV)

# Exact pins only: a loose torch requirement could pull a CUDA build. The stamp makes a second run instant;
# it is redone when requirements.lock or pyproject.toml changes.
$(STAMP): requirements.lock pyproject.toml | $(PY)
	$(PIP_INSTALL) pip==$(PIP_VERSION)
	$(PIP_INSTALL) -r requirements.lock
	$(PIP_INSTALL) --no-deps --no-build-isolation -e .
	@touch $@

setup: $(STAMP)

model: setup
	@$(PY) -m earlyexit fetch-model >/dev/null

book: model
	$(PY) -m earlyexit book --profile cpu

# The browser check (pytest -m browser) opens the smoke book in headless Chromium, so it runs after the
# build; EARLYEXIT_NO_BROWSER=1 skips it where no Chromium can be installed.
test: model
	$(PY) -m pytest -q -m "not browser"
	$(PY) -m earlyexit book --profile smoke
	$(PY) -m pytest -q -m browser

# The optional CPU peer of the engine benchmark: pip builds llama-cpp-python from its sdist (cmake and a C
# compiler; about 7 minutes on 2 cores). Its own runtime needs are numpy, jinja2 and diskcache.
LLAMA_CPP_PYTHON := llama-cpp-python==0.3.36
llama-cpp: setup
	$(PIP_INSTALL) --no-deps $(LLAMA_CPP_PYTHON) diskcache==5.6.3

clean:
	rm -rf _build book/generated

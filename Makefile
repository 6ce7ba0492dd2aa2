# rulegraph — one-command setup, demo and tests on a machine with only Python.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.rulegraph-installed
# The CPU build of torch; without the pin pip resolves a multi-GB CUDA build.
TORCH  ?= torch==2.13.0

.PHONY: setup demo test test-all bench eval clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[dev,heads,ray]" "$(TORCH)"
	touch $(STAMP)

setup: $(STAMP)

demo: setup  ## fine-tune + export the MiniLM sentiment model once (cached in .cache/), then explain a few sentences
	$(PY) examples/sentiment/demo.py

# The suite runs on two worker processes (pytest-xdist), a test module to a worker, each worker's torch on one
# thread (tests/conftest.py): about 12 minutes on two cores where one process took 19.
test: setup  ## the test suite (tiny random-weight models, no network)
	$(PY) -m pytest -q -n 2 --dist loadfile

eval: setup  ## the faithfulness tables of docs/evaluation.md: demo model + IMDB model + IMDB language model + `rulegraph evaluate` + `rulegraph tune` on the demo, IMDB and language models (resumable)
	$(PY) examples/sentiment/demo.py
	$(PY) examples/sentiment/train_imdb.py
	$(PY) examples/sentiment/evaluate.py rt --docs
	$(PY) examples/sentiment/evaluate.py imdb --engine ray --num-workers 2 --docs
	$(PY) examples/sentiment/evaluate.py imdb --name imdb-rest --engine ray --num-workers 2 --docs
	$(PY) examples/sentiment/quantity.py --docs
	$(PY) examples/lm/train.py
	$(PY) examples/lm/evaluate.py --docs
	$(PY) benchmarks/results/tune-demo/make_data.py 600 .cache/tune-20/rt-held-out-600.csv
	$(VENV)/bin/rulegraph tune .cache/sentiment-minilm/model.onnx --data .cache/tune-20/rt-held-out-600.csv \
	    --from cp-lrp --against epsilon,decomposition --protocol mask-10-50 --metric aopc --trials 24 \
	    --split 20,10,70 --seed 0 --space transformers-dense --out .cache/tune-20/dense-600
	$(PY) benchmarks/results/tune-imdb/make_data.py 200 .cache/tune-20/imdb-held-out-200.csv
	$(VENV)/bin/rulegraph tune .cache/imdb-minilm/model.onnx --data .cache/tune-20/imdb-held-out-200.csv \
	    --from cp-lrp --against lrp-ah-ln --protocol mask-10-50 --metric aopc --trials 20 --finalists 2 \
	    --split 40,20,40 --seed 0 --space transformers-dense --out .cache/tune-20/imdb-dense-20
	$(PY) benchmarks/results/tune-imdb-lm/make_data.py 600 .cache/tune-20/lm-held-out-600.csv
	$(VENV)/bin/rulegraph tune .cache/imdb-llama-e6d053e2a0/model.onnx --data .cache/tune-20/lm-held-out-600.csv \
	    --from attnlrp --against lrp-ah-ln,cp-lrp --protocol achtibat2024 --metric morf-lerf --trials 24 \
	    --finalists 3 --split 30,20,50 --seed 0 --space transformers-dense --out .cache/tune-20/imdb-lm-600

bench: setup  ## side-by-side timings on the demo model
	$(PY) benchmarks/explain_speed.py

clean:
	rm -rf $(VENV) .pytest_cache

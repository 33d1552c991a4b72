# Developer entry points. Every target builds/reuses the venv (scripts/venv.sh) on its own.
#   make run                      node on 127.0.0.1:$(PORT) + Celery worker, embedded defaults (Ctrl-C stops both)
#   make demo [ARGS=...]          with `make run` up: demo queues, a topic and traffic, then the dashboards
#   make test [ARGS="-k foo"]     pytest with real PostgreSQL + Redis (started, then always stopped); the whole suite in 2 shards
#   make test ARGS='-m "not cluster"'   the same without the tests that start node processes
#   make test-unit [ARGS=...]     tests/unit on the embedded defaults, no services, not the slow ones
#   make fuzz [ARGS=...]          the entrances' fuzz tests, longer, on SQLite (ARGS="--examples 2000"; --help)
#   make lint                     ruff check, ruff format --check, mypy, lint-imports, mkdocs build --strict (what CI runs first)
#   make fmt                      ruff format, then ruff check --fix
#   make bench                    bench/throughput.py with PostgreSQL + Redis
#   make chaos [MINUTES=5] [SEED=n] [ARGS=...]  a nemesis run: 3 nodes, faults from SEED, then the checker (ARGS="--help")
#   make docs                     the documentation site: mkdocs serve on http://127.0.0.1:8001/ (DOCS_PORT=N: another port)
#   make services-start | services-stop | services-status
SHELL := /bin/bash
.DEFAULT_GOAL := help

PORT ?= 8000
MINUTES ?= 5
SEED ?=
DOCS_PORT ?= 8001
ARGS ?=
export PORT

.PHONY: help venv run demo test test-unit fuzz lint fmt bench chaos docs services-start services-stop services-status services-env

help:
	@sed -n 's/^#   //p' $(firstword $(MAKEFILE_LIST))

venv:
	@scripts/venv.sh

run:
	@scripts/run.sh

demo:
	@scripts/in-venv.sh python manage.py mq_demo --url http://127.0.0.1:$(PORT) $(ARGS)

test:
	@scripts/test.sh $(ARGS)

test-unit:
	@scripts/test-unit.sh $(ARGS)

fuzz:
	@scripts/fuzz.sh $(ARGS)

lint:
	@scripts/lint.sh

fmt:
	@scripts/in-venv.sh ruff format .
	@scripts/in-venv.sh ruff check --fix .

chaos:
	@scripts/in-venv.sh python -m nemesis.run --minutes $(MINUTES) $(if $(SEED),--seed $(SEED)) $(ARGS)

bench:
	@scripts/with-services.sh python bench/throughput.py $(ARGS)

docs:
	@NO_MKDOCS_2_WARNING=1 scripts/in-venv.sh mkdocs serve --dev-addr 127.0.0.1:$(DOCS_PORT)

services-start:
	@scripts/services.sh start

services-stop:
	@scripts/services.sh stop

services-status:
	@scripts/services.sh status

services-env:
	@scripts/services.sh env

#!/usr/bin/env bash
# The cp312 wheels an offline GPU machine (the H200 image: Python 3.12, torch 2.11,
# transformers 5.17, triton 3.6) lacks for the sglang target on release VERSION, into .whl/
# (git-ignored; carried with the device tool's `carry`). One release per call: a wheel
# is 27-39 MB and a call carries 64 MiB.  Usage: tools/gpu/gpu_wheels.sh 0.5.17
set -euo pipefail
v=$1; rm -rf .whl; mkdir -p .whl
dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl "$@"; }
dl "sglang==$v"
# the release's own pins of what its driven modules import (transformers 5.12.1 wants
# tokenizers <= 0.23.0; the image has 0.23.2)
pins=$(unzip -p .whl/sglang-*.whl '*/METADATA' | sed -n 's/^Requires-Dist: \(transformers\)==\([^ ;]*\)$/\1==\2/p')
dl $pins
# xgrammar: the core's 0.2.9 (7 MB) for every release -- the 0.2.1 wheel older releases pin
# is 44 MB, over a call's budget with the sglang wheel; 0.5.17 imports and runs with 0.2.9
dl xgrammar==0.2.9 apache-tvm-ffi==0.1.15.post2
case "$pins" in *transformers==5.1[0-6]*|*transformers==5.[0-9].*) dl tokenizers==0.22.2;; esac
# pure-Python packages the driven modules import that the image lacks, and specrace's own
dl pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
   jsonschema referencing jsonschema-specifications rpds-py greenlet \
   compressed-tensors==0.18.0 dill==0.4.1 distro==1.9.0 fastapi==0.165.0 gguf==0.19.0 \
   jiter==0.19.0 loguru==0.7.3 msgspec==0.23.0 openai==2.8.0 opentelemetry-api==1.45.2 \
   orjson==3.13.0 partial-json-parser==0.2.1.1.post7 pybase64==1.5.1 pyzmq==27.3.0 \
   setproctitle==1.3.8 sniffio==1.3.1 starlette==1.10.0 uvicorn==0.54.0 ipython==9.18.1 \
   traitlets==5.16.1
du -sh .whl; ls .whl | wc -l

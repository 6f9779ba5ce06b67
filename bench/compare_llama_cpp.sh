#!/usr/bin/env bash
# Compare fastspec with llama.cpp's own tools on the same model pair, prompts and
# settings.  Builds llama-bench, llama-simple and llama-speculative-simple from the
# vendored llama.cpp (outside the repo, reused on later runs), then hands over to
# bench/compare_fastspec.py, which runs both sides and prints the table.
#
# Usage:  bench/compare_llama_cpp.sh [--build-only] [--repeats N] [--stock]
#
# --stock: build llama-bench from a copy of the vendored tree with fastspec's patches taken
# back (stock llama.cpp at the pinned commit; in LLAMA_BUILD_DIR-stock) and compare only
# the target alone: llama-bench tg<N_PREDICT> -d <prompt tokens> against fastspec's
# target-alone tok/s on the same prompts, interleaved in max(3, N) rounds (--repeats N).
#
# Environment (all optional):
#   LLAMA_BUILD_DIR  build directory      (default: ${TMPDIR:-/tmp}/fastspec-llama-build)
#   TARGET, DRAFT    GGUF paths           (default: fastspec's default-target / default-draft)
#   THREADS          threads per model    (default: 2)
#   N_PREDICT        tokens to generate   (default: 128)
#   JOBS             parallel build jobs  (default: 2)
#   PYTHON           interpreter with fastspec installed (default: python3)
#   RESULTS_DIR      raw logs + JSON      (default: bench/results/llama_cpp_<timestamp>, git-ignored)
set -euo pipefail

die() { echo "error: $*" >&2; exit 1; }

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
LLAMA_DIR="$REPO_ROOT/vendor/llama.cpp"
BUILD_DIR="${LLAMA_BUILD_DIR:-${TMPDIR:-/tmp}/fastspec-llama-build}"
THREADS="${THREADS:-2}"
N_PREDICT="${N_PREDICT:-128}"
JOBS="${JOBS:-2}"
PYTHON="${PYTHON:-python3}"
BUILD_ONLY=0
REPEATS=1
STOCK=0

while [[ $# -gt 0 ]]; do
    case "$1" in
        --build-only) BUILD_ONLY=1; shift ;;
        --repeats) [[ $# -ge 2 ]] || die "--repeats needs a value"; REPEATS="$2"; shift 2 ;;
        --stock) STOCK=1; shift ;;
        -h|--help) sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $1 (try --help)" ;;
    esac
done

# --- prerequisites ----------------------------------------------------------------
[[ -f "$LLAMA_DIR/CMakeLists.txt" ]] || die "vendored llama.cpp not found at $LLAMA_DIR"
command -v cmake >/dev/null || die "cmake not found in PATH"
command -v "$PYTHON" >/dev/null || die "python interpreter '$PYTHON' not found (set PYTHON=...)"
"$PYTHON" -c "import fastspec" 2>/dev/null || die "'$PYTHON' cannot import fastspec (pip install -e . first)"

# --- build (configure once; cmake rebuilds only what changed) -----------------------
# Same CPU flags as fastspec's default build (GGML_NATIVE=ON, Release).
TARGETS=(llama-bench llama-simple llama-speculative-simple)
EXTRA_ARGS=()
if [[ "$STOCK" == 1 ]]; then
    # a copy of the vendored tree without fastspec's patches (refreshed when they change)
    STOCK_SRC="$BUILD_DIR-stock/src"
    BUILD_DIR="$BUILD_DIR-stock/build"
    STAMP="$(cat "$REPO_ROOT"/patches/*.patch | cksum)"
    if [[ ! -f "$STOCK_SRC/.fastspec-stock" || "$(cat "$STOCK_SRC/.fastspec-stock")" != "$STAMP" ]]; then
        echo "== copying the vendored tree to $STOCK_SRC and taking fastspec's patches back"
        rm -rf "$STOCK_SRC" && mkdir -p "$STOCK_SRC"
        cp -a "$LLAMA_DIR/." "$STOCK_SRC/"
        "$PYTHON" "$REPO_ROOT/patches/apply_patches.py" --revert --tree "$STOCK_SRC" \
            || die "could not take the patches back in $STOCK_SRC"
        echo "$STAMP" > "$STOCK_SRC/.fastspec-stock"
    fi
    LLAMA_DIR="$STOCK_SRC"
    TARGETS=(llama-bench)
    EXTRA_ARGS=(--target-only)
fi
BIN_DIR="$BUILD_DIR/bin"
echo "== llama.cpp build dir: $BUILD_DIR (outside git; delete it to force a clean build)"
t_build0=$(date +%s)
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
    echo "== configuring"
    cmake -S "$LLAMA_DIR" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release \
        -DGGML_NATIVE=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_COMMON=ON \
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF \
        || die "cmake configure failed (see output above)"
fi
echo "== building ${TARGETS[*]} with -j $JOBS"
cmake --build "$BUILD_DIR" --config Release --target "${TARGETS[@]}" -j "$JOBS" \
    || die "build failed (see output above)"
t_build1=$(date +%s)
echo "== build step took $((t_build1 - t_build0)) s"
for t in "${TARGETS[@]}"; do
    [[ -x "$BIN_DIR/$t" ]] || die "expected binary missing: $BIN_DIR/$t"
done
[[ "$BUILD_ONLY" == 1 ]] && exit 0

# --- models ------------------------------------------------------------------------
TARGET="${TARGET:-$("$PYTHON" -m fastspec.models path default-target)}" \
    || die "default target model not cached (python -m fastspec.models pull default)"
DRAFT="${DRAFT:-$("$PYTHON" -m fastspec.models path default-draft)}" \
    || die "default draft model not cached (python -m fastspec.models pull default)"
[[ -f "$TARGET" ]] || die "target model not found: $TARGET"
[[ -f "$DRAFT" ]] || die "draft model not found: $DRAFT"

RESULTS_DIR="${RESULTS_DIR:-$SCRIPT_DIR/results/llama_cpp_$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$RESULTS_DIR"
echo "== target: $TARGET"
echo "== draft:  $DRAFT"
echo "== threads: $THREADS, tokens: $N_PREDICT, repeats: $REPEATS, raw logs: $RESULTS_DIR"
echo "== note: timings are wall-clock on a shared machine; other load makes them noisy"

exec "$PYTHON" "$SCRIPT_DIR/compare_fastspec.py" \
    --bin-dir "$BIN_DIR" --target "$TARGET" --draft "$DRAFT" \
    --threads "$THREADS" --n-predict "$N_PREDICT" --repeats "$REPEATS" \
    --results-dir "$RESULTS_DIR" "${EXTRA_ARGS[@]}"
